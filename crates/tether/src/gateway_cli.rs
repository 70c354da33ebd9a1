//! `tether gateway`.

use anyhow::Context as _;
use clap::Args;
use tether_gateway::stdio;
use tether_server::upstream::UpstreamHandler;

use crate::serve::{self, Answering, ServeArgs};

#[derive(Debug, Args)]
pub struct GatewayArgs {
    #[command(flatten)]
    serve: ServeArgs,
    /// The stdio MCP server to start for each session: a program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

pub async fn run(args: GatewayArgs) -> anyhow::Result<()> {
    let (program, rest) = args.command.split_first().context("no command to run")?;
    let command = stdio::Command::new(program.clone(), rest.iter().cloned());
    let describe = tether_server::upstream::Connect::describe(&command);
    let upstream = UpstreamHandler::discover(command)
        .await
        .map_err(|error| anyhow::anyhow!("{}", error.message))
        .with_context(|| format!("starting the upstream `{describe}`"))?;
    serve::run(args.serve, Answering::Upstream(upstream)).await
}
