//! The server's resumption decision (seed 004, "Decision Boundary").
//!
//! A resume is answered in one of three ways, decided here and nowhere else, in this order:
//! the session must be live and be the incarnation that issued the cursor (else
//! [`ServerDecision::SessionInvalid`]); then the cursor must name a stream of it (else one
//! [`ServerDecision::Resync`]), and a position of that stream holding the event the client
//! saw there ([`check_position`]: else the store went back in time, and the session is
//! invalid); then the answer is a [`ServerDecision::Replay`] that follows [`next_after`], the
//! one rule every reader of a stored stream follows: each retained event once, in order, and
//! whatever is no longer retained said once by a resync event standing exactly where it was.
//! Deciding reads state and changes none of it, so a resume can never renew an expired session.

use super::id::{Epoch, EventId, Tag};
use super::resync::{ResyncNotice, ResyncReason, SeqRange};

/// What the session store knows about the session a resume names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionLookup<'a> {
    /// No such session: never issued, or forgotten.
    Unknown,
    /// Ended by DELETE or by the server.
    Terminated,
    /// Already marked expired by the store.
    Expired,
    /// Ended because the upstream server behind a gateway stopped serving it.
    UpstreamLost,
    /// Ended because its store went back in time: history a client saw is gone or rewritten.
    HistoryRewritten,
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
    /// The upstream server behind a gateway stopped serving the session (its process exited, or
    /// it lost the session).
    UpstreamLost,
    /// The session id is known, but the cursor comes from another incarnation of it.
    IncarnationMismatch,
    /// The store went back in time (a restored backup, a failover to a replica that lagged):
    /// what the cursor names is not what the store holds, so the session's history is not the
    /// one its client saw.
    HistoryRewritten,
}

impl InvalidReason {
    /// The reason as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            InvalidReason::UnknownSession => "unknown_session",
            InvalidReason::Terminated => "terminated",
            InvalidReason::Expired => "expired",
            InvalidReason::UpstreamLost => "upstream_lost",
            InvalidReason::IncarnationMismatch => "incarnation_mismatch",
            InvalidReason::HistoryRewritten => "history_rewritten",
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

/// What the store retains of one stream. Retained events are always a contiguous suffix of the
/// stream: `retained_from..=head`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamRange {
    /// Lowest sequence number still retained; `head + 1` when nothing is.
    pub retained_from: u64,
    /// Highest sequence number written.
    pub head: u64,
    /// Whether more events will follow.
    pub state: StreamState,
}

impl StreamRange {
    /// The first retained event after `cursor`, if any.
    pub fn first_after(&self, cursor: u64) -> Option<u64> {
        let first = self.retained_from.max(cursor.saturating_add(1));
        (first <= self.head).then_some(first)
    }
}

/// What a reader of a stored stream writes next, from its cursor (see [`next_after`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The event after the cursor is retained: write the retained events, in order.
    Events,
    /// These events after the cursor are gone: write one resync event for exactly them
    /// ([`ResyncNotice::evicted`]), then go on from the range's end.
    Gap(SeqRange),
    /// Nothing follows the cursor yet: wait for the head to move.
    Wait,
    /// The stream is complete and everything up to its head is written.
    End,
    /// The stream's producer died and everything up to its head is written: write one
    /// `request_aborted` resync event ([`ResyncNotice::aborted`]), then end.
    Aborted,
}

impl Next {
    /// The reason of the resync event this step writes, if it writes one.
    pub fn resync_reason(self) -> Option<ResyncReason> {
        match self {
            Next::Gap(_) => Some(ResyncReason::Evicted),
            Next::Aborted => Some(ResyncReason::RequestAborted),
            Next::Events | Next::Wait | Next::End => None,
        }
    }
}

/// The one rule for following a stored stream, for a resume and for every later read alike:
/// every retained event after the cursor once, in order; what is gone said once, exactly where
/// it is; the end as the stream ended. `first_retained` is the first retained event after
/// `cursor` as the store read it (the first event of a page), `range` what the store said of
/// the stream just before.
pub fn next_after(cursor: u64, range: StreamRange, first_retained: Option<u64>) -> Next {
    let next = cursor.saturating_add(1);
    match first_retained {
        // Everything from the next position up to the first retained event is gone, if anything.
        Some(first) => SeqRange::new(next, first.saturating_sub(1)).map_or(Next::Events, Next::Gap),
        // Events after the cursor were written but none of them is retained any more.
        None if cursor < range.head => {
            SeqRange::new(next, range.head).map_or(Next::Wait, Next::Gap)
        }
        None => match range.state {
            StreamState::Live => Next::Wait,
            StreamState::Complete => Next::End,
            StreamState::Aborted => Next::Aborted,
        },
    }
}

/// The answer to a resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerDecision {
    /// 200: the stream from the cursor, by [`next_after`]: exactly the retained events after
    /// `after`, each loss said where it is, then the end as the stream ends (or new events).
    Replay {
        /// The cursor's sequence number; its own event is never sent again.
        after: u64,
        /// What the replay starts with, as the range read for the decision shows it.
        starts: Next,
    },
    /// 404 with the reason; the session is left as it is.
    SessionInvalid(InvalidReason),
    /// 200 with this one resync event and nothing else: the session has no stream by the
    /// cursor's name.
    Resync(ResyncNotice),
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
        SessionLookup::UpstreamLost => Err(InvalidReason::UpstreamLost),
        SessionLookup::HistoryRewritten => Err(InvalidReason::HistoryRewritten),
        SessionLookup::Live { expires_at_ms, .. } if now_ms >= expires_at_ms => {
            Err(InvalidReason::Expired)
        }
        SessionLookup::Live { epoch, .. } => Ok(epoch),
    }
}

/// What a store holds of a stream, read for a cursor at one moment: its range, and the tag of
/// the event at the cursor's position while the store can still tell it (that event is
/// retained, or is the last one before those retained).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamAt {
    /// What is retained of the stream.
    pub range: StreamRange,
    /// The tag of the event at the cursor's position, if the store still knows it.
    pub tag: Option<Tag>,
}

/// The store does not hold the history a client saw: its stream never reached the client's
/// position, or holds another event there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the store does not hold the history the cursor names")]
pub struct HistoryRewritten;

/// Whether a stream still holds, at position `seq`, the event whose tag the client (or a
/// connection writing to it) saw there: the one check of history against what a store went
/// back to. A position past the head was handed out by a store that no longer has it; another
/// tag there is another event. A position the store can no longer tell (evicted, and not the
/// last one before what is retained) passes: nothing is left to check it against.
pub fn check_position(at: StreamAt, seq: u64, seen: Tag) -> Result<(), HistoryRewritten> {
    if seq > at.range.head || at.tag.is_some_and(|held| held != seen) {
        return Err(HistoryRewritten);
    }
    Ok(())
}

/// Decides how to answer a resume of `cursor`, whose event carried `tag` (seed 004's branch,
/// in its order): the session first, then the stream and the position, then the history.
///
/// `stream` is `None` when the session has no stream by the cursor's name (a stream whose
/// events retention dropped is still known: its range retains nothing).
pub fn decide_resume(
    session: SessionLookup<'_>,
    cursor: &EventId,
    tag: Tag,
    stream: Option<StreamAt>,
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
    let Some(at) = stream else {
        return ServerDecision::Resync(ResyncNotice {
            reason: ResyncReason::UnknownStream,
            stream: cursor.stream.to_string(),
            after,
            lost: None,
            head: 0,
        });
    };
    if check_position(at, after, tag).is_err() {
        return ServerDecision::SessionInvalid(InvalidReason::HistoryRewritten);
    }
    ServerDecision::Replay {
        after,
        starts: next_after(after, at.range, at.range.first_after(after)),
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

    /// The tag of the event at `seq` in the history these tests' stores hold.
    fn tag(seq: u64) -> Tag {
        Tag::from_bits(1000 + seq)
    }

    fn cursor(seq: u64) -> EventId {
        EventId {
            epoch: epoch('A'),
            stream: StreamName::parse("r1").expect("valid stream"),
            seq,
            tag: Some(tag(seq)),
        }
    }

    /// What a store holding `range` knows at `seq`: the tag there while it can tell it.
    fn at(range: StreamRange, seq: u64) -> StreamAt {
        let known = seq <= range.head && seq.saturating_add(1) >= range.retained_from;
        StreamAt {
            range,
            tag: known.then(|| tag(seq)),
        }
    }

    fn decide(session: SessionLookup<'_>, seq: u64, stream: Option<StreamRange>) -> ServerDecision {
        let stream = stream.map(|range| at(range, seq));
        decide_resume(session, &cursor(seq), tag(seq), stream, NOW)
    }

    fn live(epoch: &Epoch) -> SessionLookup<'_> {
        SessionLookup::Live {
            epoch,
            expires_at_ms: NOW + 1,
        }
    }

    fn range(retained_from: u64, head: u64, state: StreamState) -> StreamRange {
        StreamRange {
            retained_from,
            head,
            state,
        }
    }

    fn gap(from: u64, to: u64) -> Next {
        Next::Gap(SeqRange { from, to })
    }

    /// What a reader writes, following `range` (which does not change) from `cursor` to its end
    /// or until it would wait: `n` for event `n`, `gap a..b`, `aborted`, `end`, `wait`.
    fn follow(mut cursor: u64, range: StreamRange) -> Vec<String> {
        let mut out = Vec::new();
        for _ in 0..64 {
            match next_after(cursor, range, range.first_after(cursor)) {
                Next::Events => {
                    cursor += 1;
                    out.push(cursor.to_string());
                }
                Next::Gap(lost) => {
                    out.push(format!("gap {}..{}", lost.from, lost.to));
                    cursor = lost.to;
                }
                Next::Wait => return [out, vec!["wait".into()]].concat(),
                Next::End => return [out, vec!["end".into()]].concat(),
                Next::Aborted => return [out, vec!["aborted".into()]].concat(),
            }
        }
        panic!("the reader did not stop: {out:?}");
    }

    fn replay(cursor_seq: u64, range: StreamRange) -> ServerDecision {
        decide(live(&epoch('A')), cursor_seq, Some(range))
    }

    #[test]
    fn replayable_live_session_same_incarnation_covered_cursor_replays_after_cursor() {
        let r = range(0, 9, StreamState::Live);
        assert_eq!(
            replay(5, r),
            ServerDecision::Replay {
                after: 5,
                starts: Next::Events
            }
        );
        assert_eq!(follow(5, r), ["6", "7", "8", "9", "wait"]);
    }

    #[test]
    fn replay_never_includes_the_cursors_own_event() {
        // The cursor's event itself may already be evicted: only the events after it matter.
        let r = range(6, 9, StreamState::Live);
        assert_eq!(
            replay(5, r),
            ServerDecision::Replay {
                after: 5,
                starts: Next::Events
            }
        );
        assert_eq!(follow(5, r), ["6", "7", "8", "9", "wait"]);
    }

    #[test]
    fn completed_stream_is_replayed_then_ended() {
        assert_eq!(
            follow(2, range(0, 4, StreamState::Complete)),
            ["3", "4", "end"]
        );
    }

    #[test]
    fn cursor_at_head_of_live_stream_replays_nothing_and_follows() {
        let r = range(0, 9, StreamState::Live);
        assert_eq!(
            replay(9, r),
            ServerDecision::Replay {
                after: 9,
                starts: Next::Wait
            }
        );
    }

    #[test]
    fn unknown_session_is_invalid() {
        let decision = decide(
            SessionLookup::Unknown,
            5,
            Some(range(0, 9, StreamState::Live)),
        );
        assert_eq!(
            decision,
            ServerDecision::SessionInvalid(InvalidReason::UnknownSession)
        );
    }

    #[test]
    fn terminated_session_is_invalid() {
        let decision = decide(
            SessionLookup::Terminated,
            5,
            Some(range(0, 9, StreamState::Live)),
        );
        assert_eq!(
            decision,
            ServerDecision::SessionInvalid(InvalidReason::Terminated)
        );
    }

    #[test]
    fn expired_session_is_invalid() {
        let decision = decide(SessionLookup::Expired, 5, None);
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
        let retained = Some(range(0, 9, StreamState::Live));
        let decision = decide(session, 5, retained);
        assert_eq!(
            decision,
            ServerDecision::SessionInvalid(InvalidReason::Expired)
        );
        let at_deadline = SessionLookup::Live {
            epoch: &e,
            expires_at_ms: NOW,
        };
        assert_eq!(
            decide(at_deadline, 5, retained),
            ServerDecision::SessionInvalid(InvalidReason::Expired)
        );
    }

    #[test]
    fn rotated_session_with_same_id_is_an_incarnation_mismatch() {
        let rotated = epoch('B');
        let decision = decide(live(&rotated), 5, Some(range(0, 9, StreamState::Live)));
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
            decide(live(&rotated), 5, None),
            ServerDecision::SessionInvalid(InvalidReason::IncarnationMismatch)
        );
        assert_eq!(
            decide(
                SessionLookup::Terminated,
                500,
                Some(range(0, 9, StreamState::Aborted))
            ),
            ServerDecision::SessionInvalid(InvalidReason::Terminated)
        );
    }

    #[test]
    fn evicted_history_is_said_once_then_the_retained_tail_follows_with_the_result() {
        let r = range(6, 9, StreamState::Complete);
        assert_eq!(
            replay(3, r),
            ServerDecision::Replay {
                after: 3,
                starts: gap(4, 5)
            }
        );
        assert_eq!(follow(3, r), ["gap 4..5", "6", "7", "8", "9", "end"]);
        assert_eq!(
            follow(3, range(6, 9, StreamState::Live)),
            ["gap 4..5", "6", "7", "8", "9", "wait"]
        );
    }

    #[test]
    fn a_stream_whose_retention_ran_out_is_evicted_with_its_exact_range() {
        // What a tombstone says: the stream reached 9 and ended; nothing is retained.
        let r = range(10, 9, StreamState::Complete);
        assert_eq!(
            replay(2, r),
            ServerDecision::Replay {
                after: 2,
                starts: gap(3, 9)
            }
        );
        assert_eq!(follow(2, r), ["gap 3..9", "end"]);
        assert_eq!(follow(0, r), ["gap 1..9", "end"]);
    }

    #[test]
    fn an_aborted_stream_replays_what_is_retained_then_says_it_was_aborted() {
        let r = range(0, 4, StreamState::Aborted);
        assert_eq!(
            replay(2, r),
            ServerDecision::Replay {
                after: 2,
                starts: Next::Events
            }
        );
        assert_eq!(follow(2, r), ["3", "4", "aborted"]);
        assert_eq!(follow(4, r), ["aborted"]);
        assert_eq!(
            follow(0, range(3, 5, StreamState::Aborted)),
            ["gap 1..2", "3", "4", "5", "aborted"]
        );
    }

    #[test]
    fn a_cursor_past_the_head_names_history_the_store_lost() {
        // The store handed out event 12 and went back to 9: nothing may continue from 12.
        assert_eq!(
            replay(12, range(0, 9, StreamState::Live)),
            ServerDecision::SessionInvalid(InvalidReason::HistoryRewritten)
        );
    }

    #[test]
    fn a_cursor_whose_event_the_store_holds_another_of_is_rewritten_history() {
        // The store went back to 3, then stored other events as 4..=9: the client's 7 is not
        // the store's 7.
        let r = range(0, 9, StreamState::Live);
        let other = StreamAt {
            range: r,
            tag: Some(Tag::from_bits(7)),
        };
        let decision = decide_resume(live(&epoch('A')), &cursor(7), tag(7), Some(other), NOW);
        assert_eq!(
            decision,
            ServerDecision::SessionInvalid(InvalidReason::HistoryRewritten)
        );
        // The same holds at the last position before what is retained (a gap follows it).
        let trimmed = StreamAt {
            range: range(8, 9, StreamState::Live),
            tag: Some(Tag::from_bits(7)),
        };
        assert_eq!(check_position(trimmed, 7, tag(7)), Err(HistoryRewritten));
    }

    #[test]
    fn a_position_the_store_can_no_longer_tell_is_not_held_against_the_cursor() {
        let r = range(6, 9, StreamState::Live);
        let unknown = StreamAt {
            range: r,
            tag: None,
        };
        assert_eq!(check_position(unknown, 3, tag(3)), Ok(()));
        assert_eq!(
            replay(3, r),
            ServerDecision::Replay {
                after: 3,
                starts: gap(4, 5)
            }
        );
    }

    #[test]
    fn a_stream_the_session_never_had_is_an_unknown_stream_resync_at_the_cursor() {
        let e = epoch('A');
        let ServerDecision::Resync(notice) = decide(live(&e), 2, None) else {
            panic!("expected a resync");
        };
        assert_eq!(
            (notice.reason, notice.lost, notice.position()),
            (ResyncReason::UnknownStream, None, 2)
        );
        assert_eq!((notice.stream.as_str(), notice.after), ("r1", 2));
    }

    #[test]
    fn a_reader_that_falls_behind_is_told_the_gap_then_goes_on() {
        // A page read after eviction moved past the cursor: its first event is not the next.
        let r = range(8, 12, StreamState::Live);
        assert_eq!(next_after(5, r, Some(8)), gap(6, 7));
        assert_eq!(next_after(7, r, Some(8)), Next::Events);
        // Everything after the cursor went between the range and the read.
        assert_eq!(next_after(5, r, None), gap(6, 12));
        assert_eq!(next_after(12, r, None), Next::Wait);
    }

    #[test]
    fn only_a_gap_and_an_aborted_end_write_a_resync() {
        assert_eq!(gap(1, 2).resync_reason(), Some(ResyncReason::Evicted));
        assert_eq!(
            Next::Aborted.resync_reason(),
            Some(ResyncReason::RequestAborted)
        );
        for quiet in [Next::Events, Next::Wait, Next::End] {
            assert_eq!(quiet.resync_reason(), None);
        }
    }

    #[test]
    fn invalid_reasons_as_on_the_wire() {
        let reasons = [
            InvalidReason::UnknownSession,
            InvalidReason::Terminated,
            InvalidReason::Expired,
            InvalidReason::UpstreamLost,
            InvalidReason::IncarnationMismatch,
            InvalidReason::HistoryRewritten,
        ];
        let wire: Vec<&str> = reasons.into_iter().map(InvalidReason::as_str).collect();
        assert_eq!(
            wire,
            [
                "unknown_session",
                "terminated",
                "expired",
                "upstream_lost",
                "incarnation_mismatch",
                "history_rewritten"
            ]
        );
    }

    #[test]
    fn first_after_is_the_first_retained_event_past_the_cursor() {
        let r = range(6, 9, StreamState::Live);
        assert_eq!(r.first_after(3), Some(6));
        assert_eq!(r.first_after(7), Some(8));
        assert_eq!(r.first_after(9), None);
        assert_eq!(range(10, 9, StreamState::Complete).first_after(0), None);
    }
}
