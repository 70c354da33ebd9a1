//! `tether probe`: audit a server's resumption behaviour and print the report.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use tether_probe::{Check, ProbeConfig};

/// Exit status when a check failed.
const EXIT_FAILED: u8 = 2;
/// Exit status when nothing failed but resumption could not be tested, or only warned.
const EXIT_INCONCLUSIVE: u8 = 3;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Format {
    /// A plain-text table.
    Table,
    /// JSON: `{target, requests, checks: [{id, title, verdict, evidence, signature?}]}`.
    Json,
    /// A Markdown report.
    Markdown,
    /// One self-contained HTML page.
    Html,
}

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// MCP endpoint URL.
    #[arg(value_parser = crate::client_cli::parse_url)]
    url: String,
    /// A header sent with every request, as `Name: value` (repeatable), e.g. for authorization.
    #[arg(long = "header", value_name = "NAME: VALUE", value_parser = crate::client_cli::parse_header)]
    headers: Vec<(String, String)>,
    /// A tool that sends several notifications before its result (default: the server's `count`).
    #[arg(long)]
    tool: Option<String>,
    /// The tool's arguments, as a JSON object.
    #[arg(long, default_value = "{}", requires = "tool")]
    args: String,
    /// A shell command that restarts the server and returns once it is started: enables the
    /// restart check (the probe then waits for the port).
    #[arg(long)]
    restart_cmd: Option<String>,
    /// Another replica of the same deployment: a call started on URL is resumed there.
    #[arg(long = "replica", value_parser = crate::client_cli::parse_url)]
    replicas: Vec<String>,
    /// Arguments for the streaming tool (a JSON object) that make it send more events than the
    /// server retains per stream: enables the evicted-cursor check (for tether started with
    /// `--max-events-per-stream 10`, `--evict-args '{"to": 40}'`).
    #[arg(long)]
    evict_args: Option<String>,
    /// Also trust the certificate authorities in this PEM file for an https URL.
    #[arg(long, value_name = "FILE", value_parser = crate::client_cli::parse_ca_cert)]
    ca_cert: Option<tether_client::tls::Trust>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// Write the report to this file instead of stdout.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Runs the probe; exit status 0 if it passed, 2 if a check failed, 3 if it was inconclusive.
pub async fn run(args: ProbeArgs) -> anyhow::Result<ExitCode> {
    let tool = match args.tool {
        Some(name) => Some((name, serde_json::from_str(&args.args).context("--args is not JSON")?)),
        None => None,
    };
    let terminal = std::io::stderr().is_terminal();
    let mut done = 0;
    let progress = |check: &Check| {
        done += 1;
        if terminal {
            eprint!("\r\x1b[2K[{done:>2}] {} {}", check.verdict.paint(check.verdict.as_str()), check.id);
        }
    };
    let evict_arguments = match &args.evict_args {
        Some(json) => Some(serde_json::from_str(json).context("--evict-args is not JSON")?),
        None => None,
    };
    let config = ProbeConfig {
        url: args.url,
        tool,
        restart_command: args.restart_cmd,
        replicas: args.replicas,
        evict_arguments,
        trust: args.ca_cert.unwrap_or_default(),
        headers: args.headers,
    };
    let report = tether_probe::run(config, progress).await;
    if terminal {
        eprint!("\r\x1b[2K");
    }
    let report = report?;
    let colour = args.out.is_none() && std::io::stdout().is_terminal();
    let text = match args.format {
        Format::Table if colour => report.to_colour_table(),
        Format::Table => report.to_table(),
        Format::Html => report.to_html(),
        Format::Json => report.to_json() + "\n",
        Format::Markdown => report.to_markdown(),
    };
    let elsewhere = args.out.is_some() || !matches!(args.format, Format::Table);
    match args.out {
        Some(path) => std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?,
        None => print!("{text}"),
    }
    if elsewhere {
        // The verdict where a person running it sees it, whatever the report went to.
        eprintln!("{}", report.verdict_line());
    }
    Ok(match report.conclusion() {
        tether_probe::Conclusion::Pass => ExitCode::SUCCESS,
        tether_probe::Conclusion::Fail => ExitCode::from(EXIT_FAILED),
        tether_probe::Conclusion::Inconclusive => ExitCode::from(EXIT_INCONCLUSIVE),
    })
}
