//! `tether gateway`.

use anyhow::Context as _;
use clap::Args;
use tether_client::ClientConfig;
use tether_client::tls::Trust;
use tether_gateway::upstream::{Connect, UpstreamHandler};
use tether_gateway::{http, stdio};

use crate::client_cli::{PolicyArg, parse_ca_cert};
use crate::serve::{self, Answering, ServeArgs};

#[derive(Debug, Args)]
pub struct GatewayArgs {
    #[command(flatten)]
    serve: ServeArgs,
    /// The Streamable HTTP MCP server to front (instead of a command).
    #[arg(long, value_name = "URL", conflicts_with = "command", value_parser = crate::client_cli::parse_url)]
    upstream: Option<String>,
    /// What a resume from the upstream that cannot be proven continuous (opaque event ids)
    /// leads to: `strict` ends the downstream session (`upstream_lost`), `trust` goes on.
    #[arg(long, value_enum, default_value = "strict", requires = "upstream")]
    upstream_policy: PolicyArg,
    /// Listen at once and answer 503 `not_ready` (with `Retry-After`) until the upstream is
    /// reached, trying again meanwhile; give up (exit 1) if it is not reached within this long.
    /// Without it, the upstream is reached before anything listens.
    #[arg(long, value_name = "DURATION", value_parser = tether_server::parse_duration)]
    upstream_wait: Option<std::time::Duration>,
    /// Also trust the certificate authorities in this PEM file for an https upstream.
    #[arg(long, value_name = "FILE", value_parser = parse_ca_cert, requires = "upstream")]
    ca_cert: Option<Trust>,
    /// Tell the upstream who each downstream client authenticated as (with --auth): the
    /// principal in this header of every request to it. Without, it is not told. The client's
    /// own token is never passed on.
    #[arg(long, value_name = "HEADER", requires = "upstream", value_parser = parse_header_name)]
    upstream_principal_header: Option<String>,
    /// The most upstream instances (child processes, upstream sessions) that serve 2026-07-28
    /// requests at once: each is kept between the requests of one client, and a request past
    /// the bound waits for one.
    #[arg(long, value_name = "N", default_value_t = tether_gateway::upstream::STATELESS_INSTANCES)]
    stateless_instances: std::num::NonZeroUsize,
    /// The stdio MCP server to start for each session: a program and its arguments, after `--`.
    #[arg(last = true, value_name = "COMMAND", required_unless_present = "upstream")]
    command: Vec<String>,
}

/// A header name, checked when the command starts.
fn parse_header_name(text: &str) -> Result<String, String> {
    axum::http::HeaderName::from_bytes(text.as_bytes()).map_err(|_| format!("{text:?} is not a header name"))?;
    Ok(text.to_owned())
}

impl GatewayArgs {
    /// How many threads run requests (serve's `--workers`).
    pub fn workers(&self, cores: usize) -> usize {
        self.serve.workers(cores)
    }
}

pub async fn run(args: GatewayArgs) -> anyhow::Result<()> {
    let (wait, pool) = (args.upstream_wait, args.stateless_instances);
    let reached: serve::Reaching = match (&args.upstream, args.command.split_first()) {
        (Some(url), _) => {
            let mut config = ClientConfig::new(url);
            config.policy = args.upstream_policy.into();
            config.trust = args.ca_cert.clone().unwrap_or_default();
            // While waiting, each attempt is one try, so that each is logged and the wait
            // notices the upstream as soon as it answers.
            let mut probe = config.clone();
            if wait.is_some() {
                probe.backoff.max_attempts_without_progress = 0;
            }
            let mut remote = http::Remote::new(config);
            if let Some(header) = &args.upstream_principal_header {
                remote = remote.forward_principal(header.clone());
            }
            Box::pin(reach(remote, http::Remote::new(probe), wait.is_some(), pool))
        }
        (None, Some((program, rest))) => {
            let command = stdio::Command::new(program.clone(), rest.iter().cloned());
            Box::pin(reach(command.clone(), command, wait.is_some(), pool))
        }
        (None, None) => anyhow::bail!("give the upstream: --upstream URL, or -- COMMAND [ARGS...]"),
    };
    serve::run(args.serve, Answering::Upstream { reached, wait }).await
}

/// Serves the upstream `connect` reaches, once an instance started by `probe` said who it is;
/// each attempt is logged. With `again`, tries until one answers (the caller bounds the wait),
/// else once. At most `pool` instances serve 2026-07-28 requests.
async fn reach(
    connect: impl Connect,
    probe: impl Connect,
    again: bool,
    pool: std::num::NonZeroUsize,
) -> anyhow::Result<UpstreamHandler> {
    let describe = connect.describe();
    let mut pause = std::time::Duration::from_millis(500);
    let mut attempt = 0u32;
    loop {
        attempt = attempt.saturating_add(1);
        tracing::info!(upstream = %describe, attempt, "reaching the upstream");
        match UpstreamHandler::info_of(&probe).await {
            Ok(info) => return Ok(UpstreamHandler::new(connect, info).stateless_instances(pool)),
            Err(error) if again => {
                tracing::warn!(upstream = %describe, attempt, reason = %error.message, ?pause, "the upstream is out of reach; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(5));
            }
            Err(error) => {
                return Err(anyhow::anyhow!("{}", error.message))
                    .with_context(|| format!("starting the upstream `{describe}`"));
            }
        }
    }
}
