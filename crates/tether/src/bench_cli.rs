//! `tether bench`: argument parsing and the progress bar; the load generator is
//! `tether-bench`.

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use tether_bench::{BenchConfig, Programs, Scenario, Sizes, Step, Target};
use tether_server::parse_duration;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Servers to measure: tether (all three stores), tether-memory, tether-embedded,
    /// tether-redis, rmcp, ts, python, raw, gateway-rmcp (tether gateway in front of the rmcp
    /// server) or all (repeatable).
    #[arg(long = "target", value_name = "TARGET", default_value = "all")]
    targets: Vec<String>,
    /// Scenarios: tool-call, tool-call-json, stream, resume, sessions, fanout, sustained,
    /// sustained-sessions, sustained-single (repeatable; default all).
    #[arg(long = "scenario", value_name = "NAME")]
    scenarios: Vec<String>,
    /// How long each timed scenario runs.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// How long each sustained scenario runs.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    sustained: Duration,
    /// Sessions shared by the tool-call workers.
    #[arg(long, default_value_t = 8)]
    sessions: usize,
    /// Closed-loop workers, each on its own connection.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Runs of each scenario per target; the report shows medians.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Directory of the report (`<date>.md`) and its plots (`<date>/*.svg`).
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// The rmcp server binary (built from tests/interop/rmcp_server by scripts/bench).
    #[arg(long, env = "TETHER_BENCH_RMCP")]
    rmcp_server: Option<PathBuf>,
    /// Directory where `@modelcontextprotocol/sdk` is installed.
    #[arg(long, env = "TETHER_TS_SDK")]
    ts_sdk: Option<PathBuf>,
    /// A Python with the `mcp` package installed.
    #[arg(long, env = "TETHER_BENCH_PYTHON")]
    python: Option<PathBuf>,
    /// Directory of the TypeScript and Python bench servers.
    #[arg(long, default_value = "bench/servers")]
    servers: PathBuf,
    /// Smaller sizes for a quick check (1,000 stream events, R up to 1,000, 200 idle and 50
    /// fan-out sessions) instead of the full ones.
    #[arg(long)]
    quick: bool,
    /// Serve the `raw` baseline on this address instead (the bench starts it this way).
    #[arg(long, hide = true, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:0")]
    serve_raw: Option<SocketAddr>,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    if let Some(addr) = args.serve_raw {
        anyhow::ensure!(addr.ip().is_loopback(), "the raw baseline only listens on loopback");
        tether_bench::raw::serve(addr).await.context("serving the raw baseline")?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut targets = Vec::new();
    for name in &args.targets {
        let Some(selected) = Target::select(name) else { bail!("unknown target {name:?}") };
        for target in selected {
            if !targets.contains(&target) {
                targets.push(target);
            }
        }
    }
    targets.sort();
    let scenarios = if args.scenarios.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        let mut scenarios = Vec::new();
        for name in &args.scenarios {
            scenarios.push(Scenario::parse(name).with_context(|| format!("unknown scenario {name:?}"))?);
        }
        scenarios
    };
    let sizes = if args.quick {
        Sizes { stream_events: 1_000, resume_events: vec![1, 100, 1_000], idle_sessions: 200, fanout_sessions: 50 }
    } else {
        Sizes::default()
    };
    let programs = Programs {
        tether: std::env::current_exe().context("locating the tether binary")?,
        rmcp: args.rmcp_server,
        ts_sdk: args.ts_sdk,
        python: args.python,
        servers: args.servers,
        redis_server: PathBuf::from("redis-server"),
    };
    let config = BenchConfig {
        targets,
        scenarios,
        duration: args.duration,
        sustained: args.sustained,
        sessions: args.sessions,
        concurrency: args.concurrency,
        runs: args.runs.max(1),
        programs,
        command: std::env::args().collect::<Vec<_>>().join(" "),
    };
    let terminal = std::io::stderr().is_terminal();
    let results = tether_bench::run(&config, &sizes, |step| progress(step, terminal)).await;
    let date = tether_bench::report::today();
    let path = results.write(&args.out, &date, &tether_bench::report::machine(), config.runs)?;
    println!("{}", std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?);
    eprintln!("report: {}", path.display());
    Ok(ExitCode::SUCCESS)
}

/// A progress bar on a terminal, one line per step otherwise.
fn progress(step: Step<'_>, terminal: bool) {
    let mut err = std::io::stderr();
    if step.done == step.total {
        if terminal {
            let _ = writeln!(err, "\r\x1b[2K[{}] {} of {} done", "#".repeat(30), step.done, step.total);
        }
        return;
    }
    let label = format!("{} · {} · run {}", step.target, step.scenario, step.run);
    if terminal {
        let filled = 30 * step.done / step.total.max(1);
        let bar = format!("{}{}", "#".repeat(filled), " ".repeat(30 - filled));
        let _ = write!(err, "\r\x1b[2K[{bar}] {}/{} {label}", step.done + 1, step.total);
        let _ = err.flush();
    } else {
        let _ = writeln!(err, "{}/{} {label}", step.done + 1, step.total);
    }
}
