//! Exactly-once tool execution under chaos: 1,000 `counter_add` calls of amount 1 through
//! `tether call`, while a fault proxy cuts connections at random (JSON answers included) and the
//! embedded server is killed with SIGKILL and restarted, or, in a second run, calls alternate
//! between two replicas on one Redis. With idempotency keys the counter ends at exactly 1,000
//! and every call reports its real result (the values 1 to 1,000, each once). Against a server
//! without the extension, the same faults leave calls reported as outcome unknown, and the counter
//! off by some of them.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::calls::{RUN_DEADLINE, Run, Tally, addr, assert_each_value_once, faulty_proxy};
use common::{free_port, parse, serve, temp_dir, tether};
use serde_json::Value;
use tether_testkit::RedisServer;

const CALLS: usize = 1_000;
/// Kills of the embedded server during a run.
const KILLS: usize = 3;
const ARGS: &str = r#"{"key": "chaos", "amount": 1}"#;

/// `CALLS` calls of `counter_add` through `url`; `done` counts finished calls.
fn run_calls(url: &str, done: &AtomicUsize) -> Tally {
    let value = |result: &Value| result["structuredContent"]["value"].as_i64();
    Run { url, tool: "counter_add", args: ARGS, calls: CALLS, value, deadline: RUN_DEADLINE }.go(done)
}

/// The counter's value, read past the proxy.
fn counter(url: &str) -> i64 {
    let read = tether(&["call", url, "counter_get", "--args", r#"{"key": "chaos"}"#]);
    let lines = parse(&read.rest(Duration::from_secs(30)));
    let last = lines.last().expect("counter_get answered");
    last["result"]["structuredContent"]["value"].as_i64().unwrap_or_else(|| panic!("counter_get: {last}"))
}

/// How one run with kills went.
struct Killed {
    tally: Tally,
    /// The counter's value at the end.
    value: i64,
    /// Responses the proxy cut.
    cuts: u64,
    /// Calls that were running when the server was killed.
    hit: usize,
}

/// Runs the calls through a faulty proxy against an embedded server that is killed `KILLS`
/// times and restarted on the same directory.
fn embedded_with_kills(name: &str, server_args: &[&str]) -> Killed {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let dir = temp_dir(name);
    let port = free_port();
    let (mut server, direct) = serve(port, &dir, server_args);
    let proxy = faulty_proxy(&runtime, vec![addr(port)]);
    let url = format!("http://{}/mcp", proxy.addr);
    let done = AtomicUsize::new(0);
    let mut kills = Vec::new();
    let tally = std::thread::scope(|scope| {
        let calls = scope.spawn(|| run_calls(&url, &done));
        for kill in 1..=KILLS {
            let due = kill * CALLS / (KILLS + 1);
            let deadline = Instant::now() + RUN_DEADLINE;
            while done.load(Ordering::Relaxed) < due && Instant::now() < deadline && !calls.is_finished() {
                std::thread::sleep(Duration::from_millis(5));
            }
            kills.push(Instant::now());
            server.kill9();
            server = serve(port, &dir, server_args).0;
        }
        calls.join().expect("calls")
    });
    let value = counter(&direct);
    let cuts = proxy.cuts.load(Ordering::Relaxed);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    let hit = tally.spanning(&kills);
    Killed { tally, value, cuts, hit }
}

/// Every call got its real result: the values 1 to `CALLS`, each once, and the counter at `CALLS`.
fn assert_exactly_once(run: &str, tally: &Tally, value: i64) {
    assert_each_value_once(run, tally, CALLS);
    assert_eq!(value, CALLS as i64, "{run}: the counter was added to exactly once per call");
}

#[test]
fn keyed_calls_run_exactly_once_through_kills_and_cuts() {
    let Killed { tally, value, cuts, hit } = embedded_with_kills("chaos-embedded", &["--sse-retry", "50ms"]);
    println!(
        "embedded, {KILLS} kills ({hit} calls in flight at a kill), {cuts} cuts: {} results, {} re-issued, {} unknown, \
         {} failed; counter {value}",
        tally.values.len(),
        tally.reissued,
        tally.unknown,
        tally.failed.len()
    );
    assert_exactly_once("embedded", &tally, value);
    assert!(tally.reissued > 0 && cuts > 0, "the faults happened");
    assert!(hit > 0, "a kill hit calls in flight");
}

#[test]
fn keyed_calls_run_exactly_once_across_two_redis_replicas() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let redis = runtime.block_on(RedisServer::start());
    let dir = temp_dir("chaos-redis");
    let args =
        ["--store", "redis", "--redis-url", redis.url.as_str(), "--redis-durability", "none", "--sse-retry", "50ms"];
    let (a, b) = (free_port(), free_port());
    let (replica_a, direct) = serve(a, &dir.join("a"), &args);
    let (replica_b, _) = serve(b, &dir.join("b"), &args);
    let proxy = faulty_proxy(&runtime, vec![addr(a), addr(b)]);
    let done = AtomicUsize::new(0);
    let tally = run_calls(&format!("http://{}/mcp", proxy.addr), &done);
    let value = counter(&direct);
    let cuts = proxy.cuts.load(Ordering::Relaxed);
    println!(
        "two redis replicas, {cuts} cuts: {} results, {} re-issued, {} unknown, {} failed; counter {value}",
        tally.values.len(),
        tally.reissued,
        tally.unknown,
        tally.failed.len()
    );
    drop((replica_a, replica_b));
    let _ = std::fs::remove_dir_all(&dir);
    assert_exactly_once("redis replicas", &tally, value);
    assert!(tally.reissued > 0 && cuts > 0, "the faults happened");
}

#[test]
fn without_the_extension_the_same_faults_leave_outcomes_unknown() {
    let Killed { tally, value, cuts, .. } =
        embedded_with_kills("chaos-contrast", &["--sse-retry", "50ms", "--no-idempotency"]);
    let results = tally.values.len() as i64;
    let unknown = tally.unknown as i64;
    println!(
        "without the extension, embedded, {KILLS} kills, {cuts} cuts: {results} results, {unknown} outcome unknown, \
         {} aborted, {} failed; counter {value}: of the {unknown} calls the caller cannot tell ran, {} did ({} did not)",
        tally.aborted,
        tally.failed.len(),
        value - results,
        results + unknown - value
    );
    assert_eq!(tally.reissued, 0, "nothing unkeyed is re-sent");
    assert!(unknown > 0, "cuts of JSON answers leave outcomes unknown");
    // The client stays honest: every reported result counted, and only calls without one can
    // differ.
    let (failed, aborted) = (tally.failed.len() as i64, tally.aborted as i64);
    assert!(
        results <= value && value <= results + unknown + failed + aborted,
        "{results} results, {unknown} unknown, {aborted} aborted, {failed} failed, counter {value}"
    );
}
