//! The server's resumption decision (seed 004, "Decision Boundary").
//!
//! A resume is answered in one of three ways, decided here and nowhere else, in this order:
//! the session must be live and be the incarnation that issued the cursor (else
//! [`ServerDecision::SessionInvalid`]); then the retained history must cover the cursor (else
//! [`ServerDecision::Resync`]); only then is the answer an exact [`ServerDecision::Replay`].
//! Deciding reads state and changes none of it, so a resume can never renew an expired session.

use super::id::{Epoch, EventId};
use super::resync::{ResyncNotice, ResyncReason};

/// What the session store knows about the session a resume names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionLookup<'a> {
    /// No such session: never issued, or forgotten.
    Unknown,
    /// Ended by DELETE or by the server.
    Terminated,
    /// Already marked expired by the store.
    Expired,
    /// A session record exists.
    Live {
        /// Its current incarnation's replay epoch.
        epoch: &'a Epoch,
        /// When it expires if nothing touches it, in milliseconds since the Unix epoch.
        expires_at_ms: u64,
    },
}

/// Why a session cannot be resumed; the `error.data.reason` of the 404.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InvalidReason {
    /// The session id is not known.
    UnknownSession,
    /// The session was terminated.
    Terminated,
    /// The session expired.
    Expired,
    /// The session id is known, but the cursor comes from another incarnation of it.
    IncarnationMismatch,
}

impl InvalidReason {
    /// The reason as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            InvalidReason::UnknownSession => "unknown_session",
            InvalidReason::Terminated => "terminated",
            InvalidReason::Expired => "expired",
            InvalidReason::IncarnationMismatch => "incarnation_mismatch",
        }
    }
}

/// Whether the stream's producer will add more events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamState {
    /// Still being written: after the replay, follow new events.
    Live,
    /// Finished normally (a request's stream holds its final response).
    Complete,
    /// Its producer died before finishing: nothing more will ever come.
    Aborted,
}

/// What the store retains of one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamRange {
    /// Lowest sequence number still retained; `head + 1` when nothing is.
    pub retained_from: u64,
    /// Highest sequence number written.
    pub head: u64,
    /// Whether more events will follow.
    pub state: StreamState,
}

/// What the connection does once the decided events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// Keep the connection open and send new events as they are appended.
    FollowLive,
    /// Close the stream.
    End,
}

impl Then {
    fn after(state: StreamState) -> Then {
        match state {
            StreamState::Live => Then::FollowLive,
            StreamState::Complete | StreamState::Aborted => Then::End,
        }
    }
}

/// The answer to a resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerDecision {
    /// 200: send exactly the events with `seq > after`, then follow `then`.
    Replay {
        /// The cursor's sequence number; its own event is not sent again.
        after: u64,
        /// What follows the replay.
        then: Then,
    },
    /// 404 with the reason; the session is left as it is.
    SessionInvalid(InvalidReason),
    /// 200 whose first event is a `resync` event carrying the notice, then follow `then`.
    Resync {
        /// The data of the resync event.
        notice: ResyncNotice,
        /// What follows the resync event.
        then: Then,
    },
}

/// Whether a session may be used at `now_ms`: its live incarnation's epoch, or why not.
///
/// Every request that names a session goes through this, so "expired" means the same thing for
/// a resume, a POST and a DELETE. It reads and decides; it never renews.
pub fn check_session(session: SessionLookup<'_>, now_ms: u64) -> Result<&Epoch, InvalidReason> {
    match session {
        SessionLookup::Unknown => Err(InvalidReason::UnknownSession),
        SessionLookup::Terminated => Err(InvalidReason::Terminated),
        SessionLookup::Expired => Err(InvalidReason::Expired),
        SessionLookup::Live { expires_at_ms, .. } if now_ms >= expires_at_ms => {
            Err(InvalidReason::Expired)
        }
        SessionLookup::Live { epoch, .. } => Ok(epoch),
    }
}

/// Decides how to answer a resume of `cursor` (seed 004's three-way branch).
///
/// `stream` is `None` when the session has no stream by the cursor's name.
pub fn decide_resume(
    session: SessionLookup<'_>,
    cursor: &EventId,
    stream: Option<StreamRange>,
    now_ms: u64,
) -> ServerDecision {
    let epoch = match check_session(session, now_ms) {
        Ok(epoch) => epoch,
        Err(reason) => return ServerDecision::SessionInvalid(reason),
    };
    if *epoch != cursor.epoch {
        return ServerDecision::SessionInvalid(InvalidReason::IncarnationMismatch);
    }
    let after = cursor.seq;
    let resync = |reason, lost: Option<(u64, u64)>, head, then| ServerDecision::Resync {
        notice: ResyncNotice {
            reason,
            stream: cursor.stream.to_string(),
            after,
            lost_from: lost.map(|(from, _)| from),
            lost_to: lost.map(|(_, to)| to),
            head,
        },
        then,
    };
    let Some(range) = stream else {
        return resync(ResyncReason::UnknownStream, None, 0, Then::End);
    };
    let undelivered = (after < range.head).then(|| (after + 1, range.head));
    if after > range.head {
        return resync(
            ResyncReason::AheadOfHead,
            None,
            range.head,
            Then::after(range.state),
        );
    }
    if range.state == StreamState::Aborted {
        return resync(
            ResyncReason::RequestAborted,
            undelivered,
            range.head,
            Then::End,
        );
    }
    if after + 1 < range.retained_from {
        return resync(
            ResyncReason::Evicted,
            undelivered,
            range.head,
            Then::after(range.state),
        );
    }
    ServerDecision::Replay {
        after,
        then: Then::after(range.state),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lineage::id::StreamName;

    const NOW: u64 = 1_000_000;

    fn epoch(tag: char) -> Epoch {
        Epoch::parse(&tag.to_string().repeat(22)).expect("valid epoch")
    }

    fn cursor(seq: u64) -> EventId {
        EventId {
            epoch: epoch('A'),
            stream: StreamName::parse("r1").expect("valid stream"),
            seq,
        }
    }

    fn live(epoch: &Epoch) -> SessionLookup<'_> {
        SessionLookup::Live {
            epoch,
            expires_at_ms: NOW + 1,
        }
    }

    fn range(retained_from: u64, head: u64, state: StreamState) -> Option<StreamRange> {
        Some(StreamRange {
            retained_from,
            head,
            state,
        })
    }

    fn resync_reason(
        decision: &ServerDecision,
    ) -> Option<(ResyncReason, Option<u64>, Option<u64>, u64)> {
        match decision {
            ServerDecision::Resync { notice, .. } => {
                Some((notice.reason, notice.lost_from, notice.lost_to, notice.head))
            }
            _ => None,
        }
    }

    #[test]
    fn replayable_live_session_same_incarnation_covered_cursor_replays_after_cursor() {
        let e = epoch('A');
        let decision = decide_resume(live(&e), &cursor(5), range(0, 9, StreamState::Live), NOW);
        assert_eq!(
            decision,
            ServerDecision::Replay {
                after: 5,
                then: Then::FollowLive
            }
        );
    }

    #[test]
    fn replay_never_includes_the_cursors_own_event() {
        // The cursor's event itself may already be evicted: only the events after it matter.
        let e = epoch('A');
        let decision = decide_resume(live(&e), &cursor(5), range(6, 9, StreamState::Live), NOW);
        assert_eq!(
            decision,
            ServerDecision::Replay {
                after: 5,
                then: Then::FollowLive
            }
        );
    }

    #[test]
    fn completed_stream_is_replayed_then_ended() {
        let e = epoch('A');
        let decision = decide_resume(
            live(&e),
            &cursor(2),
            range(0, 4, StreamState::Complete),
            NOW,
        );
        assert_eq!(
            decision,
            ServerDecision::Replay {
                after: 2,
                then: Then::End
            }
        );
    }

    #[test]
    fn cursor_at_head_of_live_stream_replays_nothing_and_follows() {
        let e = epoch('A');
        let decision = decide_resume(live(&e), &cursor(9), range(0, 9, StreamState::Live), NOW);
        assert_eq!(
            decision,
            ServerDecision::Replay {
                after: 9,
                then: Then::FollowLive
            }
        );
    }

    #[test]
    fn unknown_session_is_invalid() {
        let decision = decide_resume(
            SessionLookup::Unknown,
            &cursor(5),
            range(0, 9, StreamState::Live),
            NOW,
        );
        assert_eq!(
            decision,
            ServerDecision::SessionInvalid(InvalidReason::UnknownSession)
        );
    }

    #[test]
    fn terminated_session_is_invalid() {
        let decision = decide_resume(
            SessionLookup::Terminated,
            &cursor(5),
            range(0, 9, StreamState::Live),
            NOW,
        );
        assert_eq!(
            decision,
            ServerDecision::SessionInvalid(InvalidReason::Terminated)
        );
    }

    #[test]
    fn expired_session_is_invalid() {
        let decision = decide_resume(SessionLookup::Expired, &cursor(5), None, NOW);
        assert_eq!(
            decision,
            ServerDecision::SessionInvalid(InvalidReason::Expired)
        );
    }

    #[test]
    fn session_that_expired_during_a_partition_is_invalid_although_its_buffer_is_retained() {
        // Seed 004's incident: 30-minute idle TTL, 5-minute buffer retention, a 6-minute
        // partition. The buffer still covers the cursor, but the session is past its TTL:
        // the session check comes first, so the answer is 404 expired, never a replay.
        let e = epoch('A');
        let session = SessionLookup::Live {
            epoch: &e,
            expires_at_ms: NOW - 60_000,
        };
        let decision = decide_resume(session, &cursor(5), range(0, 9, StreamState::Live), NOW);
        assert_eq!(
            decision,
            ServerDecision::SessionInvalid(InvalidReason::Expired)
        );
        let at_deadline = SessionLookup::Live {
            epoch: &e,
            expires_at_ms: NOW,
        };
        assert_eq!(
            decide_resume(at_deadline, &cursor(5), range(0, 9, StreamState::Live), NOW),
            ServerDecision::SessionInvalid(InvalidReason::Expired)
        );
    }

    #[test]
    fn rotated_session_with_same_id_is_an_incarnation_mismatch() {
        let rotated = epoch('B');
        let decision = decide_resume(
            live(&rotated),
            &cursor(5),
            range(0, 9, StreamState::Live),
            NOW,
        );
        assert_eq!(
            decision,
            ServerDecision::SessionInvalid(InvalidReason::IncarnationMismatch)
        );
    }

    #[test]
    fn session_check_comes_before_buffer_check() {
        // Even with no stream at all, a dead session is reported as such, not as a resync.
        let rotated = epoch('B');
        assert_eq!(
            decide_resume(live(&rotated), &cursor(5), None, NOW),
            ServerDecision::SessionInvalid(InvalidReason::IncarnationMismatch)
        );
        assert_eq!(
            decide_resume(
                SessionLookup::Terminated,
                &cursor(500),
                range(0, 9, StreamState::Aborted),
                NOW
            ),
            ServerDecision::SessionInvalid(InvalidReason::Terminated)
        );
    }

    #[test]
    fn evicted_history_is_a_resync_naming_the_lost_range() {
        let e = epoch('A');
        let decision = decide_resume(live(&e), &cursor(3), range(6, 9, StreamState::Live), NOW);
        assert_eq!(
            resync_reason(&decision),
            Some((ResyncReason::Evicted, Some(4), Some(9), 9))
        );
        assert!(matches!(
            decision,
            ServerDecision::Resync {
                then: Then::FollowLive,
                ..
            }
        ));
    }

    #[test]
    fn fully_evicted_completed_stream_is_a_resync_then_end() {
        let e = epoch('A');
        let decision = decide_resume(
            live(&e),
            &cursor(0),
            range(10, 9, StreamState::Complete),
            NOW,
        );
        assert_eq!(
            resync_reason(&decision),
            Some((ResyncReason::Evicted, Some(1), Some(9), 9))
        );
        assert!(matches!(
            decision,
            ServerDecision::Resync {
                then: Then::End,
                ..
            }
        ));
    }

    #[test]
    fn cursor_ahead_of_head_is_a_resync_without_loss() {
        let e = epoch('A');
        let decision = decide_resume(live(&e), &cursor(12), range(0, 9, StreamState::Live), NOW);
        assert_eq!(
            resync_reason(&decision),
            Some((ResyncReason::AheadOfHead, None, None, 9))
        );
    }

    #[test]
    fn unknown_stream_is_a_resync_then_end() {
        let e = epoch('A');
        let decision = decide_resume(live(&e), &cursor(2), None, NOW);
        assert_eq!(
            resync_reason(&decision),
            Some((ResyncReason::UnknownStream, None, None, 0))
        );
        assert!(matches!(
            decision,
            ServerDecision::Resync {
                then: Then::End,
                ..
            }
        ));
    }

    #[test]
    fn dead_producer_is_a_request_aborted_resync() {
        let e = epoch('A');
        let decision = decide_resume(live(&e), &cursor(2), range(0, 4, StreamState::Aborted), NOW);
        assert_eq!(
            resync_reason(&decision),
            Some((ResyncReason::RequestAborted, Some(3), Some(4), 4))
        );
        assert!(matches!(
            decision,
            ServerDecision::Resync {
                then: Then::End,
                ..
            }
        ));
        let at_head = decide_resume(live(&e), &cursor(4), range(0, 4, StreamState::Aborted), NOW);
        assert_eq!(
            resync_reason(&at_head),
            Some((ResyncReason::RequestAborted, None, None, 4))
        );
    }

    #[test]
    fn resync_notice_names_the_cursor_and_stream() {
        let e = epoch('A');
        let ServerDecision::Resync { notice, .. } =
            decide_resume(live(&e), &cursor(3), range(6, 9, StreamState::Live), NOW)
        else {
            panic!("expected a resync");
        };
        assert_eq!(notice.stream, "r1");
        assert_eq!(notice.after, 3);
    }
}
