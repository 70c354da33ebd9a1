//! Property tests of the two decisions together: a healthy server under random disconnects
//! never makes the client see a divergence, and every injected fault is classified as the
//! right kind.

use proptest::prelude::*;
use tether_core::lineage::{
    Checkpoint, Digest, Divergence, Epoch, EventId, FirstEvent, ObservedId, Reconnect, ServerDecision, SessionLookup,
    StreamName, StreamRange, StreamState, StreamValidator, Then, Unverifiable, Verdict, client_verdict, decide_resume,
};

const SESSION: &str = "session-under-test";
const NOW: u64 = 5_000;

fn epoch(tag: char) -> Epoch {
    Epoch::parse(&tag.to_string().repeat(22)).expect("valid epoch")
}

fn event_id(epoch: &Epoch, seq: u64) -> EventId {
    EventId { epoch: epoch.clone(), stream: StreamName::parse("req-1").expect("valid stream"), seq }
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
        self.validator.accept(Some(&raw), None, data).map_err(|d| format!("{d:?}"))?;
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
                    let decision = decide_resume(session, &cursor, Some(range), NOW);
                    prop_assert_eq!(&decision, &ServerDecision::Replay { after: cursor.seq, then: Then::FollowLive });
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

#[derive(Debug, Clone)]
enum Fault {
    Status(u16),
    OtherSession,
    OtherEpochHeader,
    /// The first event skips this many events.
    Gap(u64),
    /// The first event goes back to this fraction of the cursor.
    Reset(u64),
    BoundaryDuplicate,
    BoundaryOtherContent,
    Resync,
    /// The resume is clean but a later event jumps ahead by this much.
    JumpLater(u64),
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        prop_oneof![Just(400u16), Just(404), Just(410), Just(500), Just(503)].prop_map(Fault::Status),
        Just(Fault::OtherSession),
        Just(Fault::OtherEpochHeader),
        (1u64..50).prop_map(Fault::Gap),
        (0u64..100).prop_map(Fault::Reset),
        Just(Fault::BoundaryDuplicate),
        Just(Fault::BoundaryOtherContent),
        Just(Fault::Resync),
        (1u64..50).prop_map(Fault::JumpLater),
    ]
}

/// How the client must classify a fault: a divergence kind, or the duplicate it skips.
fn expected_kind(fault: &Fault) -> &'static str {
    match fault {
        Fault::Status(_) => "session_invalid",
        Fault::OtherSession => "session_changed",
        Fault::OtherEpochHeader => "epoch_changed",
        Fault::Gap(_) | Fault::JumpLater(_) => "gap",
        Fault::Reset(_) => "replay_reset",
        Fault::BoundaryDuplicate => "boundary_duplicate",
        Fault::BoundaryOtherContent => "digest_mismatch",
        Fault::Resync => "resync",
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
    let (mut status, mut session, mut header_epoch) = (200, SESSION, a.as_str());
    let (mut first_seq, mut first_data, mut first_type) = (cursor_seq + 1, data(cursor_seq + 1), None);
    match fault {
        Fault::Status(s) => status = *s,
        Fault::OtherSession => session = "another-session",
        Fault::OtherEpochHeader => header_epoch = b.as_str(),
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
            first_data =
                br#"{"reason":"evicted","stream":"req-1","after":1,"lost_from":2,"lost_to":3,"head":3}"#.to_vec();
        }
        Fault::JumpLater(_) => {}
    }
    let first_id = id_of(first_seq);
    let reconnect = Reconnect {
        status,
        session_id: Some(session),
        epoch: Some(header_epoch),
        first_event: Some(FirstEvent { id: Some(&first_id), event: first_type, data: &first_data }),
    };
    match client_verdict(&checkpoint, &reconnect) {
        Verdict::Diverged(d) => return Ok(d.kind()),
        Verdict::BoundaryDuplicate => return Ok("boundary_duplicate"),
        Verdict::ProvisionallyContinuous => {}
        other => return Err(format!("unexpected verdict {other:?}")),
    }
    let mut validator = StreamValidator::resume(&checkpoint);
    validator.accept(Some(&first_id), None, &first_data).map_err(|d| format!("{d:?}"))?;
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
        prop_assert_eq!(classify(&fault, cursor_seq, integer_ids), Ok(expected_kind(&fault)));
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
        state in 0u8..4,
        same_epoch in any::<bool>(),
        expired in any::<bool>(),
        retained_from in 0u64..20,
        head in 0u64..20,
        cursor_seq in 0u64..25,
        stream_state in 0u8..3,
        stream_known in any::<bool>(),
    ) {
        let (a, b) = (epoch('A'), epoch('B'));
        let session_epoch = if same_epoch { &a } else { &b };
        let expires_at_ms = if expired { NOW } else { NOW + 1 };
        let session = match state {
            0 => SessionLookup::Unknown,
            1 => SessionLookup::Terminated,
            2 => SessionLookup::Expired,
            _ => SessionLookup::Live { epoch: session_epoch, expires_at_ms },
        };
        let stream_state = [StreamState::Live, StreamState::Complete, StreamState::Aborted][stream_state as usize];
        let retained_from = retained_from.min(head + 1);
        let range = stream_known.then_some(StreamRange { retained_from, head, state: stream_state });
        let cursor = event_id(&a, cursor_seq);
        let decision = decide_resume(session, &cursor, range, NOW);
        let session_ok = state == 3 && same_epoch && !expired;
        match &decision {
            ServerDecision::SessionInvalid(_) => prop_assert!(!session_ok),
            ServerDecision::Replay { after, .. } => {
                prop_assert!(session_ok && stream_known);
                prop_assert_eq!(*after, cursor_seq, "never the cursor's own event");
                prop_assert!(cursor_seq <= head && cursor_seq + 1 >= retained_from);
                prop_assert!(stream_state != StreamState::Aborted);
            }
            ServerDecision::Resync { notice, .. } => {
                prop_assert!(session_ok);
                prop_assert_eq!(notice.after, cursor_seq);
                if let (Some(from), Some(to)) = (notice.lost_from, notice.lost_to) {
                    prop_assert!(from == cursor_seq + 1 && from <= to && to == head);
                }
            }
        }
    }
}
