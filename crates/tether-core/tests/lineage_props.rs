//! Property tests of the two decisions together: a healthy server under random disconnects
//! never makes the client see a divergence; under random eviction the client gets exactly the
//! retained events and one exact notice per loss; and every injected fault is classified as
//! the right kind.

use proptest::prelude::*;
use tether_core::lineage::{
    Accepted, Checkpoint, Digest, Divergence, Epoch, EventId, FirstEvent, InvalidReason, Next, ObservedId, Reconnect,
    ResyncNotice, ResyncReason, SeqRange, ServerDecision, SessionLookup, StreamAt, StreamName, StreamRange,
    StreamState, StreamValidator, Tag, Unverifiable, Verdict, client_verdict, decide_resume, next_after,
};

const SESSION: &str = "session-under-test";
const NOW: u64 = 5_000;

fn epoch(tag: char) -> Epoch {
    Epoch::parse(&tag.to_string().repeat(22)).expect("valid epoch")
}

/// The tag the healthy store drew for event `seq`.
fn tag(seq: u64) -> Tag {
    Tag::from_bits(seq.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

fn event_id(epoch: &Epoch, seq: u64) -> EventId {
    EventId {
        epoch: epoch.clone(),
        stream: StreamName::parse("req-1").expect("valid stream"),
        seq,
        tag: Some(tag(seq)),
    }
}

/// What the healthy store holding `range` tells of position `seq`: its tag while it can.
fn held(range: StreamRange, seq: u64) -> StreamAt {
    let known = seq <= range.head && seq + 1 >= range.retained_from;
    StreamAt { range, tag: known.then(|| tag(seq)) }
}

/// Decides a resume of `cursor` against the healthy store holding `range`.
fn decide(session: SessionLookup<'_>, cursor: &EventId, range: Option<StreamRange>) -> ServerDecision {
    let seen = cursor.tag.expect("the healthy store's ids carry tags");
    decide_resume(session, cursor, seen, range.map(|range| held(range, cursor.seq)), NOW)
}

/// The data of event `seq` of the healthy stream (seq 0 is the empty priming event).
fn data(seq: u64) -> Vec<u8> {
    if seq == 0 { Vec::new() } else { format!("{{\"n\":{seq}}}").into_bytes() }
}

#[derive(Debug, Clone, Copy)]
enum Step {
    /// The producer appends one event.
    Produce,
    /// The client reads up to this many of the events written since it last read.
    Read(u8),
    /// The connection drops and the client resumes.
    Disconnect,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => Just(Step::Produce),
        3 => (1u8..5).prop_map(Step::Read),
        1 => Just(Step::Disconnect),
    ]
}

/// A client that follows one stream and proves continuity the way tether's client does.
struct Client {
    epoch: String,
    validator: StreamValidator,
    /// Sequence numbers delivered to the application, in order.
    delivered: Vec<u64>,
    /// A reconnect whose verdict waits for its first event.
    pending_resume: Option<Checkpoint>,
}

impl Client {
    fn checkpoint(&self) -> Checkpoint {
        let (last_id, last_digest) = self.validator.last().expect("primed before any disconnect");
        Checkpoint {
            session_id: SESSION.into(),
            epoch: Some(self.epoch.clone()),
            last_id: last_id.clone(),
            last_digest: *last_digest,
        }
    }

    /// Receives one event; any divergence fails the property.
    fn receive(&mut self, id: &EventId, data: &[u8]) -> Result<(), String> {
        let raw = id.to_string();
        if let Some(checkpoint) = self.pending_resume.take() {
            let reconnect = Reconnect {
                status: 200,
                session_id: Some(SESSION),
                epoch: Some(&self.epoch),
                first_event: Some(FirstEvent { id: Some(&raw), event: None, data }),
            };
            match client_verdict(&checkpoint, &reconnect) {
                Verdict::ProvisionallyContinuous => {}
                other => return Err(format!("healthy resume judged {other:?}")),
            }
        }
        let accepted = self.validator.accept(Some(&raw), None, data).map_err(|d| format!("{d:?}"))?;
        if accepted != Accepted::Event {
            return Err(format!("a plain event accepted as {accepted:?}"));
        }
        if id.seq > 0 {
            self.delivered.push(id.seq);
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn healthy_server_under_random_disconnects_never_diverges(steps in proptest::collection::vec(step(), 1..80)) {
        let e = epoch('A');
        // The server's stream: everything retained, seq 0 written at creation.
        let mut head = 0u64;
        let mut client = Client {
            epoch: e.to_string(),
            validator: StreamValidator::fresh(),
            delivered: Vec::new(),
            pending_resume: None,
        };
        client.receive(&event_id(&e, 0), &data(0)).map_err(TestCaseError::fail)?;
        // Position of the next event the connection would send.
        let mut next_send = 1u64;
        for step in steps {
            match step {
                Step::Produce => head += 1,
                Step::Read(n) => {
                    for _ in 0..n {
                        if next_send > head {
                            break;
                        }
                        client.receive(&event_id(&e, next_send), &data(next_send)).map_err(TestCaseError::fail)?;
                        next_send += 1;
                    }
                }
                Step::Disconnect => {
                    // Events in flight are lost with the connection; the cursor is what the
                    // client processed.
                    let checkpoint = client.checkpoint();
                    let ObservedId::Lineage(cursor) = checkpoint.last_id.clone() else {
                        return Err(TestCaseError::fail("lineage ids expected"));
                    };
                    let session = SessionLookup::Live { epoch: &e, expires_at_ms: NOW + 1 };
                    let range = StreamRange { retained_from: 0, head, state: StreamState::Live };
                    let decision = decide(session, &cursor, Some(range));
                    let starts = if cursor.seq < head { Next::Events } else { Next::Wait };
                    prop_assert_eq!(&decision, &ServerDecision::Replay { after: cursor.seq, starts });
                    let reconnect = Reconnect { status: 200, session_id: Some(SESSION), epoch: Some(e.as_str()), first_event: None };
                    prop_assert_eq!(client_verdict(&checkpoint, &reconnect), Verdict::AwaitingFirstEvent);
                    client.pending_resume = Some(checkpoint);
                    next_send = cursor.seq + 1;
                }
            }
        }
        // Drain: everything produced arrives exactly once, in order.
        while next_send <= head {
            client.receive(&event_id(&e, next_send), &data(next_send)).map_err(TestCaseError::fail)?;
            next_send += 1;
        }
        prop_assert_eq!(client.delivered, (1..=head).collect::<Vec<_>>());
    }
}

#[derive(Debug, Clone, Copy)]
enum Change {
    /// The producer appends one event.
    Produce,
    /// Retention drops up to this many of the oldest retained events.
    Evict(u64),
    /// The producer finishes (`Complete`) or dies (`Aborted`).
    End(StreamState),
    /// The connection writes up to this many items and the client reads them.
    Read(u8),
    /// The connection drops and the client resumes from what it processed.
    Disconnect,
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        4 => Just(Change::Produce),
        2 => (1u64..6).prop_map(Change::Evict),
        1 => prop_oneof![Just(StreamState::Complete), Just(StreamState::Aborted)].prop_map(Change::End),
        4 => (1u8..6).prop_map(Change::Read),
        2 => Just(Change::Disconnect),
    ]
}

/// What a connection writes, by `next_after`, given what the store retains now.
enum Item {
    Event(u64),
    Resync(ResyncNotice),
    End,
}

/// One connection to the stream, from `cursor`, reading the store as a server's reader does.
fn write_next(cursor: &mut u64, range: StreamRange) -> Option<Item> {
    match next_after(*cursor, range, range.first_after(*cursor)) {
        Next::Events => {
            *cursor += 1;
            Some(Item::Event(*cursor))
        }
        Next::Gap(lost) => {
            *cursor = lost.to;
            Some(Item::Resync(ResyncNotice::evicted("req-1", lost, range.head)))
        }
        Next::Wait => None,
        Next::End => Some(Item::End),
        Next::Aborted => Some(Item::Resync(ResyncNotice::aborted("req-1", range.head))),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Seed 004's third branch, exactly: under random eviction, producers, ends and cursors, the
    /// client gets every retained event after its cursor once, in order, and for what is gone
    /// one resync naming exactly it; nothing it is told is lost was still retained.
    #[test]
    fn a_resume_delivers_exactly_what_is_retained_and_names_exactly_what_is_gone(
        changes in proptest::collection::vec(change(), 1..120),
    ) {
        let e = epoch('A');
        let session = SessionLookup::Live { epoch: &e, expires_at_ms: NOW + 1 };
        let mut range = StreamRange { retained_from: 0, head: 0, state: StreamState::Live };
        let mut validator = StreamValidator::resume(&Checkpoint {
            session_id: SESSION.into(),
            epoch: Some(e.to_string()),
            last_id: ObservedId::parse(&event_id(&e, 0).to_string()),
            last_digest: Digest::of(&event_id(&e, 0).to_string(), &data(0)),
        });
        // The connection's cursor; `None` while the client is disconnected.
        let mut conn = Some(0u64);
        let (mut delivered, mut lost, mut ended) = (Vec::new(), Vec::new(), false);
        let mut receive = |item: Item, validator: &mut StreamValidator, range: &StreamRange| -> Result<bool, TestCaseError> {
            match item {
                Item::Event(seq) => {
                    let id = event_id(&e, seq).to_string();
                    let accepted = validator.accept(Some(&id), None, &data(seq)).map_err(|d| TestCaseError::fail(format!("{d:?}")))?;
                    prop_assert_eq!(accepted, Accepted::Event);
                    prop_assert!(seq >= range.retained_from, "event {} was written although not retained", seq);
                    delivered.push(seq);
                    Ok(false)
                }
                Item::Resync(notice) => {
                    let id = event_id(&e, notice.position()).to_string();
                    let accepted = validator
                        .accept(Some(&id), Some("resync"), notice.to_json().as_bytes())
                        .map_err(|d| TestCaseError::fail(format!("{d:?}")))?;
                    prop_assert_eq!(accepted, Accepted::Resync(notice.clone()));
                    if let Some(gone) = notice.lost {
                        prop_assert!(gone.to < range.retained_from, "{:?} named lost while retained from {}", gone, range.retained_from);
                        lost.extend(gone.from..=gone.to);
                    }
                    Ok(notice.reason == ResyncReason::RequestAborted)
                }
                Item::End => Ok(true),
            }
        };
        for change in changes {
            match change {
                Change::Produce if range.state == StreamState::Live => range.head += 1,
                Change::End(state) if range.state == StreamState::Live => range.state = state,
                Change::Evict(k) => range.retained_from = (range.retained_from + k).min(range.head + 1),
                Change::Read(n) => {
                    for _ in 0..n {
                        let Some(cursor) = conn.as_mut() else { break };
                        let Some(item) = write_next(cursor, range) else { break };
                        if receive(item, &mut validator, &range)? {
                            ended = true;
                            conn = None;
                        }
                    }
                }
                Change::Disconnect if !ended => {
                    let (last, _) = validator.last().expect("a cursor");
                    let ObservedId::Lineage(cursor) = last.clone() else { return Err(TestCaseError::fail("lineage ids")) };
                    let decision = decide(session, &cursor, Some(range));
                    let ServerDecision::Replay { after, starts } = decision else {
                        return Err(TestCaseError::fail(format!("a live session's resume answered {decision:?}")));
                    };
                    prop_assert_eq!(after, cursor.seq);
                    prop_assert_eq!(starts, next_after(after, range, range.first_after(after)));
                    conn = Some(after);
                }
                _ => {}
            }
        }
        // Drain whatever remains.
        if range.state == StreamState::Live {
            range.state = StreamState::Complete;
        }
        if !ended {
            let mut cursor = match conn {
                Some(cursor) => cursor,
                None => validator.last().and_then(|(id, _)| match id { ObservedId::Lineage(id) => Some(id.seq), _ => None }).unwrap_or(0),
            };
            for _ in 0..1_000 {
                let Some(item) = write_next(&mut cursor, range) else { break };
                if receive(item, &mut validator, &range)? {
                    ended = true;
                    break;
                }
            }
        }
        prop_assert!(ended, "the stream ended");
        let mut all: Vec<u64> = delivered.iter().chain(&lost).copied().collect();
        all.sort_unstable();
        prop_assert_eq!(all, (1..=range.head).collect::<Vec<_>>(), "each event delivered or named lost, once");
        prop_assert!(delivered.windows(2).all(|w| w[0] < w[1]), "in order: {:?}", delivered);
    }
}

#[derive(Debug, Clone)]
enum Fault {
    Status(u16),
    OtherSession,
    OtherEpochHeader,
    /// The epoch header disappears.
    NoEpochHeader,
    /// Seed 000's main signature: the header's epoch is unchanged, but the ids carry a new one
    /// (a restarted server that kept counting).
    EpochInsideIds,
    /// The first event skips this many events.
    Gap(u64),
    /// The first event goes back to this fraction of the cursor.
    Reset(u64),
    BoundaryDuplicate,
    BoundaryOtherContent,
    /// A resync that cannot continue the stream (the stream is unknown to the session).
    Resync,
    /// A resync naming exactly this many events after the cursor as gone.
    NamedLoss(u64),
    /// The first event's id carries no order.
    OpaqueId,
    /// The first event has no id.
    NoId,
    /// The resume is clean but a later event jumps ahead by this much.
    JumpLater(u64),
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        prop_oneof![Just(400u16), Just(404), Just(410), Just(500), Just(503)].prop_map(Fault::Status),
        Just(Fault::OtherSession),
        Just(Fault::OtherEpochHeader),
        Just(Fault::NoEpochHeader),
        Just(Fault::EpochInsideIds),
        (1u64..50).prop_map(Fault::Gap),
        (0u64..100).prop_map(Fault::Reset),
        Just(Fault::BoundaryDuplicate),
        Just(Fault::BoundaryOtherContent),
        Just(Fault::Resync),
        (1u64..50).prop_map(Fault::NamedLoss),
        Just(Fault::OpaqueId),
        Just(Fault::NoId),
        (1u64..50).prop_map(Fault::JumpLater),
    ]
}

/// How the client must classify a fault: a divergence kind, the duplicate it skips, the loss it
/// accepts as named, or why it cannot judge.
fn expected_kind(fault: &Fault, integer_ids: bool) -> &'static str {
    match fault {
        // "Not now" proves nothing either way: the client tries again.
        Fault::Status(429 | 502 | 503 | 504) => "unavailable",
        Fault::Status(_) => "session_invalid",
        Fault::OtherSession => "session_changed",
        Fault::OtherEpochHeader | Fault::NoEpochHeader => "epoch_changed",
        // An integer cursor cannot carry an epoch: a lineage id after it changes the scheme.
        Fault::EpochInsideIds if integer_ids => "non_monotonic",
        Fault::EpochInsideIds => "epoch_changed",
        Fault::Gap(_) | Fault::JumpLater(_) => "gap",
        Fault::Reset(_) => "replay_reset",
        Fault::BoundaryDuplicate => "boundary_duplicate",
        Fault::BoundaryOtherContent => "digest_mismatch",
        Fault::Resync => "resync",
        // Only lineage ids can show where a notice stands.
        Fault::NamedLoss(_) if integer_ids => "resync",
        Fault::NamedLoss(_) => "resynced",
        Fault::OpaqueId | Fault::NoId => "unverifiable",
    }
}

/// Runs a resume with `fault` injected and reports how the client classified it.
fn classify(fault: &Fault, cursor_seq: u64, integer_ids: bool) -> Result<&'static str, String> {
    let a = epoch('A');
    let b = epoch('B');
    let id_of = |seq: u64| if integer_ids { seq.to_string() } else { event_id(&a, seq).to_string() };
    let last_id = id_of(cursor_seq);
    let checkpoint = Checkpoint {
        session_id: SESSION.into(),
        epoch: Some(a.to_string()),
        last_id: ObservedId::parse(&last_id),
        last_digest: Digest::of(&last_id, &data(cursor_seq)),
    };
    let (mut status, mut session, mut header_epoch) = (200, SESSION, Some(a.as_str()));
    let (mut first_seq, mut first_data, mut first_type) = (cursor_seq + 1, data(cursor_seq + 1), None);
    let mut first_id = None;
    let notice = |reason: &str, lost: Option<(u64, u64)>, head: u64| {
        let (from, to) = lost.map_or(("null".to_owned(), "null".to_owned()), |(f, t)| (f.to_string(), t.to_string()));
        format!(
            r#"{{"reason":"{reason}","stream":"req-1","after":{cursor_seq},"lost_from":{from},"lost_to":{to},"head":{head}}}"#
        )
        .into_bytes()
    };
    match fault {
        Fault::Status(s) => status = *s,
        Fault::OtherSession => session = "another-session",
        Fault::OtherEpochHeader => header_epoch = Some(b.as_str()),
        Fault::NoEpochHeader => header_epoch = None,
        Fault::EpochInsideIds => first_id = Some(Some(event_id(&b, first_seq).to_string())),
        Fault::Gap(k) => {
            first_seq = cursor_seq + 1 + k;
            first_data = data(first_seq);
        }
        Fault::Reset(pct) => {
            first_seq = cursor_seq * pct / 100;
            first_data = b"{\"restarted\":true}".to_vec();
        }
        Fault::BoundaryDuplicate => (first_seq, first_data) = (cursor_seq, data(cursor_seq)),
        Fault::BoundaryOtherContent => (first_seq, first_data) = (cursor_seq, b"{\"other\":1}".to_vec()),
        Fault::Resync => {
            first_type = Some("resync");
            (first_seq, first_data) = (cursor_seq, notice("unknown_stream", None, 0));
        }
        Fault::NamedLoss(k) => {
            first_type = Some("resync");
            first_seq = cursor_seq + k;
            first_data = notice("evicted", Some((cursor_seq + 1, first_seq)), first_seq + 3);
        }
        Fault::OpaqueId => first_id = Some(Some("opaque-cursor-7f3a".to_owned())),
        Fault::NoId => first_id = Some(None),
        Fault::JumpLater(_) => {}
    }
    let first_id = first_id.unwrap_or_else(|| Some(id_of(first_seq)));
    let reconnect = Reconnect {
        status,
        session_id: Some(session),
        epoch: header_epoch,
        first_event: Some(FirstEvent { id: first_id.as_deref(), event: first_type, data: &first_data }),
    };
    match client_verdict(&checkpoint, &reconnect) {
        Verdict::Diverged(d) => return Ok(d.kind()),
        Verdict::BoundaryDuplicate => return Ok("boundary_duplicate"),
        Verdict::Resynced(_) => return Ok("resynced"),
        Verdict::Unverifiable(_) => return Ok("unverifiable"),
        Verdict::ProvisionallyContinuous => {}
        Verdict::AwaitingFirstEvent => return Err("a first event was given".into()),
        Verdict::Unavailable { .. } => return Ok("unavailable"),
    }
    let mut validator = StreamValidator::resume(&checkpoint);
    validator.accept(first_id.as_deref(), None, &first_data).map_err(|d| format!("{d:?}"))?;
    if let Fault::JumpLater(k) = fault {
        let jumped = first_seq + 1 + k;
        let err: Divergence =
            validator.accept(Some(&id_of(jumped)), None, &data(jumped)).expect_err("a jump is a divergence");
        return Ok(err.kind());
    }
    Err("no fault observed".into())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn every_injected_fault_is_classified_as_its_kind(
        fault in fault(),
        cursor_seq in 1u64..1_000_000,
        integer_ids in any::<bool>(),
    ) {
        prop_assert_eq!(classify(&fault, cursor_seq, integer_ids), Ok(expected_kind(&fault, integer_ids)));
    }

    #[test]
    fn integer_ids_without_epoch_are_never_called_continuous(cursor_seq in 0u64..1_000_000) {
        let last_id = cursor_seq.to_string();
        let checkpoint = Checkpoint {
            session_id: SESSION.into(),
            epoch: None,
            last_id: ObservedId::parse(&last_id),
            last_digest: Digest::of(&last_id, b"x"),
        };
        let next = (cursor_seq + 1).to_string();
        let reconnect = Reconnect {
            status: 200,
            session_id: Some(SESSION),
            epoch: None,
            first_event: Some(FirstEvent { id: Some(&next), event: None, data: b"y" }),
        };
        prop_assert_eq!(client_verdict(&checkpoint, &reconnect), Verdict::Unverifiable(Unverifiable::NoEpoch));
    }

    #[test]
    fn server_replays_only_when_session_and_history_allow(
        state in 0u8..5,
        same_epoch in any::<bool>(),
        expired in any::<bool>(),
        retained_from in 0u64..20,
        head in 0u64..20,
        cursor_seq in 0u64..25,
        stream_state in 0u8..3,
        stream_known in any::<bool>(),
        rewritten in any::<bool>(),
    ) {
        let (a, b) = (epoch('A'), epoch('B'));
        let session_epoch = if same_epoch { &a } else { &b };
        let expires_at_ms = if expired { NOW } else { NOW + 1 };
        let session = match state {
            0 => SessionLookup::Unknown,
            1 => SessionLookup::Terminated,
            2 => SessionLookup::Expired,
            3 => SessionLookup::UpstreamLost,
            _ => SessionLookup::Live { epoch: session_epoch, expires_at_ms },
        };
        let stream_state = [StreamState::Live, StreamState::Complete, StreamState::Aborted][stream_state as usize];
        let retained_from = retained_from.min(head + 1);
        let range = stream_known.then_some(StreamRange { retained_from, head, state: stream_state });
        let cursor = event_id(&a, cursor_seq);
        // A store that went back in time and stored other events holds other tags.
        let at = range.map(|range| {
            let healthy = held(range, cursor_seq);
            StreamAt { tag: healthy.tag.map(|t| if rewritten { Tag::from_bits(!t.bits()) } else { t }), ..healthy }
        });
        let decision = decide_resume(session, &cursor, tag(cursor_seq), at, NOW);
        // The expected answer, case by case, in seed 004's order: the session, then the history.
        let invalid = match state {
            0 => Some(InvalidReason::UnknownSession),
            1 => Some(InvalidReason::Terminated),
            2 => Some(InvalidReason::Expired),
            3 => Some(InvalidReason::UpstreamLost),
            _ if expired => Some(InvalidReason::Expired),
            _ if !same_epoch => Some(InvalidReason::IncarnationMismatch),
            _ => None,
        };
        let expected = match (invalid, range) {
            (Some(reason), _) => ServerDecision::SessionInvalid(reason),
            (None, None) => ServerDecision::Resync(ResyncNotice {
                reason: ResyncReason::UnknownStream, stream: "req-1".into(), after: cursor_seq, lost: None, head: 0,
            }),
            // The store handed out a position it no longer has, or holds another event there.
            (None, Some(range)) if cursor_seq > range.head => ServerDecision::SessionInvalid(InvalidReason::HistoryRewritten),
            (None, Some(_)) if rewritten && at.and_then(|at| at.tag).is_some() => {
                ServerDecision::SessionInvalid(InvalidReason::HistoryRewritten)
            }
            (None, Some(range)) => {
                let starts = if cursor_seq < range.head {
                    // The events after the cursor that are no longer retained, if any.
                    match SeqRange::new(cursor_seq + 1, range.head.min(range.retained_from.saturating_sub(1))) {
                        Some(gone) => Next::Gap(gone),
                        None => Next::Events,
                    }
                } else {
                    match range.state {
                        StreamState::Live => Next::Wait,
                        StreamState::Complete => Next::End,
                        StreamState::Aborted => Next::Aborted,
                    }
                };
                ServerDecision::Replay { after: cursor_seq, starts }
            }
        };
        prop_assert_eq!(&decision, &expected);
        if let ServerDecision::Replay { starts: Next::Gap(gone), .. } = decision {
            // A loss is named exactly: from right after the cursor up to the first retained
            // event (or the head when nothing after the cursor is retained).
            let range = range.expect("a replay has a range");
            prop_assert_eq!(gone.from, cursor_seq + 1);
            prop_assert!(gone.to < range.retained_from && gone.to <= range.head);
            prop_assert!(gone.to == range.head || gone.to + 1 == range.retained_from);
        }
    }
}
