//! A server's shared state, how it is assembled, and the tasks that keep it while it serves:
//! the sweep (renewals, expiry, retention) and the delivery of answers relayed by other replicas.

use std::sync::{Arc, Once, Weak};
use std::time::Duration;

use tether_core::input_required::StateKey;
use tether_store::{MemoryStore, Store};

use crate::drain::Drain;
use crate::http::endpoint::Endpoint;
use crate::session::Sessions;
use crate::{Authenticator, Handler, ServerConfig, http, ids, now_ms, telemetry};

/// State shared by every request of one server.
pub(crate) struct ServerState {
    pub config: ServerConfig,
    pub handler: Arc<dyn Handler>,
    pub store: Arc<dyn Store>,
    pub sessions: Sessions,
    pub auth: Option<Arc<dyn Authenticator>>,
    /// Distinguishes this process's server-to-client request ids from other replicas'.
    pub process_token: String,
    /// Seals 2026-07-28 request states; `None` only if none was configured and the OS random
    /// source failed (then no handler can ask for input with a state).
    pub state_key: Option<StateKey>,
    /// The tasks this process runs.
    pub task_runners: crate::tasks::Runners,
    /// The open `subscriptions/listen` streams of 2026-07-28 clients.
    pub listeners: crate::listen::Listeners,
    /// Whether the server drains, and the requests it runs.
    pub drain: Arc<Drain>,
    /// Who the server is, as `serverInfo` and 2026-07-28 results' `_meta` name it: the
    /// handler's name and version when the server was built.
    pub server_info: serde_json::Value,
}

/// Assembles a server from a handler, a store and a config.
pub struct Builder {
    handler: Arc<dyn Handler>,
    store: Option<Arc<dyn Store>>,
    config: ServerConfig,
    auth: Option<Arc<dyn Authenticator>>,
    drain: Option<Arc<Drain>>,
}

impl Builder {
    /// A server for `handler` with the default config and an in-memory store.
    pub fn new(handler: impl Handler) -> Builder {
        Builder { handler: Arc::new(handler), store: None, config: ServerConfig::default(), auth: None, drain: None }
    }

    /// Drains when `drain` begins: whoever stops the server holds it too (a server built
    /// without one gets its own, [`Server::drain`]).
    pub fn drain(mut self, drain: Arc<Drain>) -> Builder {
        self.drain = Some(drain);
        self
    }

    /// Uses `store` for sessions, events and request records.
    pub fn store(mut self, store: Arc<dyn Store>) -> Builder {
        self.store = Some(store);
        self
    }

    /// Uses `config`.
    pub fn config(mut self, config: ServerConfig) -> Builder {
        self.config = config;
        self
    }

    /// Requires every request to authenticate; a session belongs to the principal that created it.
    pub fn authenticator(mut self, auth: impl Authenticator) -> Builder {
        self.auth = Some(Arc::new(auth));
        self
    }

    /// The server.
    pub fn build(self) -> Server {
        let store = self.store.unwrap_or_else(|| Arc::new(MemoryStore::new(self.config.retention)));
        // Uniqueness across replicas only needs to be probable; a time-based fallback is enough
        // if the OS random source fails at start-up.
        let process_token = ids::token().unwrap_or_else(|_| format!("p{}", now_ms()));
        let state_key = self.config.request_state_key.clone().or_else(|| ids::state_key().ok());
        let info = self.handler.info();
        let shared = ServerState {
            server_info: serde_json::json!({"name": info.name, "version": info.version}),
            state_key,
            config: self.config,
            handler: self.handler,
            store,
            sessions: Sessions::default(),
            auth: self.auth,
            process_token,
            task_runners: crate::tasks::Runners::default(),
            listeners: crate::listen::Listeners::default(),
            drain: self.drain.unwrap_or_default(),
        };
        Server { shared: Arc::new(shared), background: Once::new() }
    }
}

/// A built server: mount its router anywhere.
pub struct Server {
    shared: Arc<ServerState>,
    /// The background tasks start with the first router, once however many are made.
    background: Once,
}

impl Server {
    /// How the server drains: begin it to stop taking new work, and wait for what runs.
    pub fn drain(&self) -> Arc<Drain> {
        Arc::clone(&self.shared.drain)
    }

    /// An axum router serving the MCP endpoint at `path`, a tower service to mount in an axum or
    /// hyper application. The first call (of this or [`Server::endpoint`]) also starts the
    /// background sweep that expires idle sessions and drops old history (and, on a store
    /// shared by replicas, the delivery of what other replicas relay: answers, announcements,
    /// task changes); they stop once every router and
    /// the server are dropped.
    pub fn router(&self, path: &str) -> axum::Router {
        self.start_background();
        http::router(path, Arc::clone(&self.shared))
    }

    /// The MCP endpoint at `path` on its own, with `rest` answering every other path (it must
    /// not route the authorization metadata's path, which the endpoint adds). For
    /// [`serve`](crate::serve): a request for the endpoint skips the router's matching. Starts
    /// the background work as [`Server::router`] does.
    pub fn endpoint(&self, path: &str, rest: axum::Router) -> Endpoint {
        self.start_background();
        Endpoint::new(path, Arc::clone(&self.shared), http::metadata(&self.shared).merge(rest))
    }

    /// Starts, once, the sweep of idle sessions and old history, and the delivery of what
    /// other replicas relay.
    fn start_background(&self) {
        self.background.call_once(|| {
            telemetry::describe();
            tokio::spawn(sweep(Arc::downgrade(&self.shared)));
            let shared = || Arc::downgrade(&self.shared);
            if let Some(answers) = self.shared.store.relayed_answers() {
                tokio::spawn(deliver(shared(), answers, relayed_answer));
            }
            if let Some(announcements) = self.shared.store.announcements() {
                tokio::spawn(deliver(shared(), announcements, relayed_announcement));
            }
            if let Some(changes) = self.shared.store.task_changes() {
                tokio::spawn(deliver(shared(), changes, relayed_task_change));
            }
        });
    }
}

/// A router for a server whose handler is not ready yet (a gateway still reaching its
/// upstream): every request is answered 503 `not_ready` with `Retry-After`, until `ready` holds
/// the server's own router, which serves everything from then on.
pub fn until_ready(ready: Arc<std::sync::OnceLock<axum::Router>>) -> axum::Router {
    use axum::response::IntoResponse as _;
    use tower::ServiceExt as _;
    let serve = tower::service_fn(move |request: axum::extract::Request| {
        let ready = Arc::clone(&ready);
        async move {
            match ready.get() {
                Some(router) => router.clone().oneshot(request).await,
                None => Ok(crate::Refusal::NotReady
                    .with("the server is starting and cannot answer yet; try again shortly")
                    .with_header(::http::header::RETRY_AFTER, ::http::HeaderValue::from_static("1"))
                    .into_response()),
            }
        }
    });
    axum::Router::new().fallback_service(serve)
}

/// Hands what the store relays from other replicas to `handle` until the server or the relay is
/// gone; `None` when some were dropped because this process fell behind.
async fn deliver<T: Clone>(
    shared: Weak<ServerState>,
    mut relayed: tokio::sync::broadcast::Receiver<T>,
    handle: fn(&ServerState, Option<T>),
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let item = match relayed.recv().await {
            Ok(item) => Some(item),
            Err(RecvError::Lagged(_)) => None,
            Err(RecvError::Closed) => return,
        };
        let Some(shared) = shared.upgrade() else { return };
        handle(&shared, item);
    }
}

/// A client's answer another replica received, for this process's waiting handler.
fn relayed_answer(shared: &ServerState, answer: Option<tether_store::RelayedAnswer>) {
    let Some(answer) = answer else {
        tracing::warn!("relayed answers were dropped");
        return;
    };
    let Some(runtime) = shared.sessions.get(&answer.session) else { return };
    if let Ok(tether_core::jsonrpc::Message::Response(response)) = tether_core::jsonrpc::parse_message(&answer.response)
    {
        // Another replica's handler, or nobody's: either way not ours to report.
        let _ = runtime.answer_client_request(&answer.request_id, response.outcome);
    }
}

/// What another replica announced, for this process's `subscriptions/listen` streams (its
/// sessions' standalone streams got it from the announcing replica).
fn relayed_announcement(shared: &ServerState, announcement: Option<bytes::Bytes>) {
    let Some(announcement) = announcement else {
        tracing::warn!("announcements from other replicas were dropped");
        return;
    };
    if let Ok(tether_core::jsonrpc::Message::Notification(notification)) =
        tether_core::jsonrpc::parse_message(&announcement)
    {
        shared.listeners.announce(&notification.method, notification.params.unwrap_or_default());
    }
}

/// A task another replica changed: what waits on it here looks again (on a gap, everything
/// waiting on a task does; the polls would find it too, later).
fn relayed_task_change(shared: &ServerState, id: Option<tether_core::tasks::TaskId>) {
    match id {
        Some(id) => shared.task_runners.changed(&id),
        None => shared.task_runners.changed_all(),
    }
}

/// Keeps active sessions alive, expires idle ones and applies retention, until the server is gone.
async fn sweep(shared: Weak<ServerState>) {
    let interval = match shared.upgrade() {
        Some(shared) => shared.config.sweep_interval.max(Duration::from_millis(10)),
        None => return,
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(shared) = shared.upgrade() else { return };
        let now = now_ms();
        crate::session::service::sweep(&shared, now).await;
        if let Ok(Some(bytes)) = shared.store.retained_bytes().await {
            telemetry::bytes_retained(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handler that serves nothing: the test is about the server's own tasks.
    struct Nothing;

    impl Handler for Nothing {
        fn info(&self) -> crate::ServerInfo {
            crate::ServerInfo {
                name: "nothing".into(),
                version: "0".into(),
                instructions: None,
                capabilities: serde_json::json!({}),
            }
        }

        fn call(&self, _ctx: crate::Context, method: String, _params: serde_json::Value) -> crate::HandlerFuture {
            Box::pin(std::future::ready(Err(tether_core::jsonrpc::ErrorObject {
                code: tether_core::jsonrpc::code::METHOD_NOT_FOUND,
                message: method,
                data: None,
            })))
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_background_tasks_start_once_however_many_routers_are_made() {
        let server = Builder::new(Nothing).build();
        let metrics = tokio::runtime::Handle::current().metrics();
        let before = metrics.num_alive_tasks();
        let _first = server.router("/mcp");
        let _second = server.router("/other");
        // The memory store relays nothing: the sweep is the only background task.
        assert_eq!(metrics.num_alive_tasks() - before, 1);
    }
}
