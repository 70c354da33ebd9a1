//! The probe against real servers on loopback: tether itself must pass, and a server with the
//! seed's defects must be caught with the right signatures.

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tether_builtin::BuiltinHandler;
use tether_probe::{ProbeConfig, Report, Verdict, run};
use tether_server::Builder;

struct Served {
    url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(app: Router) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let url = format!("http://{}/mcp", listener.local_addr().expect("local addr"));
    let task = tokio::spawn(async move {
        let _ = tether_server::serve(listener, app, tether_server::ConnectionLimits::default()).await;
    });
    Served { url, task }
}

/// Arguments that make `count` outrun a retention of 10 events per stream.
fn evicting() -> Option<Value> {
    Some(json!({"to": 40}))
}

async fn probe_evicting(url: &str, evict_arguments: Option<Value>) -> Report {
    let config = ProbeConfig {
        url: url.to_owned(),
        tool: None,
        restart_command: None,
        replicas: Vec::new(),
        evict_arguments,
        trust: Default::default(),
        headers: Vec::new(),
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), run(config, |_| {}))
        .await
        .expect("probe finishes")
        .expect("probe runs")
}

fn verdict(report: &Report, id: &str) -> Verdict {
    report.checks.iter().find(|c| c.id == id).unwrap_or_else(|| panic!("no check {id}: {}", report.to_table())).verdict
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tether_passes_every_check() {
    let mut config = tether_server::ServerConfig::default();
    config.retention.max_events_per_stream = 10;
    let server = serve(Builder::new(BuiltinHandler::in_memory()).config(config).build().router("/mcp")).await;
    let report = probe_evicting(&server.url, evicting()).await;
    let not_passed: Vec<_> = report.checks.iter().filter(|c| c.verdict != Verdict::Pass).map(|c| c.id).collect();
    assert!(not_passed.is_empty(), "{not_passed:?}\n{}", report.to_table());
    assert_eq!(report.checks.len(), 13, "every check ran\n{}", report.to_table());
    let evicted = report.checks.iter().find(|c| c.id == "evicted-cursor").expect("the eviction check");
    assert!(evicted.evidence[0].starts_with("exact: 10 replayed, 31 named lost"), "{:?}", evicted.evidence);
    let json: Value = serde_json::from_str(&report.to_json()).expect("report JSON");
    assert_eq!(json["checks"].as_array().map(Vec::len), Some(report.checks.len()));
    assert!(report.to_markdown().starts_with("# tether probe"));
}

/// A server with the seed defects: any session id is accepted (resurrection), every resume is a
/// quiet empty 200, and its streaming tool's stream cannot be resumed.
fn defective() -> Router {
    async fn on_post(headers: HeaderMap, body: String) -> Response {
        let message: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let id = message.get("id").cloned();
        let result = match message.get("method").and_then(Value::as_str) {
            Some("initialize") => {
                json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "defective", "version": "0"}})
            }
            Some("tools/list") => json!({"tools": [{"name": "count", "inputSchema": {"type": "object"}}]}),
            _ => json!({"content": []}),
        };
        let Some(id) = id else { return StatusCode::ACCEPTED.into_response() };
        let session = headers
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("0123456789abcdef0123456789abcdef")
            .to_owned();
        if message.get("method") == Some(&json!("tools/call")) {
            let mut sse = String::new();
            for i in 1..=6 {
                let note = json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": {"count": i}}});
                sse.push_str(&format!("id: {i}\ndata: {note}\n\n"));
            }
            sse.push_str(&format!("id: 7\ndata: {}\n\n", json!({"jsonrpc": "2.0", "id": id, "result": result})));
            return ([("content-type", "text/event-stream"), ("mcp-session-id", session.as_str())], sse)
                .into_response();
        }
        let reply = json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
        ([("content-type", "application/json"), ("mcp-session-id", session.as_str())], reply).into_response()
    }
    async fn on_get() -> Response {
        ([("content-type", "text/event-stream")], "").into_response()
    }
    Router::new().route("/mcp", post(on_post).get(on_get).delete(|| async { StatusCode::OK }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_defective_server_is_caught() {
    let server = serve(defective()).await;
    let report = probe_evicting(&server.url, evicting()).await;
    assert!(report.failed(), "{}", report.to_table());
    let signature = |id: &str| report.checks.iter().find(|c| c.id == id).and_then(|c| c.signature).unwrap_or("");
    assert_eq!(verdict(&report, "unknown-session-404"), Verdict::Fail);
    assert!(signature("unknown-session-404").contains("resurrection"));
    assert_eq!(verdict(&report, "delete-then-404"), Verdict::Fail);
    assert_eq!(verdict(&report, "protocol-version-rejected"), Verdict::Fail);
    assert_eq!(verdict(&report, "mid-stream-resume"), Verdict::Fail);
    assert!(signature("mid-stream-resume").contains("silent empty 200"));
    assert_eq!(verdict(&report, "unknown-cursor"), Verdict::Fail);
    assert_eq!(verdict(&report, "forged-ahead-cursor"), Verdict::Fail);
    assert_eq!(verdict(&report, "result-recoverable"), Verdict::Warn);
    assert_eq!(verdict(&report, "origin-host-rejected"), Verdict::Warn);
    assert_eq!(verdict(&report, "evicted-cursor"), Verdict::Fail);
    assert!(signature("evicted-cursor").contains("silent empty 200"));
    let html = report.to_html();
    assert!(
        html.contains("class=fail") && html.contains("Last-Event-ID &quot;tether-probe-unknown-cursor&quot;"),
        "{html}"
    );
    assert!(!html.contains("<script"));
}

/// A server that says what is gone but discards the retained tail with it (as tether did before
/// exact resync): a resume names everything up to the head as lost, although a later cursor
/// still gets the last events replayed.
fn discards_tail() -> Router {
    async fn on_post(body: String) -> Response {
        let message: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let session = [("mcp-session-id", "0123456789abcdef0123456789abcdef")];
        let Some(id) = message.get("id").cloned() else { return StatusCode::ACCEPTED.into_response() };
        let result = match message.get("method").and_then(Value::as_str) {
            Some("initialize") => {
                json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "lossy", "version": "0"}})
            }
            Some("tools/call") => {
                let mut sse = String::new();
                for i in 1..=6 {
                    let note =
                        json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": {"count": i}}});
                    sse.push_str(&format!("id: {i}\ndata: {note}\n\n"));
                }
                sse.push_str(&format!("id: 7\ndata: {}\n\n", json!({"jsonrpc": "2.0", "id": id, "result": {}})));
                return ([("content-type", "text/event-stream"), session[0]], sse).into_response();
            }
            Some("tools/list") => json!({"tools": [{"name": "count", "inputSchema": {"type": "object"}}]}),
            _ => json!({}),
        };
        (
            [("content-type", "application/json"), session[0]],
            json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string(),
        )
            .into_response()
    }
    async fn on_get(headers: HeaderMap) -> Response {
        let cursor: u64 =
            headers.get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).unwrap_or(0);
        // Events 1..3 are gone; 4..7 retained. The notice claims everything after the cursor.
        let body = if cursor >= 3 {
            (cursor + 1..=7).map(|i| format!("id: {i}\ndata: {{}}\n\n")).collect::<String>()
        } else {
            let notice = json!({"reason": "evicted", "lost_from": cursor + 1, "lost_to": 7, "head": 7});
            format!("id: 7\nevent: resync\ndata: {notice}\n\n")
        };
        ([("content-type", "text/event-stream")], body).into_response()
    }
    Router::new().route("/mcp", post(on_post).get(on_get).delete(|| async { StatusCode::OK }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_that_discards_retained_events_is_lossy() {
    let server = serve(discards_tail()).await;
    let report = probe_evicting(&server.url, evicting()).await;
    let check = report.checks.iter().find(|c| c.id == "evicted-cursor").expect("the eviction check");
    assert_eq!(check.verdict, Verdict::Fail, "{}", report.to_table());
    assert!(check.evidence[0].starts_with("lossy"), "{:?}", check.evidence);
    assert!(check.signature.unwrap_or("").contains("needless loss"), "{:?}", check.signature);
}
