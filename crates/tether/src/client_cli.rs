//! `tether watch`, `tether call` and `tether conformance-client`: the client library with
//! JSON-lines output (a public interface: keep its shapes stable).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use serde_json::{Value, json};
use tether_client::oauth::{ClientIdentity, FollowRedirect, MachineCredential, OAuthConfig};
use tether_client::tls::Trust;
use tether_client::{Client, ClientConfig, ClientEvent, DefaultHooks, Policy, RequestError};
use tether_core::mcp::ProtocolVersion;
use tokio::sync::mpsc::UnboundedReceiver;

/// Exit status when a divergence ends the command (`--exit-on-divergence`).
const EXIT_DIVERGENCE: u8 = 3;
/// Exit status when a call's outcome is unknown (also past `--timeout`).
const EXIT_OUTCOME_UNKNOWN: u8 = 4;
/// Exit status when `watch` gives up: the stream kept closing without progress, the server
/// offers none, or `--timeout` passed.
const EXIT_GAVE_UP: u8 = 5;
/// Exit status when the tool's result says it failed (`isError: true`).
const EXIT_TOOL_ERROR: u8 = 6;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PolicyArg {
    /// Re-initialize when continuity cannot be proven.
    Strict,
    /// Go on and report the resume as unverified.
    Trust,
}

impl From<PolicyArg> for Policy {
    fn from(policy: PolicyArg) -> Policy {
        match policy {
            PolicyArg::Strict => Policy::Strict,
            PolicyArg::Trust => Policy::Trust,
        }
    }
}

/// An `http://` or `https://` URL with a host, checked when the arguments are parsed.
pub fn parse_url(text: &str) -> Result<String, String> {
    let not_a_url = || format!("{text:?} is not an http:// or https:// URL (for example http://127.0.0.1:8808/mcp)");
    let uri: axum::http::Uri = text.parse().map_err(|_| not_a_url())?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(host)) if !host.is_empty() => Ok(text.to_owned()),
        (Some(scheme), _) if !matches!(scheme, "http" | "https") => {
            Err(format!("{text:?}: the scheme must be http or https, not {scheme}"))
        }
        _ => Err(not_a_url()),
    }
}

/// `Name: value`, for `--header`.
pub fn parse_header(text: &str) -> Result<(String, String), String> {
    let (name, value) = text.split_once(':').ok_or_else(|| format!("{text:?} is not `Name: value`"))?;
    let name = name.trim();
    axum::http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("{name:?} is not a header name"))?;
    axum::http::HeaderValue::from_str(value.trim())
        .map_err(|_| format!("the value of {name} is not a header value"))?;
    Ok((name.to_owned(), value.trim().to_owned()))
}

/// Flags shared by the client commands.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// MCP endpoint URL.
    #[arg(value_parser = parse_url)]
    url: String,
    /// A header sent with every request, as `Name: value` (repeatable), e.g. for authorization.
    #[arg(long = "header", value_name = "NAME: VALUE", value_parser = parse_header)]
    headers: Vec<(String, String)>,
    /// `human` (a progress bar, events in words, the result's text; the default on a terminal,
    /// coloured unless `NO_COLOR` is set) or `json` (one object per line; the default otherwise).
    #[arg(long, value_enum)]
    format: Option<crate::output::Format>,
    /// Keep the checkpoint (session, epoch, cursors) in this file across runs.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// What an unverifiable resume leads to.
    #[arg(long, value_enum, default_value = "strict")]
    policy: PolicyArg,
    /// Exit with status 3 at the first divergence, sending nothing more to the server.
    #[arg(long)]
    exit_on_divergence: bool,
    /// Exit after printing this many messages.
    #[arg(long)]
    max_events: Option<u64>,
    /// Give up after this long (`30s`, `2m`): `call` reports the outcome unknown (exit 4),
    /// `watch` prints `gave_up` (exit 5).
    #[arg(long, value_parser = tether_server::parse_duration)]
    timeout: Option<std::time::Duration>,
    /// How many reconnects of a stream, or re-sends of a keyed request, in a row without
    /// progress before giving up (the delays between them grow to 10 s).
    #[arg(long, default_value_t = 8)]
    retries: u32,
    /// The protocol revision to ask for: a 2025 one (the server may fall back to 2026-07-28) or
    /// 2026-07-28 (stateless, no handshake).
    #[arg(long, default_value = "2025-11-25")]
    protocol_version: ProtocolVersion,
    /// Also trust the certificate authorities in this PEM file for an https URL (the platform's
    /// roots, or `SSL_CERT_FILE`, are trusted too).
    #[arg(long, value_name = "FILE", value_parser = parse_ca_cert)]
    ca_cert: Option<Trust>,
    #[command(flatten)]
    oauth: crate::oauth_cli::OAuthArgs,
}

/// `--ca-cert FILE`: the platform's roots and the authorities in FILE, read when the command
/// starts so that a wrong file is a usage error.
pub fn parse_ca_cert(path: &str) -> Result<Trust, String> {
    Trust::platform().with_ca_file(std::path::Path::new(path)).map_err(|err| err.to_string())
}

impl ClientArgs {
    /// The client's settings; a usage error (printed) if the OAuth flags cannot be had.
    fn config(&self) -> Result<ClientConfig, ExitCode> {
        let mut config = ClientConfig::new(&self.url);
        config.oauth = self.oauth.config().map_err(|err| {
            eprintln!("{err}");
            ExitCode::from(2)
        })?;
        config.headers = self.headers.clone();
        config.checkpoint_file = self.checkpoint.clone();
        config.policy = self.policy.into();
        config.reinitialize = !self.exit_on_divergence;
        config.protocol_version = self.protocol_version;
        config.backoff.max_attempts_without_progress = self.retries;
        config.trust = self.ca_cert.clone().unwrap_or_default();
        config.connect_timeout = self.timeout;
        Ok(config)
    }

    /// Connects as these arguments say, with `adjust`'s changes (the command's own); a failure
    /// is printed, and answered with the command's exit code.
    async fn connect(
        &self,
        adjust: impl FnOnce(&mut ClientConfig),
    ) -> Result<(Client, UnboundedReceiver<ClientEvent>), ExitCode> {
        let mut config = self.config()?;
        adjust(&mut config);
        connect(config).await
    }

    /// When the command gives up, if `--timeout` says.
    fn deadline(&self) -> Option<tokio::time::Instant> {
        self.timeout.map(|timeout| tokio::time::Instant::now() + timeout)
    }
}

/// Prints that the command gave up, and why; its exit code.
fn gave_up(reason: &str) -> ExitCode {
    print(json!({"event": "gave_up", "reason": reason}));
    ExitCode::from(EXIT_GAVE_UP)
}

/// Resolves at `deadline`, or never.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Serve the client's Prometheus metrics (divergences, resyncs, re-initializations) at
    /// `http://ADDR/metrics` while it watches.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
}

#[derive(Debug, Args)]
pub struct CallArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// The tool to call.
    tool: String,
    /// The tool's arguments, as a JSON object.
    #[arg(long, default_value = "{}")]
    args: String,
    /// Send the call without an idempotency key: if its outcome is lost, it is reported
    /// unknown instead of being re-issued.
    #[arg(long)]
    no_idempotency_key: bool,
    /// Send a progress token, so the server may report progress (always with `--format human`,
    /// whose progress bar it drives).
    #[arg(long)]
    progress: bool,
    /// Declare the tasks extension (SEP-2663; implies --protocol-version 2026-07-28), so the
    /// server may run the call as a task: the call is followed to its result, with a
    /// `{"event":"task",...}` line per status.
    #[arg(long)]
    task: bool,
}

#[derive(Debug, Args)]
pub struct TaskArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// The task's id. It may begin with `-`, as a random id can.
    #[arg(allow_hyphen_values = true)]
    task_id: String,
}

#[derive(Debug, Args)]
pub struct ConformanceArgs {
    /// The URL the conformance runner appends.
    url: String,
}

fn print(line: Value) {
    crate::output::print(&line);
}

/// Prints one event; returns the exit code if it ends the command.
fn print_event(event: ClientEvent, args: &ClientArgs, messages: &mut u64) -> Option<ExitCode> {
    match event {
        ClientEvent::Message { id, message, ack, .. } => {
            print(json!({"event": "message", "id": id, "message": message}));
            ack.done();
            *messages += 1;
            if args.max_events.is_some_and(|max| *messages >= max) {
                return Some(ExitCode::SUCCESS);
            }
        }
        ClientEvent::Resumed { id, verdict } => {
            print(json!({"event": "resumed", "id": id, "verdict": verdict.as_str()}))
        }
        ClientEvent::Divergence { reason } => {
            print(json!({"event": "divergence", "kind": reason.kind(), "detail": reason.to_string()}));
            if args.exit_on_divergence {
                return Some(ExitCode::from(EXIT_DIVERGENCE));
            }
        }
        ClientEvent::Resynced { id, notice, ack } => {
            let (lost_from, lost_to) = (notice.lost.map(|l| l.from), notice.lost.map(|l| l.to));
            let detail = match notice.lost {
                Some(lost) => format!("events {}..={} of stream {} are gone", lost.from, lost.to, notice.stream),
                None => format!("the request of stream {} stopped before it finished", notice.stream),
            };
            print(json!({"event": "divergence", "kind": "resync", "reason": notice.reason.as_str(), "id": id,
                "lost_from": lost_from, "lost_to": lost_to, "detail": detail}));
            ack.done();
            if args.exit_on_divergence {
                return Some(ExitCode::from(EXIT_DIVERGENCE));
            }
        }
        ClientEvent::Reinitialized { session } => print(json!({"event": "reinitialized", "session": session})),
        ClientEvent::Task { task_id, status, message } => {
            print(json!({"event": "task", "taskId": task_id, "status": status.as_str(), "message": message}))
        }
        ClientEvent::Reissued { key, attempt, reason } => {
            print(json!({"event": "reissued", "key": key, "attempt": attempt, "reason": reason}))
        }
        ClientEvent::Unkeyed { reason } => print(json!({"event": "unkeyed", "reason": reason})),
        ClientEvent::Closed { reason, fatal: false } => return Some(gave_up(&reason)),
        ClientEvent::Closed { reason, fatal: true } => {
            eprintln!("{reason}");
            return Some(ExitCode::FAILURE);
        }
    }
    None
}

/// Connects, or says on both outputs why it could not: a JSON line for scripts, and the cause
/// (connection refused, DNS, TLS) for a person.
async fn connect(config: ClientConfig) -> Result<(Client, UnboundedReceiver<ClientEvent>), ExitCode> {
    Client::connect(config).await.map_err(|err| {
        let message = format!("could not connect: {}", tether_client::tls::describe(&err));
        print(json!({"event": "error", "error": {"code": -32603, "message": message, "data": {"reason": "connect_failed"}}}));
        if !crate::output::human() {
            eprintln!("{message}");
        }
        ExitCode::FAILURE
    })
}

/// `tether watch`: follow the standalone stream and print what arrives.
pub async fn watch(args: WatchArgs) -> ExitCode {
    crate::output::set(crate::output::Format::or_default(args.client.format));
    if let Some(addr) = args.metrics {
        match crate::serve::serve_metrics(addr, None).await {
            Ok(bound) => {
                tether_client::describe_metrics();
                print(json!({"event": "metrics", "url": format!("http://{bound}/metrics")}));
            }
            Err(err) => return gave_up(&format!("--metrics: {err:#}")),
        }
    }
    let (client, mut events) = match args.client.connect(|_| {}).await {
        Ok(connected) => connected,
        Err(code) => return code,
    };
    let deadline = args.client.deadline();
    tokio::select! {
        () = client.follow_standalone() => {}
        () = until(deadline) => return gave_up("timed out"),
    }
    let mut messages = 0;
    loop {
        let event = tokio::select! {
            event = events.recv() => event,
            () = until(deadline) => return gave_up("timed out"),
        };
        let Some(event) = event else { return gave_up("the client stopped") };
        if let Some(code) = print_event(event, &args.client, &mut messages) {
            return code;
        }
    }
}

/// `tether call`: call one tool, printing its notifications, then its outcome.
pub async fn call(args: CallArgs) -> ExitCode {
    crate::output::set(crate::output::Format::or_default(args.client.format));
    let arguments: Value = match serde_json::from_str(&args.args) {
        Ok(value @ Value::Object(_)) => value,
        _ => {
            eprintln!("--args must be a JSON object");
            return ExitCode::FAILURE;
        }
    };
    let adjust = |config: &mut ClientConfig| {
        config.idempotency_keys = !args.no_idempotency_key;
        if args.task {
            config.tasks = true;
            config.protocol_version = ProtocolVersion::V2026_07_28;
        }
    };
    let (client, events) = match args.client.connect(adjust).await {
        Ok(connected) => connected,
        Err(code) => return code,
    };
    let mut params = json!({"name": args.tool, "arguments": arguments});
    if args.progress || crate::output::human() {
        params["_meta"] = json!({"progressToken": "tether-call"});
    }
    let call = client.request(tether_core::mcp::method::TOOLS_CALL, params);
    print_outcome(&client, events, call, &args.client).await
}

/// `tether task`: follow a task (one an earlier `tether call --task` left, say) to its result.
pub async fn task(args: TaskArgs) -> ExitCode {
    crate::output::set(crate::output::Format::or_default(args.client.format));
    let adjust = |config: &mut ClientConfig| {
        config.tasks = true;
        config.protocol_version = ProtocolVersion::V2026_07_28;
    };
    let (client, events) = match args.client.connect(adjust).await {
        Ok(connected) => connected,
        Err(code) => return code,
    };
    let follow = client.follow_task(&args.task_id);
    print_outcome(&client, events, follow, &args.client).await
}

/// Prints `events` while `outcome` runs, then the outcome; the command's exit code.
async fn print_outcome(
    client: &Client,
    mut events: UnboundedReceiver<ClientEvent>,
    outcome: impl std::future::Future<Output = Result<Value, RequestError>>,
    args: &ClientArgs,
) -> ExitCode {
    let mut messages = 0;
    let deadline = args.deadline();
    tokio::pin!(outcome);
    let outcome = loop {
        tokio::select! {
            biased;
            Some(event) = events.recv() => {
                if let Some(code) = print_event(event, args, &mut messages) {
                    return code;
                }
            }
            outcome = &mut outcome => break outcome,
            () = until(deadline) => break Err(RequestError::OutcomeUnknown("timed out".into())),
        }
    };
    while let Ok(event) = events.try_recv() {
        if let Some(code) = print_event(event, args, &mut messages) {
            return code;
        }
    }
    let code = match outcome {
        Ok(result) => {
            let failed = result.get("isError") == Some(&Value::Bool(true));
            print(json!({"event": "result", "result": result}));
            if failed { ExitCode::from(EXIT_TOOL_ERROR) } else { ExitCode::SUCCESS }
        }
        Err(RequestError::Rpc(error) | RequestError::Aborted(error)) => {
            print(json!({"event": "error", "error": error}));
            ExitCode::FAILURE
        }
        Err(RequestError::OutcomeUnknown(reason)) => {
            print(json!({"event": "outcome_unknown", "reason": reason}));
            ExitCode::from(EXIT_OUTCOME_UNKNOWN)
        }
        Err(other) => {
            print(json!({"event": "error", "error": {"message": other.to_string()}}));
            ExitCode::FAILURE
        }
    };
    // The session's end is a courtesy: it must not hold up a command that timed out.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), client.close()).await;
    code
}

/// `tether conformance-client`: plays the official conformance suite's client scenarios.
pub async fn conformance(args: ConformanceArgs) -> ExitCode {
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    let mut config = ClientConfig::new(&args.url);
    config.hooks = Arc::new(DefaultHooks);
    // The revision the suite plays (0.2's runner says which; 0.1's says nothing).
    if let Some(version) = std::env::var("MCP_CONFORMANCE_PROTOCOL_VERSION").ok().and_then(|v| v.parse().ok()) {
        config.protocol_version = version;
    }
    // The suite's mock servers use opaque ids and no epoch: continuity cannot be proven there.
    config.policy = Policy::Trust;
    let context: Value =
        std::env::var("MCP_CONFORMANCE_CONTEXT").ok().and_then(|c| serde_json::from_str(&c).ok()).unwrap_or_default();
    match conformance_oauth(&scenario, &context) {
        Ok(oauth) => config.oauth = Some(oauth),
        Err(err) => {
            eprintln!("{scenario}: {err}");
            return ExitCode::FAILURE;
        }
    }
    let (client, _events) = match connect(config).await {
        Ok(connected) => connected,
        Err(code) => return code,
    };
    // Servers may send their requests (elicitation) on the standalone stream. sse-retry times the
    // client's last GET, so it gets no standalone stream.
    if scenario != "sse-retry" {
        client.follow_standalone().await;
    }
    // 0.2's scenarios say what to call: list the tools (so their header declarations are known),
    // then call each; a call the client refuses (an excluded tool) is the expected outcome there.
    if let Some(calls) = context.get("toolCalls").and_then(Value::as_array) {
        if let Err(err) = client.request("tools/list", json!({})).await {
            eprintln!("{scenario}: tools/list: {err}");
        }
        for call in calls {
            let name = call.get("name").and_then(Value::as_str).unwrap_or_default();
            let arguments = call.get("arguments").cloned().unwrap_or_else(|| json!({}));
            if let Err(err) = client.call_tool(name, arguments).await {
                eprintln!("{scenario}: {name}: {err}");
            }
        }
        client.close().await;
        return ExitCode::SUCCESS;
    }
    let outcome = match scenario.as_str() {
        "initialize" => Ok(Value::Null),
        "request-metadata" => client.request("tools/list", json!({})).await,
        "tools_call" => client.call_tool("add_numbers", json!({"a": 2, "b": 3})).await,
        "sse-retry" => client.call_tool("test_reconnection", json!({})).await,
        "elicitation-sep1034-client-defaults" => client.call_tool("test_client_elicitation_defaults", json!({})).await,
        "json-schema-2020-12-preservation" => echo_schema(&client).await,
        _ => call_every_tool(&client).await,
    };
    client.close().await;
    match outcome {
        Ok(_) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{scenario}: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The client-id metadata document URL the suite's authorization servers expect.
const CONFORMANCE_CLIENT_METADATA: &str = "https://conformance-test.local/client-metadata.json";
/// The redirect URI the suite's authorization servers send the code to (nothing listens there:
/// the redirect is read, not followed).
const CONFORMANCE_REDIRECT_URI: &str = "http://localhost:3000/callback";

/// How the conformance client authorizes: with the credentials the scenario's context gives
/// (client credentials, pre-registered), else by metadata document or dynamic registration.
fn conformance_oauth(scenario: &str, context: &Value) -> Result<OAuthConfig, String> {
    let text = |name: &str| context.get(name).and_then(Value::as_str).map(str::to_owned);
    let agent = FollowRedirect::new(CONFORMANCE_REDIRECT_URI, &Trust::platform()).map_err(|err| err.to_string())?;
    let mut oauth = OAuthConfig::new(Arc::new(agent));
    oauth.identity = match (text("client_id"), text("client_secret"), text("private_key_pem")) {
        (Some(client_id), Some(client_secret), None) if context.get("idp_id_token").is_some() => {
            ClientIdentity::Enterprise {
                client_id,
                client_secret,
                idp_token_endpoint: text("idp_token_endpoint").ok_or("the context names no idp_token_endpoint")?,
                idp_client_id: text("idp_client_id"),
                id_token: text("idp_id_token").ok_or("the context has no idp_id_token")?,
            }
        }
        (client_id, _, None) if context.get("valid_jwt").is_some() => {
            ClientIdentity::Workload { client_id, assertion: text("valid_jwt").ok_or("the context has no valid_jwt")? }
        }
        (Some(client_id), _, Some(pem)) => {
            let algorithm = text("signing_algorithm").unwrap_or_else(|| "ES256".into());
            let algorithm = algorithm.parse().map_err(|_| format!("unknown signing algorithm {algorithm}"))?;
            ClientIdentity::Machine { client_id, credential: MachineCredential::PrivateKey { pem, algorithm } }
        }
        (Some(client_id), Some(secret), None) if scenario.starts_with("auth/client-credentials") => {
            ClientIdentity::Machine { client_id, credential: MachineCredential::Secret(secret) }
        }
        (Some(client_id), client_secret, None) => {
            ClientIdentity::Registered { client_id, client_secret, issuer: text("issuer") }
        }
        _ => ClientIdentity::Dynamic { metadata_document: Some(CONFORMANCE_CLIENT_METADATA.into()) },
    };
    Ok(oauth)
}

/// The tools the server lists (which the client also learns from: idempotency, header
/// declarations, the tools it excludes).
async fn list_tools(client: &Client) -> Result<Vec<Value>, RequestError> {
    let listed = client.request("tools/list", json!({})).await?;
    Ok(listed.get("tools").and_then(Value::as_array).cloned().unwrap_or_default())
}

/// What a client of an unscripted scenario does: list the tools and call each, at once, with the
/// arguments its schema requires. A tool the client excludes is not called; each outcome goes to
/// stderr, and only a failed listing is the scenario's failure.
async fn call_every_tool(client: &Client) -> Result<Value, RequestError> {
    let mut calls = tokio::task::JoinSet::new();
    for tool in list_tools(client).await? {
        let name = tool.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
        let arguments = required_arguments(tool.get("inputSchema").unwrap_or(&Value::Null));
        let client = client.clone();
        calls.spawn(async move { (client.call_tool(&name, arguments).await, name) });
    }
    while let Some(Ok((outcome, name))) = calls.join_next().await {
        if let Err(err) = outcome {
            eprintln!("{name}: {err}");
        }
    }
    Ok(Value::Null)
}

/// A value of each required property of `schema`, by its type.
fn required_arguments(schema: &Value) -> Value {
    let mut arguments = serde_json::Map::new();
    for name in schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
        let value = match schema.pointer(&format!("/properties/{name}/type")).and_then(Value::as_str) {
            Some("integer" | "number") => json!(0),
            Some("boolean") => json!(false),
            Some("object") => json!({}),
            Some("array") => json!([]),
            Some("null") => Value::Null,
            _ => json!("x"),
        };
        arguments.insert(name.to_owned(), value);
    }
    Value::Object(arguments)
}

/// SEP-2106's round trip: the schema the client holds for `json_schema_2020_12_tool`, sent back
/// unchanged through `json_schema_echo`.
async fn echo_schema(client: &Client) -> Result<Value, RequestError> {
    let tools = list_tools(client).await?;
    let schema = tools
        .iter()
        .find(|tool| tool.get("name").and_then(Value::as_str) == Some("json_schema_2020_12_tool"))
        .and_then(|tool| tool.get("inputSchema"))
        .cloned()
        .unwrap_or(Value::Null);
    client.call_tool("json_schema_echo", json!({"schema": schema})).await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use clap::Parser;

    use super::required_arguments;

    #[derive(Debug, clap::Parser)]
    struct Flags {
        #[command(flatten)]
        client: super::ClientArgs,
    }

    #[test]
    fn retries_set_the_reconnect_budget() {
        let flags = |args: &[&str]| {
            Flags::parse_from([&["t", "http://127.0.0.1:1/mcp"], args].concat()).client.config().expect("a config")
        };
        assert_eq!(flags(&[]).backoff.max_attempts_without_progress, 8);
        assert_eq!(flags(&["--retries", "20"]).backoff.max_attempts_without_progress, 20);
    }

    #[test]
    fn an_unscripted_call_fills_every_required_property_by_its_type() {
        let schema = json!({"properties": {"s": {"type": "string"}, "n": {"type": "number"}, "b": {"type": "boolean"},
            "o": {"type": "object"}, "a": {"type": "array"}, "z": {"type": "null"}, "optional": {"type": "string"}},
            "required": ["s", "n", "b", "o", "a", "z"]});
        assert_eq!(required_arguments(&schema), json!({"s": "x", "n": 0, "b": false, "o": {}, "a": [], "z": null}));
        assert_eq!(required_arguments(&json!({})), json!({}));
    }
}
