//! `tether serve` stopped by SIGTERM, as a rolling deploy stops it: it drains. `/readyz` turns
//! 503 at once, a new session is refused 503 `draining` with `Retry-After`, a call in flight
//! finishes with its real result before the process exits 0, and a second signal exits at once.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

/// The status of `GET base + path`.
fn status_of(base: &str, path: &str) -> u16 {
    exchange(&format!("{base}{path}"), "GET", &[], "", |_| false, Duration::from_secs(10)).status
}

fn initialize_body() -> String {
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "drain-test", "version": "1"}}})
    .to_string()
}

#[test]
fn sigterm_drains_a_call_in_flight_to_its_result_and_refuses_new_sessions_meanwhile() {
    let dir = temp_dir("drain");
    let port = free_port();
    let (mut server, url) = serve(port, &dir, &["--drain-timeout", "30s"]);
    let base = format!("http://127.0.0.1:{port}");
    assert_eq!((status_of(&base, "/healthz"), status_of(&base, "/readyz")), (200, 200));

    let mut call = tether(&["call", &url, "sleep", "--args", r#"{"ms": 3000}"#, "--retries", "0"]);
    // Until the call runs: the server has its session by then.
    std::thread::sleep(Duration::from_millis(800));
    server.signal("TERM");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(status_of(&base, "/readyz"), 503, "not ready while draining");
    assert_eq!(status_of(&base, "/healthz"), 200, "alive while draining");
    let headers = [("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
    let refused = exchange(&url, "POST", &headers, &initialize_body(), |_| false, Duration::from_secs(10));
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(refused.headers.iter().any(|(name, _)| name == "retry-after"), "{:?}", refused.headers);
    let error: Value = serde_json::from_str(&refused.body).expect("a JSON error");
    assert_eq!(error["error"]["data"]["reason"], "draining", "{error}");

    let lines = parse(&call.rest(Duration::from_secs(20)));
    assert_eq!(call.exit_within(Duration::from_secs(10)).code(), Some(0), "{lines:?}");
    assert_eq!(lines.last().map(|l| l["event"].clone()), Some(json!("result")), "{lines:?}");
    assert_eq!(server.exit_within(Duration::from_secs(20)).code(), Some(0), "drained, then exited 0");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_signal_exits_at_once_whatever_still_runs() {
    let dir = temp_dir("drain-twice");
    let port = free_port();
    let (mut server, url) = serve(port, &dir, &["--drain-timeout", "120s"]);
    let _call = tether(&["call", &url, "sleep", "--args", r#"{"ms": 60000}"#]);
    std::thread::sleep(Duration::from_millis(800));
    server.signal("TERM");
    std::thread::sleep(Duration::from_millis(300));
    assert!(server.child.try_wait().expect("wait").is_none(), "the drain waits for the call");
    server.signal("INT");
    assert_eq!(server.exit_within(Duration::from_secs(20)).code(), Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}
