//! How `tether call` and `tether watch` end, on a real server: a resync followed by events is
//! reported and followed through (the result after the gap is delivered); `--exit-on-divergence`
//! exits 3 without another request; `--timeout`, a tool's `isError` and giving up have their own
//! exit codes.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};
use tether_testkit::proxy;

fn counts(lines: &[Value]) -> Vec<u64> {
    lines.iter().filter_map(|l| l["message"]["params"]["data"]["count"].as_u64()).collect()
}

/// Reproduction 2 of exact resync, through the client: the call's stream is cut, and by the time
/// the client resumes (the server's `retry` is 1 s) the count is over and only its last events
/// are retained. The client reports the resync with its exact range, then delivers the rest and
/// the result; before, it re-initialized and reported the outcome unknown.
#[test]
fn a_call_whose_stream_lost_events_to_retention_still_gets_its_result() {
    let dir = temp_dir("cli-resync-call");
    let port = free_port();
    let (_server, _) = serve(port, &dir, &["--store", "memory", "--max-events-per-stream", "5", "--sse-retry", "1s"]);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let proxy = runtime.block_on(proxy::start(vec![upstream], 7, 150, 300));
    proxy.cutting.store(true, Ordering::Relaxed);
    let url = format!("http://{}/mcp", proxy.addr);
    let args = r#"{"to": 30, "interval_ms": 20}"#;
    let mut call = tether(&["call", &url, "count", "--args", args, "--no-idempotency-key"]);
    // One cut (the call's own stream); the resume passes.
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.cuts.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "the call's stream was never cut");
        std::thread::sleep(Duration::from_millis(5));
    }
    proxy.cutting.store(false, Ordering::Relaxed);
    let lines = parse(&call.rest(Duration::from_secs(30)));
    let status = call.exit_within(Duration::from_secs(5));
    println!("{}", lines.iter().map(Value::to_string).collect::<Vec<_>>().join("\n"));
    let resync = lines.iter().find(|l| l["kind"] == "resync").unwrap_or_else(|| panic!("no resync: {lines:?}"));
    assert_eq!((resync["event"].as_str(), resync["reason"].as_str()), (Some("divergence"), Some("evicted")));
    let (from, to) = (resync["lost_from"].as_u64().expect("from"), resync["lost_to"].as_u64().expect("to"));
    // Every count arrived once, or in the range the server said is gone (event n is count n).
    let mut all = counts(&lines);
    all.extend(from..=to.min(30));
    all.sort_unstable();
    assert_eq!(all, (1..=30).collect::<Vec<_>>(), "{lines:?}");
    assert!(!lines.iter().any(|l| l["event"] == "reinitialized"), "the session went on: {lines:?}");
    let last = lines.last().expect("a last line");
    assert_eq!(
        (last["event"].as_str(), last["result"]["content"][0]["text"].as_str()),
        (Some("result"), Some("counted to 30"))
    );
    assert_eq!(status.code(), Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A watch that was down while events came and went resumes from its checkpoint: it reports
/// the resync, delivers the retained tail and keeps following the same session. With
/// `--exit-on-divergence` it exits 3 at the resync instead.
#[test]
fn a_watch_resumed_past_evicted_events_reports_the_resync_and_goes_on() {
    let dir = temp_dir("cli-resync-watch");
    let port = free_port();
    let (_server, url) = serve(port, &dir, &["--store", "memory", "--max-events-per-stream", "5"]);
    let checkpoint = dir.join("watch.json");
    let checkpoint = checkpoint.to_str().expect("path");
    let mut first = tether(&["watch", &url, "--checkpoint", checkpoint]);
    let session = checkpointed_session(std::path::Path::new(checkpoint));
    let broadcast = |id: u64, count: u64| {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "broadcast", "arguments": {"count": count}}});
        assert_eq!(post(&url, &session, &call), 200);
    };
    broadcast(1, 2);
    let before =
        parse(&[first.line(Duration::from_secs(10)).expect("1"), first.line(Duration::from_secs(10)).expect("2")]);
    // Killed once the second broadcast (event 2) is committed.
    let deadline = Instant::now() + Duration::from_secs(10);
    let committed = || {
        let saved: Value =
            std::fs::read(checkpoint).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        let id =
            saved["streams"]["get"]["last_id"].as_str().and_then(|id| tether_core::lineage::EventId::parse(id).ok());
        id.is_some_and(|id| id.seq == 2)
    };
    while !committed() {
        assert!(Instant::now() < deadline, "the watch never committed event 2");
        std::thread::sleep(Duration::from_millis(10));
    }
    first.kill9();
    // 20 more while nobody watches: the standalone stream keeps the last 5.
    broadcast(2, 20);
    let mut again = tether(&["watch", &url, "--checkpoint", checkpoint]);
    let mut lines = Vec::new();
    while lines.len() < 6 {
        lines.push(again.line(Duration::from_secs(10)).expect("the resync and the retained tail"));
    }
    let lines = parse(&lines);
    assert_eq!(lines[0]["kind"], "resync", "{lines:?}");
    let lost = (lines[0]["lost_from"].as_u64(), lines[0]["lost_to"].as_u64());
    assert_eq!(lost, (Some(3), Some(17)), "events 3..17 are gone, 18..22 retained: {lines:?}");
    let broadcasts: Vec<u64> =
        lines[1..].iter().filter_map(|l| l["message"]["params"]["data"]["broadcast"].as_u64()).collect();
    assert_eq!(broadcasts, [16, 17, 18, 19, 20], "before: {before:?}");
    // Still the same session, still following.
    broadcast(3, 1);
    let next = parse(&[again.line(Duration::from_secs(10)).expect("a later broadcast")]);
    assert_eq!(next[0]["message"]["params"]["data"]["broadcast"], 1, "{next:?}");
    again.kill9();
    // The same resume with --exit-on-divergence: exit 3 at the resync.
    broadcast(4, 20);
    let mut strict = tether(&["watch", &url, "--checkpoint", checkpoint, "--exit-on-divergence"]);
    let status = strict.exit_within(Duration::from_secs(10));
    let lines = parse(&strict.rest(Duration::from_secs(1)));
    assert_eq!(status.code(), Some(3), "{lines:?}");
    assert_eq!(lines.last().map(|l| l["kind"].clone()), Some(json!("resync")), "{lines:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The sessions a server created, from its metrics.
fn sessions_created(metrics: &str) -> u64 {
    let scraped = exchange(&format!("http://{metrics}/metrics"), "GET", &[], "", |_| false, Duration::from_secs(5));
    assert_eq!(scraped.status, 200);
    scraped
        .body
        .lines()
        .find_map(|l| l.strip_prefix("tether_sessions_created_total ").and_then(|n| n.trim().parse().ok()))
        .unwrap_or(0)
}

/// `--exit-on-divergence` exits 3 at a divergence without another request: the restarted
/// server sees no second `initialize`.
#[test]
fn exit_on_divergence_sends_nothing_more() {
    let dir = temp_dir("cli-exit-on-divergence");
    let port = free_port();
    let memory = ["--store", "memory", "--metrics", "127.0.0.1:0"];
    let (mut server, url) = serve(port, &dir, &memory);
    let checkpoint = dir.join("watch.json");
    let checkpoint = checkpoint.to_str().expect("path");
    let mut watch = tether(&["watch", &url, "--checkpoint", checkpoint]);
    checkpointed_session(std::path::Path::new(checkpoint));
    watch.kill9();
    server.kill9();
    let (restarted, _) = serve(port, &dir, &memory);
    let metrics = restarted.line(Duration::from_secs(10)).expect("metrics line");
    let metrics = metrics.trim_start_matches("metrics on http://").trim_end_matches("/metrics").to_owned();
    let mut strict = tether(&["watch", &url, "--checkpoint", checkpoint, "--exit-on-divergence"]);
    let status = strict.exit_within(Duration::from_secs(10));
    let lines = parse(&strict.rest(Duration::from_secs(1)));
    assert_eq!(status.code(), Some(3), "{lines:?}");
    assert_eq!(lines.last().map(|l| l["kind"].clone()), Some(json!("session_invalid")), "{lines:?}");
    assert_eq!(sessions_created(&metrics), 0, "no initialize after the divergence");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn timeouts_a_failed_tool_and_giving_up_have_their_exit_codes() {
    let dir = temp_dir("cli-exits");
    let port = free_port();
    let (mut server, url) = serve(port, &dir, &["--store", "memory"]);
    let mut slow = tether(&["call", &url, "sleep", "--args", r#"{"ms": 20000}"#, "--timeout", "1s"]);
    assert_eq!(slow.exit_within(Duration::from_secs(10)).code(), Some(4));
    let lines = parse(&slow.rest(Duration::from_secs(1)));
    assert_eq!(lines.last().map(|l| l["event"].clone()), Some(json!("outcome_unknown")), "{lines:?}");
    let mut failing = tether(&["call", &url, "test_error_handling"]);
    assert_eq!(failing.exit_within(Duration::from_secs(10)).code(), Some(6));
    let lines = parse(&failing.rest(Duration::from_secs(1)));
    assert_eq!(lines.last().map(|l| l["result"]["isError"].clone()), Some(json!(true)), "{lines:?}");
    let mut quiet = tether(&["watch", &url, "--timeout", "1s"]);
    assert_eq!(quiet.exit_within(Duration::from_secs(10)).code(), Some(5));
    let lines = parse(&quiet.rest(Duration::from_secs(1)));
    assert_eq!(lines.last().map(|l| l["event"].clone()), Some(json!("gave_up")), "{lines:?}");
    // A server that is gone for good: the watch gives up once its reconnects ran out.
    let mut watch = tether(&["watch", &url, "--timeout", "120s"]);
    std::thread::sleep(Duration::from_millis(500));
    server.kill9();
    let status = watch.exit_within(Duration::from_secs(100));
    let lines = parse(&watch.rest(Duration::from_secs(1)));
    assert_eq!(status.code(), Some(5), "{lines:?}");
    let last = lines.last().expect("a line");
    assert_eq!(last["event"], "gave_up", "{lines:?}");
    assert_ne!(last["reason"], "timed out", "{lines:?}");
    // Down from the start: connecting gives up by the timeout, however many retries are left,
    // and says why.
    let mut down = std::process::Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["call", &url, "greet", "--timeout", "1s", "--retries", "20"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn tether call");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = down.try_wait().expect("wait") {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "still connecting past its timeout");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut said = String::new();
    std::io::Read::read_to_string(&mut down.stderr.take().expect("stderr"), &mut said).expect("stderr read");
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(said.contains("Connection refused"), "the cause: {said}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A call the server started, whose server then restarted with its memory: `tether call` says
/// its outcome is unknown (exit 4), never that it did not run (exit 1), whatever the re-sent
/// attempts were told.
#[test]
fn a_call_running_when_its_memory_server_restarts_exits_outcome_unknown() {
    let dir = temp_dir("cli-restart");
    let port = free_port();
    let args = ["--store", "memory"];
    let (mut server, url) = serve(port, &dir, &args);
    // 2025-06-18: no priming event, so nothing to resume from: the call is sent again.
    let version = ["--protocol-version", "2025-06-18"];
    let mut call = tether(&["call", &url, "sleep", "--args", r#"{"ms": 60000}"#, version[0], version[1]]);
    // The tool has started (it sends nothing while it sleeps).
    std::thread::sleep(Duration::from_millis(500));
    server.kill9();
    let _server = serve(port, &dir, &args).0;
    let lines = parse(&call.rest(Duration::from_secs(60)));
    let status = call.exit_within(Duration::from_secs(5));
    let last = lines.last().expect("a last line");
    assert_eq!(last["event"], "outcome_unknown", "{lines:?}");
    assert_eq!(status.code(), Some(4), "{lines:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
