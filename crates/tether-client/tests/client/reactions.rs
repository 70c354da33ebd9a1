//! The client's reaction to each thing a server can answer a resume with, against a scripted
//! server: the call's stream is cut after two events, and the resume gets what the scenario says.
//! What the application sees (events and the call's outcome) is checked for each.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};
use tether_client::{Backoff, Client, ClientConfig, ClientError, ClientEvent, DivergenceReason, Policy, RequestError};
use tether_core::jsonrpc::Message;
use tether_core::lineage::{Divergence, SeqRange};

const EPOCH: &str = "EpochOfTheScriptedServer";

/// One SSE event as the server writes it; `@ID` in the data stands for the call's request id.
#[derive(Debug, Clone)]
struct Frame {
    id: Option<String>,
    event: Option<&'static str>,
    data: String,
}

/// The id of event `n` of the call's stream.
fn id(n: u64) -> String {
    format!("{EPOCH}:r1:{n}")
}

fn event(n: u64) -> Frame {
    let data = json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": {"n": n}}});
    Frame { id: Some(id(n)), event: None, data: data.to_string() }
}

fn priming() -> Frame {
    Frame { id: Some(id(0)), event: None, data: String::new() }
}

fn result(n: u64) -> Frame {
    Frame { id: Some(id(n)), event: None, data: r#"{"jsonrpc":"2.0","id":@ID,"result":{"done":true}}"#.into() }
}

fn resync(reason: &str, lost: Option<(u64, u64)>, at: u64, head: u64) -> Frame {
    let after = lost.map_or(at, |(from, _)| from - 1);
    let (from, to) = (lost.map(|l| l.0), lost.map(|l| l.1));
    let data =
        json!({"reason": reason, "stream": "r1", "after": after, "lost_from": from, "lost_to": to, "head": head});
    Frame { id: Some(id(at)), event: Some("resync"), data: data.to_string() }
}

fn trailer(reason: &str) -> Frame {
    let data = json!({"jsonrpc": "2.0", "id": "@ID", "error": {"code": -32000, "message": reason, "data": {"reason": reason}}});
    Frame { id: None, event: None, data: data.to_string().replace("\"@ID\"", "@ID") }
}

/// What a resume gets.
#[derive(Debug, Clone)]
enum Resume {
    /// 200, these events, then the connection ends.
    Stream(Vec<Frame>),
    /// The same with another replay epoch in the header.
    OtherEpoch(Vec<Frame>),
    /// This status and no stream.
    Status(u16),
    /// 200 with a JSON body instead of a stream.
    Json,
}

struct Scripted {
    /// The call's answer: these events, then the connection ends (cut).
    call: Vec<Frame>,
    resumes: VecDeque<Resume>,
    /// What happened: the cursors of resumes, and how many sessions were initialized.
    cursors: Vec<String>,
    initializes: u32,
    call_id: Value,
    /// What plain GETs (the standalone stream) get, in turn; 405 once they run out.
    standalone: VecDeque<Resume>,
    /// Whether the server speaks only 2026-07-28: it refuses the sessionful `initialize` and
    /// answers `server/discover`.
    stateless: bool,
    /// How many `server/discover`s to refuse first with -32022, naming 2026-07-28 as supported.
    refuse_discover: u32,
}

/// The frames as one connection's body, after the `retry` a server announces when it may close
/// a stream for the client to come back (SEP-1699).
fn sse(frames: &[Frame], call_id: &Value) -> String {
    std::iter::once("retry: 10\n\n".to_owned())
        .chain(frames.iter().map(|f| {
            let id = f.id.as_ref().map(|id| format!("id: {id}\n")).unwrap_or_default();
            let kind = f.event.map(|k| format!("event: {k}\n")).unwrap_or_default();
            format!("{id}{kind}data: {}\n\n", f.data.replace("@ID", &call_id.to_string()))
        }))
        .collect()
}

async fn endpoint(
    State(state): State<Arc<Mutex<Scripted>>>,
    method: Method,
    headers: HeaderMap,
    body: String,
) -> Response {
    let mut state = state.lock().expect("state");
    let stream = |body: String, epoch: &str| {
        Response::builder()
            .header("content-type", "text/event-stream")
            .header("mcp-session-id", "s1")
            .header("x-mcp-replay-epoch", epoch)
            .body(Body::from(body))
            .expect("response")
    };
    let json = |body: Value| {
        Response::builder()
            .header("content-type", "application/json")
            .header("mcp-session-id", "s1")
            .header("x-mcp-replay-epoch", EPOCH)
            .body(Body::from(body.to_string()))
            .expect("response")
    };
    match method {
        Method::POST => {
            let message: Value = serde_json::from_str(&body).unwrap_or_default();
            match message["method"].as_str() {
                Some("initialize") if state.stateless => Response::builder()
                    .status(StatusCode::BAD_REQUEST)
                    .header("content-type", "application/json")
                    .body(Body::from(
                        json!({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32022, "message": "unsupported"}})
                            .to_string(),
                    ))
                    .expect("response"),
                Some("server/discover") if state.stateless && state.refuse_discover > 0 => {
                    state.refuse_discover -= 1;
                    Response::builder()
                        .status(StatusCode::BAD_REQUEST)
                        .header("content-type", "application/json")
                        .body(Body::from(
                            json!({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32022,
                                "message": "unsupported", "data": {"supported": ["2026-07-28"], "requested": "x"}}})
                            .to_string(),
                        ))
                        .expect("response")
                }
                Some("server/discover") if state.stateless => json(json!({"jsonrpc": "2.0", "id": message["id"],
                    "result": {"capabilities": {}, "serverInfo": {"name": "scripted", "version": "1"}}})),
                // A server of the handshake era only knows no such method.
                Some("server/discover") => json(json!({"jsonrpc": "2.0", "id": message["id"],
                    "error": {"code": -32601, "message": "Method not found"}})),
                Some("initialize") => {
                    state.initializes += 1;
                    json(json!({"jsonrpc": "2.0", "id": message["id"], "result": {"protocolVersion": "2025-11-25",
                        "capabilities": {}, "serverInfo": {"name": "scripted", "version": "1"}}}))
                }
                Some("tools/call") => {
                    state.call_id = message["id"].clone();
                    stream(sse(&state.call, &state.call_id), EPOCH)
                }
                _ if message.get("id").is_some() => json(json!({"jsonrpc": "2.0", "id": message["id"], "result": {}})),
                _ => Response::builder().status(StatusCode::ACCEPTED).body(Body::empty()).expect("response"),
            }
        }
        Method::GET => {
            let answer = match headers.get("last-event-id").and_then(|v| v.to_str().ok()) {
                Some(cursor) => {
                    state.cursors.push(cursor.to_owned());
                    state.resumes.pop_front().unwrap_or(Resume::Stream(Vec::new()))
                }
                None => state.standalone.pop_front().unwrap_or(Resume::Status(405)),
            };
            match answer {
                Resume::Stream(frames) => stream(sse(&frames, &state.call_id), EPOCH),
                Resume::OtherEpoch(frames) => stream(sse(&frames, &state.call_id), "AnotherEpochAfterRestart"),
                Resume::Status(status) => Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(
                        json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32001, "message": "gone"}}).to_string(),
                    ))
                    .expect("response"),
                Resume::Json => json(json!({"jsonrpc": "2.0", "id": null, "result": {}})),
            }
        }
        _ => Response::builder().body(Body::empty()).expect("response"),
    }
}

/// How a scenario went: what the application saw, the call's outcome, the cursors of the
/// resumes and how many sessions were initialized.
struct Seen {
    events: Vec<String>,
    /// The detail of each divergence.
    details: Vec<String>,
    /// Each divergence as the application can match on it.
    reasons: Vec<DivergenceReason>,
    outcome: Result<Value, RequestError>,
    cursors: Vec<String>,
    initializes: u32,
}

/// The call's stream: the priming event and events 1 and 2, then the cut.
fn cut_after_two() -> Vec<Frame> {
    vec![priming(), event(1), event(2)]
}

async fn run(call: Vec<Frame>, resumes: Vec<Resume>, adjust: impl FnOnce(&mut ClientConfig)) -> Seen {
    let scripted = Scripted::new(call, resumes);
    run_with(scripted, adjust, |client| async move {
        Some(
            tokio::time::timeout(Duration::from_secs(10), client.call_tool("count", json!({})))
                .await
                .expect("the call ends"),
        )
    })
    .await
}

impl Scripted {
    fn new(call: Vec<Frame>, resumes: Vec<Resume>) -> Scripted {
        Scripted {
            call,
            resumes: resumes.into(),
            cursors: Vec::new(),
            initializes: 0,
            call_id: Value::Null,
            standalone: VecDeque::new(),
            stateless: false,
            refuse_discover: 0,
        }
    }
}

/// Runs `act` with a client of the scripted server, then collects what the client reports
/// until it falls quiet.
async fn run_with<F: std::future::Future<Output = Option<Result<Value, RequestError>>>>(
    scripted: Scripted,
    adjust: impl FnOnce(&mut ClientConfig),
    act: impl FnOnce(Arc<Client>) -> F,
) -> Seen {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/mcp", listener.local_addr().expect("addr"));
    let state = Arc::new(Mutex::new(scripted));
    let app = axum::Router::new().route("/mcp", axum::routing::any(endpoint)).with_state(Arc::clone(&state));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let mut config = ClientConfig::new(url);
    config.backoff =
        Backoff { initial: Duration::from_millis(1), max: Duration::from_millis(5), max_attempts_without_progress: 3 };
    adjust(&mut config);
    let (client, mut events) = Client::connect(config).await.expect("connect");
    let outcome = act(Arc::new(client)).await.unwrap_or(Ok(Value::Null));
    // What the client still reports after the call ended (a re-initialization finishes after
    // the requests it orphaned were resolved), until it falls quiet.
    let mut seen = Vec::new();
    let mut details = Vec::new();
    let mut reasons = Vec::new();
    while let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(300), events.recv()).await {
        match &event {
            ClientEvent::Divergence { reason } => {
                details.push(reason.to_string());
                reasons.push(reason.clone());
            }
            ClientEvent::Closed { reason, .. } => details.push(reason.clone()),
            _ => {}
        }
        seen.push(match event {
            ClientEvent::Message { message: Message::Notification(n), ack, .. } => {
                ack.done();
                format!("message {}", n.params.as_ref().map_or(Value::Null, |p| p["data"]["n"].clone()))
            }
            ClientEvent::Message { .. } => "message".into(),
            ClientEvent::Resumed { verdict, .. } => format!("resumed {}", verdict.as_str()),
            ClientEvent::Resynced { notice, ack, .. } => {
                ack.done();
                match notice.lost {
                    Some(lost) => format!("resynced {}..{}", lost.from, lost.to),
                    None => format!("resynced {}", notice.reason.as_str()),
                }
            }
            ClientEvent::Divergence { reason } => format!("divergence {}", reason.kind()),
            ClientEvent::Reinitialized { .. } => "reinitialized".into(),
            ClientEvent::Closed { fatal, .. } => format!("closed{}", if fatal { " fatal" } else { "" }),
            ClientEvent::Unkeyed { .. } | ClientEvent::Reissued { .. } | ClientEvent::Task { .. } => continue,
        });
    }
    server.abort();
    let state = state.lock().expect("state");
    Seen { events: seen, details, reasons, outcome, cursors: state.cursors.clone(), initializes: state.initializes }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test]
async fn a_continuous_resume_delivers_the_rest_and_the_result() {
    let seen = run(cut_after_two(), vec![Resume::Stream(vec![event(3), result(4)])], |_| {}).await;
    assert_eq!(seen.events, strings(&["message 1", "message 2", "resumed continuous", "message 3"]));
    assert_eq!(seen.outcome.expect("the result")["done"], true);
    assert_eq!(seen.cursors, [id(2)], "resumed from the last event delivered");
}

#[tokio::test]
async fn the_cursors_own_event_again_is_skipped() {
    let seen = run(cut_after_two(), vec![Resume::Stream(vec![event(2), event(3), result(4)])], |_| {}).await;
    assert_eq!(seen.events, strings(&["message 1", "message 2", "resumed duplicate_skipped", "message 3"]));
    assert!(seen.outcome.is_ok());
}

/// The divergences: each reported with its kind, the session re-initialized, and the unkeyed
/// call's outcome unknown (never a result, never a hang).
#[tokio::test]
async fn every_divergence_is_reported_and_leaves_the_outcome_unknown() {
    let mut other = event(2);
    other.data = other.data.replace("\"n\":2", "\"n\":22");
    let not_from_the_cursor = resync("evicted", Some((4, 5)), 5, 7);
    for (resume, kind) in [
        (Resume::Stream(vec![other, event(3), result(4)]), "digest_mismatch"),
        (Resume::Stream(vec![event(5), result(6)]), "gap"),
        (Resume::Stream(vec![event(1), event(2)]), "replay_reset"),
        (Resume::Stream(vec![not_from_the_cursor, event(6), result(7)]), "resync"),
        (Resume::OtherEpoch(vec![event(3), result(4)]), "epoch_changed"),
        (Resume::Status(404), "session_invalid"),
        (Resume::Json, "not_a_stream"),
    ] {
        let seen = run(cut_after_two(), vec![resume.clone()], |_| {}).await;
        let divergence = format!("divergence {kind}");
        assert_eq!(seen.events, strings(&["message 1", "message 2", &divergence, "reinitialized"]), "{resume:?}");
        assert!(matches!(seen.outcome, Err(RequestError::OutcomeUnknown(_))), "{resume:?}: {:?}", seen.outcome);
        assert_eq!(seen.initializes, 2, "{resume:?}");
    }
}

/// A resume the server cannot answer now (503: its store fails over) proves nothing: it is tried
/// again, and the next resume continues the stream, with no divergence and one session.
#[tokio::test]
async fn a_resume_answered_unavailable_is_tried_again_not_taken_for_a_lost_session() {
    let resumes = vec![Resume::Status(503), Resume::Stream(vec![event(3), result(4)])];
    let seen = run(cut_after_two(), resumes, |_| {}).await;
    assert_eq!(seen.events, strings(&["message 1", "message 2", "resumed continuous", "message 3"]));
    assert_eq!(seen.outcome.expect("the result")["done"], true);
    assert_eq!(seen.cursors, [id(2), id(2)], "both resumes from the last event delivered");
    assert_eq!(seen.initializes, 1, "the session was kept");
}

/// The application is told what it lost as values it can match on, not only as a kind: a gap
/// names exactly the events that never arrived.
#[tokio::test]
async fn a_gap_names_the_events_it_lost() {
    let seen = run(cut_after_two(), vec![Resume::Stream(vec![event(5), result(6)])], |_| {}).await;
    assert_eq!(seen.reasons, [DivergenceReason::Lineage(Divergence::Gap { lost: SeqRange { from: 3, to: 4 } })]);
}

#[tokio::test]
async fn an_exact_resync_is_reported_and_the_result_after_it_delivered() {
    let resume = vec![resync("evicted", Some((3, 5)), 5, 7), event(6), result(7)];
    let seen = run(cut_after_two(), vec![Resume::Stream(resume)], |_| {}).await;
    assert_eq!(seen.events, strings(&["message 1", "message 2", "resynced 3..5", "message 6"]));
    assert_eq!(seen.outcome.expect("the result after the gap")["done"], true);
    assert_eq!(seen.initializes, 1, "the same session goes on");
}

#[tokio::test]
async fn an_exact_resync_is_the_cursor_a_later_resume_starts_from() {
    let resumes = vec![
        Resume::Stream(vec![resync("evicted", Some((3, 5)), 5, 9), event(6)]),
        Resume::Stream(vec![event(7), result(8)]),
    ];
    let seen = run(cut_after_two(), resumes, |_| {}).await;
    assert_eq!(seen.cursors, [id(2), id(6)]);
    assert_eq!(
        seen.events,
        strings(&["message 1", "message 2", "resynced 3..5", "message 6", "resumed continuous", "message 7"])
    );
    assert!(seen.outcome.is_ok());
}

#[tokio::test]
async fn an_aborted_request_ends_with_its_error_and_a_lost_result_as_unknown() {
    let aborted = vec![resync("request_aborted", None, 2, 2), trailer("request_aborted")];
    let seen = run(cut_after_two(), vec![Resume::Stream(aborted)], |_| {}).await;
    assert_eq!(seen.events, strings(&["message 1", "message 2", "resynced request_aborted"]));
    let Err(RequestError::Aborted(error)) = seen.outcome else { panic!("aborted, not {:?}", seen.outcome) };
    assert_eq!(error.reason(), Some("request_aborted"));
    let expired = vec![resync("evicted", Some((3, 4)), 4, 4), trailer("request_history_expired")];
    let seen = run(cut_after_two(), vec![Resume::Stream(expired)], |_| {}).await;
    assert_eq!(seen.events, strings(&["message 1", "message 2", "resynced 3..4"]));
    assert!(matches!(seen.outcome, Err(RequestError::OutcomeUnknown(_))), "{:?}", seen.outcome);
    assert_eq!(seen.initializes, 1);
    // Any other error after the gap is the request's own.
    let cancelled = vec![resync("evicted", Some((3, 4)), 4, 4), trailer("request_cancelled")];
    let seen = run(cut_after_two(), vec![Resume::Stream(cancelled)], |_| {}).await;
    let Err(RequestError::Rpc(error)) = seen.outcome else { panic!("the error, not {:?}", seen.outcome) };
    assert_eq!(error.reason(), Some("request_cancelled"));
}

#[tokio::test]
async fn a_stream_that_keeps_closing_without_progress_ends_the_call_as_unknown() {
    let seen = run(cut_after_two(), Vec::new(), |_| {}).await;
    assert!(
        matches!(&seen.outcome, Err(RequestError::OutcomeUnknown(why)) if why.contains("without progress")),
        "{:?}",
        seen.outcome
    );
    assert_eq!(seen.cursors, vec![id(2); 3], "each reconnect from the same cursor, then no more");
    assert_eq!(seen.events, strings(&["message 1", "message 2"]), "no divergence: nothing was disproven");
}

#[tokio::test]
async fn a_stream_cut_before_any_event_id_cannot_be_resumed() {
    let seen = run(Vec::new(), Vec::new(), |_| {}).await;
    assert!(
        matches!(&seen.outcome, Err(RequestError::OutcomeUnknown(why)) if why.contains("before any event id")),
        "{:?}",
        seen.outcome
    );
    assert!(seen.cursors.is_empty(), "no resume without a cursor");
}

#[tokio::test]
async fn ids_without_order_are_a_divergence_unless_trusted() {
    let opaque = |n: u64| Frame { id: Some(format!("evt-{}", ["q", "b", "x", "k", "a"][n as usize])), ..event(n) };
    let call = vec![opaque(0), opaque(1), opaque(2)];
    let rest = || Resume::Stream(vec![opaque(3), Frame { id: Some("evt-z".into()), ..result(4) }]);
    let strict = run(call.clone(), vec![rest()], |_| {}).await;
    assert_eq!(
        strict.events,
        strings(&["message 0", "message 1", "message 2", "divergence unverifiable", "reinitialized"])
    );
    assert!(strict.details[0].contains("carry no order"), "{:?}", strict.details);
    let trusted = run(call, vec![rest()], |config| config.policy = Policy::Trust).await;
    assert_eq!(trusted.events, strings(&["message 0", "message 1", "message 2", "resumed unverified", "message 3"]));
    assert!(trusted.outcome.is_ok());
}

#[tokio::test]
async fn without_reinitialization_a_divergence_closes_the_client_and_sends_nothing_more() {
    let seen = run(cut_after_two(), vec![Resume::Stream(vec![event(5)])], |config| config.reinitialize = false).await;
    assert_eq!(seen.events, strings(&["message 1", "message 2", "divergence gap", "closed fatal"]));
    assert!(matches!(seen.outcome, Err(RequestError::OutcomeUnknown(_))));
    assert_eq!(seen.initializes, 1, "no second initialize");
}

#[tokio::test]
async fn a_resync_on_a_trusted_stream_is_a_divergence() {
    let opaque = |n: u64| Frame { id: Some(format!("evt-{}", ["q", "b", "x", "k", "a"][n as usize])), ..event(n) };
    let call = vec![opaque(0), opaque(1), opaque(2)];
    let resync = Frame { id: Some("evt-r".into()), event: Some("resync"), data: "{}".into() };
    let seen = run(call, vec![Resume::Stream(vec![opaque(3), resync])], |config| config.policy = Policy::Trust).await;
    assert_eq!(
        seen.events,
        strings(&[
            "message 0",
            "message 1",
            "message 2",
            "resumed unverified",
            "message 3",
            "divergence resync",
            "reinitialized"
        ])
    );
    assert!(matches!(seen.outcome, Err(RequestError::OutcomeUnknown(_))), "{:?}", seen.outcome);
}

fn standalone_event(n: u64) -> Frame {
    Frame { id: Some(format!("{EPOCH}:g1:{n}")), ..event(n) }
}

#[tokio::test]
async fn a_refused_standalone_stream_is_tried_again_and_one_the_server_does_not_offer_is_given_up() {
    let follow = |client: Arc<Client>| async move {
        client.follow_standalone().await;
        None
    };
    let mut scripted = Scripted::new(Vec::new(), Vec::new());
    scripted.standalone = [Resume::Status(503), Resume::Stream(vec![standalone_event(1)])].into();
    let seen = run_with(scripted, |_| {}, follow).await;
    assert_eq!(seen.events.first().map(String::as_str), Some("message 1"), "{:?}", seen.events);

    let seen = run_with(Scripted::new(Vec::new(), Vec::new()), |_| {}, follow).await;
    assert_eq!(seen.events, strings(&["closed"]));
    assert!(seen.details[0].contains("no standalone stream (405)"), "{:?}", seen.details);
}

#[tokio::test]
async fn following_the_standalone_stream_waits_for_the_first_attempt_only() {
    // The refusal is tried again after a backoff the caller does not wait out.
    let follow = |client: Arc<Client>| async move {
        let returned = tokio::time::timeout(Duration::from_millis(800), client.follow_standalone()).await;
        assert!(returned.is_ok(), "follow_standalone waited out the backoff after a refusal");
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        None
    };
    let mut scripted = Scripted::new(Vec::new(), Vec::new());
    scripted.standalone = [Resume::Status(404), Resume::Stream(vec![standalone_event(1)])].into();
    let slow = |config: &mut ClientConfig| {
        config.backoff = Backoff {
            initial: Duration::from_millis(1_500),
            max: Duration::from_millis(1_500),
            max_attempts_without_progress: 3,
        };
    };
    let seen = run_with(scripted, slow, follow).await;
    assert_eq!(
        seen.events.first().map(String::as_str),
        Some("message 1"),
        "then it was tried again: {:?}",
        seen.events
    );
}

#[tokio::test]
async fn a_2026_07_28_response_stream_delivers_its_notifications_and_result() {
    let notification = Frame { id: None, ..event(1) };
    let empty = Frame { id: None, event: None, data: String::new() };
    let result = Frame { id: None, ..result(2) };
    let mut scripted = Scripted::new(vec![notification, empty, result], Vec::new());
    scripted.stateless = true;
    let seen = run_with(
        scripted,
        |_| {},
        |client| async move {
            Some(
                tokio::time::timeout(Duration::from_secs(10), client.call_tool("count", json!({})))
                    .await
                    .expect("the call ends"),
            )
        },
    )
    .await;
    assert_eq!(seen.outcome.expect("the result")["done"], true);
    assert_eq!(seen.events, strings(&["message 1"]));
    assert_eq!(seen.initializes, 0, "no session: the sessionful handshake was refused");
}

/// A server that answers `initialize` without saying which version it speaks has no session
/// the client could check continuity against: connecting fails, it does not guess.
#[tokio::test]
async fn an_initialize_result_without_a_protocol_version_is_refused() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/mcp", listener.local_addr().expect("addr"));
    let answer = |body: String| async move {
        let message: Value = serde_json::from_str(&body).unwrap_or_default();
        Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(
                json!({"jsonrpc": "2.0", "id": message["id"], "result": {"capabilities": {}}}).to_string(),
            ))
            .expect("response")
    };
    let app = axum::Router::new().route("/mcp", axum::routing::post(answer));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let connected = Client::connect(ClientConfig::new(url)).await;
    server.abort();
    assert!(matches!(connected, Err(ClientError::Protocol(_))), "{:?}", connected.err());
}

/// A client set to speak 2026-07-28 to a server of the handshake era only (which knows no
/// `server/discover`) speaks that era's newest revision to it, in a session; unless it wants
/// tasks, which only 2026-07-28 has: then connecting fails rather than run calls as plain ones.
#[tokio::test]
async fn a_2026_07_28_client_speaks_the_handshake_era_to_a_server_that_knows_no_other() {
    let seen = run_with(
        Scripted::new(vec![result(1)], Vec::new()),
        |config| config.protocol_version = tether_core::mcp::ProtocolVersion::V2026_07_28,
        |client| async move {
            assert!(!client.is_stateless(), "it speaks 2026-07-28 to a server that does not");
            Some(client.call_tool("count", json!({})).await)
        },
    )
    .await;
    assert_eq!(seen.outcome.expect("the result")["done"], true);
    assert_eq!(seen.initializes, 1, "a session was initialized");

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/mcp", listener.local_addr().expect("addr"));
    let scripted = Arc::new(Mutex::new(Scripted::new(Vec::new(), Vec::new())));
    let app = axum::Router::new().route("/mcp", axum::routing::any(endpoint)).with_state(Arc::clone(&scripted));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let mut config = ClientConfig::new(url);
    config.protocol_version = tether_core::mcp::ProtocolVersion::V2026_07_28;
    config.tasks = true;
    let connected = Client::connect(config).await;
    server.abort();
    assert!(matches!(connected, Err(ClientError::Protocol(_))), "{:?}", connected.err());
    assert_eq!(scripted.lock().expect("state").initializes, 0, "no session for a client that wants tasks");
}

/// SEP-2575: a server that refuses the version it then names as supported is asked once more;
/// twice refused, the client tries the handshake, and once the server refuses that too, asks
/// for discovery twice more. Refused throughout, it gives up instead of asking forever.
#[tokio::test]
async fn a_version_refusal_naming_2026_07_28_is_retried_once() {
    for (refusals, connects) in [(1, true), (4, false)] {
        let mut scripted = Scripted::new(Vec::new(), Vec::new());
        scripted.stateless = true;
        scripted.refuse_discover = refusals;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/mcp", listener.local_addr().expect("addr"));
        let app =
            axum::Router::new().route("/mcp", axum::routing::any(endpoint)).with_state(Arc::new(Mutex::new(scripted)));
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let mut config = ClientConfig::new(url);
        config.protocol_version = tether_core::mcp::ProtocolVersion::V2026_07_28;
        let connected = Client::connect(config).await;
        server.abort();
        assert_eq!(connected.is_ok(), connects, "{refusals} refusals");
    }
}

/// An application of the handshake era, linked to a server of 2026-07-28 only (which refuses
/// `initialize`), is answered in the revision it asked for, with what the server's discovery
/// said of it: an answer naming 2026-07-28 is one such an application refuses.
#[tokio::test]
async fn a_handshake_application_linked_to_a_2026_07_28_server_is_answered_in_its_own_revision() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/mcp", listener.local_addr().expect("addr"));
    let mut scripted = Scripted::new(Vec::new(), Vec::new());
    scripted.stateless = true;
    let app =
        axum::Router::new().route("/mcp", axum::routing::any(endpoint)).with_state(Arc::new(Mutex::new(scripted)));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let (mut link, mut from_server, _events) = tether_client::link::MessageLink::new(ClientConfig::new(url));
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "desktop", "version": "1"}}});
    let message = tether_core::jsonrpc::parse_message(initialize.to_string().as_bytes()).expect("a message");
    link.send(message).await.expect("sent");
    let answer = tokio::time::timeout(Duration::from_secs(10), from_server.recv()).await.expect("answered");
    server.abort();
    let Some(Message::Response(response)) = answer.map(|from| from.message) else { panic!("a response") };
    let result = response.outcome.expect("initialized");
    assert_eq!(result["protocolVersion"], "2025-06-18", "{result}");
    assert_eq!(result["serverInfo"]["name"], "scripted", "{result}");
}
