//! `tether connect` between a stdio client (this test, writing and reading lines as a desktop
//! application would) and `tether serve`, through connection cuts and server restarts: no
//! request hangs, none runs twice, and a replaced session is announced to the client.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use common::calls::{addr, faulty_proxy};
use common::{free_port, parse, serve, temp_dir, tether};
use serde_json::{Value, json};

/// `tether connect URL` with its stdin, its stdout lines and its stderr lines.
struct Bridge {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Value>,
    errors: Receiver<String>,
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Bridge {
    fn start(url: &str) -> Bridge {
        Bridge::start_with(url, &[])
    }

    /// `tether connect URL FLAGS…`.
    fn start_with(url: &str, flags: &[&str]) -> Bridge {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tether"))
            .args([&["connect", url][..], flags].concat())
            // What the client goes through, for a failure to show.
            .env("RUST_LOG", "warn,tether_gateway=debug,tether_client=debug")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tether connect");
        let (stdout, stderr) = (child.stdout.take().expect("stdout"), child.stderr.take().expect("stderr"));
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(serde_json::from_str(&line).expect("a JSON-RPC message per line"));
            }
        });
        let (tx, errors) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let stdin = child.stdin.take();
        Bridge { child, stdin, lines, errors }
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{message}").expect("write a line");
    }

    /// Initializes, as the desktop application would.
    fn initialize(&mut self) {
        self.send(&json!({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "desktop", "version": "1"}}}));
        let answer = self.lines.recv_timeout(Duration::from_secs(20)).expect("initialize answered");
        assert_eq!(answer["id"], "init", "{answer}");
        assert!(answer["result"]["serverInfo"].is_object(), "{answer}");
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    }

    /// Closes stdin; the counts the bridge prints on stderr as it exits.
    fn finish(mut self) -> Value {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(90);
        while let Ok(line) = self.errors.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            if let Ok(counts) = serde_json::from_str::<Value>(&line)
                && counts["event"] == "counts"
            {
                return counts["counts"].clone();
            }
        }
        panic!("tether connect printed no counts");
    }
}

/// The `_meta` envelope of a 2026-07-28 desktop client's requests.
fn stateless_meta() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "desktop", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}})
}

fn add(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "counter_add", "arguments": {"key": "connect", "amount": 1}}})
}

/// Reads the bridge's lines until every id of `ids` is answered (at most `limit`); the answers
/// by id, and the notifications seen meanwhile. A request never answered fails the test with
/// what the bridge said on stderr about its calls (re-sends, resumes, divergences).
fn answers(bridge: &Bridge, ids: std::ops::Range<u64>, limit: Duration) -> (Vec<Value>, Vec<Value>) {
    let deadline = Instant::now() + limit;
    let mut answered: Vec<Option<Value>> = vec![None; (ids.end - ids.start) as usize];
    let mut notifications = Vec::new();
    while answered.iter().any(Option::is_none) {
        let Ok(line) = bridge.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) else {
            let missing: Vec<u64> =
                (ids.start..ids.end).filter(|id| answered[(id - ids.start) as usize].is_none()).collect();
            let said: Vec<String> = bridge.errors.try_iter().collect();
            let said = said.join("\n");
            panic!("requests {missing:?} never answered; the bridge's last lines on stderr:\n{said}");
        };
        match line["id"].as_u64().filter(|id| ids.contains(id)) {
            Some(id) => answered[(id - ids.start) as usize] = Some(line),
            None => notifications.push(line),
        }
    }
    (answered.into_iter().flatten().collect(), notifications)
}

fn value(answer: &Value) -> Option<i64> {
    answer["result"]["structuredContent"]["value"].as_i64()
}

#[test]
fn keyed_calls_through_connect_survive_cuts_and_a_kill_9_exactly_once() {
    keyed_calls_survive_cuts_and_a_kill_9(Revision::Handshake);
}

/// The same through a 2026-07-28 client: its calls, each a request of its own without a
/// session, are keyed and re-issued by the bridge as a session's are.
#[test]
fn keyed_2026_07_28_calls_through_connect_survive_cuts_and_a_kill_9_exactly_once() {
    keyed_calls_survive_cuts_and_a_kill_9(Revision::Stateless);
}

/// What the stdio client speaks.
#[derive(Clone, Copy)]
enum Revision {
    /// `initialize`, then requests in the session.
    Handshake,
    /// 2026-07-28: `server/discover`, then requests carrying the `_meta` envelope.
    Stateless,
}

fn keyed_calls_survive_cuts_and_a_kill_9(revision: Revision) {
    const CALLS: u64 = 100;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let dir = temp_dir(match revision {
        Revision::Handshake => "connect-kill",
        Revision::Stateless => "connect-kill-2026",
    });
    let port = free_port();
    let args = ["--sse-retry", "50ms"];
    let (mut server, direct) = serve(port, &dir, &args);
    let proxy = faulty_proxy(&runtime, vec![addr(port)]);
    // The handshake goes through whole; the calls meet the cuts.
    proxy.cutting.store(false, Ordering::Relaxed);
    let mut bridge = Bridge::start(&format!("http://{}/mcp", proxy.addr));
    let add = |id| match revision {
        Revision::Handshake => add(id),
        Revision::Stateless => {
            let mut call = add(id);
            call["params"]["_meta"] = stateless_meta();
            call
        }
    };
    match revision {
        Revision::Handshake => bridge.initialize(),
        Revision::Stateless => {
            bridge.send(&json!({"jsonrpc": "2.0", "id": "discover", "method": "server/discover",
                "params": {"_meta": stateless_meta()}}));
            let answer = bridge.lines.recv_timeout(Duration::from_secs(20)).expect("discovery answered");
            let versions = answer["result"]["supportedVersions"].as_array().cloned().unwrap_or_default();
            assert!(versions.contains(&json!("2026-07-28")), "{answer}");
        }
    }
    proxy.cutting.store(true, Ordering::Relaxed);
    for id in 0..CALLS / 2 {
        bridge.send(&add(id));
    }
    let (first, _) = answers(&bridge, 0..CALLS / 2, Duration::from_secs(120));
    server.kill9();
    for id in CALLS / 2..CALLS {
        bridge.send(&add(id));
    }
    std::thread::sleep(Duration::from_millis(300));
    server = serve(port, &dir, &args).0;
    let (second, _) = answers(&bridge, CALLS / 2..CALLS, Duration::from_secs(120));
    let counts = bridge.finish();
    println!("connect, {} cuts, 1 kill: {counts}", proxy.cuts.load(Ordering::Relaxed));

    let mut values: Vec<i64> = first.iter().chain(&second).map(|a| value(a).unwrap_or_else(|| panic!("{a}"))).collect();
    values.sort_unstable();
    assert_eq!(values, (1..=CALLS as i64).collect::<Vec<_>>(), "each call its own real result");
    let read = tether(&["call", &direct, "counter_get", "--args", r#"{"key": "connect"}"#]);
    let last = parse(&read.rest(Duration::from_secs(30))).pop().expect("counter_get answered");
    assert_eq!(last["result"]["structuredContent"]["value"], CALLS, "the counter was added to once per call");
    assert_eq!(counts["requests"], CALLS + 1, "{counts}");
    assert_eq!(counts["results"], CALLS + 1, "{counts}");
    assert!(counts["reissued"].as_u64() > Some(0), "the faults happened: {counts}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_session_lost_with_its_server_is_replaced_and_the_client_told() {
    let port = free_port();
    let dir = temp_dir("connect-memory");
    let args = ["--store", "memory", "--sse-retry", "50ms"];
    let (mut server, url) = serve(port, &dir, &args);
    let mut bridge = Bridge::start(&url);
    bridge.initialize();
    bridge.send(&add(1));
    let (before, _) = answers(&bridge, 1..2, Duration::from_secs(30));
    assert_eq!(value(&before[0]), Some(1));
    // The memory store forgets the session with the process: the next request meets a 404.
    server.kill9();
    let _server = serve(port, &dir, &args).0;
    bridge.send(&add(2));
    let (after, notifications) = answers(&bridge, 2..3, Duration::from_secs(60));
    let answer = &after[0];
    // A new server knows nothing of the old session: the request either ran in the new one (its
    // real result), or the bridge says it did not run (refused with the old session) or cannot
    // know; it never hangs.
    let reason = &answer["error"]["data"]["reason"];
    assert!(value(answer) == Some(1) || reason == "not_executed" || reason == "outcome_unknown", "{answer}");
    let warned =
        notifications.iter().any(|n| n["method"] == "notifications/message" && n["params"]["logger"] == "tether");
    assert!(warned, "the client was told its session was replaced: {notifications:?}");
    // And the bridge goes on in the new session.
    bridge.send(&add(3));
    let (later, _) = answers(&bridge, 3..4, Duration::from_secs(30));
    assert!(value(&later[0]).is_some(), "{}", later[0]);
    let counts = bridge.finish();
    println!("connect across a memory-store restart: {counts}");
    assert_eq!(counts["reinitialized"], 1, "{counts}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A call the server started, whose server then restarted with its memory (the session and the
/// call gone with it): its outcome is unknown, never "not executed", which a client would take
/// as leave to run it again.
#[test]
fn a_call_running_when_its_memory_server_restarts_is_outcome_unknown() {
    let dir = temp_dir("connect-restart");
    let port = free_port();
    let args = ["--store", "memory"];
    let (mut server, _) = serve(port, &dir, &args);
    let mut bridge = Bridge::start(&format!("http://127.0.0.1:{port}/mcp"));
    bridge.initialize();
    bridge.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "sleep", "arguments": {"ms": 60000}}}));
    // The tool has started (it sends nothing while it sleeps).
    std::thread::sleep(Duration::from_millis(500));
    server.kill9();
    let _server = serve(port, &dir, &args).0;
    let (answers, _) = answers(&bridge, 1..2, Duration::from_secs(60));
    assert_eq!(answers[0]["error"]["data"]["reason"], "outcome_unknown", "{}", answers[0]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Requests without `params` go through the bridge as they came (no `"params": null`).
#[test]
fn requests_without_params_are_forwarded_without_them() {
    let dir = temp_dir("connect-no-params");
    let port = free_port();
    let _server = serve(port, &dir, &["--store", "memory"]).0;
    let mut bridge = Bridge::start(&format!("http://127.0.0.1:{port}/mcp"));
    bridge.initialize();
    bridge.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}));
    bridge.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
    let (answers, _) = answers(&bridge, 1..3, Duration::from_secs(20));
    assert_eq!(answers[0]["result"], json!({}), "{}", answers[0]);
    assert!(answers[1]["result"]["tools"].is_array(), "{}", answers[1]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// With `--timeout`, a request the server does not answer in time is answered `outcome_unknown`
/// and cancelled, the bridge goes on serving, and the server's late answer (if any) is never
/// delivered; an `initialize` that cannot connect is answered `connect_failed`.
#[test]
fn with_a_timeout_every_request_is_answered_within_it() {
    let dir = temp_dir("connect-timeout");
    let port = free_port();
    let _server = serve(port, &dir, &["--store", "memory"]).0;
    let mut bridge = Bridge::start_with(&format!("http://127.0.0.1:{port}/mcp"), &["--timeout", "1s"]);
    bridge.initialize();
    bridge.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "sleep", "arguments": {"ms": 3000}}}));
    let (answers_1, _) = answers(&bridge, 1..2, Duration::from_secs(20));
    assert_eq!(answers_1[0]["error"]["data"]["reason"], "outcome_unknown", "{}", answers_1[0]);
    let said = answers_1[0]["error"]["message"].as_str().unwrap_or_default();
    assert!(said.contains("no answer from the server within 1s"), "{said}");
    bridge.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}));
    let (answers_2, _) = answers(&bridge, 2..3, Duration::from_secs(20));
    assert_eq!(answers_2[0]["result"], json!({}), "{}", answers_2[0]);
    // Past the tool's own end: its answer never reaches the client.
    let late: Vec<Value> = bridge.lines.recv_timeout(Duration::from_secs(4)).into_iter().collect();
    assert!(late.iter().all(|line| line["id"] != 1), "answered once: {late:?}");

    let closed = free_port();
    let mut unreachable = Bridge::start_with(&format!("http://127.0.0.1:{closed}/mcp"), &["--timeout", "1s"]);
    unreachable.send(&json!({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "desktop", "version": "1"}}}));
    let answer = unreachable.lines.recv_timeout(Duration::from_secs(20)).expect("initialize answered");
    assert_eq!(answer["error"]["data"]["reason"], "connect_failed", "{answer}");
    let said = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(said.contains("Connection refused"), "the cause: {said}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A 2026-07-28 stdio client has no `initialize`: its first `server/discover` connects the
/// bridge and is answered with the server's discovery, and its requests go through. A request
/// sent before any handshake is answered at once, never left waiting.
#[test]
fn a_2026_07_28_client_discovers_and_calls_through_connect() {
    let dir = temp_dir("connect-stateless");
    let port = free_port();
    let _server = serve(port, &dir, &["--store", "memory"]).0;
    let mut bridge = Bridge::start(&format!("http://127.0.0.1:{port}/mcp"));
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "desktop", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}});
    bridge.send(&json!({"jsonrpc": "2.0", "id": 0, "method": "tools/list"}));
    let (early, _) = answers(&bridge, 0..1, Duration::from_secs(20));
    assert_eq!(early[0]["error"]["data"]["reason"], "not_initialized", "{}", early[0]);
    bridge.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": meta}}));
    bridge.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "greet", "arguments": {"name": "stateless"}, "_meta": meta}}));
    let (answered, _) = answers(&bridge, 1..3, Duration::from_secs(20));
    assert!(answered[0]["result"]["capabilities"].is_object(), "the server's discovery: {}", answered[0]);
    assert_eq!(answered[1]["result"]["content"][0]["text"], "Hello, stateless!", "{}", answered[1]);

    // A client pinned to 2026-07-28 skips discovery: its first request connects the bridge.
    let mut pinned = Bridge::start(&format!("http://127.0.0.1:{port}/mcp"));
    pinned.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "greet", "arguments": {"name": "pinned"}, "_meta": meta}}));
    let (first, _) = answers(&pinned, 1..2, Duration::from_secs(20));
    assert_eq!(first[0]["result"]["content"][0]["text"], "Hello, pinned!", "{}", first[0]);
    // It runs its own input rounds: what the server asks comes back to it as asked.
    pinned.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "test_input_required_result_elicitation", "arguments": {}, "_meta": meta}}));
    let (asked, _) = answers(&pinned, 2..3, Duration::from_secs(20));
    assert_eq!(asked[0]["result"]["resultType"], "input_required", "{}", asked[0]);
    // A client that takes tasks gets its call's real result: the bridge follows the task the
    // server made of it, on the task's fenced stream.
    let mut tasks = meta.clone();
    tasks["io.modelcontextprotocol/clientCapabilities"] = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    pinned.send(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "slow_compute", "arguments": {"seconds": 1, "label": "bridged"}, "_meta": tasks}}));
    let (computed, _) = answers(&pinned, 3..4, Duration::from_secs(30));
    assert_eq!(computed[0]["result"]["content"][0]["text"], "bridged: computed in 1s", "{}", computed[0]);
    assert_eq!(computed[0]["result"]["resultType"], "complete", "a 2026-07-28 result: {}", computed[0]);
    let _ = std::fs::remove_dir_all(&dir);
}
