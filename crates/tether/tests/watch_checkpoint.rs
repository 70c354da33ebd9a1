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
