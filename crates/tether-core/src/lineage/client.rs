//! The client's continuity verdict (seed 000, "Decision Boundary") and the per-event
//! validator that keeps checking after a resume.
//!
//! A reconnect is continuous only if it is provably so: the same session, the same replay
//! epoch, and a first event that is exactly the one after the cursor. Everything else is a
//! [`Divergence`] or, when the server gives too little to check, [`Verdict::Unverifiable`].

use std::cmp::Ordering;

use super::digest::Digest;
use super::id::ObservedId;
use super::resync::{RESYNC_EVENT, ResyncNotice, ResyncReason, SeqRange};

/// What the client recorded about a stream before the connection dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The session id the client holds.
    pub session_id: String,
    /// The replay epoch the server advertised for the session, if it advertised one.
    pub epoch: Option<String>,
    /// The id of the last event the application fully processed: the `Last-Event-ID` sent.
    pub last_id: ObservedId,
    /// The digest of that event.
    pub last_digest: Digest,
}

/// The first event that arrived after a reconnect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FirstEvent<'a> {
    /// The event's own id field, if it had one.
    pub id: Option<&'a str>,
    /// The event type, `None` for the default `message`.
    pub event: Option<&'a str>,
    /// The event's data.
    pub data: &'a [u8],
}

/// What a reconnect showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconnect<'a> {
    /// The HTTP status of the resume request.
    pub status: u16,
    /// The `Mcp-Session-Id` echoed on the response, if any.
    pub session_id: Option<&'a str>,
    /// The `X-MCP-Replay-Epoch` on the response, if any.
    pub epoch: Option<&'a str>,
    /// The first event, or `None` while only the response head has arrived.
    pub first_event: Option<FirstEvent<'a>>,
}

/// A proof that the resumed stream is not the stream the client was following.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Divergence {
    /// The resume was answered with a non-2xx status.
    SessionInvalid {
        /// The HTTP status.
        status: u16,
    },
    /// The server echoed another session id.
    SessionChanged {
        /// The session id the client holds.
        expected: String,
        /// The session id echoed.
        got: String,
    },
    /// The replay epoch changed: the session's history was restarted.
    EpochChanged {
        /// The epoch the client holds.
        expected: Option<String>,
        /// The epoch the server now shows.
        got: Option<String>,
    },
    /// Events between the cursor and what arrived were skipped.
    Gap {
        /// The skipped sequence numbers.
        lost: SeqRange,
    },
    /// The stream went back to or before the cursor: it restarted.
    ReplayReset {
        /// The cursor's sequence number.
        last: u64,
        /// The sequence number that arrived.
        got: u64,
    },
    /// The event at the cursor's id came back with other content.
    DigestMismatch {
        /// The id of that event.
        id: String,
    },
    /// An event broke the stream's order: not the next position of the same stream.
    NonMonotonic {
        /// The id that was due after this one.
        after: String,
        /// The id that arrived, or `None` for an event without an id.
        got: Option<String>,
    },
    /// The server said it cannot resume from the cursor at all (or sent a resync that does not
    /// continue the stream where the client is).
    Resync(Option<ResyncNotice>),
}

impl std::fmt::Display for Divergence {
    /// What was seen, in words, for a person.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let or_none = |value: &Option<String>| value.clone().unwrap_or_else(|| "none".to_owned());
        match self {
            Divergence::SessionInvalid { status } => {
                write!(f, "the resume was answered {status}: the session is gone")
            }
            Divergence::SessionChanged { expected, got } => {
                write!(f, "the server answered for session {got}, not {expected}")
            }
            Divergence::EpochChanged { expected, got } => write!(
                f,
                "the replay epoch changed from {} to {}: the session's history restarted",
                or_none(expected),
                or_none(got)
            ),
            Divergence::Gap { lost } => {
                write!(f, "events {}..={} were skipped", lost.from, lost.to)
            }
            Divergence::ReplayReset { last, got } => {
                write!(
                    f,
                    "event {got} came after the cursor at {last}: the stream started over"
                )
            }
            Divergence::DigestMismatch { id } => {
                write!(f, "event {id} came back with other content")
            }
            Divergence::NonMonotonic {
                after,
                got: Some(got),
            } => write!(f, "event {got} came where {after} was due"),
            Divergence::NonMonotonic { after, got: None } => {
                write!(f, "an event without an id came where {after} was due")
            }
            Divergence::Resync(Some(notice)) => match notice.lost {
                Some(lost) => write!(
                    f,
                    "the server cannot resume stream {} from here: events {}..={} are gone ({})",
                    notice.stream,
                    lost.from,
                    lost.to,
                    notice.reason.as_str()
                ),
                None => write!(
                    f,
                    "the server cannot resume stream {} from here ({})",
                    notice.stream,
                    notice.reason.as_str()
                ),
            },
            Divergence::Resync(None) => f.write_str("the server cannot resume from this cursor"),
        }
    }
}

impl Divergence {
    /// The stable name of the divergence kind, as `tether watch` prints it.
    pub fn kind(&self) -> &'static str {
        match self {
            Divergence::SessionInvalid { .. } => "session_invalid",
            Divergence::SessionChanged { .. } => "session_changed",
            Divergence::EpochChanged { .. } => "epoch_changed",
            Divergence::Gap { .. } => "gap",
            Divergence::ReplayReset { .. } => "replay_reset",
            Divergence::DigestMismatch { .. } => "digest_mismatch",
            Divergence::NonMonotonic { .. } => "non_monotonic",
            Divergence::Resync(_) => "resync",
        }
    }
}

/// Why continuity cannot be checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unverifiable {
    /// The ids are neither lineage ids nor integers, so their order means nothing.
    OpaqueIds,
    /// The ids are integers but the server advertises no replay epoch, so a restarted
    /// server that kept counting looks continuous.
    NoEpoch,
    /// The first event has no id.
    EventWithoutId,
}

/// The verdict on a reconnect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The response head checks out; decide again when the first event arrives.
    AwaitingFirstEvent,
    /// The first event is exactly the one after the cursor: go on, validating every event.
    ProvisionallyContinuous,
    /// The first event is the cursor's own event again, byte for byte: skip it and go on.
    BoundaryDuplicate,
    /// The first event is a resync that continues the stream exactly where the client is: it
    /// names the events after the cursor that are gone, or says the stream's producer died at
    /// the cursor. Report it, and go on validating every event after it.
    Resynced(ResyncNotice),
    /// Continuity cannot be proven (seed 000: "undetectable by the client alone").
    Unverifiable(Unverifiable),
    /// Continuity is disproven.
    Diverged(Divergence),
    /// The server cannot answer the resume now (429, 502, 503, 504: overloaded, draining, its
    /// store failing over, a proxy without an upstream): nothing is proven either way. Try again
    /// within the reconnect backoff.
    Unavailable {
        /// The HTTP status.
        status: u16,
    },
}

/// Whether an HTTP `status` says "not now" (429, 502, 503, 504: the server, or one before it,
/// cannot serve the request at the moment) rather than anything about the session or the
/// request: a resume answered so is tried again, and a keyed request re-sent.
pub fn is_unavailable(status: u16) -> bool {
    matches!(status, 429 | 502 | 503 | 504)
}

/// Judges a reconnect against the checkpoint (seed 000's decision procedure).
pub fn client_verdict(checkpoint: &Checkpoint, reconnect: &Reconnect<'_>) -> Verdict {
    let diverged = Verdict::Diverged;
    if is_unavailable(reconnect.status) {
        return Verdict::Unavailable {
            status: reconnect.status,
        };
    }
    if !(200..300).contains(&reconnect.status) {
        return diverged(Divergence::SessionInvalid {
            status: reconnect.status,
        });
    }
    if let Some(echoed) = reconnect.session_id
        && echoed != checkpoint.session_id
    {
        return diverged(Divergence::SessionChanged {
            expected: checkpoint.session_id.clone(),
            got: echoed.to_owned(),
        });
    }
    if checkpoint.epoch.as_deref() != reconnect.epoch {
        return diverged(Divergence::EpochChanged {
            expected: checkpoint.epoch.clone(),
            got: reconnect.epoch.map(str::to_owned),
        });
    }
    let Some(first) = reconnect.first_event else {
        return Verdict::AwaitingFirstEvent;
    };
    if first.event == Some(RESYNC_EVENT) {
        return match judge_resync(&checkpoint.last_id, first.id, first.data) {
            Ok(notice) => Verdict::Resynced(notice),
            Err(divergence) => diverged(divergence),
        };
    }
    let Some(raw_id) = first.id else {
        return Verdict::Unverifiable(Unverifiable::EventWithoutId);
    };
    let got = ObservedId::parse(raw_id);
    let (last_seq, got_seq) = match positions(&checkpoint.last_id, &got, Some(raw_id)) {
        Ok(Some(seqs)) => seqs,
        Ok(None) => return Verdict::Unverifiable(Unverifiable::OpaqueIds),
        Err(divergence) => return diverged(divergence),
    };
    match got_seq.cmp(&last_seq) {
        Ordering::Equal if Digest::of(raw_id, first.data) == checkpoint.last_digest => {
            return Verdict::BoundaryDuplicate;
        }
        Ordering::Equal => {
            return diverged(Divergence::DigestMismatch {
                id: raw_id.to_owned(),
            });
        }
        Ordering::Less => {
            return diverged(Divergence::ReplayReset {
                last: last_seq,
                got: got_seq,
            });
        }
        Ordering::Greater if got_seq - last_seq > 1 => {
            return diverged(Divergence::Gap {
                lost: SeqRange {
                    from: last_seq + 1,
                    to: got_seq - 1,
                },
            });
        }
        Ordering::Greater => {}
    }
    // A lineage id carries its epoch; an integer id is only as good as the advertised epoch.
    if matches!(got, ObservedId::Integer(_)) && checkpoint.epoch.is_none() {
        return Verdict::Unverifiable(Unverifiable::NoEpoch);
    }
    Verdict::ProvisionallyContinuous
}

/// Where `got` stands relative to `last` on one stream: both sequence numbers, or `None` if
/// either id is opaque (nothing can be read from it). Ids of another epoch, another stream or
/// another id scheme are not of the stream `last` came from. The one comparison of two ids,
/// for the first event after a reconnect and for every event after it.
fn positions(
    last: &ObservedId,
    got: &ObservedId,
    raw: Option<&str>,
) -> Result<Option<(u64, u64)>, Divergence> {
    match (last, got) {
        (ObservedId::Lineage(last_id), ObservedId::Lineage(id)) => {
            if id.epoch != last_id.epoch {
                return Err(Divergence::EpochChanged {
                    expected: Some(last_id.epoch.to_string()),
                    got: Some(id.epoch.to_string()),
                });
            }
            if id.stream != last_id.stream {
                return Err(non_monotonic(last, raw));
            }
            Ok(Some((last_id.seq, id.seq)))
        }
        (ObservedId::Integer(last_n), ObservedId::Integer(n)) => Ok(Some((*last_n, *n))),
        (ObservedId::Opaque(_), _) | (_, ObservedId::Opaque(_)) => Ok(None),
        (ObservedId::Lineage(_), ObservedId::Integer(_))
        | (ObservedId::Integer(_), ObservedId::Lineage(_)) => Err(non_monotonic(last, raw)),
    }
}

fn resync_notice(data: &[u8]) -> Option<ResyncNotice> {
    ResyncNotice::from_json(std::str::from_utf8(data).ok()?)
}

fn non_monotonic(last: &ObservedId, got: Option<&str>) -> Divergence {
    Divergence::NonMonotonic {
        after: last.to_string(),
        got: got.map(str::to_owned),
    }
}

/// Whether a resync event continues the stream right after `last`: it names exactly the events
/// after `last` that are gone (and its id is the last of them), or says that the stream's
/// producer died right at `last` (and its id is `last`'s). Anything else is a divergence.
fn judge_resync(
    last: &ObservedId,
    id: Option<&str>,
    data: &[u8],
) -> Result<ResyncNotice, Divergence> {
    let notice = resync_notice(data);
    let (Some(found), ObservedId::Lineage(last), Some(ObservedId::Lineage(id))) =
        (&notice, last, id.map(ObservedId::parse))
    else {
        return Err(Divergence::Resync(notice));
    };
    if id.epoch != last.epoch {
        return Err(Divergence::EpochChanged {
            expected: Some(last.epoch.to_string()),
            got: Some(id.epoch.to_string()),
        });
    }
    let continues = match (found.reason, found.lost) {
        (ResyncReason::Evicted, Some(lost)) => Some(lost.from) == last.seq.checked_add(1),
        (ResyncReason::RequestAborted, None) => found.after == last.seq,
        _ => false,
    };
    let here = id.stream == last.stream
        && found.stream == last.stream.as_str()
        && id.seq == found.position();
    match notice {
        Some(notice) if continues && here => Ok(notice),
        other => Err(Divergence::Resync(other)),
    }
}

/// What [`StreamValidator::accept`] accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accepted {
    /// The next event of the stream.
    Event,
    /// A resync that continues the stream exactly: report it, then go on.
    Resync(ResyncNotice),
    /// An event without an id after a resync standing at the stream's head: the JSON-RPC error
    /// that ends a request whose outcome the stream no longer holds (one per request of the
    /// stream). It moves no cursor.
    Trailer,
}

/// Checks every event of a stream: same epoch and stream, sequence exactly one more; a resync
/// only where it continues the stream.
///
/// It holds the last accepted id and digest, which are what the client checkpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamValidator {
    last: Option<(ObservedId, Digest)>,
    /// A resync at the stream's head was accepted: events without an id may follow, until the
    /// next event with one.
    trailer: bool,
}

impl StreamValidator {
    /// A validator for a stream followed from its start: the first event sets the lineage.
    pub fn fresh() -> StreamValidator {
        StreamValidator {
            last: None,
            trailer: false,
        }
    }

    /// A validator that continues from a checkpoint (after a continuous resume).
    pub fn resume(checkpoint: &Checkpoint) -> StreamValidator {
        StreamValidator {
            last: Some((checkpoint.last_id.clone(), checkpoint.last_digest)),
            trailer: false,
        }
    }

    /// The last accepted event's id and digest.
    pub fn last(&self) -> Option<(&ObservedId, &Digest)> {
        self.last.as_ref().map(|(id, digest)| (id, digest))
    }

    /// Validates the next event and, if it continues the stream, makes it the last one.
    pub fn accept(
        &mut self,
        id: Option<&str>,
        event: Option<&str>,
        data: &[u8],
    ) -> Result<Accepted, Divergence> {
        if id.is_some() {
            self.trailer = false;
        }
        if event == Some(RESYNC_EVENT) {
            // A stream followed from its start (without a priming event) is at its position 0.
            let start = match (&self.last, id.map(ObservedId::parse)) {
                (Some((last, _)), _) => last.clone(),
                (None, Some(ObservedId::Lineage(id))) => ObservedId::Lineage(id.with_seq(0)),
                (None, _) => return Err(Divergence::Resync(resync_notice(data))),
            };
            let notice = judge_resync(&start, id, data)?;
            if let Some(raw) = id {
                self.last = Some((ObservedId::parse(raw), Digest::of(raw, data)));
            }
            self.trailer = notice.position() == notice.head;
            return Ok(Accepted::Resync(notice));
        }
        if id.is_none() && self.trailer {
            return Ok(Accepted::Trailer);
        }
        let observed = id.map(ObservedId::parse);
        if let Some((last, _)) = &self.last {
            check_next(last, observed.as_ref(), id)?;
        }
        // An id-less event on an opaque stream moves no cursor; on an ordered stream
        // check_next has already rejected it.
        if let (Some(raw), Some(observed)) = (id, observed) {
            self.last = Some((observed, Digest::of(raw, data)));
        }
        Ok(Accepted::Event)
    }
}

fn check_next(
    last: &ObservedId,
    got: Option<&ObservedId>,
    raw: Option<&str>,
) -> Result<(), Divergence> {
    if let ObservedId::Opaque(_) = last {
        return Ok(());
    }
    // An ordered stream's next event has an ordered id.
    let (last_seq, got_seq) = match got.map(|got| positions(last, got, raw)).transpose()? {
        Some(Some(seqs)) => seqs,
        Some(None) | None => return Err(non_monotonic(last, raw)),
    };
    let Some(next) = last_seq.checked_add(1) else {
        return Err(non_monotonic(last, raw));
    };
    match got_seq.cmp(&next) {
        Ordering::Equal => Ok(()),
        Ordering::Greater => Err(Divergence::Gap {
            lost: SeqRange {
                from: next,
                to: got_seq - 1,
            },
        }),
        Ordering::Less => Err(non_monotonic(last, raw)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lineage::id::{Epoch, EventId, StreamName};

    #[test]
    fn a_divergence_is_told_in_words_not_in_debug_form() {
        let notice = ResyncNotice {
            reason: ResyncReason::Evicted,
            stream: "r1".into(),
            after: 3,
            lost: Some(SeqRange { from: 4, to: 9 }),
            head: 12,
        };
        for divergence in [
            Divergence::SessionInvalid { status: 404 },
            Divergence::SessionChanged {
                expected: "a".into(),
                got: "b".into(),
            },
            Divergence::EpochChanged {
                expected: Some("e1".into()),
                got: None,
            },
            Divergence::Gap {
                lost: SeqRange { from: 4, to: 9 },
            },
            Divergence::ReplayReset { last: 7, got: 1 },
            Divergence::DigestMismatch { id: "x".into() },
            Divergence::NonMonotonic {
                after: "x".into(),
                got: None,
            },
            Divergence::Resync(Some(notice)),
            Divergence::Resync(None),
        ] {
            let text = divergence.to_string();
            assert!(
                !text.contains('{') && !text.contains("Some(") && !text.contains("None"),
                "{text}"
            );
        }
        assert_eq!(
            Divergence::SessionInvalid { status: 404 }.to_string(),
            "the resume was answered 404: the session is gone"
        );
    }

    const SESSION: &str = "sess-1";

    fn epoch(tag: char) -> Epoch {
        Epoch::parse(&tag.to_string().repeat(22)).expect("valid epoch")
    }

    fn lid(tag: char, stream: &str, seq: u64) -> String {
        EventId {
            epoch: epoch(tag),
            stream: StreamName::parse(stream).expect("valid stream"),
            seq,
            tag: None,
        }
        .to_string()
    }

    /// A checkpoint after processing event `last_id` with `data`.
    fn checkpoint(epoch: Option<&str>, last_id: &str, data: &[u8]) -> Checkpoint {
        Checkpoint {
            session_id: SESSION.into(),
            epoch: epoch.map(str::to_owned),
            last_id: ObservedId::parse(last_id),
            last_digest: Digest::of(last_id, data),
        }
    }

    fn reconnect<'a>(epoch: Option<&'a str>, first: Option<FirstEvent<'a>>) -> Reconnect<'a> {
        Reconnect {
            status: 200,
            session_id: Some(SESSION),
            epoch,
            first_event: first,
        }
    }

    fn event<'a>(id: &'a str, data: &'a [u8]) -> Option<FirstEvent<'a>> {
        Some(FirstEvent {
            id: Some(id),
            event: None,
            data,
        })
    }

    fn kind(verdict: &Verdict) -> &'static str {
        match verdict {
            Verdict::Diverged(d) => d.kind(),
            Verdict::Resynced(_) => "resynced",
            Verdict::AwaitingFirstEvent => "awaiting",
            Verdict::ProvisionallyContinuous => "continuous",
            Verdict::BoundaryDuplicate => "duplicate",
            Verdict::Unverifiable(_) => "unverifiable",
            Verdict::Unavailable { .. } => "unavailable",
        }
    }

    // --- seed 000, decision procedure, case 1: session invalid ---

    #[test]
    fn non_2xx_status_is_session_invalid() {
        let e = epoch('A');
        let cp = checkpoint(Some(e.as_str()), &lid('A', "s", 4), b"x");
        for status in [404, 400, 410, 500, 302] {
            let r = Reconnect {
                status,
                ..reconnect(Some(e.as_str()), None)
            };
            assert_eq!(
                client_verdict(&cp, &r),
                Verdict::Diverged(Divergence::SessionInvalid { status })
            );
        }
    }

    #[test]
    fn a_server_that_cannot_answer_now_proves_nothing() {
        let e = epoch('A');
        let cp = checkpoint(Some(e.as_str()), &lid('A', "s", 4), b"x");
        for status in [429, 502, 503, 504] {
            let r = Reconnect {
                status,
                ..reconnect(Some(e.as_str()), None)
            };
            assert_eq!(client_verdict(&cp, &r), Verdict::Unavailable { status });
        }
    }

    #[test]
    fn echoed_session_id_that_differs_is_session_changed() {
        let e = epoch('A');
        let cp = checkpoint(Some(e.as_str()), &lid('A', "s", 4), b"x");
        let next = lid('A', "s", 5);
        let r = Reconnect {
            session_id: Some("sess-2"),
            ..reconnect(Some(e.as_str()), event(&next, b"y"))
        };
        assert_eq!(kind(&client_verdict(&cp, &r)), "session_changed");
    }

    // --- seed 000: replay epoch ---

    #[test]
    fn epoch_header_change_is_epoch_changed() {
        let (a, b) = (epoch('A'), epoch('B'));
        let cp = checkpoint(Some(a.as_str()), &lid('A', "s", 4), b"x");
        let v = client_verdict(&cp, &reconnect(Some(b.as_str()), None));
        assert_eq!(
            v,
            Verdict::Diverged(Divergence::EpochChanged {
                expected: Some(a.to_string()),
                got: Some(b.to_string())
            })
        );
    }

    #[test]
    fn epoch_that_disappears_or_appears_is_epoch_changed() {
        let a = epoch('A');
        let cp = checkpoint(Some(a.as_str()), "4", b"x");
        assert_eq!(
            kind(&client_verdict(&cp, &reconnect(None, event("5", b"y")))),
            "epoch_changed"
        );
        let cp = checkpoint(None, "4", b"x");
        assert_eq!(
            kind(&client_verdict(
                &cp,
                &reconnect(Some(a.as_str()), event("5", b"y"))
            )),
            "epoch_changed"
        );
    }

    #[test]
    fn event_id_from_another_epoch_is_epoch_changed_even_if_header_matches() {
        let a = epoch('A');
        let cp = checkpoint(Some(a.as_str()), &lid('A', "s", 4), b"x");
        let id = lid('B', "s", 5);
        assert_eq!(
            kind(&client_verdict(
                &cp,
                &reconnect(Some(a.as_str()), event(&id, b"y"))
            )),
            "epoch_changed"
        );
    }

    // --- seed 000, case 2: gap ---

    #[test]
    fn first_event_beyond_next_is_a_gap_with_the_lost_range() {
        let a = epoch('A');
        let cp = checkpoint(Some(a.as_str()), &lid('A', "s", 4), b"x");
        let id = lid('A', "s", 9);
        assert_eq!(
            client_verdict(&cp, &reconnect(Some(a.as_str()), event(&id, b"y"))),
            Verdict::Diverged(Divergence::Gap {
                lost: SeqRange { from: 5, to: 8 }
            })
        );
    }

    // --- seed 000, case 3: replay reset ---

    #[test]
    fn first_event_before_cursor_is_a_replay_reset() {
        let a = epoch('A');
        let cp = checkpoint(Some(a.as_str()), &lid('A', "s", 4), b"x");
        let id = lid('A', "s", 1);
        assert_eq!(
            client_verdict(&cp, &reconnect(Some(a.as_str()), event(&id, b"y"))),
            Verdict::Diverged(Divergence::ReplayReset { last: 4, got: 1 })
        );
    }

    // --- boundary event: same id ---

    #[test]
    fn boundary_event_with_equal_digest_is_a_duplicate_to_skip() {
        let a = epoch('A');
        let last = lid('A', "s", 4);
        let cp = checkpoint(Some(a.as_str()), &last, b"x");
        assert_eq!(
            client_verdict(&cp, &reconnect(Some(a.as_str()), event(&last, b"x"))),
            Verdict::BoundaryDuplicate
        );
    }

    #[test]
    fn boundary_event_with_other_content_is_a_digest_mismatch() {
        let a = epoch('A');
        let last = lid('A', "s", 4);
        let cp = checkpoint(Some(a.as_str()), &last, b"x");
        assert_eq!(
            client_verdict(&cp, &reconnect(Some(a.as_str()), event(&last, b"other"))),
            Verdict::Diverged(Divergence::DigestMismatch { id: last.clone() })
        );
    }

    // --- seed 000, case 4: provisionally continuous ---

    #[test]
    fn next_event_same_epoch_is_provisionally_continuous() {
        let a = epoch('A');
        let cp = checkpoint(Some(a.as_str()), &lid('A', "s", 4), b"x");
        let id = lid('A', "s", 5);
        assert_eq!(
            client_verdict(&cp, &reconnect(Some(a.as_str()), event(&id, b"y"))),
            Verdict::ProvisionallyContinuous
        );
    }

    #[test]
    fn integer_ids_with_epoch_are_continuous() {
        let cp = checkpoint(Some("epoch-1"), "1041", b"x");
        assert_eq!(
            client_verdict(&cp, &reconnect(Some("epoch-1"), event("1042", b"y"))),
            Verdict::ProvisionallyContinuous
        );
    }

    #[test]
    fn headers_alone_await_the_first_event() {
        let a = epoch('A');
        let cp = checkpoint(Some(a.as_str()), &lid('A', "s", 4), b"x");
        assert_eq!(
            client_verdict(&cp, &reconnect(Some(a.as_str()), None)),
            Verdict::AwaitingFirstEvent
        );
    }

    #[test]
    fn session_echo_may_be_absent() {
        let a = epoch('A');
        let cp = checkpoint(Some(a.as_str()), &lid('A', "s", 4), b"x");
        let id = lid('A', "s", 5);
        let r = Reconnect {
            session_id: None,
            ..reconnect(Some(a.as_str()), event(&id, b"y"))
        };
        assert_eq!(client_verdict(&cp, &r), Verdict::ProvisionallyContinuous);
    }

    // --- seed 000, the three observed failure signatures ---

    #[test]
    fn signature_gap_with_continuous_ids_is_caught_by_the_epoch() {
        // The restarted process kept its id counter but lost its buffer: 1042 is a new
        // event, not the old 1042. A server that advertises epochs shows a new one.
        let cp = checkpoint(Some("epoch-before-restart"), "1041", b"old");
        let v = client_verdict(
            &cp,
            &reconnect(Some("epoch-after-restart"), event("1042", b"new")),
        );
        assert_eq!(kind(&v), "epoch_changed");
    }

    #[test]
    fn signature_gap_with_continuous_ids_without_epoch_is_unverifiable() {
        // Without an epoch the client alone cannot tell: it must not call this continuous.
        let cp = checkpoint(None, "1041", b"old");
        let v = client_verdict(&cp, &reconnect(None, event("1042", b"new")));
        assert_eq!(v, Verdict::Unverifiable(Unverifiable::NoEpoch));
    }

    #[test]
    fn signature_session_resurrection_is_caught_by_the_epoch() {
        // Same session id string, fresh state: a new incarnation with a new epoch and ids
        // counting from the start again.
        let (a, b) = (epoch('A'), epoch('B'));
        let cp = checkpoint(Some(a.as_str()), &lid('A', "get", 12), b"x");
        let id = lid('B', "get", 1);
        let v = client_verdict(&cp, &reconnect(Some(b.as_str()), event(&id, b"y")));
        assert_eq!(kind(&v), "epoch_changed");
    }

    #[test]
    fn signature_session_resurrection_without_epoch_is_a_replay_reset() {
        let cp = checkpoint(None, "12", b"x");
        let v = client_verdict(&cp, &reconnect(None, event("1", b"y")));
        assert_eq!(
            v,
            Verdict::Diverged(Divergence::ReplayReset { last: 12, got: 1 })
        );
    }

    #[test]
    fn signature_silent_downgrade_to_replay_from_zero_is_a_replay_reset() {
        // A replica without the buffer starts fresh at id 1; monotonic dedup would accept it.
        let cp = checkpoint(Some("e"), "1041", b"x");
        let v = client_verdict(
            &cp,
            &reconnect(Some("e"), event("1", b"{\"method\":\"tools/call\"}")),
        );
        assert_eq!(
            v,
            Verdict::Diverged(Divergence::ReplayReset { last: 1041, got: 1 })
        );
    }

    // --- what the server cannot give the client ---

    #[test]
    fn opaque_ids_are_unverifiable() {
        let cp = checkpoint(Some("e"), "stream_1700000000_abc", b"x");
        let v = client_verdict(
            &cp,
            &reconnect(Some("e"), event("stream_1700000001_def", b"y")),
        );
        assert_eq!(v, Verdict::Unverifiable(Unverifiable::OpaqueIds));
    }

    #[test]
    fn first_event_without_id_is_unverifiable() {
        let a = epoch('A');
        let cp = checkpoint(Some(a.as_str()), &lid('A', "s", 4), b"x");
        let r = reconnect(
            Some(a.as_str()),
            Some(FirstEvent {
                id: None,
                event: None,
                data: b"y",
            }),
        );
        assert_eq!(
            client_verdict(&cp, &r),
            Verdict::Unverifiable(Unverifiable::EventWithoutId)
        );
    }

    fn resync<'a>(id: &'a str, data: &'a [u8]) -> Option<FirstEvent<'a>> {
        Some(FirstEvent {
            id: Some(id),
            event: Some("resync"),
            data,
        })
    }

    #[test]
    fn a_resync_naming_exactly_the_events_after_the_cursor_continues_the_stream() {
        let a = epoch('A');
        let cp = checkpoint(Some(a.as_str()), &lid('A', "s", 4), b"x");
        let id = lid('A', "s", 9);
        let data =
            br#"{"reason":"evicted","stream":"s","after":4,"lost_from":5,"lost_to":9,"head":12}"#;
        let Verdict::Resynced(notice) =
            client_verdict(&cp, &reconnect(Some(a.as_str()), resync(&id, data)))
        else {
            panic!("expected the resync to continue the stream");
        };
        assert_eq!(notice.lost, Some(SeqRange { from: 5, to: 9 }));
    }

    #[test]
    fn a_request_aborted_resync_at_the_cursor_continues_the_stream_to_its_end() {
        let a = epoch('A');
        let cp = checkpoint(Some(a.as_str()), &lid('A', "s", 4), b"x");
        let id = lid('A', "s", 4);
        let data = br#"{"reason":"request_aborted","stream":"s","after":4,"lost_from":null,"lost_to":null,"head":4}"#;
        let verdict = client_verdict(&cp, &reconnect(Some(a.as_str()), resync(&id, data)));
        assert!(
            matches!(&verdict, Verdict::Resynced(n) if n.reason == ResyncReason::RequestAborted),
            "{verdict:?}"
        );
    }

    #[test]
    fn a_resync_that_does_not_continue_from_the_cursor_is_a_divergence() {
        let a = epoch('A');
        let cp = checkpoint(Some(a.as_str()), &lid('A', "s", 4), b"x");
        let cases: [(String, &[u8]); 6] = [
            // Starts after a hole: event 5 is neither delivered nor named lost.
            (
                lid('A', "s", 9),
                br#"{"reason":"evicted","stream":"s","after":5,"lost_from":6,"lost_to":9,"head":9}"#,
            ),
            // Its id is not the last position it names.
            (
                lid('A', "s", 12),
                br#"{"reason":"evicted","stream":"s","after":4,"lost_from":5,"lost_to":9,"head":12}"#,
            ),
            // Another stream's notice.
            (
                lid('A', "t", 9),
                br#"{"reason":"evicted","stream":"t","after":4,"lost_from":5,"lost_to":9,"head":9}"#,
            ),
            // A reason this client does not know.
            (
                lid('A', "s", 2),
                br#"{"reason":"ahead_of_head","stream":"s","after":4,"lost_from":null,"lost_to":null,"head":2}"#,
            ),
            (
                lid('A', "s", 4),
                br#"{"reason":"unknown_stream","stream":"s","after":4,"lost_from":null,"lost_to":null,"head":0}"#,
            ),
            // Not a notice at all.
            (lid('A', "s", 5), b"{}"),
        ];
        for (id, data) in cases {
            let verdict = client_verdict(&cp, &reconnect(Some(a.as_str()), resync(&id, data)));
            assert_eq!(
                kind(&verdict),
                "resync",
                "{}",
                String::from_utf8_lossy(data)
            );
        }
        let other_epoch = lid('B', "s", 9);
        let data =
            br#"{"reason":"evicted","stream":"s","after":4,"lost_from":5,"lost_to":9,"head":9}"#;
        let verdict = client_verdict(
            &cp,
            &reconnect(Some(a.as_str()), resync(&other_epoch, data)),
        );
        assert_eq!(kind(&verdict), "epoch_changed");
    }

    #[test]
    fn event_from_another_stream_is_non_monotonic() {
        let a = epoch('A');
        let cp = checkpoint(Some(a.as_str()), &lid('A', "s", 4), b"x");
        let id = lid('A', "other", 5);
        assert_eq!(
            kind(&client_verdict(
                &cp,
                &reconnect(Some(a.as_str()), event(&id, b"y"))
            )),
            "non_monotonic"
        );
    }

    #[test]
    fn change_of_id_scheme_is_non_monotonic() {
        let a = epoch('A');
        let cp = checkpoint(Some(a.as_str()), &lid('A', "s", 4), b"x");
        assert_eq!(
            kind(&client_verdict(
                &cp,
                &reconnect(Some(a.as_str()), event("5", b"y"))
            )),
            "non_monotonic"
        );
    }

    #[test]
    fn status_is_checked_before_everything_else() {
        let cp = checkpoint(Some("e"), "4", b"x");
        let r = Reconnect {
            status: 404,
            session_id: Some("other"),
            epoch: Some("other"),
            first_event: event("1", b"y"),
        };
        assert_eq!(kind(&client_verdict(&cp, &r)), "session_invalid");
    }

    // --- after the first event: the per-event validator ---

    #[test]
    fn validator_accepts_contiguous_events() {
        let a = epoch('A');
        let cp = checkpoint(Some(a.as_str()), &lid('A', "s", 4), b"x");
        let mut v = StreamValidator::resume(&cp);
        for seq in 5..10 {
            v.accept(Some(&lid('A', "s", seq)), None, b"d")
                .expect("contiguous");
        }
        let (last, digest) = v.last().expect("has a last event");
        assert_eq!(last.to_string(), lid('A', "s", 9));
        assert_eq!(*digest, Digest::of(&lid('A', "s", 9), b"d"));
    }

    #[test]
    fn validator_reports_a_jump_in_the_middle_as_a_gap() {
        let mut v = StreamValidator::fresh();
        v.accept(Some(&lid('A', "s", 0)), None, b"").expect("first");
        v.accept(Some(&lid('A', "s", 1)), None, b"a").expect("next");
        assert_eq!(
            v.accept(Some(&lid('A', "s", 4)), None, b"b"),
            Err(Divergence::Gap {
                lost: SeqRange { from: 2, to: 3 }
            })
        );
    }

    #[test]
    fn validator_reports_repeats_and_backward_steps_as_non_monotonic() {
        let mut v = StreamValidator::fresh();
        v.accept(Some("7"), None, b"a").expect("first");
        assert_eq!(
            v.accept(Some("7"), None, b"a").map_err(|d| d.kind()),
            Err("non_monotonic")
        );
        assert_eq!(
            v.accept(Some("3"), None, b"a").map_err(|d| d.kind()),
            Err("non_monotonic")
        );
        assert_eq!(
            v.accept(None, None, b"a").map_err(|d| d.kind()),
            Err("non_monotonic")
        );
        assert_eq!(
            v.accept(Some("x"), None, b"a").map_err(|d| d.kind()),
            Err("non_monotonic")
        );
        v.accept(Some("8"), None, b"a")
            .expect("the stream still continues from 7");
    }

    #[test]
    fn validator_reports_epoch_change_and_other_stream() {
        let mut v = StreamValidator::fresh();
        v.accept(Some(&lid('A', "s", 3)), None, b"").expect("first");
        assert_eq!(
            v.accept(Some(&lid('B', "s", 4)), None, b"")
                .map_err(|d| d.kind()),
            Err("epoch_changed")
        );
        assert_eq!(
            v.accept(Some(&lid('A', "t", 4)), None, b"")
                .map_err(|d| d.kind()),
            Err("non_monotonic")
        );
    }

    #[test]
    fn validator_reports_resync_events_that_do_not_continue_the_stream() {
        let mut v = StreamValidator::fresh();
        assert_eq!(
            v.accept(Some("1"), Some("resync"), b"{}")
                .map_err(|d| d.kind()),
            Err("resync")
        );
        let mut v = StreamValidator::fresh();
        v.accept(Some(&lid('A', "s", 3)), None, b"a")
            .expect("first");
        let data =
            br#"{"reason":"evicted","stream":"s","after":4,"lost_from":5,"lost_to":6,"head":6}"#;
        assert_eq!(
            v.accept(Some(&lid('A', "s", 6)), Some("resync"), data)
                .map_err(|d| d.kind()),
            Err("resync"),
            "event 4 is neither delivered nor named lost"
        );
    }

    #[test]
    fn validator_accepts_a_gap_resync_then_the_events_after_it() {
        let mut v = StreamValidator::fresh();
        v.accept(Some(&lid('A', "s", 3)), None, b"a")
            .expect("first");
        let id = lid('A', "s", 6);
        let data =
            br#"{"reason":"evicted","stream":"s","after":3,"lost_from":4,"lost_to":6,"head":9}"#;
        let accepted = v.accept(Some(&id), Some("resync"), data).expect("exact");
        assert!(
            matches!(&accepted, Accepted::Resync(n) if n.lost == Some(SeqRange { from: 4, to: 6 })),
            "{accepted:?}"
        );
        assert_eq!(v.last().map(|(id, _)| id.to_string()), Some(id));
        assert_eq!(
            v.accept(Some(&lid('A', "s", 7)), None, b"b"),
            Ok(Accepted::Event)
        );
        assert_eq!(
            v.accept(None, None, b"c").map_err(|d| d.kind()),
            Err("non_monotonic"),
            "no trailer after a resync that is not at the head"
        );
    }

    #[test]
    fn validator_of_a_fresh_stream_accepts_a_resync_from_its_start() {
        // A 2025-06-18 POST answer has no priming event: its first event may be the gap's notice.
        let mut v = StreamValidator::fresh();
        let data =
            br#"{"reason":"evicted","stream":"s","after":0,"lost_from":1,"lost_to":4,"head":9}"#;
        let accepted = v.accept(Some(&lid('A', "s", 4)), Some("resync"), data);
        assert!(matches!(accepted, Ok(Accepted::Resync(_))), "{accepted:?}");
        assert_eq!(
            v.accept(Some(&lid('A', "s", 5)), None, b"x"),
            Ok(Accepted::Event)
        );
        let mut v = StreamValidator::fresh();
        let later =
            br#"{"reason":"evicted","stream":"s","after":1,"lost_from":2,"lost_to":4,"head":9}"#;
        assert_eq!(
            v.accept(Some(&lid('A', "s", 4)), Some("resync"), later)
                .map_err(|d| d.kind()),
            Err("resync"),
            "event 1 is neither delivered nor named lost"
        );
    }

    #[test]
    fn validator_accepts_trailers_after_a_resync_at_the_head_until_the_next_id() {
        let mut v = StreamValidator::fresh();
        v.accept(Some(&lid('A', "s", 3)), None, b"a")
            .expect("first");
        let data = br#"{"reason":"request_aborted","stream":"s","after":3,"lost_from":null,"lost_to":null,"head":3}"#;
        let accepted = v
            .accept(Some(&lid('A', "s", 3)), Some("resync"), data)
            .expect("aborted at the cursor");
        assert!(matches!(accepted, Accepted::Resync(_)));
        // One error per request of the stream (a batch's has several).
        assert_eq!(v.accept(None, None, b"error 1"), Ok(Accepted::Trailer));
        assert_eq!(v.accept(None, None, b"error 2"), Ok(Accepted::Trailer));
        assert_eq!(
            v.accept(Some(&lid('A', "s", 4)), None, b"b"),
            Ok(Accepted::Event)
        );
        assert_eq!(
            v.accept(None, None, b"late").map_err(|d| d.kind()),
            Err("non_monotonic"),
            "no trailer after an event with an id"
        );
    }

    #[test]
    fn validator_on_opaque_stream_records_without_ordering() {
        let mut v = StreamValidator::fresh();
        v.accept(Some("b"), None, b"1").expect("first");
        v.accept(Some("a"), None, b"2")
            .expect("opaque ids carry no order");
        v.accept(None, None, b"3")
            .expect("an id-less event moves no cursor");
        assert_eq!(v.last().map(|(id, _)| id.to_string()), Some("a".into()));
    }
}
