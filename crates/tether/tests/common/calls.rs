//! Many `tether call` processes against one server, and how each call ended: the chaos runs of
//! chaos.rs (the built-in counter) and gateway_chaos.rs (a stdio server's counter) share it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tether_testkit::proxy;

use super::{parse, tether};

/// `tether call` processes running at once.
pub const WORKERS: usize = 4;
/// How long one call may take, faults and re-issues included.
pub const CALL_DEADLINE: Duration = Duration::from_secs(90);
/// How long a whole run of the built-in server's calls may take.
pub const RUN_DEADLINE: Duration = Duration::from_secs(300);

/// How the calls of one run ended.
#[derive(Debug, Default)]
pub struct Tally {
    /// The counter values the calls reported, one per call that got its result.
    pub values: Vec<i64>,
    /// Calls answered `request_aborted`: their server died under them.
    pub aborted: usize,
    /// Calls reported as outcome unknown.
    pub unknown: usize,
    /// What each of those said, for a failed run's message.
    pub unknown_said: Vec<String>,
    /// Calls that ended otherwise (error, nothing), with their output.
    pub failed: Vec<String>,
    /// Re-issues of keyed calls.
    pub reissued: usize,
    /// When each call started and ended.
    pub spans: Vec<(Instant, Instant)>,
}

impl Tally {
    /// The calls that were running when one of `kills` happened: started before it and ended
    /// after it (the server they were waiting for died under them).
    pub fn spanning(&self, kills: &[Instant]) -> usize {
        self.spans.iter().filter(|(start, end)| kills.iter().any(|kill| start < kill && kill < end)).count()
    }
}

/// One run: `calls` calls of `tool` with `args` through `url`.
pub struct Run<'a> {
    pub url: &'a str,
    pub tool: &'a str,
    pub args: &'a str,
    pub calls: usize,
    /// The counter value a result reports.
    pub value: fn(&Value) -> Option<i64>,
    /// How long the whole run may take: calls not started by then are not made.
    pub deadline: Duration,
}

impl Run<'_> {
    /// Makes the calls, `WORKERS` at a time; `done` counts finished calls.
    pub fn go(&self, done: &AtomicUsize) -> Tally {
        let next = AtomicUsize::new(0);
        let tally = Mutex::new(Tally::default());
        let started = Instant::now();
        std::thread::scope(|scope| {
            for _ in 0..WORKERS {
                scope.spawn(|| {
                    while next.fetch_add(1, Ordering::Relaxed) < self.calls && started.elapsed() < self.deadline {
                        // A budget of re-sends that outlasts a server's restart on a loaded machine.
                        let mut call = tether(&["call", self.url, self.tool, "--args", self.args, "--retries", "16"]);
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
                            Some("result") => match (self.value)(&last["result"]) {
                                Some(value) => tally.values.push(value),
                                None => tally.failed.push(last.to_string()),
                            },
                            Some("error") if last["error"]["data"]["reason"] == "request_aborted" => tally.aborted += 1,
                            Some("outcome_unknown") => {
                                tally.unknown += 1;
                                tally.unknown_said.push(last.to_string());
                            }
                            _ => tally.failed.push(format!("exit {status:?} after {:?}: {lines:?}", began.elapsed())),
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        tally.into_inner().expect("tally")
    }
}

/// A proxy in front of `upstreams` that cuts any response after 200 to 6,000 body bytes.
pub fn faulty_proxy(runtime: &tokio::runtime::Runtime, upstreams: Vec<std::net::SocketAddr>) -> proxy::Proxy {
    let proxy = runtime.block_on(proxy::start(upstreams, 0x5eed_c4a0, 200, 6_000));
    proxy.cutting.store(true, Ordering::Relaxed);
    proxy.cut_responses.store(true, Ordering::Relaxed);
    proxy
}

/// A loopback address.
pub fn addr(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}

/// Every call got its real result: the values 1 to `calls`, each once.
pub fn assert_each_value_once(run: &str, tally: &Tally, calls: usize) {
    assert!(tally.failed.is_empty(), "{run}: calls without their result: {:?}", tally.failed);
    assert_eq!(tally.unknown, 0, "{run}: no outcome is unknown: {:?}", tally.unknown_said);
    assert_eq!(tally.aborted, 0, "{run}: no call was aborted");
    let mut values = tally.values.clone();
    values.sort_unstable();
    let expected: Vec<i64> = (1..=calls as i64).collect();
    assert!(
        values == expected,
        "{run}: each call reported a distinct real result: {:?}",
        &values[..values.len().min(50)]
    );
}
