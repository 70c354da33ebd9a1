//! Exactly-once tool execution under chaos: 1,000 `counter_add` calls of amount 1 through
//! `tether call`, while a fault proxy cuts connections at random (JSON answers included) and the
//! embedded server is killed with SIGKILL and restarted, or, in a second run, calls alternate
//! between two replicas on one Redis. With idempotency keys the counter ends at exactly 1,000
//! and every call reports its real result (the values 1 to 1,000, each once). Against a server
//! without the extension, the same faults leave calls reported as outcome unknown, and the counter
//! off by some of them.

mod common;

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{free_port, parse, serve, temp_dir, tether};
use serde_json::Value;
use tether_testkit::{RedisServer, proxy};

const CALLS: usize = 1_000;
/// `tether call` processes running at once.
const WORKERS: usize = 4;
/// Kills of the embedded server during a run.
const KILLS: usize = 3;
/// How long one call may take, faults and re-issues included.
const CALL_DEADLINE: Duration = Duration::from_secs(90);
/// How long a whole run may take.
const RUN_DEADLINE: Duration = Duration::from_secs(300);
const ARGS: &str = r#"{"key": "chaos", "amount": 1}"#;

/// How the calls of one run ended.
#[derive(Debug, Default)]
struct Tally {
    /// The counter values the calls reported, one per call that got its result.
    values: Vec<i64>,
    /// Calls reported as outcome unknown.
    unknown: usize,
    /// Calls that ended otherwise (error, nothing), with their output.
    failed: Vec<String>,
    /// Re-issues of keyed calls.
    reissued: usize,
    /// When each call started and ended.
    spans: Vec<(Instant, Instant)>,
}

impl Tally {
    /// The calls that were running when one of `kills` happened: started before it and ended
    /// after it (the server they were waiting for died under them).
    fn spanning(&self, kills: &[Instant]) -> usize {
        self.spans.iter().filter(|(start, end)| kills.iter().any(|kill| start < kill && kill < end)).count()
    }
}

/// Makes `CALLS` calls through `url`, `WORKERS` at a time; `done` counts finished calls.
fn run_calls(url: &str, done: &AtomicUsize) -> Tally {
    let next = AtomicUsize::new(0);
    let tally = Mutex::new(Tally::default());
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| {
                while next.fetch_add(1, Ordering::Relaxed) < CALLS && started.elapsed() < RUN_DEADLINE {
                    let mut call = tether(&["call", url, "counter_add", "--args", ARGS]);
                    let began = Instant::now();
                    let lines = call.rest(CALL_DEADLINE);
                    let status = call.child.try_wait().ok().flatten().and_then(|s| s.code());
                    call.kill9();
                    let lines = parse(&lines);
                    let mut tally = tally.lock().expect("tally");
                    tally.spans.push((began, Instant::now()));
                    tally.reissued += lines.iter().filter(|l| l["event"] == "reissued").count();
                    let last = lines.last().cloned().unwrap_or(Value::Null);
                    match last["event"].as_str() {
                        Some("result") => match last["result"]["structuredContent"]["value"].as_i64() {
                            Some(value) => tally.values.push(value),
                            None => tally.failed.push(last.to_string()),
                        },
                        Some("outcome_unknown") => tally.unknown += 1,
                        _ => tally.failed.push(format!("exit {status:?} after {:?}: {lines:?}", began.elapsed())),
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    tally.into_inner().expect("tally")
}

/// The counter's value, read past the proxy.
fn counter(url: &str) -> i64 {
    let read = tether(&["call", url, "counter_get", "--args", r#"{"key": "chaos"}"#]);
    let lines = parse(&read.rest(Duration::from_secs(30)));
    let last = lines.last().expect("counter_get answered");
    last["result"]["structuredContent"]["value"].as_i64().unwrap_or_else(|| panic!("counter_get: {last}"))
}

/// A proxy in front of `upstreams` that cuts any response after 200 to 6,000 body bytes.
fn faulty_proxy(runtime: &tokio::runtime::Runtime, upstreams: Vec<std::net::SocketAddr>) -> proxy::Proxy {
    let proxy = runtime.block_on(proxy::start(upstreams, 0x5eed_c4a0, 200, 6_000));
    proxy.cutting.store(true, Ordering::Relaxed);
    proxy.cut_responses.store(true, Ordering::Relaxed);
    proxy
}

fn addr(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
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
    assert!(tally.failed.is_empty(), "{run}: calls without their result: {:?}", tally.failed);
    assert_eq!(tally.unknown, 0, "{run}: no outcome is unknown");
    let mut values = tally.values.clone();
    values.sort_unstable();
    let expected: Vec<i64> = (1..=CALLS as i64).collect();
    assert!(
        values == expected,
        "{run}: each call reported a distinct real result: {:?}",
        &values[..values.len().min(50)]
    );
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
    let args = ["--store", "redis", "--redis-url", redis.url.as_str(), "--sse-retry", "50ms"];
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
         {} failed; counter {value}: of the {unknown} calls the caller cannot tell ran, {} did ({} did not)",
        tally.failed.len(),
        value - results,
        results + unknown - value
    );
    assert_eq!(tally.reissued, 0, "nothing unkeyed is re-sent");
    assert!(unknown > 0, "cuts of JSON answers leave outcomes unknown");
    // The client stays honest: every reported result counted, and only unknown calls can differ.
    let failed = tally.failed.len() as i64;
    assert!(
        results <= value && value <= results + unknown + failed,
        "{results} results, {unknown} unknown, {failed} failed, counter {value}"
    );
}
