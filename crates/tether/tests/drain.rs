//! `tether serve` stopped by SIGTERM, as a rolling deploy stops it: it drains. `/readyz` turns
//! 503 at once, a new session is refused 503 `draining` with `Retry-After`, a call in flight
//! finishes with its real result before the process exits 0, and a second signal exits at once.
//! On Redis, a replica whose drain timed out leaves the store: what it still ran is
//! `request_aborted` at the other replicas at once.

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

/// A replica on Redis whose drain times out leaves the store on its way out: the call it still
/// ran ends `request_aborted` for a client resuming at another replica at once, not after the
/// request lease (a minute here) in which the others would wait for its heartbeat to lapse.
#[test]
fn a_replica_past_its_drain_timeout_hands_what_it_ran_over_as_request_aborted_at_once() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let redis = runtime.block_on(tether_testkit::RedisServer::start());
    let dir = temp_dir("drain-leave");
    let args = [
        "--store",
        "redis",
        "--redis-url",
        redis.url.as_str(),
        "--redis-durability",
        "none",
        "--request-lease",
        "60s",
        "--drain-timeout",
        "1s",
    ];
    let (mut leaving, a) = serve(free_port(), &dir.join("a"), &args);
    let (_staying, b) = serve(free_port(), &dir.join("b"), &args);
    let session = raw_session(&a);
    let headers = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("Mcp-Session-Id", session.as_str()),
        ("MCP-Protocol-Version", "2025-11-25"),
    ];
    // Keyed, so that it is answered as a stream at once, its priming event a place to resume from.
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "sleep", "arguments": {"ms": 120_000}, "_meta": {"io.tether/idempotencyKey": "drain-leave"}}});
    let started =
        exchange(&a, "POST", &headers, &call.to_string(), |body| !sse_events(body).is_empty(), Duration::from_secs(10));
    let primed = sse_events(&started.body)[0].0.clone().expect("the priming event's id");
    leaving.signal("TERM");
    assert_eq!(leaving.exit_within(Duration::from_secs(20)).code(), Some(0), "exited once the drain timed out");

    let mut resuming = headers.to_vec();
    resuming[1] = ("Accept", "text/event-stream");
    resuming.push(("Last-Event-ID", primed.as_str()));
    let resumed = exchange(&b, "GET", &resuming, "", |body| answer_of(body).is_some(), Duration::from_secs(20));
    let answer = answer_of(&resumed.body).unwrap_or_else(|| panic!("no answer within 20 s: {}", resumed.body));
    assert_eq!(answer["id"], 7, "{answer}");
    assert_eq!(answer["error"]["data"]["reason"], "request_aborted", "{answer}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `/readyz` asks the store: with its Redis gone, the replica is not ready (503, saying why),
/// though alive; with Redis back, it is ready again.
#[test]
fn readyz_says_503_while_the_store_does_not_answer() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut redis = runtime.block_on(tether_testkit::RedisServer::start());
    let dir = temp_dir("drain-readyz-store");
    let port = free_port();
    let args = ["--store", "redis", "--redis-url", redis.url.as_str(), "--redis-durability", "none"];
    let (_server, _) = serve(port, &dir, &args);
    let base = format!("http://127.0.0.1:{port}");
    assert_eq!(status_of(&base, "/readyz"), 200);
    runtime.block_on(redis.kill());
    let unready = exchange(&format!("{base}/readyz"), "GET", &[], "", |_| false, Duration::from_secs(10));
    assert_eq!(unready.status, 503, "{}", unready.body);
    assert!(unready.body.starts_with("the store does not answer"), "{}", unready.body);
    assert_eq!(status_of(&base, "/healthz"), 200, "alive all the same");
    runtime.block_on(redis.restart());
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while status_of(&base, "/readyz") != 200 {
        assert!(std::time::Instant::now() < deadline, "not ready again with Redis back");
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
