//! `tether watch --checkpoint` across a restart of the client: the second run resumes the same
//! session from the file, proves continuity, and delivers each message exactly once.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

#[test]
fn a_restarted_watch_resumes_from_its_checkpoint_exactly_once() {
    let dir = temp_dir("watch-checkpoint");
    let checkpoint = dir.join("watch.json");
    let (_server, url) = serve(free_port(), &dir.join("data"), &[]);
    let path = checkpoint.to_str().expect("path");

    // First run: open the standalone stream, then stop after two broadcasts.
    let watch = tether(&["watch", &url, "--checkpoint", path, "--max-events", "2"]);
    let session = checkpointed_session(&checkpoint);
    let broadcast = |id: u64, count: u64| {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "broadcast", "arguments": {"count": count}}});
        assert_eq!(post(&url, &session, &call), 200);
    };
    broadcast(1, 2);
    let run1 = parse(&watch.rest(Duration::from_secs(10)));
    drop(watch);
    // While no client is connected, three more broadcasts are retained on the stream.
    broadcast(2, 3);

    let watch = tether(&["watch", &url, "--checkpoint", path, "--max-events", "3"]);
    let run2 = parse(&watch.rest(Duration::from_secs(10)));
    let numbers = |lines: &[Value]| {
        lines.iter().filter_map(|l| l["message"]["params"]["data"]["broadcast"].as_u64()).collect::<Vec<_>>()
    };
    assert_eq!(numbers(&run1), [1, 2]);
    assert_eq!(numbers(&run2), [1, 2, 3], "the second run gets the three new broadcasts, once");
    assert_eq!(run2[0]["event"], "resumed");
    assert_eq!(run2[0]["verdict"], "continuous");
    assert!(run2.iter().all(|l| l["event"] != "divergence" && l["event"] != "reinitialized"), "{run2:?}");
    let saved: Value = serde_json::from_slice(&std::fs::read(&checkpoint).expect("checkpoint")).expect("json");
    assert_eq!(saved["session_id"], session.as_str(), "the same session all along");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `watch --checkpoint` is at-least-once (README): a notification printed just before a
/// SIGKILL, whose checkpoint had not been written yet, is printed again by the next run, with
/// the same id. Deduplicated on the id, every notification is there exactly once.
#[test]
fn a_watch_killed_again_and_again_prints_every_notification_with_its_id() {
    let dir = temp_dir("watch-killed");
    let checkpoint = dir.join("watch.json");
    let path = checkpoint.to_str().expect("path");
    let (_server, url) = serve(free_port(), &dir.join("data"), &[]);
    let mut watch = tether(&["watch", &url, "--checkpoint", path]);
    let session = checkpointed_session(&checkpoint);
    const COUNT: u64 = 1_500;
    let broadcaster = {
        let (url, session) = (url.clone(), session.clone());
        std::thread::spawn(move || {
            let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "broadcast", "arguments": {"count": COUNT, "interval_ms": 2}}});
            post(&url, &session, &call)
        })
    };
    let mut runs: Vec<Vec<Value>> = Vec::new();
    let numbers = |run: &[Value]| {
        run.iter().filter_map(|l| l["message"]["params"]["data"]["broadcast"].as_u64()).collect::<Vec<_>>()
    };
    // Each run is killed once it has printed some messages, so every kill hits a running watch.
    for _ in 0..4 {
        let mut lines = Vec::new();
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while numbers(&parse(&lines)).len() < 100 && std::time::Instant::now() < until {
            if let Some(line) = watch.line(Duration::from_millis(100)) {
                lines.push(line);
            }
        }
        watch.kill9();
        // What it printed before the kill and the loop did not read yet is printed all the same.
        lines.extend(watch.rest(Duration::from_secs(5)));
        runs.push(parse(&lines));
        watch = tether(&["watch", &url, "--checkpoint", path]);
    }
    assert_eq!(broadcaster.join().expect("thread"), 200);
    let mut last = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !numbers(&parse(&last)).contains(&COUNT) && std::time::Instant::now() < deadline {
        if let Some(line) = watch.line(Duration::from_millis(200)) {
            last.push(line);
        }
    }
    drop(watch);
    runs.push(parse(&last));

    let mut by_id: std::collections::BTreeMap<String, Value> = std::collections::BTreeMap::new();
    let (mut printed, mut again) = (0, 0);
    for line in runs.iter().flatten().filter(|l| l["event"] == "message") {
        let id = line["id"].as_str().expect("every message is printed with its id").to_owned();
        printed += 1;
        if let Some(first) = by_id.insert(id, line["message"].clone()) {
            assert_eq!(first, line["message"], "an id is always the same notification");
            again += 1;
        }
    }
    let mut unique: Vec<u64> = by_id.values().filter_map(|m| m["params"]["data"]["broadcast"].as_u64()).collect();
    unique.sort_unstable();
    println!("watch killed 4 times: {printed} lines printed, {again} printed again, {} unique", unique.len());
    assert_eq!(unique, (1..=COUNT).collect::<Vec<_>>(), "none lost, and none twice under two ids");
    for run in &runs {
        let ids: Vec<&str> = run.iter().filter(|l| l["event"] == "message").filter_map(|l| l["id"].as_str()).collect();
        let distinct: std::collections::BTreeSet<&str> = ids.iter().copied().collect();
        assert_eq!(ids.len(), distinct.len(), "within one run, nothing is printed twice");
    }
    assert!(runs.iter().take(4).all(|r| numbers(r).len() >= 100), "every kill hit a watch that was printing");
    let _ = std::fs::remove_dir_all(&dir);
}
