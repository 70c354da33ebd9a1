//! The `tether` command: argument parsing and wiring only; the work is in the library crates.

mod serve;

use clap::{Parser, Subcommand};

/// MCP Streamable HTTP where resuming a stream is a correctness guarantee.
#[derive(Debug, Parser)]
#[command(name = "tether", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve MCP over Streamable HTTP (all legacy revisions and 2026-07-28) with the built-in tools.
    Serve(serve::ServeArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match cli.command {
        Command::Serve(args) => runtime.block_on(serve::run(args)),
    }
}
