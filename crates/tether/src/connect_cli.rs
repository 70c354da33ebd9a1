//! `tether connect`.

use std::process::ExitCode;

use clap::Args;
use tether_client::ClientConfig;
use tether_client::tls::Trust;
use tether_gateway::connect;

use crate::client_cli::{PolicyArg, parse_ca_cert};

#[derive(Debug, Args)]
pub struct ConnectArgs {
    /// The Streamable HTTP MCP endpoint.
    #[arg(value_parser = crate::client_cli::parse_url)]
    url: String,
    /// A header sent with every request, as `Name: value` (repeatable), e.g. for authorization.
    #[arg(long = "header", value_name = "NAME: VALUE", value_parser = crate::client_cli::parse_header)]
    headers: Vec<(String, String)>,
    /// What a resume that cannot be proven continuous (opaque event ids) leads to: `strict`
    /// replaces the session, `trust` goes on.
    #[arg(long, value_enum, default_value = "strict")]
    policy: PolicyArg,
    /// Answer each request within this long (`30s`, `2m`): one the server has not answered by
    /// then is answered with an error whose reason is `outcome_unknown` (it may have run), and
    /// an `initialize` that could not connect with `connect_failed` and the cause (connection
    /// refused, DNS, TLS).
    #[arg(long, value_parser = tether_server::parse_duration)]
    timeout: Option<std::time::Duration>,
    /// How many reconnects of a stream, re-sends of a keyed request or connection attempts in a
    /// row without progress before giving up (the delays between them grow to 10 s).
    #[arg(long, default_value_t = 8)]
    retries: u32,
    /// Also trust the certificate authorities in this PEM file for an https URL.
    #[arg(long, value_name = "FILE", value_parser = parse_ca_cert)]
    ca_cert: Option<Trust>,
    /// Serve the client's Prometheus metrics (divergences, resyncs, re-initializations,
    /// re-sends) at `http://ADDR/metrics`.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    #[command(flatten)]
    oauth: crate::oauth_cli::OAuthArgs,
}

/// Bridges stdin and stdout to the server; prints what it carried to stderr as one JSON line
/// when the client closes stdin.
pub async fn run(args: ConnectArgs) -> ExitCode {
    if let Some(addr) = args.metrics {
        match crate::serve::serve_metrics(addr, None).await {
            Ok(bound) => {
                tether_client::describe_metrics();
                // Standard output is the client's: what tether says goes to standard error.
                eprintln!("{}", serde_json::json!({"event": "metrics", "url": format!("http://{bound}/metrics")}));
            }
            Err(err) => {
                eprintln!("{}", serde_json::json!({"event": "error", "message": format!("--metrics: {err:#}")}));
                return ExitCode::FAILURE;
            }
        }
    }
    let mut config = ClientConfig::new(&args.url);
    config.oauth = match args.oauth.config() {
        Ok(oauth) => oauth,
        Err(err) => {
            eprintln!("{}", serde_json::json!({"event": "error", "message": err}));
            return ExitCode::from(2);
        }
    };
    config.headers = args.headers;
    config.policy = args.policy.into();
    config.trust = args.ca_cert.unwrap_or_default();
    config.backoff.max_attempts_without_progress = args.retries;
    let counts = connect::bridge(config, args.timeout, tokio::io::stdin(), tokio::io::stdout()).await;
    eprintln!("{}", serde_json::json!({"event": "counts", "counts": counts}));
    if counts.pending() == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
