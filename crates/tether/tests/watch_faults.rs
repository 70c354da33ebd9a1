//! `tether watch` against a fault-injecting MCP server: every failure signature of seed 000 and
//! every divergence kind is reported with the right `kind`, and the client re-initializes.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

/// What the server does when the client resumes its first stream.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// Restarted, kept counting ids, lost the buffer: new epoch, ids go on.
    GapWithContinuousIds,
    /// The same, from a server that never advertised an epoch.
    GapWithContinuousIdsNoEpoch,
    /// Accepted the stale session id with fresh state: new incarnation, ids from 1.
    SessionResurrection,
    /// A replica without the buffer starts from id 1, same session and epoch.
    ReplayFromZero,
    SessionChanged,
    EpochChanged,
    NotFound,
    /// Events skipped at the resume.
    Gap,
    /// The cursor's event again, byte for byte, then the rest: not a divergence.
    BoundaryDuplicate,
    /// The cursor's id with other content.
    BoundaryOtherContent,
    /// A clean resume, then a jump in the middle of the resumed stream.
    JumpMidStream,
    /// Ids that carry no order.
    OpaqueIds,
    Resync,
    /// The first session is gone by the time `notifications/initialized` arrives (404), as when
    /// a balancer sends it to a replica that never had it.
    LostAfterInitialize,
}

struct Faulty {
    fault: Fault,
    sessions: u32,
    /// The `Last-Event-ID` of every resume, in order.
    cursors: Vec<String>,
}

fn uses_epoch(fault: Fault) -> bool {
    fault != Fault::GapWithContinuousIdsNoEpoch
}

fn id(fault: Fault, n: u64) -> String {
    if fault == Fault::OpaqueIds {
        format!("evt-{}", ["k", "b", "x", "a", "q", "c"][n as usize % 6])
    } else {
        n.to_string()
    }
}

fn message(n: u64) -> String {
    json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": {"n": n}}})
        .to_string()
}

fn sse(events: &[(String, Option<&str>, String)]) -> String {
    events
        .iter()
        .map(|(id, kind, data)| {
            let kind = kind.map(|k| format!("event: {k}\n")).unwrap_or_default();
            format!("id: {id}\n{kind}retry: 10\ndata: {data}\n\n")
        })
        .collect()
}

async fn endpoint(
    State(state): State<Arc<Mutex<Faulty>>>,
    method: Method,
    headers: HeaderMap,
    body: String,
) -> Response {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let session = header("mcp-session-id").unwrap_or_default();
    let mut state = state.lock().expect("state");
    let fault = state.fault;
    let epoch_of = |session: &str| format!("epoch-{session}");
    if method == Method::POST {
        let message: Value = serde_json::from_str(&body).unwrap_or_default();
        if message["method"] == "initialize" {
            state.sessions += 1;
            let session = format!("s{}", state.sessions);
            let mut builder =
                Response::builder().header("content-type", "application/json").header("mcp-session-id", &session);
            if uses_epoch(fault) {
                builder = builder.header("x-mcp-replay-epoch", epoch_of(&session));
            }
            let result = json!({"jsonrpc": "2.0", "id": message["id"], "result": {"protocolVersion": "2025-11-25",
                "capabilities": {}, "serverInfo": {"name": "faulty", "version": "1"}}});
            return builder.body(Body::from(result.to_string())).expect("response");
        }
        if fault == Fault::LostAfterInitialize && session == "s1" {
            return Response::builder().status(StatusCode::NOT_FOUND).body(Body::empty()).expect("response");
        }
        return Response::builder().status(StatusCode::ACCEPTED).body(Body::empty()).expect("response");
    }
    if method == Method::DELETE {
        return Response::builder().body(Body::empty()).expect("response");
    }
    let mut echo = session.clone();
    let mut epoch = uses_epoch(fault).then(|| epoch_of(&session));
    let respond = |echo: &str, epoch: Option<String>, body: Body| {
        let mut builder =
            Response::builder().header("content-type", "text/event-stream").header("mcp-session-id", echo);
        if let Some(epoch) = epoch {
            builder = builder.header("x-mcp-replay-epoch", epoch);
        }
        builder.body(body).expect("response")
    };
    let first = || (1..=3).map(|n| (id(fault, n), None, message(n))).collect::<Vec<_>>();
    let Some(cursor) = header("last-event-id") else {
        // A new standalone stream: three events, then the connection drops (first session),
        // or one event and a stream that stays open (after re-initialization).
        if session != "s1" {
            return respond(&echo, epoch, live(sse(&[(id(fault, 1), None, message(100))])));
        }
        return respond(&echo, epoch, Body::from(sse(&first())));
    };
    // Asserted by the test (a panic here would only end this connection).
    state.cursors.push(cursor);
    let plain =
        |range: std::ops::RangeInclusive<u64>| range.map(|n| (id(fault, n), None, message(n))).collect::<Vec<_>>();
    let events = match fault {
        Fault::GapWithContinuousIds => {
            epoch = Some("epoch-after-restart".into());
            plain(4..=5)
        }
        Fault::GapWithContinuousIdsNoEpoch | Fault::OpaqueIds => plain(4..=5),
        Fault::SessionResurrection => {
            epoch = Some("epoch-resurrected".into());
            plain(1..=2)
        }
        Fault::ReplayFromZero => plain(1..=2),
        Fault::SessionChanged => {
            echo = "another-session".into();
            plain(4..=5)
        }
        Fault::EpochChanged => {
            epoch = Some("epoch-other".into());
            plain(4..=5)
        }
        Fault::NotFound => {
            let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32001, "message": "Session not found"}});
            return Response::builder()
                .status(StatusCode::NOT_FOUND)
                .body(Body::from(body.to_string()))
                .expect("response");
        }
        Fault::Gap => plain(6..=7),
        // No resume happens in this scenario; a clean one if it did.
        Fault::LostAfterInitialize => plain(4..=5),
        Fault::BoundaryDuplicate => plain(3..=5),
        Fault::BoundaryOtherContent => vec![(id(fault, 3), None, message(33))],
        Fault::JumpMidStream => vec![(id(fault, 4), None, message(4)), (id(fault, 7), None, message(7))],
        Fault::Resync => {
            let notice =
                json!({"reason": "evicted", "stream": "get", "after": 3, "lost_from": 4, "lost_to": 9, "head": 9});
            vec![("9".into(), Some("resync"), notice.to_string())]
        }
    };
    respond(&echo, epoch, live(sse(&events)))
}

/// A body that sends `text` and then stays open for a while, like a live stream.
fn live(text: String) -> Body {
    use futures_util::StreamExt;
    let open = futures_util::stream::once(async {
        tokio::time::sleep(Duration::from_secs(20)).await;
        Ok::<_, std::convert::Infallible>(String::new())
    });
    Body::from_stream(futures_util::stream::iter([Ok(text)]).chain(open))
}

struct Watch(Child);

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `tether watch` against a server with `fault` and returns its JSON lines, read until
/// `done` says so (bounded in time); asserts that the client resumed the first stream from the
/// last event it delivered.
fn watch(fault: Fault, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
    let url = format!("http://{}/mcp", listener.local_addr().expect("addr"));
    let state = Arc::new(Mutex::new(Faulty { fault, sessions: 0, cursors: Vec::new() }));
    let app = axum::Router::new().route("/mcp", axum::routing::any(endpoint)).with_state(Arc::clone(&state));
    runtime.spawn(async move { axum::serve(listener, app).await });
    let child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["watch", &url])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn tether watch");
    let mut watch = Watch(child);
    let stdout = watch.0.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut lines = Vec::new();
    while !done(&lines) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => lines.push(serde_json::from_str(&line).expect("JSON line")),
            Err(_) => break,
        }
    }
    drop(watch);
    runtime.shutdown_background();
    let cursors = std::mem::take(&mut state.lock().expect("state").cursors);
    // Every scenario but the lost handshake resumes the first session's stream once.
    if fault != Fault::LostAfterInitialize {
        assert_eq!(cursors.first(), Some(&id(fault, 3)), "{fault:?}: the client resumes from its last processed event");
    }
    lines
}

fn reinitialized(lines: &[Value]) -> bool {
    lines.iter().any(|l| l["event"] == "reinitialized")
}

/// Asserts the first divergence has `kind`, nothing from the diverged stream was delivered,
/// and the client re-initialized.
fn assert_diverges(fault: Fault, kind: &str) {
    let lines = watch(fault, reinitialized);
    let divergences: Vec<&Value> = lines.iter().filter(|l| l["event"] == "divergence").collect();
    assert!(!divergences.is_empty(), "{fault:?}: no divergence in {lines:?}");
    assert_eq!(divergences[0]["kind"], kind, "{fault:?}: {lines:?}");
    assert!(reinitialized(&lines), "{fault:?}: no re-initialization in {lines:?}");
    let delivered: Vec<u64> = lines
        .iter()
        .take_while(|l| l["event"] != "divergence")
        .filter(|l| l["event"] == "message")
        .filter_map(|l| l["message"]["params"]["data"]["n"].as_u64())
        .collect();
    assert_eq!(delivered, [1, 2, 3], "{fault:?}: only the proven events are delivered");
}

#[test]
fn signature_gap_with_continuous_ids_is_an_epoch_change() {
    assert_diverges(Fault::GapWithContinuousIds, "epoch_changed");
}

#[test]
fn signature_gap_with_continuous_ids_without_epoch_is_unverifiable() {
    assert_diverges(Fault::GapWithContinuousIdsNoEpoch, "unverifiable");
}

#[test]
fn signature_session_resurrection_is_an_epoch_change() {
    assert_diverges(Fault::SessionResurrection, "epoch_changed");
}

#[test]
fn signature_replay_from_zero_is_a_replay_reset() {
    assert_diverges(Fault::ReplayFromZero, "replay_reset");
}

#[test]
fn changed_session_id_is_reported() {
    assert_diverges(Fault::SessionChanged, "session_changed");
}

#[test]
fn changed_epoch_is_reported() {
    assert_diverges(Fault::EpochChanged, "epoch_changed");
}

#[test]
fn not_found_is_session_invalid() {
    assert_diverges(Fault::NotFound, "session_invalid");
}

#[test]
fn skipped_events_are_a_gap() {
    assert_diverges(Fault::Gap, "gap");
}

#[test]
fn boundary_event_with_other_content_is_a_digest_mismatch() {
    assert_diverges(Fault::BoundaryOtherContent, "digest_mismatch");
}

#[test]
fn jump_in_the_middle_of_a_resumed_stream_is_a_gap() {
    let lines = watch(Fault::JumpMidStream, reinitialized);
    let kinds: Vec<&Value> = lines.iter().filter(|l| l["event"] == "divergence").map(|l| &l["kind"]).collect();
    assert_eq!(kinds.first().copied(), Some(&json!("gap")), "{lines:?}");
    assert!(lines.iter().any(|l| l["event"] == "resumed" && l["verdict"] == "continuous"), "{lines:?}");
    assert!(reinitialized(&lines));
    // Event 4 continues the stream and is delivered; event 7 jumps and is held back.
    let delivered: Vec<u64> = lines
        .iter()
        .take_while(|l| l["event"] != "divergence")
        .filter_map(|l| l["message"]["params"]["data"]["n"].as_u64())
        .collect();
    assert_eq!(delivered, [1, 2, 3, 4], "{lines:?}");
    let gap = lines.iter().find(|l| l["event"] == "divergence").expect("the gap");
    assert!(gap["detail"].as_str().is_some_and(|d| d.contains("events 5..=6 were skipped")), "the lost range: {gap}");
}

#[test]
fn opaque_ids_are_unverifiable() {
    assert_diverges(Fault::OpaqueIds, "unverifiable");
}

#[test]
fn resync_event_is_reported() {
    assert_diverges(Fault::Resync, "resync");
}

#[test]
fn boundary_duplicate_is_skipped_without_divergence() {
    let five = |lines: &[Value]| lines.iter().any(|l| l["message"]["params"]["data"]["n"] == 5);
    let lines = watch(Fault::BoundaryDuplicate, five);
    let delivered: Vec<u64> = lines
        .iter()
        .filter(|l| l["event"] == "message")
        .filter_map(|l| l["message"]["params"]["data"]["n"].as_u64())
        .collect();
    assert_eq!(delivered, [1, 2, 3, 4, 5], "no duplicate message: {lines:?}");
    assert!(lines.iter().all(|l| l["event"] != "divergence"), "{lines:?}");
    assert!(lines.iter().any(|l| l["event"] == "resumed" && l["verdict"] == "duplicate_skipped"), "{lines:?}");
}

#[test]
fn a_session_lost_during_the_handshake_is_replaced_by_a_new_handshake() {
    let lines = watch(Fault::LostAfterInitialize, |lines| !lines.is_empty());
    let first = lines.first().unwrap_or_else(|| panic!("no output: the handshake was not retried"));
    assert_eq!(first["event"], "message", "{lines:?}");
    assert_eq!(first["message"]["params"]["data"]["n"], 100, "the stream of the second session: {lines:?}");
}
