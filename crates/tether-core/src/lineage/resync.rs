//! The `resync` event: the server's explicit word that part of a stream is gone, or that a
//! stream will never finish.
//!
//! A resume replays every retained event after the cursor; whatever is no longer retained is
//! said once, by one resync event standing exactly where the gap is. Its id is
//! `{epoch}:{stream}:{p}` with `p` = [`ResyncNotice::position`], the last position it accounts
//! for, so the ids a client sees stay contiguous across it.

use serde::{Deserialize, Serialize};

/// The SSE event type of a resync event.
pub const RESYNC_EVENT: &str = "resync";

/// An inclusive range of sequence numbers of one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SeqRange {
    /// First sequence number of the range.
    pub from: u64,
    /// Last sequence number of the range.
    pub to: u64,
}

impl SeqRange {
    /// `from..=to`, if not empty.
    pub fn new(from: u64, to: u64) -> Option<SeqRange> {
        (from <= to).then_some(SeqRange { from, to })
    }

    /// Whether `seq` is in the range.
    pub fn contains(&self, seq: u64) -> bool {
        (self.from..=self.to).contains(&seq)
    }
}

/// Why a resume is not a plain replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResyncReason {
    /// Events after the cursor are no longer retained: the notice names exactly which.
    Evicted,
    /// The session has no stream by that name (never had, or the store forgot its tombstone).
    UnknownStream,
    /// The request that fed the stream died before finishing; its result will never come.
    RequestAborted,
}

impl ResyncReason {
    /// The reason as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ResyncReason::Evicted => "evicted",
            ResyncReason::UnknownStream => "unknown_stream",
            ResyncReason::RequestAborted => "request_aborted",
        }
    }
}

/// The JSON data of a resync event:
/// `{"reason","stream","after","lost_from","lost_to","head"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Wire", into = "Wire")]
pub struct ResyncNotice {
    /// Why the resume is not a plain replay.
    pub reason: ResyncReason,
    /// The stream that was resumed.
    pub stream: String,
    /// The position the notice follows: the cursor, or the last event written before it.
    pub after: u64,
    /// The events the client will never receive (`lost_from..=lost_to` on the wire; both `null`
    /// when nothing is lost).
    pub lost: Option<SeqRange>,
    /// The stream's head when the server decided (0 for a stream the session never had).
    pub head: u64,
}

impl ResyncNotice {
    /// Events `lost` of `stream` are gone; the stream goes on after them.
    pub fn evicted(stream: &str, lost: SeqRange, head: u64) -> ResyncNotice {
        ResyncNotice {
            reason: ResyncReason::Evicted,
            stream: stream.to_owned(),
            after: lost.from - 1,
            lost: Some(lost),
            head,
        }
    }

    /// The producer of `stream` died after writing event `head`: nothing more will come.
    pub fn aborted(stream: &str, head: u64) -> ResyncNotice {
        ResyncNotice {
            reason: ResyncReason::RequestAborted,
            stream: stream.to_owned(),
            after: head,
            lost: None,
            head,
        }
    }

    /// The sequence number of the event's id: the last position the notice accounts for. For a
    /// loss, its last event (the next event is the one after it); without one, the position the
    /// client already has (`after`).
    pub fn position(&self) -> u64 {
        self.lost.map_or(self.after, |lost| lost.to)
    }

    /// The JSON data of the event.
    pub fn to_json(&self) -> String {
        // A struct of strings and integers: serializing it cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| unreachable!("a notice always serializes"))
    }

    /// Reads the data of a resync event; `None` if it is not a notice.
    pub fn from_json(data: &str) -> Option<ResyncNotice> {
        serde_json::from_str(data).ok()
    }
}

/// The notice as on the wire: the range as two nullable members.
#[derive(Serialize, Deserialize)]
struct Wire {
    reason: ResyncReason,
    stream: String,
    after: u64,
    lost_from: Option<u64>,
    lost_to: Option<u64>,
    head: u64,
}

impl From<ResyncNotice> for Wire {
    fn from(notice: ResyncNotice) -> Wire {
        Wire {
            reason: notice.reason,
            stream: notice.stream,
            after: notice.after,
            lost_from: notice.lost.map(|r| r.from),
            lost_to: notice.lost.map(|r| r.to),
            head: notice.head,
        }
    }
}

impl TryFrom<Wire> for ResyncNotice {
    type Error = &'static str;

    fn try_from(wire: Wire) -> Result<ResyncNotice, &'static str> {
        let lost = match (wire.lost_from, wire.lost_to) {
            (None, None) => None,
            (Some(from), Some(to)) => {
                Some(SeqRange::new(from, to).ok_or("lost_from is after lost_to")?)
            }
            _ => return Err("lost_from and lost_to are both numbers or both null"),
        };
        Ok(ResyncNotice {
            reason: wire.reason,
            stream: wire.stream,
            after: wire.after,
            lost,
            head: wire.head,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_shape_is_stable() {
        let notice = ResyncNotice::evicted("r1", SeqRange { from: 4, to: 9 }, 12);
        assert_eq!(
            notice.to_json(),
            r#"{"reason":"evicted","stream":"r1","after":3,"lost_from":4,"lost_to":9,"head":12}"#
        );
        assert_eq!(ResyncNotice::from_json(&notice.to_json()), Some(notice));
        let aborted = ResyncNotice::aborted("r1", 7);
        assert_eq!(
            aborted.to_json(),
            r#"{"reason":"request_aborted","stream":"r1","after":7,"lost_from":null,"lost_to":null,"head":7}"#
        );
        for reason in [
            ResyncReason::Evicted,
            ResyncReason::UnknownStream,
            ResyncReason::RequestAborted,
        ] {
            assert_eq!(
                serde_json::to_value(reason).ok(),
                Some(serde_json::Value::from(reason.as_str()))
            );
        }
    }

    #[test]
    fn a_half_or_inverted_range_is_not_a_notice() {
        let half =
            r#"{"reason":"evicted","stream":"r1","after":3,"lost_from":4,"lost_to":null,"head":9}"#;
        assert_eq!(ResyncNotice::from_json(half), None);
        let inverted =
            r#"{"reason":"evicted","stream":"r1","after":3,"lost_from":9,"lost_to":4,"head":9}"#;
        assert_eq!(ResyncNotice::from_json(inverted), None);
    }

    #[test]
    fn the_position_is_the_last_one_the_notice_accounts_for() {
        assert_eq!(
            ResyncNotice::evicted("s", SeqRange { from: 4, to: 9 }, 20).position(),
            9
        );
        assert_eq!(ResyncNotice::aborted("s", 7).position(), 7);
        let unknown = ResyncNotice {
            reason: ResyncReason::UnknownStream,
            stream: "s".into(),
            after: 12,
            lost: None,
            head: 0,
        };
        assert_eq!(unknown.position(), 12, "never behind the cursor");
    }

    #[test]
    fn ranges_are_never_empty() {
        assert_eq!(SeqRange::new(3, 2), None);
        let range = SeqRange::new(3, 3).expect("one position");
        assert!(range.contains(3) && !range.contains(2) && !range.contains(4));
    }
}
