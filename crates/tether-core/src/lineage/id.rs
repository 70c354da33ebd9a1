//! Event ids: `{epoch}:{stream}:{seq}:{tag}`, parsed once and trusted afterwards.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// Why a string is not a lineage id, epoch or stream name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// Not three `:`-separated parts.
    #[error("event id must have the form epoch:stream:seq")]
    Shape,
    /// The epoch is too short, too long or has a character outside `[A-Za-z0-9_-]`.
    #[error("epoch must be {min} to {max} characters of [A-Za-z0-9_-]", min = Epoch::MIN_LEN, max = Epoch::MAX_LEN)]
    Epoch,
    /// The stream name is empty, too long or has a character outside `[A-Za-z0-9_-]`.
    #[error("stream must be 1 to {max} characters of [A-Za-z0-9_-]", max = StreamName::MAX_LEN)]
    Stream,
    /// The sequence number is not a canonical decimal u64 (no sign, no leading zero).
    #[error("seq must be a decimal u64 without sign or leading zeros")]
    Seq,
    /// The session id is empty, too long or has a character outside visible ASCII.
    #[error("session id must be 1 to {max} visible ASCII characters", max = SessionId::MAX_LEN)]
    Session,
    /// The tag is not 11 characters of canonical unpadded base64url.
    #[error("tag must be {len} characters of canonical base64url", len = Tag::LEN)]
    Tag,
}

/// A map keyed by session ids and stream names. The server mints them at random and a client
/// can only look them up, never insert one of its choosing, so they need no defence against
/// keys chosen to collide (SipHash's), which was 3% of a tool call's instructions (callgrind).
/// Maps keyed by what a client picks (request ids, idempotency keys) keep SipHash.
pub type IdMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

fn is_token(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Parses a canonical decimal u64: digits only, no leading zero unless the number is 0.
/// Canonical form keeps one id per event: `7` and `07` must not both name it.
pub fn parse_canonical_u64(s: &str) -> Option<u64> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if canonical { s.parse().ok() } else { None }
}

/// The replay epoch of one session incarnation.
///
/// A new epoch is drawn whenever a session's history starts afresh, so ids from different
/// incarnations never compare as continuous. Shared, not copied, when cloned: every store
/// operation of a request names its incarnation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Epoch(Arc<str>);

impl Epoch {
    /// Shortest epoch: 11 base64url characters hold 64 bits.
    pub const MIN_LEN: usize = 11;
    /// Longest epoch accepted.
    pub const MAX_LEN: usize = 64;

    /// Parses an epoch.
    pub fn parse(s: &str) -> Result<Epoch, IdError> {
        if (Self::MIN_LEN..=Self::MAX_LEN).contains(&s.len()) && is_token(s) {
            Ok(Epoch(Arc::from(s)))
        } else {
            Err(IdError::Epoch)
        }
    }

    /// An epoch made from 128 random bits (the caller supplies them from a CSPRNG).
    pub fn from_entropy(bytes: [u8; 16]) -> Epoch {
        Epoch(Arc::from(base64url(&bytes)))
    }

    /// The epoch as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Epoch {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Epoch::parse(s)
    }
}

/// Unpadded base64url: the alphabet of epochs and session ids.
pub fn base64url(bytes: &[u8]) -> String {
    crate::base64::encode(bytes, crate::base64::Encoding::UrlUnpadded)
}

/// Appends `bytes` to `out` as unpadded base64url.
pub fn push_base64url(out: &mut String, bytes: &[u8]) {
    crate::base64::push(out, bytes, crate::base64::Encoding::UrlUnpadded);
}

/// A session's id (`Mcp-Session-Id`): visible ASCII, as the spec requires of it, parsed once
/// where it enters (a header, a store row) so the store's operations cannot be handed a request
/// key or a digest in its place. Shared, not copied, when cloned.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(Arc<str>);

impl SessionId {
    /// Longest session id accepted (tether mints 32 characters).
    pub const MAX_LEN: usize = 256;

    /// Parses a session id.
    pub fn parse(s: &str) -> Result<SessionId, IdError> {
        if (1..=Self::MAX_LEN).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic()) {
            Ok(SessionId(Arc::from(s)))
        } else {
            Err(IdError::Session)
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for SessionId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SessionId::parse(s)
    }
}

/// Maps keyed by session id are looked up by the text a store row or a relay message holds.
impl std::borrow::Borrow<str> for SessionId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// The name of one stream inside a session (a request's stream, or the standalone GET stream).
/// Shared, not copied, when cloned: a request's stream is named by its output, its store
/// records and every connection that follows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamName(Arc<str>);

impl StreamName {
    /// Longest stream name accepted.
    pub const MAX_LEN: usize = 64;

    /// Parses a stream name.
    pub fn parse(s: &str) -> Result<StreamName, IdError> {
        if (1..=Self::MAX_LEN).contains(&s.len()) && is_token(s) {
            Ok(StreamName(Arc::from(s)))
        } else {
            Err(IdError::Stream)
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StreamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for StreamName {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StreamName::parse(s)
    }
}

/// Ids travel as their text in serialized messages (between replicas), parsed again where they
/// are read, so a malformed one is refused there rather than carried on.
macro_rules! serde_as_text {
    ($($id:ident),*) => {$(
        impl serde::Serialize for $id {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $id {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<$id, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                $id::parse(&text).map_err(serde::de::Error::custom)
            }
        }
    )*};
}

serde_as_text!(Epoch, SessionId, StreamName);

/// What the store drew for one stored event: 64 random bits, written as the fourth part of the
/// event's id.
///
/// A store that goes back in time (a restored backup, a failover to a replica that lagged) and
/// then stores other events at positions it had already handed out draws new tags for them, so
/// the same position never carries the same tag twice: a cursor whose tag is not the tag the
/// store holds at its position names history the store no longer has. Tags are not secrets and
/// need no order; only a repeat matters, and 64 random bits make one negligible.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(u64);

impl Tag {
    /// The length of a tag as text: 64 bits in unpadded base64url.
    pub const LEN: usize = 11;

    /// The tag of these 64 bits.
    pub const fn from_bits(bits: u64) -> Tag {
        Tag(bits)
    }

    /// The tag's 64 bits, as a store keeps them.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// Parses a tag: exactly the 11 characters [`Tag`]'s `Display` writes, so one tag has one
    /// text.
    pub fn parse(s: &str) -> Result<Tag, IdError> {
        let bytes = (s.len() == Tag::LEN)
            .then(|| crate::base64::decode(s, crate::base64::Encoding::UrlUnpadded))
            .flatten()
            .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
            .ok_or(IdError::Tag)?;
        let tag = Tag(u64::from_be_bytes(bytes));
        // The last character carries two bits past the 64: canonical text has them clear.
        if tag.to_string() == s {
            Ok(tag)
        } else {
            Err(IdError::Tag)
        }
    }

    /// The tag of the priming event (event 0) of `stream`. A stream's name is never used twice
    /// in a session, and its priming event is always the same (empty, at its start), so its tag
    /// follows from the name: a connection can send the priming event's id before it has read
    /// anything, and a resume from it can be checked after every event of the stream is gone.
    pub fn priming(stream: &StreamName) -> Tag {
        use sha2::Digest as _;
        let digest = sha2::Sha256::new()
            .chain_update(b"tether priming event\0")
            .chain_update(stream.as_str())
            .finalize();
        let mut bits = [0u8; 8];
        bits.copy_from_slice(&digest[..8]);
        Tag(u64::from_be_bytes(bits))
    }

    /// Appends the tag's text to `out`.
    pub fn push_to(self, out: &mut String) {
        push_base64url(out, &self.0.to_be_bytes());
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = String::with_capacity(Tag::LEN);
        self.push_to(&mut text);
        f.write_str(&text)
    }
}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tag({self})")
    }
}

impl FromStr for Tag {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Tag::parse(s)
    }
}

/// A tether event id: which incarnation, which stream, which position, and the tag the store
/// drew for the event there.
///
/// `seq` is contiguous per stream from 0; 0 is the stream's priming event. Written
/// `{epoch}:{stream}:{seq}:{tag}`; a server that draws no tags writes `{epoch}:{stream}:{seq}`,
/// which a client reads the same way (its order and continuity do not depend on the tag).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventId {
    /// The session incarnation that produced the event.
    pub epoch: Epoch,
    /// The stream the event belongs to.
    pub stream: StreamName,
    /// The event's position in its stream.
    pub seq: u64,
    /// The tag the store drew for the event, if the id carries one.
    pub tag: Option<Tag>,
}

impl EventId {
    /// Parses `{epoch}:{stream}:{seq}` or `{epoch}:{stream}:{seq}:{tag}`.
    pub fn parse(s: &str) -> Result<EventId, IdError> {
        let mut parts = s.split(':');
        let (Some(epoch), Some(stream), Some(seq), tag, None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(IdError::Shape);
        };
        Ok(EventId {
            epoch: Epoch::parse(epoch)?,
            stream: StreamName::parse(stream)?,
            seq: parse_canonical_u64(seq).ok_or(IdError::Seq)?,
            tag: tag.map(Tag::parse).transpose()?,
        })
    }

    /// The position `seq` of the same stream, whose tag this id does not know.
    pub fn with_seq(&self, seq: u64) -> EventId {
        EventId {
            seq,
            tag: None,
            ..self.clone()
        }
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.epoch, self.stream, self.seq)?;
        match self.tag {
            Some(tag) => write!(f, ":{tag}"),
            None => Ok(()),
        }
    }
}

impl FromStr for EventId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventId::parse(s)
    }
}

/// An event id as a client sees it from any server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ObservedId {
    /// A tether lineage id.
    Lineage(EventId),
    /// A plain decimal integer, as many servers (and the seed documents) use.
    Integer(u64),
    /// Anything else: order and continuity cannot be read from it.
    Opaque(String),
}

impl ObservedId {
    /// Classifies an id string. Never fails: unknown shapes are `Opaque`.
    pub fn parse(s: &str) -> ObservedId {
        if let Ok(id) = EventId::parse(s) {
            ObservedId::Lineage(id)
        } else if let Some(n) = parse_canonical_u64(s) {
            ObservedId::Integer(n)
        } else {
            ObservedId::Opaque(s.to_owned())
        }
    }
}

/// [`ObservedId::parse`], for whoever reads ids back from text (a checkpoint file).
impl FromStr for ObservedId {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(ObservedId::parse(s))
    }
}

impl fmt::Display for ObservedId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObservedId::Lineage(id) => id.fmt(f),
            ObservedId::Integer(n) => n.fmt(f),
            ObservedId::Opaque(s) => f.write_str(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_travel_as_their_text_and_are_parsed_again_on_arrival() {
        let session = SessionId::parse("s-1").expect("session");
        let text = serde_json::to_string(&(
            &session,
            Epoch::from_entropy([7; 16]),
            StreamName::parse("r1").expect("stream"),
        ))
        .expect("serializes");
        let (back, epoch, stream): (SessionId, Epoch, StreamName) =
            serde_json::from_str(&text).expect("parses");
        assert_eq!(
            (back, epoch, stream.as_str()),
            (session, Epoch::from_entropy([7; 16]), "r1")
        );
        assert!(serde_json::from_str::<StreamName>("\"not a token\"").is_err());
        assert!(serde_json::from_str::<Epoch>("\"short\"").is_err());
        assert!(serde_json::from_str::<SessionId>("\"\"").is_err());
    }

    const EPOCH: &str = "AAAAAAAAAAAAAAAAAAAAAA";

    #[test]
    fn parses_and_formats_lineage_ids() {
        let s = format!("{EPOCH}:req-7_x:42");
        let id = EventId::parse(&s).expect("valid");
        assert_eq!(id.epoch.as_str(), EPOCH);
        assert_eq!(id.stream.as_str(), "req-7_x");
        assert_eq!(id.seq, 42);
        assert_eq!(id.to_string(), s);
        assert_eq!(id.tag, None);
        assert_eq!(id.with_seq(0).to_string(), format!("{EPOCH}:req-7_x:0"));
    }

    #[test]
    fn a_tagged_id_keeps_its_tag_and_a_new_position_forgets_it() {
        let tag = Tag::from_bits(0x0123_4567_89ab_cdef);
        let s = format!("{EPOCH}:r1:9:{tag}");
        let id = EventId::parse(&s).expect("valid");
        assert_eq!((id.seq, id.tag), (9, Some(tag)));
        assert_eq!(id.to_string(), s);
        assert_eq!(
            id.with_seq(10).tag,
            None,
            "another position's tag is not this one's"
        );
        assert_eq!(EventId::parse(&format!("{s}:x")), Err(IdError::Shape));
        assert_eq!(EventId::parse(&format!("{EPOCH}:r1:9:")), Err(IdError::Tag));
    }

    #[test]
    fn tags_are_eleven_canonical_base64url_characters() {
        for bits in [0, 1, u64::MAX, 0x8000_0000_0000_0000] {
            let tag = Tag::from_bits(bits);
            let text = tag.to_string();
            assert_eq!(text.len(), Tag::LEN);
            assert_eq!(Tag::parse(&text), Ok(tag));
            assert_eq!(tag.bits(), bits);
        }
        assert_eq!(Tag::from_bits(0).to_string(), "AAAAAAAAAAA");
        // "AAAAAAAAAAB" sets a bit past the 64: another text for the tag "AAAAAAAAAAA".
        for bad in [
            "",
            "AAAAAAAAAA",
            "AAAAAAAAAAAA",
            "AAAAAAAAAAB",
            "AAAAAAAAAA=",
            "AAAAAAAAAA+",
        ] {
            assert_eq!(Tag::parse(bad), Err(IdError::Tag), "{bad:?}");
        }
    }

    #[test]
    fn session_ids_are_visible_ascii_of_bounded_length() {
        assert_eq!(
            SessionId::parse("a-Z_0~!").map(|id| id.to_string()),
            Ok("a-Z_0~!".to_owned())
        );
        let longest = "x".repeat(SessionId::MAX_LEN);
        assert!(SessionId::parse(&longest).is_ok());
        for bad in ["", "a b", "a\tb", "é", &format!("{longest}x")] {
            assert_eq!(SessionId::parse(bad), Err(IdError::Session), "{bad:?}");
        }
    }

    #[test]
    fn a_session_id_is_its_text_and_is_found_by_it() {
        let id = SessionId::parse("s-1").expect("valid");
        assert_eq!(id.as_str(), "s-1");
        let mut map = std::collections::HashMap::new();
        map.insert(id.clone(), 1);
        assert_eq!(
            map.get("s-1"),
            Some(&1),
            "looked up by the text a store row holds"
        );
        assert_eq!(map.get("s-2"), None);
    }

    #[test]
    fn base64url_text_is_appended_unpadded() {
        let mut out = String::from("x:");
        push_base64url(&mut out, &[0xfb, 0xff]);
        assert_eq!(out, "x:-_8");
        assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
    }

    #[test]
    fn rejects_malformed_ids_with_a_reason() {
        for (s, err) in [
            ("", IdError::Shape),
            ("a:b", IdError::Shape),
            (&format!("{EPOCH}:s:1:2"), IdError::Tag),
            (&format!("{EPOCH}:s:1:AAAAAAAAAAA:2"), IdError::Shape),
            ("short:s:1", IdError::Epoch),
            (&format!("{}:s:1", "A".repeat(65)), IdError::Epoch),
            ("AAAAAAAAAA.A:s:1", IdError::Epoch),
            (&format!("{EPOCH}::1"), IdError::Stream),
            (&format!("{EPOCH}:s/x:1"), IdError::Stream),
            (&format!("{EPOCH}:s:"), IdError::Seq),
            (&format!("{EPOCH}:s:01"), IdError::Seq),
            (&format!("{EPOCH}:s:+1"), IdError::Seq),
            (&format!("{EPOCH}:s:-1"), IdError::Seq),
            (&format!("{EPOCH}:s:18446744073709551616"), IdError::Seq),
            (&format!("{EPOCH}:s: 1"), IdError::Seq),
        ] {
            assert_eq!(EventId::parse(s), Err(err), "{s:?}");
        }
        assert_eq!(
            EventId::parse(&format!("{EPOCH}:s:18446744073709551615")).map(|id| id.seq),
            Ok(u64::MAX)
        );
    }

    #[test]
    fn observed_ids_fall_back_to_integer_then_opaque() {
        assert!(matches!(
            ObservedId::parse(&format!("{EPOCH}:s:0")),
            ObservedId::Lineage(_)
        ));
        assert_eq!(ObservedId::parse("1041"), ObservedId::Integer(1041));
        assert_eq!(ObservedId::parse("0"), ObservedId::Integer(0));
        for opaque in ["007", "-1", "abc_123_xyz", "", "1.5"] {
            assert_eq!(ObservedId::parse(opaque), ObservedId::Opaque(opaque.into()));
        }
    }

    #[test]
    fn epoch_from_entropy_is_a_valid_128_bit_token() {
        let epoch = Epoch::from_entropy([0xff; 16]);
        assert_eq!(epoch.as_str().len(), 22);
        assert_eq!(Epoch::parse(epoch.as_str()), Ok(epoch));
        assert_ne!(Epoch::from_entropy([1; 16]), Epoch::from_entropy([2; 16]));
    }
}
