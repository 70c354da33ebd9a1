//! What the server counts, through the `metrics` facade (a no-op until the application installs
//! a recorder; `tether serve --metrics` installs a Prometheus one). Names and labels are decided
//! here, once.

use std::collections::HashMap;
use std::sync::{LazyLock, RwLock};
use std::time::Duration;

use metrics::{Key, Label, Metadata, SharedString};
use serde_json::Value;
use tether_core::jsonrpc::ErrorObject;
use tether_core::lineage::{InvalidReason, ResyncReason, ServerDecision};

/// The target of the access log: a line per request and per session ended, with its duration.
/// `tether`'s default filter leaves it out; `RUST_LOG=info` shows it.
pub const ACCESS: &str = "tether_access";

/// The log filter `tether` applies when `RUST_LOG` is not set: warnings, what tether says of its
/// own state (`info`), and no access log. Spans are at `debug`, so none is made.
pub fn default_log_filter() -> String {
    format!("warn,tether=info,{ACCESS}=off")
}

/// The most tool names a metric is labelled with; calls of any other tool count as `other`.
const MAX_TOOL_LABELS: usize = 256;

/// What the metrics recorded per call are registered with, as `metrics`' macros would.
const METADATA: Metadata<'static> = Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// The keys of a label's series of a counter by outcome and a histogram of durations, built
/// once: a key built per call (a vector of labels, hashed) cost a call about 1.5% of its
/// instructions, recorder or not.
struct Series<const OUTCOMES: usize> {
    /// The counter's, by outcome.
    counted: [Key; OUTCOMES],
    /// The histogram's.
    duration: Key,
}

impl<const OUTCOMES: usize> Series<OUTCOMES> {
    /// `counter` and `histogram` labelled `label` = `value`, the counter's by `outcome` as well.
    fn new(
        counter: &'static str,
        histogram: &'static str,
        label: &'static str,
        value: &str,
        outcomes: [&'static str; OUTCOMES],
    ) -> Self {
        let value = SharedString::from_owned(value.to_owned());
        let labelled = |more: Option<&'static str>| {
            let mut labels = vec![Label::new(label, value.clone())];
            labels.extend(more.map(|outcome| Label::from_static_parts("outcome", outcome)));
            labels
        };
        Series {
            counted: outcomes.map(|outcome| Key::from_parts(counter, labelled(Some(outcome)))),
            duration: Key::from_parts(histogram, labelled(None)),
        }
    }

    /// Counts one that ended as the `outcome`th of the outcomes after `took`.
    fn record(&self, outcome: usize, took: Duration) {
        metrics::with_recorder(|recorder| {
            recorder.register_counter(&self.counted[outcome], &METADATA).increment(1);
            recorder.register_histogram(&self.duration, &METADATA).record(took.as_secs_f64());
        });
    }
}

/// How a tool call ended, the outcome label of its counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ToolEnded {
    /// With a result.
    Result,
    /// With a result that has `isError`.
    ToolError,
    /// With an error, or cancelled.
    Error,
}

/// The outcome labels, in the order of [`ToolEnded`].
const TOOL_OUTCOMES: [&str; 3] = ["result", "tool_error", "error"];

/// A tool's series.
type ToolSeries = Series<3>;

/// A tool's series, labelled with its name.
fn tool_series(name: &str) -> ToolSeries {
    Series::new("tether_tool_calls_total", "tether_tool_call_duration_seconds", "tool", name, TOOL_OUTCOMES)
}

/// The tools a metric may name: those the server itself listed (a `tools/list` result) or
/// answered with a result that is no error, so a client naming tools that do not exist cannot grow the label
/// set, and at most [`MAX_TOOL_LABELS`] of them.
static TOOLS: LazyLock<RwLock<HashMap<Box<str>, ToolSeries>>> = LazyLock::new(RwLock::default);

/// The series of every tool the set does not hold.
static OTHER_TOOL: LazyLock<ToolSeries> = LazyLock::new(|| tool_series("other"));

/// Learns `names` while there is room.
fn learn_tools<'a>(names: impl Iterator<Item = &'a str>) {
    let mut tools = TOOLS.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    for name in names {
        if tools.len() < MAX_TOOL_LABELS && !tools.contains_key(name) {
            tools.insert(Box::from(name), tool_series(name));
        }
    }
}

/// A request ended with `outcome` (`None`: cancelled) after `took`: a `tools/list` result
/// teaches the tool labels, and a `tools/call` of `tool` is counted by tool and how it ended
/// (`result`, `tool_error` for a result with `isError`, `error`).
pub(crate) fn tool_outcome(
    method: &str,
    tool: Option<&str>,
    outcome: Option<&Result<Value, ErrorObject>>,
    took: Duration,
) {
    match method {
        tether_core::mcp::method::TOOLS_LIST => {
            if let Some(Ok(result)) = outcome
                && let Some(listed) = result.get("tools").and_then(Value::as_array)
            {
                learn_tools(listed.iter().filter_map(|tool| tool.get("name")?.as_str()));
            }
        }
        tether_core::mcp::method::TOOLS_CALL => {
            let Some(tool) = tool else { return };
            let ended = match outcome {
                // Some servers answer a tool they do not have with `isError`: only a result
                // without it shows the tool exists.
                Some(Ok(result)) if result.get("isError").and_then(Value::as_bool) == Some(true) => {
                    ToolEnded::ToolError
                }
                Some(Ok(_)) => ToolEnded::Result,
                _ => ToolEnded::Error,
            };
            let read = || TOOLS.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            let mut tools = read();
            if ended == ToolEnded::Result && !tools.contains_key(tool) {
                drop(tools);
                learn_tools(std::iter::once(tool));
                tools = read();
            }
            tools.get(tool).unwrap_or(&OTHER_TOOL).record(ended as usize, took);
        }
        _ => {}
    }
}

/// This process stopped serving the session of `runtime`: its client ended it (`None`), or the
/// server did, for `reason`. Logged on [`ACCESS`] and recorded as the conventions' session
/// duration.
pub(crate) fn session_over(runtime: &crate::session::SessionRuntime, reason: Option<&'static str>) {
    let lasted = runtime.began.elapsed();
    tracing::info!(
        target: ACCESS,
        session = %runtime.id,
        version = runtime.version.as_str(),
        ended = reason.unwrap_or("terminated"),
        duration_s = lasted.as_secs_f64(),
        "session ended"
    );
    crate::trace::session_ended(runtime.version, lasted, reason);
}

/// A keyed request was answered from its idempotency record, without running again.
pub(crate) fn idempotent_replay() {
    metrics::counter!("tether_idempotent_replays_total").increment(1);
}

/// A task this process ran ended `status` (`completed`, `failed`, `cancelled`).
pub(crate) fn task_ended(status: &'static str) {
    metrics::counter!("tether_tasks_ended_total", "status" => status).increment(1);
}

/// Tasks this process runs now.
pub(crate) fn tasks_running(running: usize) {
    metrics::gauge!("tether_tasks_running").set(running as f64);
}

/// A request was refused at the HTTP layer with `status`, for `reason`.
pub(crate) fn refused(status: http::StatusCode, reason: Option<&str>) {
    let reason = reason.unwrap_or("none").to_owned();
    metrics::counter!("tether_http_refusals_total", "status" => status.as_str().to_owned(), "reason" => reason)
        .increment(1);
}

/// A session was created by `initialize`.
pub(crate) fn session_created() {
    metrics::counter!("tether_sessions_created_total").increment(1);
}

/// A session was ended by the client's DELETE.
pub(crate) fn session_terminated() {
    metrics::counter!("tether_sessions_terminated_total").increment(1);
}

/// A session was ended by the server (`SessionHandle::end`), with why: `upstream_lost`,
/// `history_rewritten`.
pub(crate) fn session_ended_by_server(why: tether_store::SessionEnd) {
    let reason = why.reason().as_str();
    metrics::counter!("tether_sessions_ended_by_server_total", "reason" => reason).increment(1);
}

/// Sessions expired by a sweep.
pub(crate) fn sessions_expired(count: usize) {
    metrics::counter!("tether_sessions_expired_total").increment(count as u64);
}

/// Sessions this process serves (set where its set of runtimes changes).
pub(crate) fn sessions_live(live: usize) {
    metrics::gauge!("tether_sessions_live").set(live as f64);
}

/// A connection to a session stream opened (`1`) or closed (`-1`).
pub(crate) fn stream_connections(delta: f64) {
    metrics::gauge!("tether_streams_live").increment(delta);
}

/// Events made durable in the store.
pub(crate) fn events_appended(count: usize) {
    metrics::counter!("tether_events_appended_total").increment(count as u64);
}

/// Events written on connections that resumed a stream (`Last-Event-ID`).
pub(crate) fn events_replayed(count: usize) {
    metrics::counter!("tether_events_replayed_total").increment(count as u64);
}

/// How a resume was decided: `replay`, `session_invalid` or `resync`, with the reason (a
/// replay that starts with what is gone counts as the resync it starts with).
pub(crate) fn resume(decision: &ServerDecision) {
    let (branch, reason) = match decision {
        ServerDecision::Replay { starts, .. } => match starts.resync_reason() {
            Some(reason) => ("resync", reason.as_str()),
            None => ("replay", "none"),
        },
        ServerDecision::SessionInvalid(reason) => ("session_invalid", InvalidReason::as_str(*reason)),
        ServerDecision::Resync(notice) => ("resync", notice.reason.as_str()),
    };
    metrics::counter!("tether_resumes_total", "branch" => branch, "reason" => reason).increment(1);
}

/// A resync event was written on a connection (a gap or an aborted request's end, on a resume
/// or a live connection that fell behind).
pub(crate) fn resync_sent(reason: ResyncReason) {
    metrics::counter!("tether_resyncs_sent_total", "reason" => reason.as_str()).increment(1);
}

/// A store operation whose latency is measured. Not each read of a followed stream: that is
/// once per event.
#[derive(Debug, Clone, Copy)]
pub(crate) enum StoreOp {
    /// A request's record (`begin_request`).
    BeginRequest,
    /// A request's events (`append`).
    Append,
    /// An idempotency key's claim (`claim_key`).
    ClaimKey,
}

/// How long a store operation took, by operation (`op`). Each label is a literal, so the
/// histogram's key is a static, built once, not per call.
pub(crate) fn store_latency(op: StoreOp, took: Duration) {
    let histogram = match op {
        StoreOp::BeginRequest => metrics::histogram!("tether_store_seconds", "op" => "begin_request"),
        StoreOp::Append => metrics::histogram!("tether_store_seconds", "op" => "append"),
        StoreOp::ClaimKey => metrics::histogram!("tether_store_seconds", "op" => "claim_key"),
    };
    histogram.record(took.as_secs_f64());
}

/// Event bytes the store retains, when it can tell.
pub(crate) fn bytes_retained(bytes: u64) {
    metrics::gauge!("tether_retained_bytes").set(bytes as f64);
}

/// How a request ended, the outcome label of its counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// With a result.
    Result,
    /// With an error, or cancelled.
    Error,
}

impl Ended {
    /// The label.
    pub(crate) fn as_str(self) -> &'static str {
        REQUEST_OUTCOMES[self as usize]
    }
}

/// The outcome labels, in the order of [`Ended`].
const REQUEST_OUTCOMES: [&str; 2] = ["result", "error"];

/// The series of each of the protocol's methods, in the order of its table, then of every
/// other method's.
static REQUESTS: LazyLock<Vec<Series<2>>> = LazyLock::new(|| {
    let methods = tether_core::methods::METHODS.iter().map(|info| info.name).chain(["other"]);
    let series = |method| {
        Series::new("tether_requests_total", "tether_request_duration_seconds", "method", method, REQUEST_OUTCOMES)
    };
    methods.map(series).collect()
});

/// A request ended (its terminal event written, or its task finished), and how long it ran.
/// The method is named only if it is one of the protocol's (else `other`), so a client cannot
/// grow the label set.
pub(crate) fn request_finished(method: &str, ended: Ended, took: Duration) {
    let index = tether_core::methods::index(method).unwrap_or(tether_core::methods::METHODS.len());
    // The table has a series for each method and one for the rest.
    if let Some(series) = REQUESTS.get(index) {
        series.record(ended as usize, took);
    }
}

/// Requests running now.
pub(crate) fn requests_running(running: usize) {
    metrics::gauge!("tether_requests_running").set(running as f64);
}

/// The server began draining (`1`), before it stops.
pub(crate) fn draining() {
    metrics::gauge!("tether_draining").set(1.0);
}

/// The counters and gauges without labels, and what each answers.
const PLAIN: [(&str, &str); 15] = [
    ("tether_sessions_created_total", "Sessions created by initialize."),
    ("tether_sessions_terminated_total", "Sessions ended by the client's DELETE."),
    ("tether_sessions_expired_total", "Sessions expired after their idle TTL."),
    ("tether_events_appended_total", "Events made durable in the store."),
    ("tether_events_replayed_total", "Events written on connections that resumed a stream."),
    ("tether_connections_refused_total", "Connections refused past --max-connections."),
    ("tether_sessions_live", "Sessions this process serves."),
    ("tether_streams_live", "Open SSE connections."),
    ("tether_retained_bytes", "Event bytes the store retains (memory and embedded stores)."),
    ("tether_connections_open", "Open connections."),
    ("tether_requests_running", "Requests running now, from their start to their terminal event."),
    ("tether_draining", "1 once the server drains before it stops (SIGTERM), else 0."),
    ("tether_idempotent_replays_total", "Keyed requests answered from their record, without running again."),
    ("tether_tasks_running", "Tasks this process runs now."),
    (
        "tether_upstream_instances",
        "Upstream instances (child processes, upstream sessions) running behind tether gateway.",
    ),
];

/// Describes every metric (the `# HELP` lines of a Prometheus scrape) and makes the series known
/// in advance present from the start, at zero: a dashboard sees a rate of 0, not nothing. Called
/// when the first router is made, after the application installed its recorder.
pub(crate) fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    for (name, help) in PLAIN {
        if name.ends_with("_total") {
            describe_counter!(name, help);
        } else {
            describe_gauge!(name, help);
        }
    }
    describe_counter!("tether_requests_total", "Requests that ended, by method and outcome (result or error).");
    describe_histogram!(
        "tether_request_duration_seconds",
        metrics::Unit::Seconds,
        "How long requests ran, from their start to their terminal event, by method."
    );
    describe_histogram!(
        "tether_store_seconds",
        metrics::Unit::Seconds,
        "How long store operations took, by operation."
    );
    describe_counter!("tether_sessions_ended_by_server_total", "Sessions the server ended, by reason.");
    describe_counter!("tether_tasks_refused_total", "Calls refused as tasks past the cap, by cap.");
    describe_counter!("tether_connections_expired_total", "Connections closed for doing nothing too long, by reason.");
    describe_counter!(
        "tether_resumes_total",
        "Resumes (Last-Event-ID) by how they were decided: replay, session_invalid or resync, and why."
    );
    describe_counter!("tether_resyncs_sent_total", "resync events written, by reason.");
    describe_gauge!("tether_build_info", "1, labelled with the version that runs.");
    describe_counter!(
        "tether_tool_calls_total",
        "tools/call requests that ended, by tool (the server's own, else other) and outcome (result, tool_error, error)."
    );
    describe_histogram!(
        "tether_tool_call_duration_seconds",
        metrics::Unit::Seconds,
        "How long tools/call requests ran, by tool."
    );
    describe_counter!("tether_tasks_ended_total", "Tasks this process ran that ended, by status.");
    describe_counter!("tether_http_refusals_total", "Requests refused at the HTTP layer, by status and reason.");
    for name in PLAIN.iter().map(|(name, _)| *name).filter(|name| name.ends_with("_total")) {
        metrics::counter!(name).increment(0);
    }
    for reason in [ResyncReason::Evicted, ResyncReason::UnknownStream, ResyncReason::RequestAborted] {
        metrics::counter!("tether_resyncs_sent_total", "reason" => reason.as_str()).increment(0);
    }
    let methods = tether_core::methods::METHODS.iter().zip(REQUESTS.iter());
    for (_, series) in methods.filter(|(info, _)| !info.name.starts_with("notifications/")) {
        metrics::with_recorder(|recorder| {
            for key in &series.counted {
                recorder.register_counter(key, &METADATA).increment(0);
            }
        });
    }
    for status in ["completed", "failed", "cancelled"] {
        metrics::counter!("tether_tasks_ended_total", "status" => status).increment(0);
    }
    for cap in ["total", "per_principal"] {
        metrics::counter!("tether_tasks_refused_total", "cap" => cap).increment(0);
    }
    metrics::counter!("tether_resumes_total", "branch" => "replay", "reason" => "none").increment(0);
    metrics::gauge!("tether_sessions_live").increment(0.0);
    metrics::gauge!("tether_streams_live").increment(0.0);
    metrics::gauge!("tether_connections_open").increment(0.0);
    metrics::gauge!("tether_requests_running").increment(0.0);
    metrics::gauge!("tether_draining").increment(0.0);
    metrics::gauge!("tether_tasks_running").increment(0.0);
    metrics::gauge!("tether_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

/// Connections open now (`delta` is +1 or -1).
pub(crate) fn connections_open(delta: f64) {
    metrics::gauge!("tether_connections_open").increment(delta);
}

/// A call was refused as a task: as many ran as allowed, in all or (`principal`) of its
/// principal.
pub(crate) fn task_refused(principal: bool) {
    let cap = if principal { "per_principal" } else { "total" };
    metrics::counter!("tether_tasks_refused_total", "cap" => cap).increment(1);
}

/// A connection over `max_connections` was refused.
pub(crate) fn connection_refused() {
    metrics::counter!("tether_connections_refused_total").increment(1);
}

/// A connection was closed for doing nothing for too long.
pub(crate) fn connection_expired(why: crate::connection::Expiry) {
    metrics::counter!("tether_connections_expired_total", "reason" => why.as_str()).increment(1);
}
