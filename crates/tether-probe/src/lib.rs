//! `tether probe`: a black-box audit of an MCP Streamable HTTP server's session and resumption
//! behaviour.
//!
//! The probe speaks only HTTP to the URL it is given, sends a bounded number of requests, and
//! reports each check as pass, warn, fail or n/a with the evidence it saw. A failure names the seed
//! failure signature it matches (silent empty 200, resurrection, gap, duplicate, unbounded
//! latency), because "the resume returned 200" proves nothing by itself.

mod checks;
mod report;
mod restart;
mod wire;

use serde_json::{Value, json};

pub use report::{Check, Conclusion, Counts, Report, ResumeTrace, ServerIdentity, Verdict};

use checks::StreamingCall;
use wire::Wire;

/// Why a probe run could not produce a report.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The server could not be reached, or the connection failed.
    #[error("transport: {0}")]
    Transport(String),
    /// `initialize` did not produce a result, so no check can run.
    #[error("initialize failed: {0}")]
    Handshake(String),
    /// The `--restart-cmd` failed, or the server did not come back.
    #[error("restart: {0}")]
    Restart(String),
    /// The run reached its request budget (a safety bound, never expected).
    #[error("request budget of {0} exhausted")]
    Budget(u32),
}

/// What to probe.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    /// The MCP endpoint, e.g. `http://127.0.0.1:8080/mcp`.
    pub url: String,
    /// A tool that streams several notifications before its result, with its arguments. Without
    /// one, the probe uses a `count` tool if the server lists it; otherwise the resumption checks
    /// are n/a.
    pub tool: Option<(String, Value)>,
    /// A shell command that restarts the server (and returns once it is started); enables the
    /// restart check.
    pub restart_command: Option<String>,
    /// Other replicas behind the same deployment; enables the replica-switch check.
    pub replicas: Vec<String>,
    /// Arguments for the streaming tool that make it send more events than the server retains
    /// per stream; enables the evicted-cursor check.
    pub evict_arguments: Option<Value>,
    /// Which https servers are trusted (the platform's roots, and any authority added).
    pub trust: tether_client::tls::Trust,
    /// Headers sent with every request (`Authorization`, say).
    pub headers: Vec<(String, String)>,
}

/// The checks so far, shown to `progress` as each one finishes.
struct Recorder<F> {
    checks: Vec<Check>,
    progress: F,
}

impl<F: FnMut(&Check)> Recorder<F> {
    fn push(&mut self, check: Check) {
        (self.progress)(&check);
        self.checks.push(check);
    }

    fn extend(&mut self, checks: Vec<Check>) {
        checks.into_iter().for_each(|c| self.push(c));
    }
}

/// Runs every check against the server and returns the report; `progress` sees each check as
/// it finishes (for a progress display).
pub async fn run(config: ProbeConfig, progress: impl FnMut(&Check)) -> Result<Report, ProbeError> {
    let wire = Wire::new(&config.url, &config.trust, &config.headers)?;
    let (session, handshake) = wire.initialize().await?;
    let mut out = Recorder { checks: Vec::new(), progress };
    out.push(checks::session_id(&session, &handshake));
    if session.id.is_some() {
        out.push(checks::version_rejected(&wire, &session).await?);
        out.push(checks::origin_and_host(&wire, &session).await?);
        out.push(checks::unknown_session(&wire, &session).await?);
        out.push(checks::delete_then_404(&wire).await?);
    }
    match streaming_call(&wire, &session, config.tool).await? {
        Some(call) => {
            let reference = checks::reference(&wire, &session, &call).await?;
            out.push(checks::priming(&session, &reference));
            out.push(checks::ids_ordered(&reference));
            let (resume, cursor) = checks::mid_stream_resume(&wire, &session, &call, &reference).await?;
            out.push(resume);
            out.push(checks::isolation(&wire, cursor.as_deref()).await?);
            out.push(checks::result_recoverable(&wire, &session, &reference).await?);
            out.push(checks::evicted_cursor(&wire, &session, &call, config.evict_arguments.as_ref()).await?);
            for replica in &config.replicas {
                out.push(checks::replica_resume(&wire, &wire.at(replica), &session, &call, &reference).await?);
            }
            if let Some(command) = &config.restart_command {
                out.push(restart::restart(&wire, &session, &reference, command).await?);
            }
            // Last: a server may end the session over a cursor no history of it holds.
            out.extend(checks::bad_cursors(&wire, &session, cursor.as_deref()).await?);
        }
        None => out.push(Check {
            id: "resumption",
            title: "resumption checks need a tool that streams notifications (--tool)",
            verdict: Verdict::NotApplicable,
            evidence: vec!["no --tool given and the server lists no `count` tool".into()],
            signature: None,
            trace: None,
        }),
    }
    let _ = wire.delete(&session).await;
    let info = handshake.response(1).and_then(|m| m.get("result")?.get("serverInfo").cloned()).unwrap_or_default();
    let text = |key: &str| info.get(key).and_then(serde_json::Value::as_str).map(str::to_owned);
    let server = ServerIdentity { name: text("name"), version: text("version"), protocol: session.version.clone() };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    Ok(Report {
        target: config.url,
        server,
        tether: env!("CARGO_PKG_VERSION"),
        date: tether_core::date::rfc3339(u64::try_from(now).unwrap_or(u64::MAX)),
        requests: wire.sent(),
        checks: out.checks,
    })
}

/// The call the resumption checks use: the configured one, or the server's `count` tool.
async fn streaming_call(
    wire: &Wire,
    session: &wire::Session,
    configured: Option<(String, Value)>,
) -> Result<Option<StreamingCall>, ProbeError> {
    if let Some((tool, arguments)) = configured {
        return Ok(Some(StreamingCall { tool, arguments }));
    }
    let list = json!({"jsonrpc": "2.0", "id": 10, "method": "tools/list"});
    let answer = wire.post(Some(session), &list, &[], 8, std::time::Duration::from_secs(5)).await?;
    let has_count = answer
        .response(10)
        .as_ref()
        .and_then(|m| m.pointer("/result/tools"))
        .and_then(Value::as_array)
        .is_some_and(|tools| tools.iter().any(|t| t.get("name") == Some(&json!("count"))));
    Ok(has_count.then(|| StreamingCall { tool: "count".into(), arguments: json!({"to": 6, "interval_ms": 30}) }))
}
