//! `tether serve`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use tether_builtin::BuiltinHandler;
use tether_client::oauth::KeySetFetcher;
use tether_core::input_required::StateKey;
use tether_gateway::upstream::UpstreamHandler;
use tether_server::{
    Authenticator, BearerToken, Builder, ConnectionLimits, Drain, FetchFuture, Jwt, JwtConfig, KeySetSource,
    MAX_KEY_SET_BYTES, ProtectedResource, Readiness, ServerConfig, ServerTls, health_router, parse_duration,
};
use tether_store::{CounterStore, KeyRecords as _, MemoryStore, RedisDurability, RedisStore, SqliteStore, Store};
use tower::util::Either;

/// The authenticator `--auth` and its flags describe, if any.
fn authenticator(args: &ServeArgs) -> anyhow::Result<Option<Box<dyn Authenticator>>> {
    let mode = args.auth.or((!args.auth_token.is_empty()).then_some(AuthMode::Token));
    let jwt_flags = args.jwt_issuer.is_some()
        || args.jwt_audience.is_some()
        || args.jwt_jwks_uri.is_some()
        || !args.tool_scopes.is_empty();
    if jwt_flags && mode != Some(AuthMode::Jwt) {
        anyhow::bail!("--jwt-issuer, --jwt-audience, --jwt-jwks-uri and --tool-scope are for --auth jwt");
    }
    match mode {
        None => Ok(None),
        Some(AuthMode::Token) => {
            anyhow::ensure!(!args.auth_token.is_empty(), "--auth token needs at least one --auth-token");
            let tokens = args.auth_token.iter().map(|given| match given.split_once(':') {
                Some((principal, token)) => (principal.to_owned(), token.to_owned()),
                None => ("bearer".to_owned(), given.clone()),
            });
            Ok(Some(Box::new(BearerToken::with_principals(tokens).context("--auth-token")?)))
        }
        Some(AuthMode::Jwt) => {
            anyhow::ensure!(args.auth_token.is_empty(), "--auth-token is for --auth token, not --auth jwt");
            let (Some(issuer), Some(audience)) = (&args.jwt_issuer, &args.jwt_audience) else {
                anyhow::bail!("--auth jwt needs --jwt-issuer and --jwt-audience");
            };
            let mut resource = ProtectedResource::new(audience, issuer.clone()).context("--jwt-audience")?;
            for given in &args.tool_scopes {
                let (tool, scopes) = given
                    .split_once('=')
                    .with_context(|| format!("--tool-scope {given:?}: expected TOOL=SCOPE[,SCOPE...]"))?;
                let scopes: Vec<String> =
                    scopes.split([',', ' ']).filter(|s| !s.is_empty()).map(str::to_owned).collect();
                anyhow::ensure!(
                    !tool.is_empty() && !scopes.is_empty(),
                    "--tool-scope {given:?} names no tool or no scope"
                );
                resource = resource.require_scopes(tool, scopes);
            }
            let http = tether_client::tls::Trust::platform()
                .http_client()
                .timeout(KEY_FETCH_TIMEOUT)
                .build()
                .context("an HTTP client for the issuer's keys")?;
            let keys = IssuerKeys(KeySetFetcher::new(http, issuer.clone(), args.jwt_jwks_uri.clone()));
            Ok(Some(Box::new(Jwt::new(JwtConfig::new(issuer.clone()), resource, keys))))
        }
    }
}

/// How long a fetch of the issuer's metadata or keys may take.
const KEY_FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The issuer's keys, fetched over HTTP(S).
struct IssuerKeys(KeySetFetcher);

impl KeySetSource for IssuerKeys {
    fn fetch(&self) -> FetchFuture<'_> {
        Box::pin(async move { self.0.fetch(MAX_KEY_SET_BYTES).await.map_err(|err| err.to_string()) })
    }
}

/// What an acknowledged write must survive, with the `redis` store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RedisDurabilityArg {
    /// A Redis restart: Redis must fsync every write (appendonly yes, appendfsync always; or,
    /// from 7.2, appendonly yes: tether waits for the fsync).
    Fsync,
    /// A failover to a replica: each write waits for --redis-replicas replicas (WAIT).
    Replicated,
    /// Nothing: a restart or failover may lose acknowledged writes (clients are told, not misled).
    None,
}

/// How requests authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuthMode {
    /// Static bearer tokens, each naming a principal (--auth-token).
    Token,
    /// OAuth access tokens: JWTs of --jwt-issuer for --jwt-audience, verified with the issuer's
    /// published keys; the token's subject is the principal.
    Jwt,
}

/// Where sessions and events are kept.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StoreKind {
    /// SQLite under --data-dir: sessions and history survive a restart (the default).
    Embedded,
    /// In process memory: lost on restart, and a restart is visible to clients as 404.
    Memory,
    /// Redis at --redis-url, shared by replicas: a client may resume on any of them.
    Redis,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on: `IP:PORT`, `HOST:PORT` (`localhost:8808`), or a port alone (on
    /// 127.0.0.1).
    #[arg(long, default_value = "127.0.0.1:8808", value_parser = parse_listen)]
    listen: SocketAddr,
    /// Serve https with the certificate chain in this PEM file (the server's certificate first),
    /// HTTP/2 and HTTP/1.1 offered by ALPN; needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, a PEM file.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Path of the MCP endpoint.
    #[arg(long, default_value = "/mcp")]
    path: String,
    /// Where sessions and events are kept.
    #[arg(long, value_enum, default_value = "embedded")]
    store: StoreKind,
    /// Directory of the embedded store.
    #[arg(long, default_value = "./tether-data")]
    data_dir: PathBuf,
    /// Threads that run requests. Default: one per core, one fewer with the embedded store,
    /// whose writer and flush threads take about a core's share of the work of each call.
    #[arg(long, env = "TOKIO_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..))]
    workers: Option<u16>,
    /// Redis of the `redis` store.
    #[arg(long, default_value = "redis://127.0.0.1:6379/")]
    redis_url: String,
    /// What an acknowledged write survives with the `redis` store; Redis's configuration is
    /// checked against it at start, and an eviction policy other than noeviction is refused but
    /// with `none`.
    #[arg(long, value_enum, default_value = "fsync")]
    redis_durability: RedisDurabilityArg,
    /// How many replicas each write must reach with `--redis-durability replicated`.
    #[arg(long, default_value_t = 1)]
    redis_replicas: u32,
    /// How long a write may wait for them; past it the write fails.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    redis_wait_timeout: Duration,
    /// How long a replica may go silent before its running requests are reported aborted (the
    /// Redis store; the embedded store, one process per directory, knows at once after a restart).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    request_lease: Duration,
    /// How long a finished task is kept after its creation (its `ttlMs`).
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    task_ttl: Duration,
    /// How often clients are asked to poll a task, and how often a replica reads back a task it
    /// runs or streams in case another replica changed it without the store announcing it.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    task_poll_interval: Duration,
    /// The reconnection delay announced to 2025-11-25 clients.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    sse_retry: Duration,
    /// How long a finished request's stream stays replayable (e.g. 500ms, 2s, 5m).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    retention: Duration,
    /// Most events retained per stream; a resume from before the oldest gets a `resync` event.
    #[arg(long, default_value_t = 10_000)]
    max_events_per_stream: usize,
    /// How long a session lives without activity.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    session_idle_ttl: Duration,
    /// Most live sessions.
    #[arg(long, default_value_t = 10_000)]
    max_sessions: usize,
    /// Most tasks running at once (2026-07-28 calls that became tasks), over every replica; one
    /// more is refused with 429 `too_many_tasks`.
    #[arg(long, default_value_t = 4_096)]
    max_tasks: usize,
    /// Most tasks of one principal (a bearer token's, or an access token's subject; all
    /// unauthenticated clients are one) running at once.
    #[arg(long, default_value_t = 1_024)]
    max_tasks_per_principal: usize,
    /// An Origin allowed besides the loopback origins (repeatable).
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    allowed_origins: Vec<String>,
    /// Require `Authorization: Bearer TOKEN` on every request. `PRINCIPAL:TOKEN` names who holds
    /// the token; repeat it for several principals, whose sessions and tasks stay apart (each
    /// one's are invisible to the others). A token without a name is principal `bearer`. In
    /// `TETHER_AUTH_TOKEN`, separate several with commas.
    #[arg(long, env = "TETHER_AUTH_TOKEN", value_name = "[PRINCIPAL:]TOKEN", value_delimiter = ',')]
    auth_token: Vec<String>,
    /// How requests authenticate: `token` (--auth-token) or `jwt` (OAuth access tokens). Default:
    /// `token` when --auth-token is given, none otherwise.
    #[arg(long, value_enum)]
    auth: Option<AuthMode>,
    /// With --auth jwt: the issuer whose access tokens are taken (their `iss`, compared as
    /// written). Its keys are found through its metadata (RFC 8414) unless --jwt-jwks-uri
    /// names them.
    #[arg(long, value_name = "URL")]
    jwt_issuer: Option<String>,
    /// With --auth jwt: this server's resource identifier, the URL clients reach the MCP
    /// endpoint at. Tokens must name it as their audience; the protected resource metadata
    /// (RFC 9728) names it, and is served at its well-known path.
    #[arg(long, value_name = "URL")]
    jwt_audience: Option<String>,
    /// With --auth jwt: where the issuer's JWK Set is, instead of its metadata's `jwks_uri`.
    #[arg(long, value_name = "URL")]
    jwt_jwks_uri: Option<String>,
    /// With --auth jwt: scopes a token must grant to call TOOL (repeatable); a call without
    /// them is refused with 403 `insufficient_scope`, naming them.
    #[arg(long = "tool-scope", value_name = "TOOL=SCOPE[,SCOPE...]")]
    tool_scopes: Vec<String>,
    /// How long the outcome of a request sent with an idempotency key is kept.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    idempotency_ttl: Duration,
    /// Do not offer exactly-once execution (`io.tether/idempotency`): keys are ignored.
    #[arg(long)]
    no_idempotency: bool,
    /// The key 2026-07-28 request states are sealed with, as 64 hex digits; replicas serving the
    /// same clients must share it. Default: a random key per process.
    #[arg(long, env = "TETHER_REQUEST_STATE_KEY", value_parser = parse_state_key, hide_env_values = true)]
    request_state_key: Option<StateKey>,
    /// Most connections open at once; one more is answered 503 and closed. Default: the
    /// descriptor limit (raised to its hard limit at start) less an eighth, at least 64, kept for
    /// the store and for those refusals.
    #[arg(long)]
    max_connections: Option<usize>,
    /// How long a request head may take from its first byte, and a new connection may wait
    /// before sending one.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    header_timeout: Duration,
    /// How long a connection stays open with no request in flight (an open stream is a request
    /// in flight).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    idle_timeout: Duration,
    /// How long a part of a response may wait for the client to take it (a client that stops
    /// reading a stream, or never opens its HTTP/2 window) before the connection is closed.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    send_timeout: Duration,
    /// How long a request body may take to arrive; a slower one gets 408.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    body_timeout: Duration,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464), with `/healthz`
    /// and `/readyz` beside them.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// On SIGTERM or SIGINT, how long requests still running may take to finish (no new session
    /// or 2026-07-28 request is taken meanwhile, and `/readyz` answers 503) before the process
    /// exits; a second signal exits at once.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    drain_timeout: Duration,
    /// Export OpenTelemetry spans (one per MCP request, with the MCP semantic conventions) and
    /// the conventions' metrics over OTLP/HTTP to this collector (`/v1/traces` and `/v1/metrics`
    /// are added). Without it, the standard `OTEL_EXPORTER_OTLP_ENDPOINT` variables are
    /// honoured; with neither, nothing is exported.
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
}

/// Installs the Prometheus recorder behind the libraries' `metrics` calls and serves its text at
/// `/metrics` on `addr`, with the probes of `readiness` beside it if given; returns the bound
/// address.
pub async fn serve_metrics(addr: SocketAddr, readiness: Option<Readiness>) -> anyhow::Result<SocketAddr> {
    // Store latencies as histograms (Prometheus can aggregate those across replicas), from 100 µs
    // to 1 s.
    let buckets = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];
    // Requests and tool calls, from a millisecond to a minute.
    let requests = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(metrics_exporter_prometheus::Matcher::Full("tether_store_seconds".into()), &buckets)
        .context("metric buckets")?
        .set_buckets_for_metric(metrics_exporter_prometheus::Matcher::Suffix("_duration_seconds".into()), &requests)
        .context("metric buckets")?
        .install_recorder()
        .context("installing the metrics recorder")?;
    crate::process_metrics::describe();
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let bound = listener.local_addr()?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        // Histograms are compacted here rather than on every scrape.
        let mut ticker = tokio::time::interval(Duration::from_secs(5));
        loop {
            ticker.tick().await;
            upkeep.run_upkeep();
        }
    });
    let mut app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let handle = handle.clone();
            async move {
                crate::process_metrics::record();
                handle.render()
            }
        }),
    );
    if let Some(readiness) = readiness {
        app = app.merge(health_router(readiness));
    }
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            eprintln!("tether serve: the metrics endpoint stopped: {err}");
        }
    });
    Ok(bound)
}

/// How many connections the kernel may queue before `serve` accepts them (capped by
/// `net.core.somaxconn`): a burst of connections waits there instead of retrying its SYN.
const LISTEN_BACKLOG: u32 = 4_096;

fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Raises the soft limit on open descriptors to the hard limit, and returns the soft limit.
fn raise_descriptor_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => limit,
        Err(err) => {
            let (soft, _) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap_or((1_024, 1_024));
            eprintln!("tether serve: could not raise the descriptor limit ({err}); it stays {soft}");
            soft
        }
    }
}

/// The connections `descriptors` leave room for: an eighth of them, at least 64, is kept for
/// the store, the metrics endpoint and the refusals of connections over the limit.
fn max_connections_for(descriptors: u64) -> usize {
    let reserve = (descriptors / 8).max(64);
    usize::try_from(descriptors.saturating_sub(reserve)).unwrap_or(usize::MAX).max(1)
}

/// Reaching a gateway's upstream: its handler, or why it could not be reached.
pub type Reaching = Pin<Box<dyn Future<Output = anyhow::Result<UpstreamHandler>> + Send>>;

/// What answers the requests `serve` takes.
pub enum Answering {
    /// The built-in tools.
    Builtin,
    /// An upstream server (`tether gateway`), once `reached` has reached it. With `wait`, the
    /// server listens before that, answering 503 `not_ready`, and gives up after `wait`.
    Upstream {
        /// Reaches the upstream, or says why it could not.
        reached: Reaching,
        /// How long to serve `not_ready` while the upstream is out of reach.
        wait: Option<Duration>,
    },
}

pub async fn run(args: ServeArgs, answering: Answering) -> anyhow::Result<()> {
    let authenticator = authenticator(&args)?;
    let service = match answering {
        Answering::Builtin => "tether",
        Answering::Upstream { .. } => "tether-gateway",
    };
    let otel = crate::otel::install(args.otlp_endpoint.as_deref(), service)?;
    let mut config = ServerConfig {
        session_idle_ttl: args.session_idle_ttl,
        sse_retry: args.sse_retry,
        max_sessions: args.max_sessions,
        max_tasks: args.max_tasks,
        max_tasks_per_principal: args.max_tasks_per_principal,
        allowed_origins: args.allowed_origins,
        require_loopback_host: args.listen.ip().is_loopback(),
        idempotency: !args.no_idempotency,
        body_timeout: args.body_timeout,
        request_state_key: args.request_state_key,
        task_ttl: args.task_ttl,
        task_poll_interval: args.task_poll_interval,
        ..ServerConfig::default()
    };
    let room = max_connections_for(raise_descriptor_limit());
    let max_connections = match args.max_connections {
        Some(wanted) if wanted > room => {
            eprintln!(
                "tether serve: --max-connections {wanted} is more than the descriptor limit leaves room for; \
                 beyond {room} connections, new ones wait unaccepted instead of being refused"
            );
            wanted
        }
        Some(wanted) => wanted,
        None => room,
    };
    let limits = ConnectionLimits {
        max_connections,
        header_timeout: args.header_timeout,
        idle_timeout: args.idle_timeout,
        send_timeout: args.send_timeout,
        ..ConnectionLimits::default()
    };
    config.retention.idempotency_ms = u64::try_from(args.idempotency_ttl.as_millis()).unwrap_or(u64::MAX);
    config.retention.ended_stream_ms = u64::try_from(args.retention.as_millis()).unwrap_or(u64::MAX);
    config.retention.max_events_per_stream = args.max_events_per_stream;
    config.retention.tombstone_ms = config.retention.tombstone_ms.max(config.retention.ended_stream_ms);
    config.retention.lease_ms = u64::try_from(args.request_lease.as_millis()).unwrap_or(u64::MAX);
    config.sweep_interval = config.sweep_interval.min(args.request_lease / 4);
    // Read before any store opens: a flag that cannot serve leaves no data directory behind.
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(ServerTls::from_pem_files(cert, key).context("--tls-cert, --tls-key")?),
        _ => None,
    };
    // Unique per process, so a restarted server never inherits its predecessor's lease.
    let started = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let owner = format!("{}-{started}", std::process::id());
    let (store, counters) = match args.store {
        StoreKind::Memory => both(MemoryStore::new(config.retention)),
        StoreKind::Embedded => {
            let store = SqliteStore::open(&args.data_dir, config.retention, &owner)
                .with_context(|| format!("opening the store in {}", args.data_dir.display()))?;
            let (records, claims) = (store.records().await?, store.claims().await?);
            tracing::info!(dir = %args.data_dir.display(), records, claims, "embedded store: idempotency records, keys ever claimed");
            both(store)
        }
        StoreKind::Redis => {
            let durability = match args.redis_durability {
                RedisDurabilityArg::Fsync => RedisDurability::Fsync,
                RedisDurabilityArg::Replicated => RedisDurability::Replicated {
                    replicas: args.redis_replicas,
                    timeout_ms: u64::try_from(args.redis_wait_timeout.as_millis()).unwrap_or(u64::MAX),
                },
                RedisDurabilityArg::None => RedisDurability::Unchecked,
            };
            let owner = tether_store::ReplicaId::parse(&owner).context("this replica's name")?;
            let store = RedisStore::open(&args.redis_url, config.retention, &owner, durability)
                .await
                .with_context(|| format!("opening the redis store at {}", args.redis_url))?;
            match args.redis_durability {
                RedisDurabilityArg::None => tracing::warn!(url = %args.redis_url, "redis store: {}", store.guarantee()),
                _ => tracing::info!(url = %args.redis_url, "redis store: {}", store.guarantee()),
            }
            both(store)
        }
    };
    let path = args.path.clone();
    let leaving = Arc::clone(&store);
    let drain = Drain::new();
    let draining = Arc::clone(&drain);
    // A gateway that waits for its upstream is not ready until it has reached it.
    let started = Arc::new(std::sync::OnceLock::new());
    let mut readiness = Readiness::new(Arc::clone(&drain)).store(Arc::clone(&store));
    if matches!(answering, Answering::Upstream { wait: Some(_), .. }) {
        readiness = readiness.started(Arc::clone(&started));
    }
    let server = move |builder: Builder| {
        let mut builder = builder.config(config).store(store).drain(draining);
        if let Some(authenticator) = authenticator {
            builder = builder.authenticator(authenticator);
        }
        builder.build()
    };
    // Installed before the server is made, which describes its metrics to the recorder.
    let scrape = match args.metrics {
        Some(addr) => Some(serve_metrics(addr, Some(readiness.clone())).await?),
        None => None,
    };
    // Without a wait, the upstream is reached before anything listens, and nothing is waited for.
    type Waiting = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;
    let never = || -> Waiting { Box::pin(std::future::pending()) };
    // The probes answer whatever the MCP endpoint does meanwhile (a gateway still waiting).
    let probes = health_router(readiness);
    let (app, waiting) = match answering {
        Answering::Builtin => {
            (Either::Left(server(Builder::new(BuiltinHandler::new(counters))).endpoint(&path, probes)), never())
        }
        Answering::Upstream { reached, wait: None } => {
            (Either::Left(server(Builder::new(reached.await?)).endpoint(&path, probes)), never())
        }
        Answering::Upstream { reached, wait: Some(wait) } => {
            let became_ready = Arc::clone(&started);
            let waiting = async move {
                let upstream = tokio::time::timeout(wait, reached)
                    .await
                    .map_err(|_| anyhow::anyhow!("the upstream was not reached within --upstream-wait {wait:?}"))??;
                let _ = became_ready.set(server(Builder::new(upstream)).router(&path));
                tracing::info!("the upstream is reached: serving");
                std::future::pending::<anyhow::Result<()>>().await
            };
            let waiting: Waiting = Box::pin(waiting);
            (Either::Right(probes.merge(tether_server::until_ready(started))), waiting)
        }
    };
    let listener = bind(args.listen).with_context(|| format!("binding {}", args.listen))?;
    let local = listener.local_addr()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!("listening on {scheme}://{local}{}", args.path);
    if let Some(scrape) = scrape {
        println!("metrics on http://{scrape}/metrics");
    }
    let mut signals = Signals::new()?;
    let (ended, cut_off) = tokio::select! {
        served = async {
            match tls {
                Some(tls) => tether_server::serve_tls(listener, app, limits, tls).await,
                None => tether_server::serve(listener, app, limits).await,
            }
        } => (served.context("serving"), false),
        gave_up = waiting => (gave_up, false),
        drain = drained(&drain, &mut signals, args.drain_timeout) => (Ok(()), drain == Drained::CutOff),
    };
    // What still runs is handed over as aborted now, rather than once the request lease lapses.
    if cut_off {
        match tokio::time::timeout(LEAVE_TIMEOUT, leaving.leave()).await {
            Ok(Ok(())) => tracing::info!("left the store: what still ran ended aborted"),
            Ok(Err(err)) => {
                tracing::warn!(%err, "could not leave the store: the others learn of it after the request lease")
            }
            Err(_) => tracing::warn!(
                ?LEAVE_TIMEOUT,
                "leaving the store timed out: the others learn of it after the request lease"
            ),
        }
    }
    if let Some(otel) = otel {
        let _ = tokio::task::spawn_blocking(move || otel.shutdown()).await;
    }
    ended
}

/// How long leaving the store may take at exit.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(5);

/// SIGTERM (what Kubernetes, systemd and `docker stop` send) and SIGINT.
struct Signals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            terminate: signal(SignalKind::terminate()).context("listening for SIGTERM")?,
            interrupt: signal(SignalKind::interrupt()).context("listening for SIGINT")?,
        })
    }

    /// The next of either; its name.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.interrupt.recv() => "SIGINT",
        }
    }
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drained {
    /// No request runs.
    Idle,
    /// The drain timed out, or a second signal came, while requests still ran.
    CutOff,
}

/// Resolves once the process may exit: after the first signal, `drain` begins (while the caller
/// goes on serving what runs) and lasts until no request runs, `timeout` passes, or a second
/// signal comes.
async fn drained(drain: &Drain, signals: &mut Signals, timeout: Duration) -> Drained {
    let signal = signals.next().await;
    tracing::info!(signal, running = drain.running(), ?timeout, "draining before exit");
    drain.begin();
    tokio::select! {
        finished = tokio::time::timeout(timeout, drain.idle()) => match finished {
            Ok(()) => {
                tracing::info!("drained: every request finished");
                Drained::Idle
            }
            Err(_) => {
                tracing::warn!(running = drain.running(), "the drain timed out: what still runs is cut off");
                Drained::CutOff
            }
        },
        again = signals.next() => {
            tracing::warn!(signal = again, running = drain.running(), "a second signal: exiting at once");
            Drained::CutOff
        }
    }
}

/// `--listen`: an address, a host name and port (resolved now, an IPv4 address preferred), or a
/// port alone, on the loopback address.
fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    let resolved: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(text)
        .map_err(|err| format!("{text:?} is not IP:PORT, HOST:PORT or a port ({err})"))?
        .collect();
    resolved
        .iter()
        .find(|addr| addr.is_ipv4())
        .or_else(|| resolved.first())
        .copied()
        .ok_or_else(|| format!("{text:?} resolves to no address"))
}

/// A state key from 64 hex digits.
fn parse_state_key(text: &str) -> Result<StateKey, String> {
    let digits = text.as_bytes();
    if digits.len() != 64 {
        return Err("a request state key is 64 hex digits (256 bits)".into());
    }
    let mut key = [0u8; 32];
    for (byte, pair) in key.iter_mut().zip(digits.chunks(2)) {
        let pair = std::str::from_utf8(pair).map_err(|_| "not hex".to_owned())?;
        *byte = u8::from_str_radix(pair, 16).map_err(|_| format!("{pair:?} is not hex"))?;
    }
    Ok(StateKey::new(key))
}

/// One backend as the server's store and as the built-in tools' counters.
fn both<S: Store + CounterStore>(store: S) -> (Arc<dyn Store>, Arc<dyn CounterStore>) {
    let store = Arc::new(store);
    (Arc::clone(&store) as Arc<dyn Store>, store)
}

impl ServeArgs {
    /// How many threads run requests: `--workers`, or one per core of `cores`, less the one the
    /// embedded store's own threads keep busy.
    pub fn workers(&self, cores: usize) -> usize {
        match (self.workers, self.store) {
            (Some(workers), _) => workers.into(),
            (None, StoreKind::Embedded) => cores.saturating_sub(1).max(1),
            (None, StoreKind::Memory | StoreKind::Redis) => cores.max(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches, Parser};

    use super::{ServeArgs, max_connections_for, parse_listen, parse_state_key};

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    /// `Serve` parsed from `flags` alone: `TOKIO_WORKER_THREADS`, if this process has it, is not read.
    fn parse(flags: &[&str]) -> Result<Serve, clap::Error> {
        let command = Serve::command().mut_arg("workers", |arg| arg.env(None));
        let matches = command.try_get_matches_from(std::iter::once("serve").chain(flags.iter().copied()))?;
        Serve::from_arg_matches(&matches)
    }

    fn workers(flags: &[&str], cores: usize) -> usize {
        parse(flags).expect("flags").args.workers(cores)
    }

    #[test]
    fn the_embedded_store_leaves_its_threads_a_core_unless_workers_are_given() {
        assert_eq!(workers(&[], 2), 1);
        assert_eq!(workers(&[], 8), 7);
        assert_eq!(workers(&[], 1), 1, "never zero");
        assert_eq!(workers(&["--store", "memory"], 2), 2);
        assert_eq!(workers(&["--store", "redis"], 8), 8);
        assert_eq!(workers(&["--workers", "3"], 2), 3);
        assert!(parse(&["--workers", "0"]).is_err());
    }

    #[test]
    fn listen_takes_an_address_a_host_and_port_or_a_port() {
        assert_eq!(parse_listen("0.0.0.0:9000").map(|a| a.to_string()).as_deref(), Ok("0.0.0.0:9000"));
        assert_eq!(parse_listen("8834").map(|a| a.to_string()).as_deref(), Ok("127.0.0.1:8834"));
        let local = parse_listen("localhost:8834").expect("localhost resolves");
        assert!(local.ip().is_loopback() && local.port() == 8834, "{local}");
        assert!(parse_listen("127.0.0.1:99999").is_err());
        assert!(parse_listen("no such host.invalid:1").is_err());
    }

    #[test]
    fn a_state_key_is_64_hex_digits() {
        assert!(parse_state_key(&"0f".repeat(32)).is_ok());
        assert!(parse_state_key(&"0f".repeat(31)).is_err());
        assert!(parse_state_key(&"zz".repeat(32)).is_err());
        assert!(parse_state_key(&"é".repeat(32)).is_err());
    }

    #[test]
    fn connections_leave_room_for_the_store_and_refusals() {
        assert_eq!(max_connections_for(1_024), 896);
        assert_eq!(max_connections_for(256), 192);
        assert_eq!(max_connections_for(65_536), 57_344);
        assert_eq!(max_connections_for(10), 1, "never zero");
    }
}
