//! The `tether` command: argument parsing and wiring only; the work is in the library crates.

use clap::Parser;

/// MCP Streamable HTTP where resuming a stream is a correctness guarantee.
#[derive(Debug, Parser)]
#[command(name = "tether", version, about, long_about = None, arg_required_else_help = true)]
struct Cli {}

fn main() {
    let Cli {} = Cli::parse();
}
