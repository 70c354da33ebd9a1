//! The load generator behind `tether bench`: starts each target server on loopback, drives the
//! same scenarios against all of them in one run, and writes a report with the ratios to
//! tether.
//!
//! Every target speaks the same tools (`count {to, interval_ms}` and `notify_all {seq}`), and
//! every target is driven by the same minimal HTTP/1.1 client ([`wire`]), so the differences
//! measured are the servers'. [`raw`] is the ceiling: a hyper server that reads the same
//! JSON-RPC and writes the same SSE bytes with no MCP logic at all.

pub mod raw;
pub mod report;
pub mod scenario;
pub mod target;
pub mod wire;

use std::path::PathBuf;
use std::time::Duration;

pub use scenario::{Outcome, Scenario};
pub use target::{Programs, Target};

/// Why a bench run could not go on.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A target server could not be started or did not announce its address.
    #[error("starting {target}: {reason}")]
    Start {
        /// The target.
        target: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// Writing the report failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Drawing a plot failed.
    #[error("plotting {path}: {reason}")]
    Plot {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// What to run and how hard.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The servers to measure, in report order.
    pub targets: Vec<Target>,
    /// The scenarios to run against each.
    pub scenarios: Vec<Scenario>,
    /// How long each timed scenario runs (tool calls, fan-out, session creation's cap).
    pub duration: Duration,
    /// How long the sustained scenarios run: long enough for periodic work (sweeps, map growth,
    /// allocator purges) to happen many times.
    pub sustained: Duration,
    /// Sessions shared by the tool-call workers.
    pub sessions: usize,
    /// Closed-loop workers, each with its own connection.
    pub concurrency: usize,
    /// Runs of every (target, scenario); the report shows medians.
    pub runs: usize,
    /// Where the servers' programs are.
    pub programs: Programs,
    /// The command line, quoted in the report.
    pub command: String,
}

/// Sizes the scenarios use; fixed by the issue that defines the bench, overridable in tests.
#[derive(Debug, Clone)]
pub struct Sizes {
    /// Notifications the `stream` scenario's tool sends.
    pub stream_events: u64,
    /// Retained events the `resume` scenario replays after the cursor.
    pub resume_events: Vec<u64>,
    /// Idle sessions the `sessions` scenario creates at most.
    pub idle_sessions: usize,
    /// Sessions holding a standalone stream in the `fanout` scenario.
    pub fanout_sessions: usize,
}

impl Default for Sizes {
    fn default() -> Self {
        Sizes {
            stream_events: 100_000,
            resume_events: vec![1, 100, 10_000, 100_000],
            idle_sessions: 10_000,
            fanout_sessions: 1_000,
        }
    }
}

/// Progress of a run, for a progress bar.
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    /// Steps done so far.
    pub done: usize,
    /// Steps in all.
    pub total: usize,
    /// The target being measured.
    pub target: &'a str,
    /// The scenario being run.
    pub scenario: &'a str,
    /// The run, counted from 1.
    pub run: usize,
}

/// Runs every scenario against every target, `runs` times each, and returns what was measured.
/// A target that cannot run a scenario gets an [`Outcome::Unsupported`] or
/// [`Outcome::Failed`] row instead of ending the bench.
pub async fn run(config: &BenchConfig, sizes: &Sizes, mut progress: impl FnMut(Step<'_>)) -> report::Results {
    let total = config.targets.len() * config.scenarios.len() * config.runs;
    let mut results = report::Results::new(config.command.clone());
    let mut done = 0;
    for &target in &config.targets {
        for &scenario in &config.scenarios {
            for run in 1..=config.runs {
                progress(Step { done, total, target: target.name(), scenario: scenario.name(), run });
                let outcome = scenario::run(target, scenario, config, sizes).await;
                results.add(target, scenario, outcome);
                done += 1;
            }
        }
    }
    progress(Step { done, total, target: "", scenario: "", run: 0 });
    results
}
