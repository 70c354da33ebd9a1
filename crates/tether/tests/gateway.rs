//! `tether gateway -- COMMAND` in front of a real stdio MCP server (tests/gateway/stdio_server.py,
//! standard library only): one child per session, its traffic both ways, and what happens when
//! the child dies or the session ends.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::*;

const SERVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/gateway/stdio_server.py");

/// `tether gateway` on the memory store in front of the test server; returns it once it listens.
fn gateway() -> (Process, String) {
    start(&["--store", "memory", "--listen", &format!("127.0.0.1:{}", free_port())])
}

/// `tether gateway` with `flags` in front of the test server; returns it once it listens.
fn start(flags: &[&str]) -> (Process, String) {
    start_before(flags, &["--", "python3", SERVER])
}

/// `tether gateway` with `flags` in front of `upstream` (`--upstream URL` or `-- COMMAND...`).
fn start_before(flags: &[&str], upstream: &[&str]) -> (Process, String) {
    let mut args = vec!["gateway"];
    args.extend_from_slice(flags);
    args.extend_from_slice(upstream);
    let process = tether(&args);
    let first = process.line(Duration::from_secs(30)).expect("tether gateway started");
    let url = first.strip_prefix("listening on ").expect("listening line").to_owned();
    (process, url)
}

const LEGACY: &str = "2025-11-25";

/// A legacy session, initialized; its id.
fn initialize(url: &str) -> String {
    let body = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": {"roots": {}},
        "clientInfo": {"name": "gateway-test", "version": "1"}}});
    let response = send(url, None, &body);
    assert_eq!(response.status, 200, "{}", response.body);
    let session = response.headers.iter().find(|(name, _)| name == "mcp-session-id").expect("a session id").1.clone();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(send(url, Some(&session), &initialized).status, 202);
    session
}

/// POSTs `body` (on `session`) and reads the whole answer.
fn send(url: &str, session: Option<&str>, body: &Value) -> Exchanged {
    let mut headers = vec![
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("MCP-Protocol-Version", LEGACY),
    ];
    if let Some(session) = session {
        headers.push(("Mcp-Session-Id", session));
    }
    exchange(url, "POST", &headers, &body.to_string(), |_| false, Duration::from_secs(20))
}

/// The JSON-RPC messages of an answer, whether JSON or SSE.
fn messages(body: &str) -> Vec<Value> {
    if let Ok(value) = serde_json::from_str::<Value>(body) {
        return vec![value];
    }
    body.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str(data).ok())
        .collect()
}

/// Calls `tool` on `session` with a progress token; every message of the answer.
fn call(url: &str, session: &str, tool: &str, arguments: Value) -> Vec<Value> {
    static NEXT_ID: AtomicU64 = AtomicU64::new(100);
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": tool, "arguments": arguments, "_meta": {"progressToken": "p"}}});
    let response = send(url, Some(session), &body);
    assert_eq!(response.status, 200, "{tool}: {}", response.body);
    messages(&response.body)
}

/// The text of the result among `messages`.
fn result_text(messages: &[Value]) -> String {
    let last = messages.last().expect("an answer");
    last["result"]["content"][0]["text"].as_str().unwrap_or_else(|| panic!("no result: {messages:?}")).to_owned()
}

fn alive(pid: &str) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Waits at most ten seconds for `done`.
fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn each_session_gets_its_own_child_and_its_traffic_both_ways() {
    let (_gateway, url) = gateway();
    let (a, b) = (initialize(&url), initialize(&url));
    let pid_a = result_text(&call(&url, &a, "pid", json!({})));
    let pid_b = result_text(&call(&url, &b, "pid", json!({})));
    assert_ne!(pid_a, pid_b, "two sessions share one child");
    assert_eq!(result_text(&call(&url, &a, "pid", json!({}))), pid_a, "a session's child changed");

    // Progress flows back on the request's stream, under the client's own token.
    let counted = call(&url, &a, "count", json!({"to": 4}));
    let steps: Vec<&Value> =
        counted.iter().filter_map(|m| m["params"]["progress"].as_u64().map(|_| &m["params"])).collect();
    assert_eq!(steps.len(), 4, "{counted:?}");
    assert!(steps.iter().all(|p| p["progressToken"] == "p"), "{counted:?}");
    assert_eq!(result_text(&counted), "counted to 4");

    // The child's request to the client goes out on the call's stream, and the answer the
    // client POSTs back reaches the child under the child's own id (tether's client answers
    // `roots/list` with no roots).
    let out = parse(&tether(&["call", &url, "roots"]).rest(Duration::from_secs(30)));
    let last = out.last().expect("tether call printed its outcome");
    assert_eq!(last["event"], "result", "{out:?}");
    assert_eq!(last["result"]["content"][0]["text"], "0 roots", "{out:?}");
}

#[test]
fn a_child_that_dies_ends_its_session_as_upstream_lost_and_its_calls_as_request_aborted() {
    let listen = format!("127.0.0.1:{}", free_port());
    let (gateway, url) = start(&["--store", "memory", "--listen", &listen, "--metrics", "127.0.0.1:0"]);
    let scrape = gateway.line(Duration::from_secs(10)).expect("the metrics line");
    let scrape = scrape.strip_prefix("metrics on ").expect("metrics on URL").to_owned();
    let session = initialize(&url);
    let pid = result_text(&call(&url, &session, "pid", json!({})));
    let (url_, session_) = (url.clone(), session.clone());
    let running = std::thread::spawn(move || call(&url_, &session_, "count", json!({"to": 1000, "interval_ms": 20})));
    std::thread::sleep(Duration::from_millis(300));
    let crashed = send(
        &url,
        Some(&session),
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "crash", "arguments": {}}}),
    );
    // Both calls end with an error that says their outcome was cut short, never silence.
    for answer in [messages(&crashed.body), running.join().expect("the running call")] {
        let last = answer.last().expect("an answer");
        assert_eq!(last["error"]["data"]["reason"], "request_aborted", "{answer:?}");
    }
    eventually("the child is still there", || !alive(&pid));
    // The session is gone (once its calls have recorded their answers), and says why: a client
    // starts a new one.
    let ping = json!({"jsonrpc": "2.0", "id": 3, "method": "ping"});
    eventually("the session outlived its child", || send(&url, Some(&session), &ping).status == 404);
    let refused = send(&url, Some(&session), &ping);
    let error: Value = serde_json::from_str(&refused.body).expect("a JSON error");
    assert_eq!(error["error"]["data"]["reason"], "upstream_lost", "{error}");
    // A new session gets a new child.
    let again = initialize(&url);
    assert_ne!(result_text(&call(&url, &again, "pid", json!({}))), pid);
    // Counted: one session lost with its upstream, and one child running (the new session's).
    let metrics = exchange(&scrape, "GET", &[], "", |_| false, Duration::from_secs(10)).body;
    assert!(metrics.contains("tether_sessions_ended_by_server_total{reason=\"upstream_lost\"} 1"), "{metrics}");
    assert!(metrics.contains("tether_upstream_instances 1"), "{metrics}");
}

#[test]
fn ending_a_session_stops_its_child() {
    let (_gateway, url) = gateway();
    let session = initialize(&url);
    let pid = result_text(&call(&url, &session, "pid", json!({})));
    assert!(alive(&pid));
    let deleted = exchange(
        &url,
        "DELETE",
        &[("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", LEGACY)],
        "",
        |_| false,
        Duration::from_secs(10),
    );
    assert_eq!(deleted.status, 200);
    eventually("the child outlived its session", || !alive(&pid));
}

#[test]
fn a_2026_07_28_request_is_served_by_a_child_of_its_own() {
    let (_gateway, url) = gateway();
    let modern = |tool: &str, arguments: Value| {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": tool, "arguments": arguments,
            "_meta": {"progressToken": "m", "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {}}}});
        let headers = [
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", tool),
        ];
        let response = exchange(&url, "POST", &headers, &body.to_string(), |_| false, Duration::from_secs(20));
        assert_eq!(response.status, 200, "{}", response.body);
        messages(&response.body)
    };
    let answer = modern("count", json!({"to": 3}));
    assert_eq!(answer.iter().filter(|m| m["method"] == "notifications/progress").count(), 3, "{answer:?}");
    assert_eq!(result_text(&answer), "counted to 3");
    // Each request its own child, stopped once the request is answered.
    let (first, second) = (result_text(&modern("pid", json!({}))), result_text(&modern("pid", json!({}))));
    assert_ne!(first, second, "two requests shared a child");
    eventually("a request's child outlived it", || !alive(&first) && !alive(&second));
}

#[test]
fn a_session_begun_before_a_restart_ends_as_upstream_lost_instead_of_meeting_a_fresh_child() {
    let dir = temp_dir("gateway-restart");
    let listen = format!("127.0.0.1:{}", free_port());
    let flags = ["--data-dir", dir.to_str().expect("utf-8 path"), "--listen", listen.as_str()];
    let (mut gateway, url) = start(&flags);
    let session = initialize(&url);
    let pid = result_text(&call(&url, &session, "pid", json!({})));
    gateway.kill9();
    let (_gateway, url) = start(&flags);
    // The embedded store kept the session, but its child's state died with the old process: the
    // session ends, and says why, instead of a fresh child answering under the old session id.
    let body = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "pid", "arguments": {}}});
    let refused = send(&url, Some(&session), &body);
    assert_eq!(refused.status, 404, "{}", refused.body);
    let error: Value = serde_json::from_str(&refused.body).expect("a JSON error");
    assert_eq!(error["error"]["data"]["reason"], "upstream_lost", "{error}");
    let ping = json!({"jsonrpc": "2.0", "id": 4, "method": "ping"});
    assert_eq!(send(&url, Some(&session), &ping).status, 404);
    let again = initialize(&url);
    assert_ne!(result_text(&call(&url, &again, "pid", json!({}))), pid);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_http_upstream_carries_requests_both_ways_and_its_lost_session_ends_the_downstream_one() {
    let dir = temp_dir("gateway-http-upstream");
    let upstream_port = free_port();
    let (mut upstream, upstream_url) = serve(upstream_port, &dir, &["--store", "memory"]);
    let listen = format!("127.0.0.1:{}", free_port());
    let (_gateway, url) = start_before(&["--store", "memory", "--listen", &listen], &["--upstream", &upstream_url]);

    // The upstream asks the client (elicitation) in the middle of a call: the request crosses
    // the gateway to the client and the answer back, under ids each side knows.
    let out = parse(&tether(&["call", &url, "test_elicitation_sep1034_defaults"]).rest(Duration::from_secs(30)));
    let last = out.last().expect("tether call printed its outcome");
    assert_eq!(last["event"], "result", "{out:?}");
    assert_eq!(last["result"]["content"][0]["text"].as_str().map(|t| t.contains("accept")), Some(true), "{out:?}");

    let session = initialize(&url);
    assert_eq!(result_text(&call(&url, &session, "count", json!({"to": 3}))), "counted to 3");
    // The upstream restarts on the memory store: its session is gone, and so is the downstream
    // one, with the reason, instead of a new upstream session answering as if nothing happened.
    upstream.kill9();
    let (_upstream, _) = serve(upstream_port, &dir, &["--store", "memory"]);
    let answer = call(&url, &session, "count", json!({"to": 3}));
    let reason = answer.last().expect("an answer")["error"]["data"]["reason"].clone();
    assert!(
        ["not_executed", "outcome_unknown", "request_aborted"].contains(&reason.as_str().unwrap_or_default()),
        "{answer:?}"
    );
    let ping = json!({"jsonrpc": "2.0", "id": 9, "method": "ping"});
    eventually("the session outlived its upstream session", || send(&url, Some(&session), &ping).status == 404);
    let refused: Value = serde_json::from_str(&send(&url, Some(&session), &ping).body).expect("a JSON error");
    assert_eq!(refused["error"]["data"]["reason"], "upstream_lost", "{refused}");
    // A new downstream session gets a new upstream session.
    let again = initialize(&url);
    assert_eq!(result_text(&call(&url, &again, "count", json!({"to": 2}))), "counted to 2");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn max_sessions_bounds_the_children() {
    let listen = format!("127.0.0.1:{}", free_port());
    let (gateway, url) = start(&["--store", "memory", "--listen", &listen, "--max-sessions", "2"]);
    let (a, b) = (initialize(&url), initialize(&url));
    let pids = [result_text(&call(&url, &a, "pid", json!({}))), result_text(&call(&url, &b, "pid", json!({})))];
    // A third session is refused before any child starts for it.
    let body = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "gateway-test", "version": "1"}}});
    let refused = send(&url, None, &body);
    assert_eq!(refused.status, 503, "{}", refused.body);
    let error: Value = serde_json::from_str(&refused.body).expect("a JSON error");
    assert_eq!(error["error"]["data"]["reason"], "too_many_sessions", "{error}");
    let children = children_of(gateway.child.id());
    assert_eq!(children.len(), 2, "one child per admitted session: {children:?}, sessions' {pids:?}");
}

/// The pids of `parent`'s child processes.
fn children_of(parent: u32) -> Vec<String> {
    let tasks = std::fs::read_dir(format!("/proc/{parent}/task")).expect("the gateway's tasks");
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|children| children.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .collect()
}
