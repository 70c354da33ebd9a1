//! `tether serve --store embedded` killed with SIGKILL mid-stream and restarted: clients resume
//! the same session with nothing lost or duplicated, and the request the crash interrupted ends
//! as `request_aborted`, never a hang and never run twice.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

/// Options that keep a crash test short: a one-second lease, fast reconnects.
const FAST: [&str; 4] = ["--request-lease", "1s", "--sse-retry", "50ms"];

fn numbers(lines: &[Value], field: &str) -> Vec<u64> {
    lines.iter().filter_map(|l| l["message"]["params"]["data"][field].as_u64()).collect()
}

fn contiguous_from_one(numbers: &[u64]) -> bool {
    numbers.iter().enumerate().all(|(i, n)| *n == i as u64 + 1)
}

#[test]
fn kill_9_during_a_streaming_call_ends_it_as_request_aborted_without_loss() {
    let dir = temp_dir("crash-call");
    let port = free_port();
    let (mut server, url) = serve(port, &dir, &FAST);
    let call = tether(&["call", &url, "count", "--args", r#"{"to": 100000, "interval_ms": 5}"#]);
    let mut lines = Vec::new();
    while lines.len() < 20 {
        lines.push(call.line(Duration::from_secs(10)).expect("notifications before the crash"));
    }
    server.kill9();
    let (_server, _) = serve(port, &dir, &FAST);
    lines.extend(call.rest(Duration::from_secs(30)));
    let lines = parse(&lines);
    let counts = numbers(&lines, "count");
    println!(
        "crash during call: {} notifications before the crash were delivered, then: {:?}",
        counts.len(),
        lines.iter().skip(counts.len()).map(|l| l["event"].clone()).collect::<Vec<_>>()
    );
    assert!(contiguous_from_one(&counts), "no loss, no duplicate: {counts:?}");
    assert!(lines.iter().any(|l| l["event"] == "divergence" && l["kind"] == "resync"), "{lines:?}");
    // The call carried an idempotency key: re-issued, it is answered from its record, which
    // says its server died mid-run. `count` is not resumable, so it is not run again.
    assert!(lines.iter().any(|l| l["event"] == "reissued"), "{lines:?}");
    let last = lines.last().expect("a last line");
    assert_eq!(
        (last["event"].as_str(), last["error"]["data"]["reason"].as_str()),
        (Some("error"), Some("request_aborted")),
        "{lines:?}"
    );
    let mut call = call;
    assert_eq!(call.child.wait().expect("exit").code(), Some(1));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kill_9_during_a_broadcast_loses_and_duplicates_nothing_on_the_standalone_stream() {
    let dir = temp_dir("crash-broadcast");
    let port = free_port();
    let (mut server, url) = serve(port, &dir.join("data"), &FAST);
    let checkpoint = dir.join("watch.json");
    let watch = tether(&["watch", &url, "--checkpoint", checkpoint.to_str().expect("path")]);
    let session = checkpointed_session(&checkpoint);
    let broadcaster = {
        let (url, session) = (url.clone(), session.clone());
        std::thread::spawn(move || {
            let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "broadcast", "arguments": {"count": 100000, "interval_ms": 5}}});
            post(&url, &session, &call)
        })
    };
    let mut lines = Vec::new();
    while lines.len() < 20 {
        lines.push(watch.line(Duration::from_secs(10)).expect("broadcasts before the crash"));
    }
    server.kill9();
    assert_eq!(broadcaster.join().expect("thread"), 0, "the broadcasting request died with the server");
    let (_server, _) = serve(port, &dir.join("data"), &FAST);
    // After the restart the same session and stream carry a new broadcast.
    let deadline = Instant::now() + Duration::from_secs(20);
    // Until the watch has resumed, the restarted server does not know the session's standalone
    // stream and a broadcast reaches nobody; each try is a new request (a reused id would attach
    // to the earlier call instead of running again).
    for id in 2.. {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "broadcast", "arguments": {"count": 3}}});
        assert_eq!(post(&url, &session, &call), 200);
        let seen = watch.rest(Duration::from_millis(500));
        let done =
            parse(&seen).iter().any(|l| l["message"]["params"]["data"]["broadcast"] == 3 && l["event"] == "message");
        lines.extend(seen);
        if done || Instant::now() > deadline {
            break;
        }
    }
    let lines = parse(&lines);
    let resumed = lines
        .iter()
        .position(|l| l["event"] == "resumed")
        .unwrap_or_else(|| panic!("no resume after the restart: {lines:?}"));
    assert_eq!(lines[resumed]["verdict"], "continuous", "{lines:?}");
    assert!(lines.iter().all(|l| l["event"] != "divergence"), "{lines:?}");
    let before: Vec<u64> = numbers(&lines[..resumed], "broadcast");
    let after: Vec<u64> = numbers(&lines[resumed..], "broadcast");
    println!("crash during broadcast: {} before the restart, {} after: {after:?}", before.len(), after.len());
    // What was appended before the crash arrives once, in order; then the new broadcasts.
    let first_new = after.iter().position(|n| *n == 1).unwrap_or(after.len());
    let mut old: Vec<u64> = before.clone();
    old.extend(&after[..first_new]);
    assert!(contiguous_from_one(&old), "no loss, no duplicate across the crash: {old:?}");
    assert!(after[first_new..].starts_with(&[1, 2, 3]), "{after:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_keyed_call_is_not_reissued_to_a_restarted_memory_server_whose_records_are_new() {
    let dir = temp_dir("crash-memory");
    let port = free_port();
    let memory = ["--store", "memory", "--sse-retry", "50ms"];
    let (mut server, url) = serve(port, &dir, &memory);
    let call = tether(&["call", &url, "count", "--args", r#"{"to": 100000, "interval_ms": 5}"#]);
    let mut lines = Vec::new();
    for _ in 0..5 {
        lines.push(call.line(Duration::from_secs(10)).expect("notifications before the crash"));
    }
    server.kill9();
    let (_server, _) = serve(port, &dir, &memory);
    lines.extend(call.rest(Duration::from_secs(60)));
    let lines = parse(&lines);
    // The call carried a key (the server offered them)...
    assert!(!lines.iter().any(|l| l["event"] == "unkeyed"), "{lines:?}");
    // ...but the new process's records never saw it: a re-issue there would run the call again.
    assert!(lines.iter().any(|l| l["event"] == "reinitialized"), "{lines:?}");
    assert!(!lines.iter().any(|l| l["event"] == "reissued"), "{lines:?}");
    assert_eq!(lines.last().map(|l| l["event"].clone()), Some(json!("outcome_unknown")), "{lines:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reproduction 3 of exact resync: a request the crash interrupted was answered, on resume from
/// an early cursor, with `request_aborted` naming as lost the events that were on disk. Now the
/// resume replays every event on disk, then says the request was aborted (nothing lost), then
/// ends the request with its error.
#[test]
fn a_request_a_crash_interrupted_replays_what_is_on_disk_then_says_it_was_aborted() {
    let dir = temp_dir("crash-replay");
    let port = free_port();
    let (mut server, url) = serve(port, &dir, &FAST);
    let session = raw_session(&url);
    let headers = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("Mcp-Session-Id", session.as_str()),
    ];
    let call = r#"{"jsonrpc":"2.0","id":"c1","method":"tools/call","params":{"name":"count","arguments":{"to":30,"interval_ms":100},"_meta":{"progressToken":"p"}}}"#;
    // Read the priming event and the first notifications, then let a few more reach the disk.
    let answer = exchange(&url, "POST", &headers, call, |body| sse_events(body).len() >= 3, Duration::from_secs(10));
    assert_eq!(answer.status, 200);
    let seen = sse_events(&answer.body);
    let cursor = seen[1].0.clone().expect("event 1's id");
    std::thread::sleep(Duration::from_millis(700));
    server.kill9();
    let (_server, _) = serve(port, &dir, &FAST);
    let mut resume = headers.to_vec();
    resume.push(("Last-Event-ID", &cursor));
    let resumed = exchange(&url, "GET", &resume, "", |_| false, Duration::from_secs(10));
    assert_eq!(resumed.status, 200);
    let events = sse_events(&resumed.body);
    let (replayed, end) = events.split_at(events.len().saturating_sub(2));
    let seqs: Vec<u64> = replayed
        .iter()
        .map(|(id, _, _)| {
            id.as_deref().and_then(|id| tether_core::lineage::EventId::parse(id).ok()).expect("a lineage id").seq
        })
        .collect();
    println!("resumed from {cursor} after the crash: events {seqs:?}, then {end:?}");
    assert!(seqs.len() >= 4, "the events written before the crash are replayed: {events:?}");
    assert_eq!(seqs, (2..2 + seqs.len() as u64).collect::<Vec<_>>(), "every event on disk, in order");
    let [(Some(id), Some(kind), notice), (None, None, error)] = end else { panic!("a notice and the error: {end:?}") };
    assert_eq!(kind, "resync");
    let notice: Value = serde_json::from_str(notice).expect("notice");
    let head = *seqs.last().expect("replayed");
    assert_eq!(
        (notice["reason"].as_str(), notice["lost_from"].clone(), notice["head"].as_u64()),
        (Some("request_aborted"), Value::Null, Some(head)),
        "nothing on disk is declared lost"
    );
    let at = tether_core::lineage::EventId::parse(id).expect("a lineage id");
    assert_eq!(at.seq, head, "the notice stands at the head: {id}");
    let last = replayed.last().and_then(|(id, _, _)| id.as_deref()).expect("the head's id");
    assert_eq!(at.tag, tether_core::lineage::EventId::parse(last).expect("lineage id").tag, "with the head's tag");
    let error: Value = serde_json::from_str(error).expect("error");
    assert_eq!(
        (error["id"].as_str(), error["error"]["data"]["reason"].as_str()),
        (Some("c1"), Some("request_aborted"))
    );
    let _ = std::fs::remove_dir_all(&dir);
}
