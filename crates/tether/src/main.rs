//! The `tether` command: argument parsing and wiring only; the work is in the library crates.

mod allocator;
mod bench_cli;
mod client_cli;
mod connect_cli;
mod gateway_cli;
mod oauth_cli;
mod otel;
mod output;
mod probe_cli;
mod process_metrics;
mod serve;

use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand, ValueEnum};

/// mimalloc ([`allocator`]).
#[global_allocator]
static ALLOCATOR: allocator::Mimalloc = allocator::Mimalloc;

/// The version, with the commit it was built from.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("TETHER_COMMIT"), ")");

/// MCP Streamable HTTP where resuming a stream is a correctness guarantee.
#[derive(Debug, Parser)]
#[command(name = "tether", version = VERSION, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines on stderr are written (levels and targets from `RUST_LOG`, default `warn`,
    /// and `info` for what tether itself says of its state; `RUST_LOG=info` adds the access log,
    /// a line per request and per session ended, with its duration).
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
}

/// The shape of log lines.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, with the fields of the enclosing spans (session, stream, request).
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve MCP over Streamable HTTP (all sessionful revisions and 2026-07-28) with the built-in tools.
    Serve(serve::ServeArgs),
    /// Serve another MCP server with tether's guarantees: a stdio one, one child process per
    /// session (`tether gateway [serve's flags] -- COMMAND [ARGS...]`), or a Streamable HTTP
    /// one (`--upstream URL`).
    Gateway(gateway_cli::GatewayArgs),
    /// Bridge a stdio MCP client (a desktop application) to a Streamable HTTP server through
    /// tether's client: every reconnect proven, no request left hanging.
    Connect(connect_cli::ConnectArgs),
    /// Follow a server's standalone stream, proving continuity on every reconnect.
    Watch(client_cli::WatchArgs),
    /// Call one tool and print its notifications (a progress bar on a terminal) and outcome.
    Call(client_cli::CallArgs),
    /// Follow a task (SEP-2663) to its result: its events from the checkpointed cursor, then its
    /// outcome.
    Task(client_cli::TaskArgs),
    /// Audit any MCP server's session and resumption behaviour (exit status 0 pass, 2 fail, 3
    /// inconclusive).
    Probe(probe_cli::ProbeArgs),
    /// Measure tether against rmcp, the TypeScript and Python SDKs and a raw hyper baseline.
    Bench(bench_cli::BenchArgs),
    /// Play the official MCP conformance suite's client scenarios (reads MCP_CONFORMANCE_SCENARIO).
    ConformanceClient(client_cli::ConformanceArgs),
    /// Print a shell completion script (`tether completions bash > /etc/bash_completion.d/tether`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Errors are one line, with every cause, and never a backtrace: they are the user's to read.
fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Command::Completions { shell } = cli.command {
        clap_complete::generate(shell, &mut Cli::command(), "tether", &mut std::io::stdout());
        return Ok(ExitCode::SUCCESS);
    }
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tether_server::default_log_filter().into()),
        )
        // Colour only for a person at a terminal, never in a file or a collector's pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().with_current_span(false).with_span_list(true).init(),
    }
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let workers = match &cli.command {
        Command::Serve(args) => Some(args.workers(cores)),
        Command::Gateway(args) => Some(args.workers(cores)),
        _ => None,
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = workers {
        runtime.worker_threads(workers);
    }
    let runtime = runtime.enable_all().build()?;
    match cli.command {
        Command::Serve(args) => {
            runtime.block_on(serve::run(args, serve::Answering::Builtin)).map(|()| ExitCode::SUCCESS)
        }
        Command::Gateway(args) => runtime.block_on(gateway_cli::run(args)).map(|()| ExitCode::SUCCESS),
        Command::Connect(args) => Ok(runtime.block_on(connect_cli::run(args))),
        Command::Watch(args) => Ok(runtime.block_on(client_cli::watch(args))),
        Command::Call(args) => Ok(runtime.block_on(client_cli::call(args))),
        Command::Task(args) => Ok(runtime.block_on(client_cli::task(args))),
        Command::Probe(args) => runtime.block_on(probe_cli::run(args)),
        Command::Bench(args) => runtime.block_on(bench_cli::run(args)),
        Command::ConformanceClient(args) => Ok(runtime.block_on(client_cli::conformance(args))),
        Command::Completions { .. } => Ok(ExitCode::SUCCESS),
    }
}
