//! The scenarios: what each measures, and how, against a freshly started target.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::target::{self, Mode, Target};
use crate::wire::{Conn, Endpoint, Session, WireError};
use crate::{BenchConfig, Sizes};

/// A scenario of the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scenario {
    /// Closed-loop tool calls, each sending one progress notification then the result (SSE).
    ToolCall,
    /// The same with a JSON response and no notification.
    ToolCallJson,
    /// One call streaming many small notifications; events per second at the client.
    Stream,
    /// Time from a resume GET to the last replayed event, for several history sizes.
    Resume,
    /// Session creation rate and resident memory per idle session.
    Sessions,
    /// One broadcast per second to many sessions' standalone streams; delivery latency.
    Fanout,
    /// Tool calls as `tool-call`, for the sustained duration (30 s by default) on
    /// [`SUSTAINED_CONNECTIONS`] connections sharing one session: the tail (p99.9, max) and
    /// the slowest call of every 100 ms.
    Sustained,
    /// The same with a session per connection.
    SustainedSessions,
    /// The same on one connection: latency with no queueing behind other calls.
    SustainedSingle,
}

/// Connections of the sustained scenarios (but the single one).
pub const SUSTAINED_CONNECTIONS: usize = 16;

/// The metric of the CPU time the target used per call: its server's and helpers', in µs.
pub const SERVER_CPU: &str = "server CPU µs/call";

/// The metric of the CPU time the bench's load generator used per call, in µs.
pub const CLIENT_CPU: &str = "client CPU µs/call";

/// The width of one point of the latency-over-time series.
pub const TIMELINE_STEP: Duration = Duration::from_millis(100);

impl Scenario {
    /// Every scenario, in report order.
    pub const ALL: [Scenario; 9] = [
        Scenario::ToolCall,
        Scenario::ToolCallJson,
        Scenario::Stream,
        Scenario::Resume,
        Scenario::Sessions,
        Scenario::Fanout,
        Scenario::Sustained,
        Scenario::SustainedSessions,
        Scenario::SustainedSingle,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::ToolCall => "tool-call",
            Scenario::ToolCallJson => "tool-call-json",
            Scenario::Stream => "stream",
            Scenario::Resume => "resume",
            Scenario::Sessions => "sessions",
            Scenario::Fanout => "fanout",
            Scenario::Sustained => "sustained",
            Scenario::SustainedSessions => "sustained-sessions",
            Scenario::SustainedSingle => "sustained-single",
        }
    }

    /// The scenario with this name.
    pub fn parse(name: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// One measured figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    /// What it is (`calls/s`, `p99 ms`, ...): also the column of the report.
    pub name: String,
    /// Its value.
    pub value: f64,
}

/// What one run of a scenario measured.
#[derive(Debug, Clone, Default)]
pub struct Measurement {
    /// The figures, in column order.
    pub metrics: Vec<Metric>,
    /// Latencies in microseconds, when the scenario has them.
    pub latency_us: Option<Histogram<u64>>,
    /// `(history size, milliseconds)` points of the resume scenario.
    pub curve: Vec<(u64, f64)>,
    /// The slowest call started in each [`TIMELINE_STEP`] of the measured time, in
    /// milliseconds (`None`: no call started in it, the sign of a stall longer than the step).
    pub timeline: Vec<Option<f64>>,
}

impl Measurement {
    fn push(&mut self, name: impl Into<String>, value: f64) {
        self.metrics.push(Metric { name: name.into(), value });
    }
}

/// How one run of a scenario ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// It ran; here is what it measured.
    Measured(Measurement),
    /// The target does not do what the scenario needs (for example, it keeps no history).
    Unsupported(String),
    /// It broke (the reason is the first error).
    Failed(String),
}

enum Problem {
    Unsupported(String),
    Failed(String),
}

impl From<WireError> for Problem {
    fn from(err: WireError) -> Self {
        Problem::Failed(err.to_string())
    }
}

type Result<T> = std::result::Result<T, Problem>;

/// Starts a fresh `target`, runs `scenario` against it once, and stops it.
pub async fn run(target: Target, scenario: Scenario, config: &BenchConfig, sizes: &Sizes) -> Outcome {
    let mode = if scenario == Scenario::ToolCallJson { Mode::Json } else { Mode::Sse };
    let largest = sizes.resume_events.iter().copied().chain([sizes.stream_events]).max().unwrap_or(0);
    let programs = config.programs.clone();
    let started = tokio::task::spawn_blocking(move || target::start(target, mode, &programs, largest + 16)).await;
    let running = match started {
        Ok(Ok(running)) => running,
        Ok(Err(err)) => return Outcome::Failed(err.to_string()),
        Err(err) => return Outcome::Failed(err.to_string()),
    };
    let endpoint = running.endpoint.clone();
    let measured = match scenario {
        Scenario::ToolCall => tool_calls(&running, Load::timed(config, true)).await,
        Scenario::ToolCallJson => tool_calls(&running, Load::timed(config, false)).await,
        Scenario::Sustained => tool_calls(&running, Load::sustained(config, SUSTAINED_CONNECTIONS, 1)).await,
        Scenario::SustainedSessions => {
            tool_calls(&running, Load::sustained(config, SUSTAINED_CONNECTIONS, SUSTAINED_CONNECTIONS)).await
        }
        Scenario::SustainedSingle => tool_calls(&running, Load::sustained(config, 1, 1)).await,
        Scenario::Stream => stream(&endpoint, sizes.stream_events).await,
        Scenario::Resume => resume(&endpoint, &sizes.resume_events).await,
        Scenario::Sessions => sessions(&endpoint, config, sizes.idle_sessions, &running).await,
        Scenario::Fanout => fanout(&endpoint, config, sizes.fanout_sessions).await,
    };
    // Killing and reaping blocks briefly; the runtime has other work in flight.
    let _ = tokio::task::spawn_blocking(move || drop(running)).await;
    match measured {
        Ok(measurement) => Outcome::Measured(measurement),
        Err(Problem::Unsupported(reason)) => Outcome::Unsupported(reason),
        Err(Problem::Failed(reason)) => Outcome::Failed(reason),
    }
}

fn histogram() -> Histogram<u64> {
    // 1 µs to 10 min at 3 significant digits; the bounds are constants, so this cannot fail.
    Histogram::new_with_bounds(1, 600_000_000, 3).unwrap_or_else(|_| Histogram::new(3).expect("3 sigfig is valid"))
}

fn micros(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX).max(1)
}

fn percentile_ms(histogram: &Histogram<u64>, quantile: f64) -> f64 {
    histogram.value_at_quantile(quantile) as f64 / 1_000.0
}

fn add_latencies(measurement: &mut Measurement, histogram: Histogram<u64>) {
    measurement.push("p50 ms", percentile_ms(&histogram, 0.50));
    measurement.push("p99 ms", percentile_ms(&histogram, 0.99));
    measurement.push("p99.9 ms", percentile_ms(&histogram, 0.999));
    measurement.latency_us = Some(histogram);
}

/// How a tool-call scenario loads its target.
#[derive(Debug, Clone, Copy)]
struct Load {
    /// Closed-loop workers, each on its own connection.
    connections: usize,
    /// Sessions, shared round-robin by the workers.
    sessions: usize,
    /// How long calls are measured, after the warm-up.
    duration: Duration,
    /// With a progress token (one notification, SSE), or not (JSON).
    streamed: bool,
}

impl Load {
    /// `tool-call` and `tool-call-json`, as configured.
    fn timed(config: &BenchConfig, streamed: bool) -> Load {
        Load { connections: config.concurrency, sessions: config.sessions, duration: config.duration, streamed }
    }

    /// The sustained scenarios: fixed connection counts, so that their figures compare across
    /// runs and with other load generators.
    fn sustained(config: &BenchConfig, connections: usize, sessions: usize) -> Load {
        Load { connections, sessions, duration: config.sustained, streamed: true }
    }
}

/// The slowest call started in each step of a timeline, in microseconds.
#[derive(Debug, Default)]
struct Timeline(Vec<u64>);

impl Timeline {
    fn record(&mut self, since_start: Duration, micros: u64) {
        let step = usize::try_from(since_start.as_millis() / TIMELINE_STEP.as_millis()).unwrap_or(usize::MAX);
        if step >= self.0.len() {
            self.0.resize(step.saturating_add(1), 0);
        }
        self.0[step] = self.0[step].max(micros);
    }

    fn merge(&mut self, other: Timeline) {
        if other.0.len() > self.0.len() {
            self.0.resize(other.0.len(), 0);
        }
        for (mine, theirs) in self.0.iter_mut().zip(other.0) {
            *mine = (*mine).max(theirs);
        }
    }

    /// Milliseconds per step over `steps` steps; `None` where no call started.
    fn millis(&self, steps: usize) -> Vec<Option<f64>> {
        (0..steps).map(|i| self.0.get(i).filter(|us| **us > 0).map(|us| *us as f64 / 1_000.0)).collect()
    }
}

/// The tool-call scenarios: `load.connections` closed-loop workers over `load.sessions`
/// sessions call `count {to: 1}` (with a progress token: one notification, SSE) or
/// `count {to: 0}` (JSON) for the duration, after a warm-up of a fifth of it (at most a
/// second) that is not counted. The CPU time the target and the bench used over the measured
/// time, per call, goes with the rates: a load generator on the same cores takes what the
/// server leaves, so calls/s alone measures the two together.
async fn tool_calls(running: &target::Running, load: Load) -> Result<Measurement> {
    let endpoint = &running.endpoint;
    let mut ids = Vec::new();
    for _ in 0..load.sessions.max(1) {
        ids.push(Session::start(endpoint).await?.id);
    }
    let warmup = (load.duration / 5).min(Duration::from_secs(1));
    let start = Instant::now();
    let (measure_from, until) = (start + warmup, start + warmup + load.duration);
    let streamed = load.streamed;
    let mut workers = JoinSet::new();
    for worker in 0..load.connections.max(1) {
        let conn = Conn::open(endpoint).await?;
        // Workers sharing a session must not reuse each other's request ids: a server may
        // (tether does) answer a repeated id with the first call's stream.
        let first_id = 1 + worker as u64 * 1_000_000_000;
        let mut session = Session::attach(conn, ids[worker % ids.len()].clone(), first_id);
        workers.spawn(async move {
            let mut latencies = histogram();
            let mut timeline = Timeline::default();
            let mut calls = 0u64;
            let to = u64::from(streamed);
            loop {
                let sent = Instant::now();
                if sent >= until {
                    return Ok::<_, WireError>((latencies, timeline, calls));
                }
                let outcome = session.call("count", json!({"to": to}), streamed).await?;
                if outcome.notifications != to {
                    return Err(WireError::Protocol(format!(
                        "expected {to} notification, got {}",
                        outcome.notifications
                    )));
                }
                if sent >= measure_from {
                    let took = micros(sent.elapsed());
                    let _ = latencies.record(took);
                    timeline.record(sent - measure_from, took);
                    calls += 1;
                }
            }
        });
    }
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu_from = (running.cpu_time(), target::own_cpu_time());
    let mut all = histogram();
    let mut over_time = Timeline::default();
    let mut calls = 0;
    while let Some(joined) = workers.join_next().await {
        let (latencies, timeline, n) = joined.map_err(|e| Problem::Failed(e.to_string()))??;
        let _ = all.add(latencies);
        over_time.merge(timeline);
        calls += n;
    }
    let cpu_to = (running.cpu_time(), target::own_cpu_time());
    let measured = Instant::now().saturating_duration_since(measure_from).as_secs_f64();
    let mut measurement = Measurement::default();
    measurement.push("calls/s", calls as f64 / measured);
    let max = all.max() as f64 / 1_000.0;
    add_latencies(&mut measurement, all);
    measurement.push("max ms", max);
    let per_call = |from: Option<Duration>, to: Option<Duration>| {
        let used = to?.checked_sub(from?)?;
        (calls > 0).then(|| used.as_secs_f64() * 1e6 / calls as f64)
    };
    if let Some(us) = per_call(cpu_from.0, cpu_to.0) {
        measurement.push(SERVER_CPU, us);
    }
    if let Some(us) = per_call(cpu_from.1, cpu_to.1) {
        measurement.push(CLIENT_CPU, us);
    }
    let steps = usize::try_from(load.duration.as_millis().div_ceil(TIMELINE_STEP.as_millis())).unwrap_or(usize::MAX);
    measurement.timeline = over_time.millis(steps);
    Ok(measurement)
}

/// `stream`: one call sending `events` progress notifications; events per second at the client.
async fn stream(endpoint: &Endpoint, events: u64) -> Result<Measurement> {
    let mut session = Session::start(endpoint).await?;
    let start = Instant::now();
    let outcome = session.call("count", json!({"to": events}), true).await?;
    let elapsed = start.elapsed().as_secs_f64();
    if outcome.notifications != events {
        return Err(Problem::Failed(format!("received {} of {events} notifications", outcome.notifications)));
    }
    let mut measurement = Measurement::default();
    measurement.push("events/s", events as f64 / elapsed);
    measurement.push("total s", elapsed);
    Ok(measurement)
}

/// How long a resume may go without an event before the bench stops waiting.
const RESUME_SILENCE: Duration = Duration::from_secs(10);

/// `resume`: for each size R, a call sends R+1 notifications and ends; a GET with the first
/// event's id as `Last-Event-ID` must then replay the other R and the result. Measured from
/// sending the GET to receiving the result.
async fn resume(endpoint: &Endpoint, sizes: &[u64]) -> Result<Measurement> {
    let mut session = Session::start(endpoint).await?;
    let mut measurement = Measurement::default();
    for &retained in sizes {
        let call_id = session.next_request_id();
        let outcome = session.call("count", json!({"to": retained + 1}), true).await?;
        let Some(cursor) = outcome.first_event_id else {
            return Err(Problem::Unsupported("its events carry no ids, so no stream can be resumed".into()));
        };
        let mut conn = Conn::open(endpoint).await?;
        let start = Instant::now();
        let mut events = match conn.get(session.id.as_deref(), Some(&cursor)).await {
            Ok(events) => events,
            Err(WireError::Status { status, .. }) => {
                return Err(Problem::Unsupported(format!("a resume GET after a finished call answers {status}")));
            }
            Err(err) => return Err(err.into()),
        };
        let mut replayed = 0u64;
        let finished = loop {
            match tokio::time::timeout(RESUME_SILENCE, events.next()).await {
                Err(_) | Ok(Ok(None)) => break None,
                Ok(Err(err)) => return Err(err.into()),
                Ok(Ok(Some(event))) => match crate::wire::classify(&event.data, call_id)? {
                    crate::wire::Kind::Response => break Some(start.elapsed()),
                    crate::wire::Kind::Notification => replayed += 1,
                    crate::wire::Kind::Other => {}
                },
            }
        };
        match finished {
            Some(elapsed) if replayed == retained => {
                let ms = elapsed.as_secs_f64() * 1_000.0;
                measurement.curve.push((retained, ms));
                measurement.push(format!("R={retained} ms"), ms);
            }
            _ if replayed == 0 => {
                return Err(Problem::Unsupported(format!(
                    "a resume after a finished call replays nothing (R={retained})"
                )));
            }
            _ => return Err(Problem::Failed(format!("replayed {replayed} of {retained} events, then stopped"))),
        }
    }
    Ok(measurement)
}

/// `sessions`: `concurrency` workers create sessions (initialize + initialized) until
/// `idle` exist or three durations pass; the creation rate, and the server's resident memory
/// per session once they sit idle.
async fn sessions(
    endpoint: &Endpoint,
    config: &BenchConfig,
    idle: usize,
    running: &target::Running,
) -> Result<Measurement> {
    drop(Session::start(endpoint).await?);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = running.resident_kib();
    let created = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let until = start + config.duration * 3;
    let mut workers = JoinSet::new();
    for _ in 0..config.concurrency.max(1) {
        let (endpoint, created) = (endpoint.clone(), Arc::clone(&created));
        workers.spawn(async move {
            let mut conn = Conn::open(&endpoint).await?;
            while Instant::now() < until && created.fetch_add(1, Ordering::Relaxed) < idle {
                conn = Session::initialize(conn).await?.conn;
            }
            Ok::<_, WireError>(())
        });
    }
    while let Some(joined) = workers.join_next().await {
        joined.map_err(|e| Problem::Failed(e.to_string()))??;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let created = created.load(Ordering::Relaxed).min(idle) as f64;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut measurement = Measurement::default();
    measurement.push("sessions/s", created / elapsed);
    measurement.push("sessions", created);
    if let (Some(before), Some(after)) = (before, running.resident_kib()) {
        measurement.push("KiB/session", after.saturating_sub(before) as f64 / created.max(1.0));
    }
    Ok(measurement)
}

/// `fanout`: `count` sessions each hold a standalone GET stream; a control session calls
/// `notify_all {seq}` once a second for the duration (at least three times); the latency from
/// sending the call to each stream receiving the message.
async fn fanout(endpoint: &Endpoint, config: &BenchConfig, count: usize) -> Result<Measurement> {
    let sent: Arc<Mutex<Vec<Option<Instant>>>> = Arc::default();
    let latencies = Arc::new(Mutex::new(histogram()));
    let delivered = Arc::new(AtomicUsize::new(0));
    let mut readers = JoinSet::new();
    let mut opening = JoinSet::new();
    for i in 0..count {
        let endpoint = endpoint.clone();
        opening.spawn(async move {
            let mut session = Session::start(&endpoint).await?;
            let events = session.conn.get(session.id.as_deref(), None).await?;
            Ok::<_, WireError>((session, events))
        });
        if opening.len() >= 64 || i + 1 == count {
            while let Some(joined) = opening.join_next().await {
                let (session, mut events) = joined.map_err(|e| Problem::Failed(e.to_string()))??;
                let (sent, latencies, delivered) = (Arc::clone(&sent), Arc::clone(&latencies), Arc::clone(&delivered));
                readers.spawn(async move {
                    let _session = session;
                    while let Ok(Some(event)) = events.next().await {
                        let Some(seq) = broadcast_seq(&event.data) else { continue };
                        let at = sent.lock().ok().and_then(|s| s.get(seq).copied().flatten());
                        if let (Some(at), Ok(mut histogram)) = (at, latencies.lock()) {
                            let _ = histogram.record(micros(at.elapsed()));
                            delivered.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        }
    }
    // Let servers that register a stream after answering the GET finish doing so.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut control = Session::start(endpoint).await?;
    let broadcasts = config.duration.as_secs().max(3) as usize;
    let mut call_latency = histogram();
    for seq in 1..=broadcasts {
        let tick = Instant::now();
        if let Ok(mut sent) = sent.lock() {
            sent.resize(seq + 1, None);
            sent[seq] = Some(tick);
        }
        control.call("notify_all", json!({"seq": seq}), false).await?;
        let _ = call_latency.record(micros(tick.elapsed()));
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(tick.elapsed())).await;
    }
    let expected = broadcasts * count;
    let deadline = Instant::now() + Duration::from_secs(5);
    while delivered.load(Ordering::Relaxed) < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    readers.abort_all();
    let received = delivered.load(Ordering::Relaxed);
    let histogram = latencies.lock().map(|h| h.clone()).unwrap_or_else(|_| histogram());
    let mut measurement = Measurement::default();
    measurement.push("delivered %", 100.0 * received as f64 / expected as f64);
    add_latencies(&mut measurement, histogram);
    measurement.push("broadcast call ms", percentile_ms(&call_latency, 0.5));
    if received == 0 {
        return Err(Problem::Failed(format!("none of {expected} broadcast messages arrived")));
    }
    Ok(measurement)
}

/// The `seq` of a `notify_all` message, if the event is one.
fn broadcast_seq(data: &str) -> Option<usize> {
    let message: Value = serde_json::from_str(data).ok()?;
    if message.get("method")?.as_str()? != "notifications/message" {
        return None;
    }
    usize::try_from(message.pointer("/params/data/seq")?.as_u64()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_names_round_trip() {
        for scenario in Scenario::ALL {
            assert_eq!(Scenario::parse(scenario.name()), Some(scenario));
        }
        assert_eq!(Scenario::parse("nope"), None);
    }

    #[test]
    fn a_timeline_keeps_the_slowest_call_of_each_step_and_shows_empty_steps() {
        let step = TIMELINE_STEP;
        let mut one = Timeline::default();
        one.record(Duration::ZERO, 2_000);
        one.record(step / 2, 5_000);
        one.record(step * 3, 1_000);
        let mut other = Timeline::default();
        other.record(step / 3, 3_000);
        other.record(step * 4 + step / 2, 90_000);
        one.merge(other);
        assert_eq!(one.millis(6), vec![Some(5.0), None, None, Some(1.0), Some(90.0), None]);
    }

    #[test]
    fn broadcast_messages_are_recognized() {
        let message =
            r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":{"seq":3}}}"#;
        assert_eq!(broadcast_seq(message), Some(3));
        assert_eq!(broadcast_seq(r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#), None);
        assert_eq!(broadcast_seq(""), None);
    }
}
