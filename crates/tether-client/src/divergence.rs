//! Why the client stopped trusting a session: the core's lineage verdicts and the client's own.

use std::fmt;

use tether_core::lineage::{Divergence, Unverifiable};

/// Why the client stopped trusting the session it followed; it re-initializes next (or stops,
/// with [`ClientConfig::reinitialize`](crate::ClientConfig::reinitialize) off).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DivergenceReason {
    /// The server refused a request of the session with 404: it no longer knows the session.
    Refused {
        /// The status.
        status: u16,
        /// The refusal as the server worded it.
        detail: String,
    },
    /// A check of the stream's lineage failed: the core's verdict (a refused resume, another
    /// session or epoch, a gap, a replay from the start, another event at the cursor, broken
    /// order, or a resync that does not continue the stream).
    Lineage(Divergence),
    /// A resume could not be proven continuous, under [`Policy::Strict`](crate::Policy::Strict).
    Unverifiable(Unverifiable),
    /// A `resync` arrived on a stream followed without proof (after an unverifiable resume,
    /// under [`Policy::Trust`](crate::Policy::Trust)): where it belongs cannot be known. Holds
    /// the event's data.
    UnplacedResync(String),
    /// The response was not a well-formed event stream.
    Undecodable(String),
    /// A stream's cursor has no checkpoint to judge its resume by.
    NoCheckpoint {
        /// The cursor.
        cursor: String,
    },
    /// A resume was answered with a success status but no event stream.
    NotAStream {
        /// The cursor resumed from.
        cursor: String,
        /// The status.
        status: u16,
    },
    /// A task's event stream (`tasks/stream`) could not be followed exactly; the client follows
    /// the task's canonical state (`tasks/get`) instead. No re-initialization: a task outlives
    /// any stream.
    TaskStream {
        /// The task.
        task_id: String,
        /// What broke.
        broke: TaskStreamBreak,
    },
}

pub use tether_core::lineage::TaskStreamBreak;

impl DivergenceReason {
    /// Every kind [`DivergenceReason::kind`] names, for metrics present from the start.
    pub(crate) const KINDS: [&'static str; 16] = [
        "session_invalid",
        "session_changed",
        "epoch_changed",
        "gap",
        "replay_reset",
        "digest_mismatch",
        "non_monotonic",
        "resync",
        "unverifiable",
        "undecodable",
        "no_checkpoint",
        "not_a_stream",
        "task_events_gone",
        "task_gap",
        "task_digest_mismatch",
        "task_ended_early",
    ];

    /// The stable name of the reason, as `tether watch` prints it and the
    /// `tether_client_divergences_total` metric labels it.
    pub fn kind(&self) -> &'static str {
        match self {
            DivergenceReason::Refused { .. } => "session_invalid",
            DivergenceReason::Lineage(divergence) => divergence.kind(),
            DivergenceReason::Unverifiable(_) => "unverifiable",
            DivergenceReason::UnplacedResync(_) => "resync",
            DivergenceReason::Undecodable(_) => "undecodable",
            DivergenceReason::NoCheckpoint { .. } => "no_checkpoint",
            DivergenceReason::NotAStream { .. } => "not_a_stream",
            DivergenceReason::TaskStream { broke: TaskStreamBreak::EventsGone { .. }, .. } => "task_events_gone",
            DivergenceReason::TaskStream { broke: TaskStreamBreak::Gap { .. }, .. } => "task_gap",
            DivergenceReason::TaskStream { broke: TaskStreamBreak::Digest { .. }, .. } => "task_digest_mismatch",
            DivergenceReason::TaskStream { broke: TaskStreamBreak::EndedEarly { .. }, .. } => "task_ended_early",
        }
    }
}

impl fmt::Display for DivergenceReason {
    /// What was seen, for a person.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DivergenceReason::Refused { status, detail } => write!(f, "request answered {status}: {detail}"),
            DivergenceReason::Lineage(divergence) => write!(f, "{divergence}"),
            DivergenceReason::Unverifiable(Unverifiable::OpaqueIds) => {
                f.write_str("event ids carry no order (neither lineage ids nor integers)")
            }
            DivergenceReason::Unverifiable(Unverifiable::NoEpoch) => {
                f.write_str("integer event ids but no replay epoch: a restarted server would look continuous")
            }
            DivergenceReason::Unverifiable(Unverifiable::EventWithoutId) => {
                f.write_str("the first event after the reconnect has no id")
            }
            DivergenceReason::UnplacedResync(data) => f.write_str(data),
            DivergenceReason::Undecodable(err) => write!(f, "undecodable stream: {err}"),
            DivergenceReason::NoCheckpoint { cursor } => write!(f, "no checkpoint for cursor {cursor}"),
            DivergenceReason::NotAStream { cursor, status } => {
                write!(f, "resume of {cursor} answered {status} without a stream")
            }
            DivergenceReason::TaskStream { task_id, broke } => match broke {
                TaskStreamBreak::EventsGone { after, earliest } => {
                    let after = after.map_or_else(|| "its start".to_owned(), |a| format!("event {a}"));
                    let kept =
                        earliest.map_or_else(|| "none is kept".to_owned(), |e| format!("the oldest kept is {e}"));
                    write!(f, "task {task_id}: the events after {after} are gone ({kept})")
                }
                TaskStreamBreak::Gap { expected, got } => {
                    write!(f, "task {task_id}: event {got} came where {expected} had to")
                }
                TaskStreamBreak::Digest { seq } => {
                    write!(f, "task {task_id}: event {seq} does not chain to the event before it")
                }
                TaskStreamBreak::EndedEarly { after } => {
                    let after = after.map_or_else(|| "its start".to_owned(), |a| format!("event {a}"));
                    write!(f, "task {task_id}: the stream ended after {after}, before the task's final status")
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_has_its_own_kind() {
        let reasons = [
            DivergenceReason::Refused { status: 404, detail: "unknown session".into() },
            DivergenceReason::Lineage(Divergence::SessionInvalid { status: 404 }),
            DivergenceReason::Unverifiable(Unverifiable::NoEpoch),
            DivergenceReason::UnplacedResync("{}".into()),
            DivergenceReason::Undecodable("bad".into()),
            DivergenceReason::NoCheckpoint { cursor: "7".into() },
            DivergenceReason::NotAStream { cursor: "7".into(), status: 200 },
            DivergenceReason::TaskStream {
                task_id: "t".into(),
                broke: TaskStreamBreak::EventsGone { after: Some(3), earliest: Some(9) },
            },
            DivergenceReason::TaskStream { task_id: "t".into(), broke: TaskStreamBreak::Gap { expected: 4, got: 6 } },
            DivergenceReason::TaskStream { task_id: "t".into(), broke: TaskStreamBreak::Digest { seq: 4 } },
            DivergenceReason::TaskStream { task_id: "t".into(), broke: TaskStreamBreak::EndedEarly { after: Some(4) } },
        ];
        let kinds: Vec<&str> = reasons.iter().map(DivergenceReason::kind).collect();
        for kind in &kinds {
            assert!(DivergenceReason::KINDS.contains(kind), "{kind} is missing from KINDS");
        }
        assert_eq!(
            kinds,
            [
                "session_invalid",
                "session_invalid",
                "unverifiable",
                "resync",
                "undecodable",
                "no_checkpoint",
                "not_a_stream",
                "task_events_gone",
                "task_gap",
                "task_digest_mismatch",
                "task_ended_early"
            ]
        );
    }
}
