//! `tether gateway` with the official SDKs on either side.
//!
//! Exactly-once: 500 keyed calls of a stdio server written with the Python SDK
//! (tests/gateway/py_count_server.py), which counts its runs in a file, through a proxy that
//! cuts connections at random; in a second run the gateway (embedded store) is also killed with
//! SIGKILL once and restarted. The server knows nothing of keys, resumption or tether: the
//! gateway claims each key before the call reaches the server.
//!
//! Resumption: the Python and TypeScript SDK clients call a streaming tool of a stdio server
//! through the gateway while a proxy cuts every stream, and get each notification once, in
//! order, and the result.
//!
//! Needs `TETHER_PY_SDK` (a Python with `pip install mcp`) and `TETHER_TS_SDK` (a directory with
//! `@modelcontextprotocol/sdk` installed): a plain `cargo test` ignores them; scripts/test installs
//! both and runs them.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::calls::{Run, Tally, addr, assert_each_value_once, faulty_proxy};
use common::{Process, free_port, temp_dir, tether};
use serde_json::Value;

const CALLS: usize = 500;
/// How long a run may take: each call is a session of its own, so a Python child of its own
/// (about 0.4 s of CPU to start), on two cores.
const RUN_DEADLINE: Duration = Duration::from_secs(900);
const SERVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/gateway/py_count_server.py");

const STDIO_SERVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/gateway/stdio_server.py");
const PY_CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/gateway/sdk_resume.py");
const TS_CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/gateway/sdk_resume.mjs");

fn python() -> String {
    std::env::var("TETHER_PY_SDK").expect(
        "TETHER_PY_SDK must name a Python with the official MCP SDK (`pip install mcp`); scripts/test installs one",
    )
}

/// `tether gateway` on `port` (embedded store in `dir`) in front of the counting server, which
/// counts in `count`.
fn gateway(port: u16, dir: &Path, count: &Path) -> Process {
    let listen = format!("127.0.0.1:{port}");
    let count_file = format!("COUNT_FILE={}", count.display());
    let python = python();
    let data = dir.to_str().expect("utf-8 path");
    let process = tether(&[
        "gateway",
        "--listen",
        &listen,
        "--data-dir",
        data,
        "--sse-retry",
        "50ms",
        "--",
        "env",
        &count_file,
        &python,
        SERVER,
    ]);
    let first = process.line(Duration::from_secs(60)).expect("tether gateway started");
    assert!(first.starts_with("listening on "), "{first}");
    process
}

/// The value a result of `add` reports (the SDK writes the returned object as text).
fn value(result: &Value) -> Option<i64> {
    let text = result["content"][0]["text"].as_str()?;
    serde_json::from_str::<Value>(text).ok()?["value"].as_i64()
}

/// How many times the server's tool really ran.
fn ran(count: &Path) -> i64 {
    std::fs::read_to_string(count).map_or(0, |text| text.trim().parse().expect("a count"))
}

/// Makes the calls through a cutting proxy in front of a gateway; with `kill`, the gateway is
/// killed with SIGKILL once half the calls are done and restarted on the same store.
fn run(name: &str, kill: bool) -> (Tally, i64, u64, usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let dir = temp_dir(name);
    let count = dir.join("count");
    let port = free_port();
    let mut server = gateway(port, &dir.join("data"), &count);
    let proxy = faulty_proxy(&runtime, vec![addr(port)]);
    let url = format!("http://{}/mcp", proxy.addr);
    let done = AtomicUsize::new(0);
    let mut kills = Vec::new();
    let tally = std::thread::scope(|scope| {
        let calls = scope.spawn(|| {
            Run { url: &url, tool: "add", args: r#"{"amount": 1}"#, calls: CALLS, value, deadline: RUN_DEADLINE }
                .go(&done)
        });
        if kill {
            let deadline = Instant::now() + RUN_DEADLINE;
            while done.load(Ordering::Relaxed) < CALLS / 2 && Instant::now() < deadline && !calls.is_finished() {
                std::thread::sleep(Duration::from_millis(5));
            }
            kills.push(Instant::now());
            server.kill9();
            server = gateway(port, &dir.join("data"), &count);
        }
        calls.join().expect("calls")
    });
    let cuts = proxy.cuts.load(Ordering::Relaxed);
    drop(server);
    let hit = tally.spanning(&kills);
    let ran = ran(&count);
    let _ = std::fs::remove_dir_all(&dir);
    (tally, ran, cuts, hit)
}

#[test]
#[ignore = "needs the SDKs scripts/test installs (TETHER_PY_SDK, TETHER_TS_SDK); it runs them"]
fn keyed_calls_through_a_gateway_run_exactly_once_under_cuts() {
    let (tally, ran, cuts, _) = run("gateway-chaos-cuts", false);
    println!(
        "gateway, {cuts} cuts: {} results, {} re-issued, {} aborted, {} unknown, {} failed; the server ran the tool {ran} times",
        tally.values.len(),
        tally.reissued,
        tally.aborted,
        tally.unknown,
        tally.failed.len()
    );
    assert_each_value_once("gateway with cuts", &tally, CALLS);
    assert_eq!(ran, CALLS as i64, "the server ran the tool exactly once per call");
    assert!(tally.reissued > 0 && cuts > 0, "the faults happened");
}

#[test]
#[ignore = "needs the SDKs scripts/test installs (TETHER_PY_SDK, TETHER_TS_SDK); it runs them"]
fn a_kill_9_of_a_gateway_leaves_each_call_with_its_result_or_request_aborted_and_none_run_twice() {
    let (tally, ran, cuts, hit) = run("gateway-chaos-kill", true);
    let results = tally.values.len() as i64;
    println!(
        "gateway, 1 kill ({hit} calls in flight at the kill), {cuts} cuts: {results} results, {} re-issued, {} aborted, \
         {} unknown, {} failed; the server ran the tool {ran} times",
        tally.reissued,
        tally.aborted,
        tally.unknown,
        tally.failed.len()
    );
    assert!(tally.failed.is_empty(), "calls without an outcome: {:?}", tally.failed);
    assert_eq!(tally.unknown, 0, "no outcome is unknown");
    assert_eq!(results + tally.aborted as i64, CALLS as i64, "every call ended with its result or request_aborted");
    let mut values = tally.values.clone();
    values.sort_unstable();
    values.dedup();
    assert_eq!(values.len() as i64, results, "no two calls reported the same run");
    // Each result is a run; an aborted call may have run before the kill, never twice.
    assert!(
        results <= ran && ran <= results + tally.aborted as i64,
        "{results} results and {} aborted, but the tool ran {ran} times",
        tally.aborted
    );
    assert!(hit > 0, "the kill hit calls in flight");
}

#[test]
#[ignore = "needs the SDKs scripts/test installs (TETHER_PY_SDK, TETHER_TS_SDK); it runs them"]
fn sdk_clients_resume_through_a_gateway_whose_streams_are_cut() {
    let ts_sdk = std::env::var("TETHER_TS_SDK").expect(
        "TETHER_TS_SDK must name a directory with @modelcontextprotocol/sdk installed; scripts/test installs one",
    );
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let gateway = tether(&[
        "gateway",
        "--store",
        "memory",
        "--listen",
        &listen,
        "--sse-retry",
        "50ms",
        "--",
        "python3",
        STDIO_SERVER,
    ]);
    let first = gateway.line(Duration::from_secs(60)).expect("tether gateway started");
    assert!(first.starts_with("listening on "), "{first}");
    // Cuts after 600 to 1,800 bytes of each stream: the Python SDK gives up on a call after two
    // resumes in a row end abruptly (MAX_RECONNECTION_ATTEMPTS in mcp 2.3.0), so the budget leaves
    // its 12 notifications room to finish after a cut or two.
    let proxy = runtime.block_on(tether_testkit::proxy::start(vec![addr(port)], 0x5eed_0d1c, 600, 1_800));
    proxy.cutting.store(true, Ordering::Relaxed);
    let url = format!("http://{}/mcp", proxy.addr);
    for (name, mut command) in
        [("python", std::process::Command::new(python())), ("typescript", std::process::Command::new("node"))]
    {
        let script = if name == "python" { PY_CLIENT } else { TS_CLIENT };
        let before = proxy.cuts.load(Ordering::Relaxed);
        let output = command
            .args([script, url.as_str(), "12"])
            .env("TETHER_TS_SDK", &ts_sdk)
            .output()
            .unwrap_or_else(|err| panic!("{name} sdk client: {err}"));
        let cuts = proxy.cuts.load(Ordering::Relaxed) - before;
        let stdout = String::from_utf8_lossy(&output.stdout);
        println!("{name} sdk client through the gateway, {cuts} cuts: {}", stdout.trim());
        assert!(output.status.success(), "{name}: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
        assert!(cuts > 0, "{name}: the proxy cut nothing");
    }
}
