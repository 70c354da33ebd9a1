//! `tether gateway -- COMMAND` in front of a real stdio MCP server (tests/gateway/stdio_server.py,
//! standard library only): one child per session, its traffic both ways, and what happens when
//! the child dies or the session ends.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::*;
use tether_core::jsonrpc::Message;
use tether_testkit::RedisServer;

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

const SESSIONFUL: &str = "2025-11-25";

/// How long a test waits for one answer.
const TIMEOUT: Duration = Duration::from_secs(20);

/// A session, initialized; its id.
fn initialize(url: &str) -> String {
    let body = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": SESSIONFUL, "capabilities": {"roots": {}},
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
        ("MCP-Protocol-Version", SESSIONFUL),
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
        &[("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", SESSIONFUL)],
        "",
        |_| false,
        Duration::from_secs(10),
    );
    assert_eq!(deleted.status, 200);
    eventually("the child outlived its session", || !alive(&pid));
}

#[test]
fn a_2026_07_28_request_is_served_by_a_child_kept_for_its_client() {
    let (gateway, url) =
        start(&["--store", "memory", "--listen", &format!("127.0.0.1:{}", free_port()), "--stateless-instances", "2"]);
    let stateless = |client: &str, tool: &str, arguments: Value| {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": tool, "arguments": arguments,
            "_meta": {"progressToken": "m", "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {},
                      "io.modelcontextprotocol/clientInfo": {"name": client, "version": "7"}}}});
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
    let answer = stateless("desk", "count", json!({"to": 3}));
    assert_eq!(answer.iter().filter(|m| m["method"] == "notifications/progress").count(), 3, "{answer:?}");
    assert_eq!(result_text(&answer), "counted to 3");
    // The child, of the handshake era, gets that era's request (it refuses the 2026-07-28
    // envelope, as the Python SDK does) and was initialized as the real client.
    assert_eq!(result_text(&stateless("desk", "client", json!({}))), "desk 7");
    // The same client's requests share its child, kept between them; another client gets one
    // of its own, initialized as that client.
    let desk = result_text(&stateless("desk", "pid", json!({})));
    assert_eq!(result_text(&stateless("desk", "pid", json!({}))), desk, "a request of the same client started a child");
    assert_eq!(result_text(&stateless("laptop", "client", json!({}))), "laptop 7");
    let laptop = result_text(&stateless("laptop", "pid", json!({})));
    assert_ne!(laptop, desk, "two clients shared a child");
    // Past the bound (2), a third client's child takes the place of the longest idle one.
    let phone = result_text(&stateless("phone", "pid", json!({})));
    eventually("the longest idle child outlived its place", || !alive(&desk));
    let mut children = children_of(gateway.child.id());
    children.sort();
    let mut kept = vec![laptop, phone];
    kept.sort();
    assert_eq!(children, kept, "the children past the bound");
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

/// With `--upstream-wait`, a gateway started before its upstream listens at once and answers
/// 503 `not_ready` with `Retry-After`, trying the upstream again meanwhile; once the upstream
/// is up, it serves as any gateway does. `/readyz` says 503 `starting` until then.
#[test]
fn a_gateway_waiting_for_its_upstream_answers_not_ready_until_it_is_reached() {
    let dir = temp_dir("gateway-upstream-wait");
    let upstream_port = free_port();
    let upstream_url = format!("http://127.0.0.1:{upstream_port}/mcp");
    let listen = format!("127.0.0.1:{}", free_port());
    let flags = ["--store", "memory", "--listen", &listen, "--upstream-wait", "60s"];
    let (_gateway, url) = start_before(&flags, &["--upstream", &upstream_url]);
    let body = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": SESSIONFUL, "capabilities": {}, "clientInfo": {"name": "gateway-test", "version": "1"}}});
    let refused = send(&url, None, &body);
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(refused.headers.iter().any(|(name, _)| name == "retry-after"), "{:?}", refused.headers);
    let error: Value = serde_json::from_str(&refused.body).expect("a JSON error");
    assert_eq!(error["error"]["data"]["reason"], "not_ready", "{error}");
    let readyz = || exchange(&format!("http://{listen}/readyz"), "GET", &[], "", |_| false, Duration::from_secs(10));
    let waiting = readyz();
    assert_eq!((waiting.status, waiting.body.as_str()), (503, "starting\n"), "not ready until the upstream is reached");
    let _upstream = serve(upstream_port, &dir, &["--store", "memory"]);
    eventually("the gateway reached its upstream", || send(&url, None, &body).status == 200);
    assert_eq!(readyz().status, 200);
    let session = initialize(&url);
    assert_eq!(result_text(&call(&url, &session, "count", json!({"to": 2}))), "counted to 2");
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
        "protocolVersion": SESSIONFUL, "capabilities": {}, "clientInfo": {"name": "gateway-test", "version": "1"}}});
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

/// Two `tether gateway` replicas sharing `redis`, in front of the test server, each declaring
/// a replica gone once its heartbeat is `lease` old.
fn replicas(redis: &RedisServer, lease: &str) -> [(Process, String); 2] {
    [(), ()].map(|()| {
        let listen = format!("127.0.0.1:{}", free_port());
        start(&[
            "--store",
            "redis",
            "--redis-url",
            &redis.url,
            "--redis-durability",
            "none",
            "--request-lease",
            lease,
            "--listen",
            &listen,
        ])
    })
}

fn redis() -> (tokio::runtime::Runtime, RedisServer) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let redis = rt.block_on(RedisServer::start());
    (rt, redis)
}

/// Whether process `pid` runs (exists and is not a zombie waiting to be reaped).
fn running(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

#[test]
fn a_request_reaching_another_replica_runs_on_its_sessions_child_there() {
    let (_rt, redis) = redis();
    let [(_a, url_a), (b, url_b)] = replicas(&redis, "10s");
    let session = initialize(&url_a);
    let pid = result_text(&call(&url_a, &session, "pid", json!({})));
    // Through the other replica: the same child, and that replica starts none of its own.
    assert_eq!(result_text(&call(&url_b, &session, "pid", json!({}))), pid, "another child answered");
    assert_eq!(children_of(b.child.id()), Vec::<String>::new(), "the other replica started a child");

    // The child's progress reaches the client through the replica it asked, in order.
    let counted = call(&url_b, &session, "count", json!({"to": 4}));
    let steps: Vec<u64> = counted
        .iter()
        .filter(|m| m["params"]["progressToken"] == "p")
        .filter_map(|m| m["params"]["progress"].as_u64())
        .collect();
    assert_eq!(steps, [1, 2, 3, 4], "{counted:?}");
    assert_eq!(result_text(&counted), "counted to 4");

    // The child's request to the client goes out on the relayed call's stream; the client's
    // answer, posted to the replica it asked, reaches the child; the client resumes the stream
    // there for the result.
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "roots", "arguments": {}}});
    let headers = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("MCP-Protocol-Version", SESSIONFUL),
        ("Mcp-Session-Id", session.as_str()),
    ];
    let asked = exchange(&url_b, "POST", &headers, &body.to_string(), |body| body.contains("roots/list"), TIMEOUT);
    let (event_id, _, data) = sse_events(&asked.body)
        .into_iter()
        .find(|(_, _, data)| data.contains("roots/list"))
        .unwrap_or_else(|| panic!("no request to the client: {}", asked.body));
    let request: Value = serde_json::from_str(&data).expect("the request to the client");
    let answer =
        json!({"jsonrpc": "2.0", "id": request["id"], "result": {"roots": [{"uri": "file:///r", "name": "r"}]}});
    assert_eq!(send(&url_b, Some(&session), &answer).status, 202);
    let event_id = event_id.expect("the request's event id");
    let resume = [
        ("Accept", "text/event-stream"),
        ("MCP-Protocol-Version", SESSIONFUL),
        ("Mcp-Session-Id", session.as_str()),
        ("Last-Event-ID", event_id.as_str()),
    ];
    let rest = exchange(&url_b, "GET", &resume, "", |body| body.contains("\"result\""), TIMEOUT);
    assert_eq!(result_text(&messages(&rest.body)), "1 roots", "{}", rest.body);

    // A notification from the client, posted to the other replica, reaches the child.
    let changed = json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"});
    assert_eq!(send(&url_b, Some(&session), &changed).status, 202);
    eventually("the notification did not reach the child", || {
        result_text(&call(&url_a, &session, "heard", json!({})))
            .lines()
            .any(|m| m == "notifications/roots/list_changed")
    });
}

#[test]
fn when_the_replica_holding_a_session_dies_its_relayed_calls_are_aborted_and_the_session_ends() {
    let (_rt, redis) = redis();
    let [(mut a, url_a), (_b, url_b)] = replicas(&redis, "2s");
    let (relayed, untouched) = (initialize(&url_a), initialize(&url_a));
    let child = result_text(&call(&url_b, &relayed, "pid", json!({})));
    let (url, session) = (url_b.clone(), relayed.clone());
    let running_call =
        std::thread::spawn(move || call(&url, &session, "count", json!({"to": 1000, "interval_ms": 20})));
    std::thread::sleep(Duration::from_millis(500));
    a.kill9();
    // The call that ran on the dead replica's child ends saying it may have run, never silence.
    let answer = running_call.join().expect("the relayed call");
    assert_eq!(answer.last().expect("an answer")["error"]["data"]["reason"], "request_aborted", "{answer:?}");
    // Both sessions that replica held end, and say why: the one whose call was relayed, and one
    // this replica never served before.
    let ping = json!({"jsonrpc": "2.0", "id": 3, "method": "ping"});
    for session in [&relayed, &untouched] {
        eventually("the session outlived its replica", || send(&url_b, Some(session), &ping).status == 404);
        let refused: Value = serde_json::from_str(&send(&url_b, Some(session), &ping).body).expect("a JSON error");
        assert_eq!(refused["error"]["data"]["reason"], "upstream_lost", "{refused}");
    }
    // The dead replica's child went with it.
    eventually("the dead replica's child outlived it", || !running(&child));
}

#[test]
fn keyed_calls_through_a_cutting_balancer_over_two_replicas_run_once_each() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let redis = rt.block_on(RedisServer::start());
    let dir = temp_dir("gateway-replicas");
    let count = dir.join("count");
    let count_file = format!("COUNT_FILE={}", count.display());
    let (pa, pb) = (free_port(), free_port());
    let _replicas = [pa, pb].map(|port| {
        let listen = format!("127.0.0.1:{port}");
        let flags = [
            "--store",
            "redis",
            "--redis-url",
            &redis.url,
            "--redis-durability",
            "none",
            "--sse-retry",
            "10ms",
            "--listen",
            &listen,
        ];
        start_before(&flags, &["--", "env", &count_file, "python3", SERVER])
    });
    let upstreams = [pa, pb].map(|port| std::net::SocketAddr::from(([127, 0, 0, 1], port))).to_vec();
    let (mut results, mut counted, mut resumed, mut reissued, mut reinitialized) = (Vec::new(), 0, 0, 0, 0);
    let mut progress = Vec::new();
    let cuts = rt.block_on(async {
        // Each connection goes to the next replica: the session's calls alternate between the
        // one holding its child and the one relaying to it, and so do the resumes of their
        // streams.
        let balancer = tether_testkit::proxy::start(upstreams, 0x9a7e, 100, 1_500).await;
        let mut config = tether_client::ClientConfig::new(format!("http://{}/mcp", balancer.addr));
        config.backoff = tether_client::Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(100),
            max_attempts_without_progress: 40,
        };
        let (client, mut events) = tether_client::Client::connect(config).await.expect("connect");
        balancer.cutting.store(true, Ordering::Relaxed);
        let started = Instant::now();
        while results.len() < 60 && started.elapsed() < Duration::from_secs(60) {
            let add = client.request_keyed("tools/call", json!({"name": "add", "arguments": {"amount": 1}}));
            let slow = client.request(
                "tools/call",
                json!({"name": "count", "arguments": {"to": 15, "interval_ms": 10}, "_meta": {"progressToken": "p"}}),
            );
            let (add, slow) = tokio::join!(add, slow);
            results.push(add.map(|result| result["content"][0]["text"].as_str().unwrap_or_default().to_owned()));
            counted += usize::from(slow.is_ok_and(|result| result["content"][0]["text"] == "counted to 15"));
        }
        balancer.cutting.store(false, Ordering::Relaxed);
        while let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(500), events.recv()).await {
            match event {
                tether_client::ClientEvent::Message { message, ack, .. } => {
                    if let Message::Notification(n) = message {
                        progress.extend(n.params.as_ref().and_then(|p| p["progress"].as_u64()));
                    }
                    ack.done();
                }
                tether_client::ClientEvent::Resumed { .. } => resumed += 1,
                tether_client::ClientEvent::Reissued { .. } => reissued += 1,
                tether_client::ClientEvent::Reinitialized { .. } => reinitialized += 1,
                _ => {}
            }
        }
        balancer.cuts.load(Ordering::Relaxed)
    });
    println!(
        "two gateway replicas, {cuts} cuts: {} keyed adds, {counted} streamed counts, {resumed} resumes, \
         {reissued} re-issued, {reinitialized} re-initialized",
        results.len()
    );
    assert!(cuts >= 5, "the balancer cut too little to test anything: {cuts}");
    // Every call got its real result, and the child ran each add exactly once, in order.
    let values: Vec<String> = results.into_iter().map(|r| r.expect("an add's result")).collect();
    let expected: Vec<String> = (1..=values.len()).map(|n| n.to_string()).collect();
    assert_eq!(values, expected, "an add ran twice or not at all");
    assert_eq!(std::fs::read_to_string(&count).expect("the count file"), values.len().to_string());
    assert_eq!(counted, values.len(), "a streamed call failed");
    // Each streamed call's progress arrived once each, in order, across cuts and replicas.
    let expected: Vec<u64> = (0..counted).flat_map(|_| 1..=15).collect();
    assert_eq!(progress, expected, "progress was lost, repeated or reordered");
    assert_eq!(reinitialized, 0, "the session was replaced");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_child_that_dies_under_a_relayed_call_ends_it_as_request_aborted() {
    let (_rt, redis) = redis();
    let [(_a, url_a), (_b, url_b)] = replicas(&redis, "10s");
    let session = initialize(&url_a);
    let (url, id) = (url_b.clone(), session.clone());
    let relayed = std::thread::spawn(move || call(&url, &id, "count", json!({"to": 1000, "interval_ms": 20})));
    std::thread::sleep(Duration::from_millis(500));
    let crash =
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "crash", "arguments": {}}});
    let crashed = send(&url_a, Some(&session), &crash);
    assert_eq!(messages(&crashed.body).last().expect("an answer")["error"]["data"]["reason"], "request_aborted");
    let answer = relayed.join().expect("the relayed call");
    assert_eq!(answer.last().expect("an answer")["error"]["data"]["reason"], "request_aborted", "{answer:?}");
    let ping = json!({"jsonrpc": "2.0", "id": 3, "method": "ping"});
    eventually("the session outlived its child", || send(&url_b, Some(&session), &ping).status == 404);
    let refused: Value = serde_json::from_str(&send(&url_b, Some(&session), &ping).body).expect("a JSON error");
    assert_eq!(refused["error"]["data"]["reason"], "upstream_lost", "{refused}");
}

#[test]
fn a_cancellation_reaching_the_relaying_replica_cancels_the_call_at_the_child() {
    let (_rt, redis) = redis();
    let [(_a, url_a), (_b, url_b)] = replicas(&redis, "10s");
    let session = initialize(&url_a);
    let (url, id) = (url_b.clone(), session.clone());
    let long = json!({"jsonrpc": "2.0", "id": 50, "method": "tools/call", "params": {
        "name": "count", "arguments": {"to": 1000, "interval_ms": 20}, "_meta": {"progressToken": "p"}}});
    let running = std::thread::spawn(move || send(&url, Some(&id), &long));
    std::thread::sleep(Duration::from_millis(500));
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 50}});
    assert_eq!(send(&url_b, Some(&session), &cancel).status, 202);
    // The call ends well before its thousand steps, and its child was told.
    let started = Instant::now();
    let answer = running.join().expect("the relayed call");
    assert!(started.elapsed() < Duration::from_secs(10), "the cancelled call ran on: {}", answer.body);
    assert!(!answer.body.contains("counted to 1000"), "{}", answer.body);
    assert!(answer.body.contains(r#""reason":"request_cancelled""#), "ended as cancelled: {}", answer.body);
    eventually("the child never heard of the cancellation", || {
        result_text(&call(&url_a, &session, "heard", json!({}))).lines().any(|m| m == "notifications/cancelled")
    });
}

/// The messages an HTTP upstream sends on a call's stream (its logs here) reach the downstream
/// client on that call's stream, not on the standalone stream or nowhere.
#[test]
fn an_http_upstreams_messages_during_a_call_arrive_on_the_calls_stream() {
    let dir = temp_dir("gateway-http-scoped");
    let (_upstream, upstream_url) = serve(free_port(), &dir, &["--store", "memory"]);
    let listen = format!("127.0.0.1:{}", free_port());
    let (_gateway, url) = start_before(&["--store", "memory", "--listen", &listen], &["--upstream", &upstream_url]);
    let session = initialize(&url);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "count", "arguments": {"to": 3}}});
    let response = send(&url, Some(&session), &body);
    assert_eq!(response.status, 200, "{}", response.body);
    let messages = messages(&response.body);
    let counts: Vec<_> = messages.iter().filter_map(|m| m["params"]["data"]["count"].as_u64()).collect();
    assert_eq!(counts, [1, 2, 3], "{messages:?}");
    assert_eq!(result_text(&messages), "counted to 3");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The peak resident memory of process `pid`, in KiB (`VmHWM`).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the process's status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("a number of KiB")
}

/// A child that writes 200 MB to stderr without a newline: the gateway keeps a bounded line,
/// not the whole of it, and serves the session as usual.
#[test]
fn a_child_flooding_stderr_without_a_newline_does_not_grow_the_gateway() {
    let flood = format!("head -c 200000000 /dev/zero | tr '\\0' x >&2; exec python3 {SERVER}");
    let listen = format!("127.0.0.1:{}", free_port());
    let (gateway, url) = start_before(&["--store", "memory", "--listen", &listen], &["--", "sh", "-c", &flood]);
    let session = initialize(&url);
    assert_eq!(result_text(&call(&url, &session, "count", json!({"to": 2}))), "counted to 2");
    let peak = peak_rss_kib(gateway.child.id());
    assert!(peak < 150 * 1024, "the gateway peaked at {} MiB", peak / 1024);
}
