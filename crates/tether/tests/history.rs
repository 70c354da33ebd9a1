//! A store that goes back in time: Redis restarted from an older snapshot, Redis restarted
//! empty under a running replica, the embedded store's directory restored from a backup. In
//! each, history a client saw is gone, and the server must say so: a resume from a position
//! the store no longer holds as the client saw it ends the session as `history_rewritten`, and
//! an idempotency key whose claim the client was acknowledged is refused as
//! `records_regressed`, never run again.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};
use tether_core::lineage::EventId;
use tether_testkit::RedisServer;

const WAIT: Duration = Duration::from_secs(10);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// A 2025-11-25 session and the idempotency records its server advertised.
fn initialize(url: &str) -> (String, String) {
    let json = [("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let response = exchange(url, "POST", &json, init, |_| false, WAIT);
    assert_eq!(response.status, 200, "{}", response.body);
    let session = header(&response.headers, "mcp-session-id").to_owned();
    let result: Value = serde_json::from_str(&response.body).expect("the initialize result");
    let records = result["result"]["capabilities"]["experimental"]["io.tether/idempotency"]["records"]
        .as_str()
        .expect("the idempotency records")
        .to_owned();
    (session, records)
}

fn session_headers(session: &str) -> Vec<(&'static str, String)> {
    vec![
        ("Content-Type", "application/json".into()),
        ("Accept", "application/json, text/event-stream".into()),
        ("Mcp-Session-Id", session.into()),
        ("MCP-Protocol-Version", "2025-11-25".into()),
    ]
}

/// POSTs `body` in `session`, reading until its JSON-RPC response arrived.
fn call(url: &str, session: &str, body: &Value) -> Exchanged {
    let headers = session_headers(session);
    let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    exchange(url, "POST", &headers, &body.to_string(), |body| answer_of(body).is_some(), WAIT)
}

/// Calls tool `name` with `arguments` (and `meta`), retrying while the store is unavailable
/// (a Redis that just restarted), for at most ten seconds; returns the exchange and its
/// response.
fn tool(url: &str, session: &str, id: u64, name: &str, arguments: Value, meta: Value) -> (Exchanged, Value) {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": name, "arguments": arguments, "_meta": meta}});
    let deadline = Instant::now() + WAIT;
    loop {
        let exchanged = call(url, session, &body);
        let answer = answer_of(&exchanged.body);
        if exchanged.status == 200 && answer.as_ref().is_some_and(|a| a["result"]["isError"] != true) {
            let answer = answer.expect("a response");
            return (exchanged, answer);
        }
        assert!(Instant::now() < deadline, "{name} kept failing: {} {}", exchanged.status, exchanged.body);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Appends `count` server messages to the session's standalone stream.
fn broadcast(url: &str, session: &str, id: u64, count: u64) {
    tool(url, session, id, "broadcast", json!({"count": count}), json!({}));
}

/// `counter_add` of `amount` to counter `c` under idempotency `key`, showing the claim it was
/// acknowledged before if any: the response, and the claim the server acknowledges now.
fn keyed_add(url: &str, session: &str, id: u64, key: &str, claim: Option<&str>) -> (Value, Option<String>) {
    let mut meta = json!({"io.tether/idempotencyKey": key});
    if let Some((records, position)) = claim.and_then(|c| c.rsplit_once(':')) {
        meta["io.tether/idempotencyClaim"] =
            json!({"records": records, "position": position.parse::<u64>().expect("a position")});
    }
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "counter_add", "arguments": {"key": "c", "amount": 1}, "_meta": meta}});
    let exchanged = call(url, session, &body);
    assert_eq!(exchanged.status, 200, "{}", exchanged.body);
    let claimed = header(&exchanged.headers, "x-mcp-idempotency-claim");
    let claimed = (!claimed.is_empty()).then(|| claimed.to_owned());
    (answer_of(&exchanged.body).expect("a response"), claimed)
}

/// The counter's value, read without changing it.
fn counter(url: &str, session: &str) -> i64 {
    let (_, answer) = tool(url, session, 90, "counter_get", json!({"key": "c"}), json!({}));
    answer["result"]["structuredContent"]["value"].as_i64().expect("the counter's value")
}

/// Opens the session's standalone stream and returns its priming event's id.
fn open_standalone(url: &str, session: &str) -> String {
    let headers = session_headers(session);
    let mut headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    headers[1] = ("Accept", "text/event-stream");
    let opened = exchange(url, "GET", &headers, "", |body| !sse_events(body).is_empty(), WAIT);
    assert_eq!(opened.status, 200);
    sse_events(&opened.body)[0].0.clone().expect("the priming event's id")
}

/// Resumes the standalone stream from `cursor`, reading until `want` events came (or the
/// stream ended): the status, the events' ids and the body.
fn resume(url: &str, session: &str, cursor: &str, want: usize) -> (u16, Vec<String>, String) {
    let headers = session_headers(session);
    let mut headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    headers[1] = ("Accept", "text/event-stream");
    headers.push(("Last-Event-ID", cursor));
    let resumed = exchange(url, "GET", &headers, "", |body| sse_events(body).len() >= want, WAIT);
    let ids = sse_events(&resumed.body).into_iter().filter_map(|(id, _, _)| id).collect();
    (resumed.status, ids, resumed.body)
}

fn seq(id: &str) -> u64 {
    EventId::parse(id).expect("a lineage id").seq
}

fn reason(answer: &Value) -> &str {
    answer["error"]["data"]["reason"].as_str().unwrap_or_default()
}

fn value(answer: &Value) -> i64 {
    answer["result"]["structuredContent"]["value"].as_i64().unwrap_or_else(|| panic!("a counter value: {answer}"))
}

/// Copies the files of directory `from` into `to`, made anew.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).expect("a directory");
    for entry in std::fs::read_dir(from).expect("the directory") {
        let entry = entry.expect("an entry");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("a copy");
    }
}

/// What a client holds after a store went back in time, and what it is told: its cursor at
/// event 7 of the standalone stream and the claim of key `k-2`, acknowledged at count 2.
struct Held {
    cursor: String,
    claim: String,
}

/// The first half of every reproduction: events 1..=3 and key `k-1` before the store's
/// snapshot (`snapshot`), then events 4..=7 and key `k-2` after it.
fn before_the_rollback(url: &str, session: &str, snapshot: impl FnOnce() -> String) -> (Held, String) {
    let primed = open_standalone(url, session);
    broadcast(url, session, 1, 3);
    let (_, first, _) = resume(url, session, &primed, 3);
    assert_eq!(first.iter().map(|id| seq(id)).collect::<Vec<_>>(), [1, 2, 3]);
    let (one, _) = keyed_add(url, session, 2, "k-1", None);
    assert_eq!(value(&one), 1);
    // The snapshot may need a new server to go on with (the embedded store is copied stopped).
    let url = snapshot();
    broadcast(&url, session, 3, 4);
    let (_, seen, _) = resume(&url, session, first.last().expect("event 3"), 4);
    assert_eq!(seen.iter().map(|id| seq(id)).collect::<Vec<_>>(), [4, 5, 6, 7]);
    let (two, claim) = keyed_add(&url, session, 4, "k-2", None);
    assert_eq!(value(&two), 2);
    let claim = claim.expect("the claim of k-2, acknowledged in a header");
    (Held { cursor: seen.last().expect("event 7").clone(), claim }, url)
}

/// The second half: the server's messages go on at positions it handed out before, with other
/// events; the client's resume and its key are told what happened.
fn after_the_rollback(url: &str, session: &str, held: &Held, expected_counter: i64) {
    broadcast(url, session, 5, 6);
    let (status, ids, body) = resume(url, session, &held.cursor, 1);
    assert_eq!(status, 404, "a resume from a history the store lost continued: {ids:?}");
    assert!(body.contains("history_rewritten"), "{body}");
    let (status, _, body) = resume(url, session, &held.cursor, 1);
    assert_eq!((status, body.contains("history_rewritten")), (404, true), "the session stays ended: {body}");
    // A new session, as the client's next step is: the key is refused, not run again.
    let (fresh, _) = initialize(url);
    let (again, _) = keyed_add(url, &fresh, 6, "k-2", Some(&held.claim));
    assert_eq!(reason(&again), "records_regressed", "{again}");
    assert_eq!(counter(url, &fresh), expected_counter, "the addition of k-2 was not made again");
}

#[test]
fn a_redis_restarted_from_an_older_snapshot_is_told_to_clients_for_stream_ids_and_keys() {
    let rt = runtime();
    let mut redis = rt.block_on(RedisServer::start_with(&["--save", "", "--appendonly", "no"]));
    let dir = temp_dir("history-redis-snapshot");
    let args = ["--store", "redis", "--redis-url", &redis.url, "--redis-durability", "none"];
    let (_server, url) = serve(free_port(), &dir, &args);
    let (session, _) = initialize(&url);
    let (held, url) = before_the_rollback(&url, &session, || {
        assert_eq!(rt.block_on(redis.command(&["SAVE"])), "+OK");
        url.clone()
    });
    // Back to the snapshot: events 4..=7 and key k-2 are gone, the session and k-1 remain.
    rt.block_on(redis.restart());
    serving_again(&url);
    after_the_rollback(&url, &session, &held, 1);
}

/// Waits until the replica at `url` answers again after its Redis restarted (its connection to
/// Redis comes back on the next command): a new session's `initialize` gets a 200.
fn serving_again(url: &str) {
    let deadline = Instant::now() + WAIT;
    let json = [("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    while exchange(url, "POST", &json, init, |_| false, WAIT).status != 200 {
        assert!(Instant::now() < deadline, "the replica never served again");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_redis_restarted_empty_under_a_running_replica_is_other_records() {
    let rt = runtime();
    let mut redis = rt.block_on(RedisServer::start());
    let dir = temp_dir("history-redis-empty");
    let args = ["--store", "redis", "--redis-url", &redis.url, "--redis-durability", "none"];
    let (_server, url) = serve(free_port(), &dir, &args);
    let (session, records) = initialize(&url);
    let (one, claim) = keyed_add(&url, &session, 2, "k-1", None);
    assert_eq!(value(&one), 1);
    rt.block_on(redis.restart());
    // The replica, still running, names the records Redis has now: others.
    serving_again(&url);
    let (fresh, now) = initialize(&url);
    assert_ne!(now, records, "records that lost every claim are other records");
    let (again, _) = keyed_add(&url, &fresh, 3, "k-1", claim.as_deref());
    assert_eq!(reason(&again), "records_regressed", "{again}");
    assert_eq!(counter(&url, &fresh), 0, "the addition was not made again");
}

#[test]
fn an_embedded_store_restored_from_a_backup_is_told_to_clients_for_stream_ids_and_keys() {
    let dir = temp_dir("history-embedded");
    let backup = temp_dir("history-embedded-backup");
    let port = free_port();
    let (mut server, url) = serve(port, &dir, &[]);
    let (session, _) = initialize(&url);
    let mut restarted = None;
    let (held, _) = before_the_rollback(&url, &session, || {
        // A backup of the directory, taken while the server is stopped.
        server.kill9();
        copy_dir(&dir, &backup);
        let (again, url) = serve(port, &dir, &[]);
        restarted = Some(again);
        url
    });
    drop(restarted.take());
    copy_dir(&backup, &dir);
    let (_restored, url) = serve(free_port(), &dir, &[]);
    after_the_rollback(&url, &session, &held, 1);
}

/// `tether serve` with `args`, expected to refuse to start: what it said on stderr.
fn refused(args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tether"))
        .arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .output()
        .expect("run tether serve");
    assert!(!output.status.success(), "it started: {}", String::from_utf8_lossy(&output.stdout));
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Redis is held to what an acknowledged write must survive: a Redis that keeps writes only in
/// memory, or may evict tether's keys, is refused unless the operator accepts that knowingly;
/// one that fsyncs every write serves.
#[test]
fn redis_is_checked_against_what_an_acknowledged_write_survives() {
    let rt = runtime();
    let dir = temp_dir("history-redis-durability");
    let volatile = rt.block_on(RedisServer::start());
    let said = refused(&["--store", "redis", "--redis-url", &volatile.url, "--data-dir", dir.to_str().expect("path")]);
    assert!(said.contains("appendonly no") && said.contains("--redis-durability none"), "{said}");
    let evicting = rt.block_on(RedisServer::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--maxmemory",
        "64mb",
        "--maxmemory-policy",
        "allkeys-lru",
    ]));
    let said = refused(&["--store", "redis", "--redis-url", &evicting.url]);
    assert!(said.contains("maxmemory-policy allkeys-lru"), "{said}");
    let durable = rt.block_on(RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]));
    let (_server, url) = serve(free_port(), &dir, &["--store", "redis", "--redis-url", &durable.url]);
    let (session, _) = initialize(&url);
    let (one, _) = keyed_add(&url, &session, 1, "k", None);
    assert_eq!(value(&one), 1);
    let (_volatile_server, _) =
        serve(free_port(), &dir, &["--store", "redis", "--redis-url", &volatile.url, "--redis-durability", "none"]);
}

/// With `--redis-durability replicated`, every acknowledged write waits for its replicas
/// (WAIT); a Redis with fewer replicas than asked is refused.
#[test]
fn replicated_writes_wait_for_their_replicas() {
    let rt = runtime();
    let dir = temp_dir("history-redis-replicated");
    let primary = rt.block_on(RedisServer::start());
    let port = primary.url.trim_start_matches("redis://127.0.0.1:").trim_end_matches('/').to_owned();
    let _replica =
        rt.block_on(RedisServer::start_with(&["--save", "", "--appendonly", "no", "--replicaof", "127.0.0.1", &port]));
    let deadline = Instant::now() + WAIT;
    while !rt.block_on(primary.command(&["INFO", "replication"])).contains("state=online") {
        assert!(Instant::now() < deadline, "the replica never connected");
        std::thread::sleep(Duration::from_millis(50));
    }
    let two =
        ["--store", "redis", "--redis-url", &primary.url, "--redis-durability", "replicated", "--redis-replicas", "2"];
    let said = refused(&two);
    assert!(said.contains("1 replicas online") && said.contains("must reach 2"), "{said}");
    let one = ["--store", "redis", "--redis-url", &primary.url, "--redis-durability", "replicated"];
    let (_server, url) = serve(free_port(), &dir, &one);
    let (session, _) = initialize(&url);
    let (added, _) = keyed_add(&url, &session, 1, "k", None);
    assert_eq!(value(&added), 1);
}
