//! `tether gateway`.

use anyhow::Context as _;
use clap::Args;
use tether_client::ClientConfig;
use tether_gateway::upstream::{Connect, UpstreamHandler};
use tether_gateway::{http, stdio};

use tether_client::tls::Trust;

use crate::client_cli::{PolicyArg, parse_ca_cert};
use crate::serve::{self, Answering, ServeArgs};

#[derive(Debug, Args)]
pub struct GatewayArgs {
    #[command(flatten)]
    serve: ServeArgs,
    /// The Streamable HTTP MCP server to front (instead of a command).
    #[arg(long, value_name = "URL", conflicts_with = "command")]
    upstream: Option<String>,
    /// What a resume from the upstream that cannot be proven continuous (opaque event ids)
    /// leads to: `strict` ends the downstream session (`upstream_lost`), `trust` goes on.
    #[arg(long, value_enum, default_value = "strict", requires = "upstream")]
    upstream_policy: PolicyArg,
    /// Also trust the certificate authorities in this PEM file for an https upstream.
    #[arg(long, value_name = "FILE", value_parser = parse_ca_cert, requires = "upstream")]
    ca_cert: Option<Trust>,
    /// The stdio MCP server to start for each session: a program and its arguments, after `--`.
    #[arg(last = true, value_name = "COMMAND", required_unless_present = "upstream")]
    command: Vec<String>,
}

pub async fn run(args: GatewayArgs) -> anyhow::Result<()> {
    let upstream = match (&args.upstream, args.command.split_first()) {
        (Some(url), _) => {
            let mut config = ClientConfig::new(url);
            config.policy = args.upstream_policy.into();
            config.trust = args.ca_cert.clone().unwrap_or_default();
            discover(http::Remote::new(config)).await?
        }
        (None, Some((program, rest))) => discover(stdio::Command::new(program.clone(), rest.iter().cloned())).await?,
        (None, None) => anyhow::bail!("give the upstream: --upstream URL, or -- COMMAND [ARGS...]"),
    };
    serve::run(args.serve, Answering::Upstream(upstream)).await
}

/// Starts one instance of the upstream to learn who it is.
async fn discover(connect: impl Connect) -> anyhow::Result<UpstreamHandler> {
    let describe = connect.describe();
    UpstreamHandler::discover(connect)
        .await
        .map_err(|error| anyhow::anyhow!("{}", error.message))
        .with_context(|| format!("starting the upstream `{describe}`"))
}
