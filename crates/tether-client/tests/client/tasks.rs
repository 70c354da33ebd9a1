//! How the client follows a task's event stream against a scripted 2026-07-28 server: each event
//! must be the next one and chain to the one before; a gap, a digest that does not chain, or
//! `events_gone` is reported as a divergence, and the task's canonical state (`tasks/get`) gives
//! the call its outcome.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};
use tether_client::{Client, ClientConfig, ClientEvent, DivergenceReason, TaskStreamBreak};
use tether_core::lineage::Digest;
use tether_core::mcp::ProtocolVersion;
use tether_core::tasks::{self, STATUS_EVENT, TaskEvent};

const TASK: &str = "task-1";

/// How the scripted server's stream goes wrong.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Event 1 is skipped: event 2 comes after event 0.
    Gap,
    /// Event 1 carries the digest of another history.
    Digest,
    /// The stream is refused with `events_gone`.
    Gone,
    /// The stream's response comes before the task's final status event, on every connection
    /// (a server whose history ends before the follower's: its store went back).
    EndedEarly,
    /// The stream is refused with `cursor_ahead`: the server's history does not reach the
    /// cursor.
    Ahead,
}

/// The task's events: working, a notification, working again, completed; each chained.
fn events() -> Vec<TaskEvent> {
    let payloads = [
        (STATUS_EVENT, json!({"status": "working"})),
        (tasks::NOTIFICATION_EVENT, json!({"method": "notifications/message", "params": {"data": {"n": 1}}})),
        (tasks::NOTIFICATION_EVENT, json!({"method": "notifications/message", "params": {"data": {"n": 2}}})),
        (STATUS_EVENT, json!({"status": "completed"})),
    ];
    TaskEvent::chain(TASK, payloads)
}

struct Script {
    fault: Fault,
    /// The methods the server was sent, in order.
    seen: Mutex<Vec<String>>,
}

async fn serve(State(script): State<Arc<Script>>, body: String) -> Response {
    let request: Value = serde_json::from_str(&body).unwrap_or_default();
    let method = request["method"].as_str().unwrap_or_default().to_owned();
    script.seen.lock().expect("seen").push(method.clone());
    let id = request["id"].clone();
    let json = |result: Value| {
        let body = json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
        Response::builder().header("content-type", "application/json").body(Body::from(body)).expect("response")
    };
    match method.as_str() {
        "server/discover" => json(json!({"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {},
            "extensions": {tasks::EXTENSION: {}, tasks::STREAMS_EXTENSION: {}}}, "serverInfo": {"name": "s", "version": "1"}})),
        "tools/call" => json(json!({"resultType": "task", "taskId": TASK, "status": "working",
            "createdAt": "2026-12-02T00:00:00Z", "lastUpdatedAt": "2026-12-02T00:00:00Z", "ttlMs": null, "pollIntervalMs": 20})),
        "tasks/get" => json(json!({"resultType": "complete", "taskId": TASK, "status": "completed",
            "createdAt": "2026-12-02T00:00:00Z", "lastUpdatedAt": "2026-12-02T00:00:01Z", "ttlMs": null,
            "result": {"content": [{"type": "text", "text": "done"}]}})),
        "tasks/stream" if matches!(script.fault, Fault::Gone | Fault::Ahead) => {
            let error = match script.fault {
                Fault::Gone => tasks::events_gone(TASK, 7),
                _ => tether_core::jsonrpc::ErrorObject {
                    code: -32602,
                    message: "the cursor names no event".into(),
                    data: Some(json!({"reason": tasks::CURSOR_AHEAD})),
                },
            };
            let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": error.code, "message": error.message, "data": error.data}});
            Response::builder()
                .header("content-type", "application/json")
                .body(Body::from(body.to_string()))
                .expect("response")
        }
        "tasks/stream" => {
            let mut events = events();
            match script.fault {
                Fault::Gap => {
                    events.remove(1);
                }
                Fault::Digest => events[1].digest = Digest::of("another", b"history"),
                Fault::EndedEarly => {
                    events.pop();
                }
                Fault::Gone | Fault::Ahead => {}
            }
            let after = request["params"]["after"].as_u64();
            events.retain(|event| after.is_none_or(|after| event.seq > after));
            let mut body = String::new();
            for event in &events {
                let message = json!({"jsonrpc": "2.0", "method": tasks::method::EVENT, "params": event.params(TASK)});
                body.push_str(&format!("data: {message}\n\n"));
            }
            body.push_str(&format!(
                "data: {}\n\n",
                json!({"jsonrpc": "2.0", "id": id, "result": {"resultType": "complete"}})
            ));
            Response::builder().header("content-type", "text/event-stream").body(Body::from(body)).expect("response")
        }
        _ => Response::builder().status(StatusCode::NOT_FOUND).body(Body::empty()).expect("response"),
    }
}

/// Calls a tool against a server with `fault`: the divergences the client reported, the methods
/// it sent, and the call's result.
async fn follow(fault: Fault) -> (Vec<DivergenceReason>, Vec<String>, Value) {
    let script = Arc::new(Script { fault, seen: Mutex::default() });
    let app = axum::Router::new().route("/mcp", axum::routing::post(serve)).with_state(Arc::clone(&script));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/mcp", listener.local_addr().expect("addr"));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let mut config = ClientConfig::new(url);
    config.protocol_version = ProtocolVersion::V2026_07_28;
    config.tasks = true;
    let (client, mut events) = Client::connect(config).await.expect("connect");
    let result = tokio::time::timeout(std::time::Duration::from_secs(10), client.call_tool("job", json!({})))
        .await
        .expect("the call ends")
        .expect("the task's result");
    server.abort();
    let mut divergences = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let ClientEvent::Divergence { reason } = event {
            divergences.push(reason);
        }
    }
    let seen = script.seen.lock().expect("seen").clone();
    (divergences, seen, result)
}

fn broke(divergences: &[DivergenceReason]) -> Vec<TaskStreamBreak> {
    divergences
        .iter()
        .map(|reason| match reason {
            DivergenceReason::TaskStream { task_id, broke } if task_id == TASK => broke.clone(),
            other => panic!("not a task stream divergence: {other}"),
        })
        .collect()
}

#[tokio::test]
async fn a_gap_in_a_task_stream_is_a_divergence_and_the_task_state_decides() {
    let (divergences, seen, result) = follow(Fault::Gap).await;
    assert_eq!(broke(&divergences), [TaskStreamBreak::Gap { expected: 1, got: 2 }]);
    assert_eq!(result["content"][0]["text"], "done");
    assert_eq!(seen.last().map(String::as_str), Some("tasks/get"), "{seen:?}");
}

#[tokio::test]
async fn an_event_that_does_not_chain_is_a_divergence() {
    let (divergences, _, result) = follow(Fault::Digest).await;
    assert_eq!(broke(&divergences), [TaskStreamBreak::Digest { seq: 1 }]);
    assert_eq!(result["content"][0]["text"], "done");
}

#[tokio::test]
async fn a_stream_that_ends_before_the_task_s_final_status_is_a_divergence_not_a_cut() {
    let (divergences, seen, result) = follow(Fault::EndedEarly).await;
    assert_eq!(broke(&divergences), [TaskStreamBreak::EndedEarly { after: Some(2) }]);
    assert_eq!(result["content"][0]["text"], "done");
    assert_eq!(seen.iter().filter(|m| *m == "tasks/stream").count(), 1, "not resumed as a cut: {seen:?}");
}

#[tokio::test]
async fn a_cursor_the_server_s_history_does_not_reach_is_a_divergence_not_a_lost_task() {
    let (divergences, _, result) = follow(Fault::Ahead).await;
    assert_eq!(broke(&divergences), [TaskStreamBreak::EndedEarly { after: None }]);
    assert_eq!(result["content"][0]["text"], "done");
}

#[tokio::test]
async fn events_gone_is_a_divergence_never_a_silent_skip() {
    let (divergences, _, result) = follow(Fault::Gone).await;
    assert_eq!(broke(&divergences), [TaskStreamBreak::EventsGone { after: None, earliest: Some(7) }]);
    assert_eq!(result["content"][0]["text"], "done");
}

/// Messages' `count`s among `events`, and the task's id if one was reported.
fn counts(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<ClientEvent>,
    into: &mut Vec<u64>,
    task: &mut Option<String>,
) {
    while let Ok(event) = events.try_recv() {
        match event {
            ClientEvent::Message { message: tether_core::jsonrpc::Message::Notification(n), .. } => {
                into.extend(n.params.and_then(|p| p["data"]["count"].as_u64()));
            }
            ClientEvent::Task { task_id, .. } => *task = Some(task_id),
            _ => {}
        }
    }
}

#[tokio::test]
async fn a_restarted_client_follows_a_task_on_from_its_checkpoint_exactly() {
    use tether_builtin::BuiltinHandler;
    use tether_server::Builder;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/mcp", listener.local_addr().expect("addr"));
    let app = Builder::new(BuiltinHandler::in_memory()).build().router("/mcp");
    let server = tokio::spawn(async move {
        let _ = tether_server::serve(listener, app, tether_server::ConnectionLimits::default()).await;
    });
    let file = std::env::temp_dir().join(format!("tether-task-checkpoint-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let config = || {
        let mut config = ClientConfig::new(url.clone());
        config.protocol_version = ProtocolVersion::V2026_07_28;
        config.tasks = true;
        config.checkpoint_file = Some(file.clone());
        config
    };
    let (first, mut first_events) = Client::connect(config()).await.expect("connect");
    let call = tokio::spawn({
        let first = first.clone();
        async move { first.call_tool("count", json!({"to": 40, "interval_ms": 20})).await }
    });
    let (mut seen, mut task) = (Vec::new(), None);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while seen.len() < 5 {
        assert!(tokio::time::Instant::now() < deadline, "the first client saw {seen:?}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        counts(&mut first_events, &mut seen, &mut task);
    }
    call.abort();
    let _ = call.await;
    drop(first);
    // What was handed to the application before the first client stopped is its.
    counts(&mut first_events, &mut seen, &mut task);
    let task = task.expect("the call became a task");
    let saved = tether_client::CheckpointFile::load(&file).expect("the checkpoint");
    assert_eq!(saved.tasks.get(&task).map(|c| c.seq), Some(seen.len() as u64), "working, then one event per count");

    let (second, mut second_events) = Client::connect(config()).await.expect("connect again");
    let result = tokio::time::timeout(std::time::Duration::from_secs(10), second.follow_task(&task))
        .await
        .expect("the task ends")
        .expect("its result");
    assert_eq!(result["content"][0]["text"], "counted to 40");
    let mut rest = Vec::new();
    counts(&mut second_events, &mut rest, &mut None);
    seen.extend(rest);
    assert_eq!(seen, (1..=40).collect::<Vec<u64>>(), "every count once, in order, across the restart");
    let saved = tether_client::CheckpointFile::load(&file).expect("the checkpoint");
    assert!(saved.tasks.is_empty(), "a finished task is no longer followed");
    server.abort();
    let _ = std::fs::remove_file(&file);
}
