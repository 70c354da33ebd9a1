//! Exactly-once execution (`io.tether/idempotency`, docs/PROTOCOL.md): the key a client puts
//! on a request, and the acknowledgement of its claim that lets the client show, when it sends
//! the key again, what the server's records told it, so records that went back in time are
//! caught before the request could run twice.

use serde_json::{Value, json};

/// A client-chosen key naming one logical request across re-sends, sessions and replicas
/// (`_meta["io.tether/idempotencyKey"]`): 1 to 128 printable ASCII characters, no spaces. A
/// UUID is the intended shape; anything within those bounds is accepted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a string is not an [`IdempotencyKey`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an idempotency key is 1 to 128 printable ASCII characters without spaces")]
pub struct InvalidIdempotencyKey;

impl IdempotencyKey {
    /// The longest key accepted.
    pub const MAX_LEN: usize = 128;

    /// Checks `text`.
    pub fn parse(text: &str) -> Result<IdempotencyKey, InvalidIdempotencyKey> {
        let valid =
            (1..=Self::MAX_LEN).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_graphic());
        if valid {
            Ok(IdempotencyKey(text.to_owned()))
        } else {
            Err(InvalidIdempotencyKey)
        }
    }

    /// A random key in UUID version 4 form, from the 16 random bytes given.
    pub fn from_random(bytes: [u8; 16]) -> IdempotencyKey {
        let mut b = bytes;
        b[6] = (b[6] & 0x0f) | 0x40;
        b[8] = (b[8] & 0x3f) | 0x80;
        let hex: String = b.iter().map(|b| format!("{b:02x}")).collect();
        IdempotencyKey(format!(
            "{}-{}-{}-{}-{}",
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..]
        ))
    }

    /// The key's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A key's claim as the server's records acknowledged it: which records, and the position
/// they gave the claim. Records count their claims; a claim's position is the count once it is
/// made. The server sends it with the key's first response (`X-MCP-Idempotency-Claim:
/// <records>:<position>`); a client sending the key again shows it
/// (`_meta["io.tether/idempotencyClaim"] = {"records", "position"}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acknowledged {
    /// The name of the records.
    pub records: String,
    /// The claim's position in them.
    pub position: u64,
}

impl Acknowledged {
    /// Whether records named `records`, whose count of claims is `position`, and which have
    /// forgotten the claims up to `forgotten_through` (retention forgot them, or a claim was
    /// released because its request did not run, or must run again), no longer hold this claim
    /// as they acknowledged it: they are other records, they are behind it, the key is unknown
    /// to them although they did not forget this claim, or they hold another claim of the key
    /// that is not a later one made after they forgot this one. `held` is the position of the
    /// claim they hold for the key, if any. The one rule of regressed records (the Redis store's
    /// claim script applies it in Lua).
    pub fn regressed(
        &self,
        records: &str,
        position: u64,
        forgotten_through: u64,
        held: Option<u64>,
    ) -> bool {
        self.records != records
            || self.position > position
            || match held {
                Some(at) => match at.cmp(&self.position) {
                    std::cmp::Ordering::Equal => false,
                    std::cmp::Ordering::Less => true,
                    // A later claim: made after this one was forgotten, or after it was lost.
                    std::cmp::Ordering::Greater => self.position > forgotten_through,
                },
                None => self.position > forgotten_through,
            }
    }

    /// The header value: `<records>:<position>`.
    pub fn to_header(&self) -> String {
        format!("{}:{}", self.records, self.position)
    }

    /// Reads a header value; `None` unless it is `<records>:<position>` with records of the
    /// token alphabet.
    pub fn from_header(value: &str) -> Option<Acknowledged> {
        let (records, position) = value.rsplit_once(':')?;
        let token = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        let position = crate::lineage::parse_canonical_u64(position)?;
        token(records).then(|| Acknowledged {
            records: records.to_owned(),
            position,
        })
    }

    /// The `_meta` value a re-sent request shows.
    pub fn to_meta(&self) -> Value {
        json!({"records": self.records, "position": self.position})
    }

    /// Reads a `_meta` value; `None` unless it has exactly a string `records` and an integer
    /// `position`.
    pub fn from_meta(value: &Value) -> Option<Acknowledged> {
        let object = value.as_object().filter(|o| o.len() == 2)?;
        let records = object.get("records")?.as_str()?;
        let position = object.get("position")?.as_u64()?;
        Acknowledged::from_header(&format!("{records}:{position}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_are_bounded_printable_ascii() {
        let uuid = IdempotencyKey::from_random([0xab; 16]);
        assert_eq!(uuid.as_str(), "abababab-abab-4bab-abab-abababababab");
        assert_eq!(IdempotencyKey::parse(uuid.as_str()), Ok(uuid));
        assert!(IdempotencyKey::parse(&"k".repeat(IdempotencyKey::MAX_LEN)).is_ok());
        for bad in [
            String::new(),
            "k".repeat(IdempotencyKey::MAX_LEN + 1),
            "a b".into(),
            "caf\u{e9}".into(),
            "a\n".into(),
        ] {
            assert_eq!(
                IdempotencyKey::parse(&bad),
                Err(InvalidIdempotencyKey),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn an_acknowledgement_reads_back_from_its_header_and_its_meta() {
        let ack = Acknowledged {
            records: "r-1_x".into(),
            position: 42,
        };
        assert_eq!(ack.to_header(), "r-1_x:42");
        assert_eq!(
            Acknowledged::from_header(&ack.to_header()),
            Some(ack.clone())
        );
        assert_eq!(Acknowledged::from_meta(&ack.to_meta()), Some(ack));
        for bad in ["", "r", ":1", "r:", "r:01", "r:-1", "r s:1", "r:1x"] {
            assert_eq!(Acknowledged::from_header(bad), None, "{bad:?}");
        }
        for bad in [
            json!({"records": "r"}),
            json!({"records": "r", "position": -1}),
            json!({"records": 1, "position": 1}),
        ] {
            assert_eq!(Acknowledged::from_meta(&bad), None, "{bad}");
        }
    }

    #[test]
    fn records_regressed_when_they_no_longer_hold_the_claim_as_acknowledged() {
        let ack = Acknowledged {
            records: "r".into(),
            position: 5,
        };
        assert!(!ack.regressed("r", 9, 0, Some(5)), "held as acknowledged");
        assert!(ack.regressed("other", 9, 0, Some(5)), "other records");
        assert!(ack.regressed("r", 4, 0, None), "behind the claim");
        assert!(
            ack.regressed("r", 4, 0, Some(5)),
            "a count behind the claim, whatever they hold"
        );
        assert!(!ack.regressed("r", 5, 0, Some(5)), "the newest claim, held");
        assert!(ack.regressed("r", 9, 4, None), "lost, not forgotten");
        assert!(!ack.regressed("r", 9, 5, None), "forgotten by retention");
        assert!(
            ack.regressed("r", 9, 0, Some(7)),
            "claimed again since, not forgotten"
        );
        assert!(
            !ack.regressed("r", 9, 5, Some(7)),
            "forgotten (released), then claimed again"
        );
        assert!(
            ack.regressed("r", 9, 5, Some(3)),
            "an earlier claim held, though this one was forgotten"
        );
    }
}
