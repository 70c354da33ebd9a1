//! Serves an upstream MCP server behind tether's transport: any peer that exchanges JSON-RPC
//! messages (a child process on stdio, an rmcp service in this process, a server reached over
//! HTTP) becomes a tether server, with exact resumption, 404s that say why, durable stores and
//! idempotency keys, whatever the upstream itself does.
//!
//! Each session gets an upstream instance of its own ([`Connect::connect`]), started when the
//! session is initialized and initialized with the client's own `initialize` params; it is
//! stopped when the process stops serving the session. On a store shared by replicas (Redis), a
//! request that reaches a replica other than the one holding its session's instance is relayed
//! to that one and runs there ([`tether_server::relay`]). A session whose instance is out of
//! reach (begun before a restart, or at a replica that is gone) ends as `upstream_lost`
//! ([`Handler::adopts`]) rather than being served from reset state. If the upstream stops
//! first, its running requests end with a `request_aborted` error and the session ends as
//! [`SessionEnd::UpstreamLost`]: later requests naming it get 404 `upstream_lost`, so the client
//! starts a new session instead of talking to nothing. A 2026-07-28 request, which has no
//! session, is served by an instance initialized as the client the request declares (its info
//! and capabilities), one request at a time: an idle one kept from an earlier request of the
//! same client, else a new one, at most [`UpstreamHandler::stateless_instances`] alive at once
//! (`pool`).
//!
//! Requests go to the upstream under ids of tether's own; its answers, progress (routed by
//! token), notifications and requests to the client (sampling, elicitation, roots) come back to
//! the request they belong to. A notification that belongs to no request goes to the session's
//! standalone stream (dropped if the client opened none). A request to the client goes out on
//! the stream of the request it originates from when the upstream says which (rmcp does), else
//! of the latest running one; with none running it is refused. The upstream's `ping` is
//! answered here.

mod peer;
mod pool;

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use tether_core::jsonrpc::{ErrorObject, Message, Notification, RequestId};
use tether_core::translate;
use tether_store::SessionEnd;
use tokio::sync::{mpsc, watch};

use peer::Peer;
use pool::{Declared, Lease, Place, Pool};
use tether_core::lineage::{Epoch, SessionId};
use tether_server::relay::{self, ABORT_GRACE, Held, Holder, Relay, lost, unavailable};
use tether_server::{AdoptFuture, Context, Handler, HandlerFuture, ServerInfo, SessionHandle};

/// How many instances serve 2026-07-28 requests at most, unless
/// [`UpstreamHandler::stateless_instances`] says otherwise.
pub const STATELESS_INSTANCES: NonZeroUsize = NonZeroUsize::new(4).expect("4 is not 0");

/// How long an upstream may take to answer `initialize`.
const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(30);

/// A message from the upstream.
#[derive(Debug)]
pub struct FromUpstream {
    /// The message.
    pub message: Message,
    /// The request (by the id the upstream received it under) that this message belongs to,
    /// when the upstream says: a request to the client, or a notification.
    pub origin: Option<RequestId>,
}

impl From<Message> for FromUpstream {
    fn from(message: Message) -> FromUpstream {
        FromUpstream { message, origin: None }
    }
}

/// How many messages may wait in a [`Link`] each way: an upstream that stops reading, or a
/// client that floods notifications, holds at most this many, and what comes past it waits
/// (requests, what the upstream sends) or is dropped and counted (client notifications).
pub const LINK_QUEUE: usize = 1_024;

/// One connected upstream instance: messages both ways, in order, at most [`LINK_QUEUE`] waiting
/// each way.
pub struct Link {
    /// What tether sends: requests, notifications and answers to the upstream's requests.
    pub to_upstream: mpsc::Sender<Message>,
    /// What the upstream sends; closed when it stops.
    pub from_upstream: mpsc::Receiver<FromUpstream>,
    /// Held as long as the instance is used; dropping it stops the instance (a child process is
    /// killed, an in-process service dropped).
    pub keep: Box<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").finish_non_exhaustive()
    }
}

/// Starts upstream instances.
pub trait Connect: Send + Sync + 'static {
    /// Starts (or reaches) one instance, not yet initialized, to serve `principal` (who the
    /// downstream client authenticated as, if the gateway authenticates): an upstream may be
    /// told who it is, never given the client's credentials. The error says why not.
    fn connect(&self, principal: Option<&str>) -> BoxFuture<'static, Result<Link, String>>;

    /// Names the upstream in errors and logs (a command line, a URL).
    fn describe(&self) -> String;
}

/// A tether [`Handler`] that hands every request to an upstream server. On a store shared by
/// replicas, what the other replicas send this process (the store's owner name) is taken to be
/// this handler's: give each one a store of its own.
pub struct UpstreamHandler {
    info: ServerInfo,
    upstream: Arc<Upstream>,
}

/// A session's instance: none while it starts, then started or why not.
type Starting = watch::Receiver<Option<Result<Arc<Peer>, ErrorObject>>>;

/// The upstream as this process reaches it: how to start instances, and the running ones.
struct Upstream {
    connect: Box<dyn Connect>,
    /// The instances of the sessions this process serves, each started once, with the session
    /// (incarnation) it serves.
    sessions: Mutex<HashMap<String, (SessionHandle, Starting)>>,
    /// Requests to and from the other replicas, from the first that needed it; `None` if the
    /// store serves a single process.
    relay: OnceLock<Option<Relay>>,
    /// The instances that serve 2026-07-28 requests.
    pool: Arc<Pool>,
}

impl std::fmt::Debug for UpstreamHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamHandler").field("upstream", &self.upstream.connect.describe()).finish_non_exhaustive()
    }
}

impl UpstreamHandler {
    /// Serves the upstream `connect` reaches, presenting it as `info` says.
    pub fn new(connect: impl Connect, info: ServerInfo) -> UpstreamHandler {
        let upstream = Upstream {
            connect: Box::new(connect),
            sessions: Mutex::default(),
            relay: OnceLock::new(),
            pool: Pool::new(STATELESS_INSTANCES),
        };
        UpstreamHandler { info, upstream: Arc::new(upstream) }
    }

    /// Serves 2026-07-28 requests with at most `limit` instances alive at once
    /// ([`STATELESS_INSTANCES`] by default): a request past it waits for an instance to be
    /// returned, or takes the place of an idle one initialized as another client.
    pub fn stateless_instances(self, limit: NonZeroUsize) -> UpstreamHandler {
        self.upstream.pool.set_limit(limit);
        self
    }

    /// Serves the upstream `connect` reaches, presenting it as it presents itself: one instance
    /// is started and initialized to learn its `serverInfo`, capabilities and instructions, then
    /// stopped.
    pub async fn discover(connect: impl Connect) -> Result<UpstreamHandler, ErrorObject> {
        let info = UpstreamHandler::info_of(&connect).await?;
        Ok(UpstreamHandler::new(connect, info))
    }

    /// How the upstream `connect` reaches presents itself (its `serverInfo`, capabilities and
    /// instructions): one instance is started and initialized to learn it, then stopped.
    pub async fn info_of(connect: &impl Connect) -> Result<ServerInfo, ErrorObject> {
        let describe = described(connect);
        let link = connect.connect(None).await.map_err(|err| unavailable(&describe, err))?;
        let client = translate::initialize_params(&json!({}), &tether_client());
        let (_peer, initialized) = Peer::start(link, client, None, describe).await?;
        let text = |pointer: &str| initialized.pointer(pointer).and_then(Value::as_str).map(str::to_owned);
        let info = ServerInfo {
            name: text("/serverInfo/name").unwrap_or_else(|| connect.describe()),
            version: text("/serverInfo/version").unwrap_or_default(),
            instructions: text("/instructions"),
            capabilities: initialized.get("capabilities").cloned().unwrap_or_else(|| json!({})),
        };
        Ok(info)
    }
}

impl Upstream {
    /// Starts and initializes one instance.
    async fn start(
        &self,
        client: Value,
        principal: Option<&str>,
        session: Option<SessionHandle>,
    ) -> Result<Peer, ErrorObject> {
        let describe = self.describe();
        let link = self.connect.connect(principal).await.map_err(|err| unavailable(&describe, err))?;
        Ok(Peer::start(link, client, session, describe).await?.0)
    }

    /// An instance initialized with `client` (a 2026-07-28 request's declared client) to serve
    /// one request: an idle one of the same client, else a new one once the pool has a place.
    async fn lease(&self, client: Value, ctx: &Context) -> Result<Lease, ErrorObject> {
        let declared = Declared { params: client, principal: ctx.principal().map(str::to_owned) };
        match self.pool.place(declared, ctx.cancelled()).await? {
            Place::Reused(lease) => Ok(lease),
            Place::Start(reserved) => {
                let Declared { params, principal } = reserved.client();
                let peer = self.start(params.clone(), principal.as_deref(), None).await?;
                Ok(reserved.started(peer))
            }
        }
    }

    /// Starts the instance of a session this process just initialized; if it cannot start, the
    /// session ends as `upstream_lost`.
    fn start_session(self: &Arc<Self>, session: SessionHandle) {
        // Other replicas may relay the session's requests here from now on.
        self.relay(&session);
        let (started, starting) = watch::channel(None);
        lock(&self.sessions).insert(session.id().to_owned(), (session.clone(), starting));
        self.forget_when_ended(&session);
        let upstream = Arc::clone(self);
        tokio::spawn(async move {
            let peer = async {
                let describe = upstream.describe();
                let client = session.client().await.map_err(|err| unavailable(&describe, err))?;
                let peer =
                    Arc::new(upstream.start(client.params, client.principal.as_deref(), Some(session.clone())).await?);
                end_session_when_stopped(&peer, session.clone());
                Ok::<_, ErrorObject>(peer)
            }
            .await;
            let failed = peer.as_ref().err().map(|error| error.message.clone());
            started.send_replace(Some(peer));
            if let Some(error) = failed {
                tracing::warn!(session = session.id(), %error, "the session's upstream did not start");
                session.end(SessionEnd::UpstreamLost, ABORT_GRACE).await;
            }
        });
    }

    /// Requests to and from the other replicas sharing the store `session`'s server uses;
    /// `None` if it serves a single process.
    fn relay(self: &Arc<Self>, session: &SessionHandle) -> Option<&Relay> {
        self.relay
            .get_or_init(|| {
                let holder: Arc<dyn Holder> = Arc::clone(self) as Arc<dyn Holder>;
                Relay::start(Arc::downgrade(&holder), session)
            })
            .as_ref()
    }

    /// How `session`'s instance is started here, if this process started it.
    fn starting(&self, session: &SessionHandle) -> Option<Starting> {
        lock(&self.sessions).get(session.id()).filter(|(serving, _)| serving.same(session)).map(|(_, s)| s.clone())
    }

    /// The instance of `session` if it is up here now.
    fn started_peer(&self, session: &SessionHandle) -> Option<Arc<Peer>> {
        self.starting(session)?.borrow().as_ref().and_then(|started| started.as_ref().ok().cloned())
    }

    /// Forgets the session's instance once the process stops serving the session (unless
    /// another incarnation's has replaced it), which stops the instance once no request of it
    /// runs.
    fn forget_when_ended(self: &Arc<Self>, session: &SessionHandle) {
        let (upstream, session) = (Arc::downgrade(self), session.clone());
        tokio::spawn(async move {
            session.ended().await;
            let Some(upstream) = upstream.upgrade() else { return };
            let mut sessions = lock(&upstream.sessions);
            if sessions.get(session.id()).is_some_and(|(serving, _)| serving.same(&session)) {
                sessions.remove(session.id());
            }
        });
    }
}

/// Ends `session` as `upstream_lost` once its instance stops on its own.
fn end_session_when_stopped(peer: &Peer, session: SessionHandle) {
    let gone = peer.gone.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = gone.cancelled() => {
                tracing::warn!(session = session.id(), "the upstream stopped: the session ends");
                session.end(SessionEnd::UpstreamLost, ABORT_GRACE).await;
            }
            // Stopped by tether (the session ended first): nothing to report.
            () = session.ended() => {}
        }
    });
}

/// How tether names itself to an instance it starts for no client: to learn who the upstream
/// is, or for a 2026-07-28 request that names no client.
fn tether_client() -> Value {
    json!({"name": "tether", "version": env!("CARGO_PKG_VERSION")})
}

/// A 2026-07-28 request as an instance of a sessionful revision takes it: the `initialize`
/// params its envelope declares (the client's info and capabilities), and its params without
/// that envelope, which such servers refuse.
fn to_sessionful(mut params: Value) -> (Value, Value) {
    let initialize = translate::initialize_params(&params, &tether_client());
    translate::strip_envelope(&mut params);
    (initialize, params)
}

impl Handler for UpstreamHandler {
    fn info(&self) -> ServerInfo {
        self.info.clone()
    }

    fn call(&self, ctx: Context, method: String, params: Value) -> HandlerFuture {
        let upstream = Arc::clone(&self.upstream);
        Box::pin(async move {
            let Some(session) = ctx.session() else {
                // 2026-07-28: the request is the whole exchange, on an instance of the pool.
                let (initialize, params) = to_sessionful(params);
                let lease = upstream.lease(initialize, &ctx).await?;
                let outcome = lease.peer().call(ctx.clone(), method, params).await;
                lease.finish(!ctx.is_cancelled());
                return outcome;
            };
            match upstream.starting(&session) {
                Some(starting) => session_peer(starting, &upstream.describe()).await?.call(ctx, method, params).await,
                // Begun at another replica, which holds its instance.
                None => match upstream.relay(&session) {
                    Some(relay) => relay.call(ctx, &session, method, params).await,
                    None => Err(lost(&upstream.describe())),
                },
            }
        })
    }

    fn session_started(&self, session: SessionHandle) {
        self.upstream.start_session(session);
    }

    /// An instance's state lives in the process that started it: a session begun elsewhere is
    /// served only while that replica is alive to relay its requests to.
    fn adopts(&self, session: &SessionHandle) -> AdoptFuture {
        Box::pin(relay::holder_alive(session.clone()))
    }

    fn notified(&self, session: SessionHandle, method: &str, params: Value) {
        let params = (!params.is_null()).then_some(params);
        let notification = Notification { method: method.to_owned(), params };
        if self.upstream.starting(&session).is_none() {
            if let Some(relay) = self.upstream.relay(&session) {
                relay.notify(&session, notification);
            }
            return;
        }
        // A session whose instance has not started yet has nothing to tell: the instance starts
        // from the client's state as it then is.
        if let Some(peer) = self.upstream.started_peer(&session) {
            peer.notify(notification);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Maps of handles only: still consistent after a panic elsewhere.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The instance `starting` starts, once started.
async fn session_peer(mut starting: Starting, describe: &str) -> Result<Arc<Peer>, ErrorObject> {
    let gone = || lost(describe);
    // Started at `initialize`: wait for it to be up (or to have failed).
    let started = starting.wait_for(Option::is_some).await.map_err(|_| gone())?;
    started.clone().unwrap_or_else(|| Err(gone()))
}

/// How errors and logs name the upstream `connect` reaches.
fn described(connect: &dyn Connect) -> String {
    format!("the upstream server ({})", connect.describe())
}

impl Holder for Upstream {
    fn describe(&self) -> String {
        described(self.connect.as_ref())
    }

    fn holding(&self, id: &SessionId, epoch: &Epoch) -> Option<SessionHandle> {
        lock(&self.sessions).get(id.as_str()).filter(|(serving, _)| serving.epoch() == epoch).map(|(s, _)| s.clone())
    }

    fn run(
        &self,
        session: SessionHandle,
        ctx: Context,
        method: String,
        params: Value,
    ) -> BoxFuture<'static, (Result<Value, ErrorObject>, Held)> {
        let starting = self.starting(&session);
        let describe = self.describe();
        Box::pin(async move {
            // A session this process did not start has no instance here.
            let peer = match starting {
                Some(starting) => session_peer(starting, &describe).await,
                None => Err(lost(&describe)),
            };
            match peer {
                Ok(peer) => {
                    let outcome = peer.call(ctx, method, params).await;
                    (outcome, if peer.gone.is_cancelled() { Held::Gone } else { Held::Kept })
                }
                Err(error) => (Err(error), Held::Gone),
            }
        })
    }

    fn notify(&self, session: SessionHandle, notification: Notification) {
        if let Some(peer) = self.started_peer(&session) {
            peer.notify(notification);
        }
    }
}
