//! Requests between replicas sharing a store (Redis), for a handler whose state of a session
//! lives only in the process that began the session (a [`Holder`]: a gateway's upstream
//! instance). A request naming the session that reaches another replica is sent to that one
//! ([`Relay::call`]), which runs it on the state it holds ([`Holder::run`]) with a context
//! writing to the request's stream in the store. So whatever the state sends while the request
//! runs (progress, notifications, requests to the client) reaches the client through the replica
//! it reads from, as any output does; the client's answers reach it as answers are relayed
//! between replicas anyway; the outcome comes back here, and this replica answers the request.
//!
//! The store delivers messages between replicas at most once, so a replica waiting on an
//! outcome probes for it: a call the holder does not know (lost on the way, or finished and its
//! outcome lost) ends as `request_aborted`. A holder whose heartbeat lapsed is gone, with what
//! it held: its calls end as `request_aborted` and its session as `upstream_lost`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use serde_json::Value;
use tether_core::jsonrpc::{ErrorObject, Notification};
use tether_core::lineage::{Epoch, SessionId, StreamName, StreamState};
use tether_store::{ReplicaId, ReplicaMessage, RequestKey, SessionEnd, Store};
use tokio::sync::{broadcast, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::refusal::Refusal;
use crate::request::context::{Context, SessionHandle};

/// How long a session's running requests get to record their outcome once what held its state
/// is gone.
pub const ABORT_GRACE: Duration = Duration::from_secs(2);

/// State of sessions that lives only in the process that began them, reached from the other
/// replicas sharing the store through a [`Relay`].
pub trait Holder: Send + Sync + 'static {
    /// Names what is held, in errors and logs (`the upstream server (…)`).
    fn describe(&self) -> String;

    /// The session this process holds state of, if it is session `id` in incarnation `epoch`.
    fn holding(&self, id: &SessionId, epoch: &Epoch) -> Option<SessionHandle>;

    /// Runs a call another replica relayed on the state of `session`, its output going to
    /// `ctx`: the outcome, and what is left of the state.
    fn run(
        &self,
        session: SessionHandle,
        ctx: Context,
        method: String,
        params: Value,
    ) -> BoxFuture<'static, (Result<Value, ErrorObject>, Held)>;

    /// A notification of `session`'s client that another replica received.
    fn notify(&self, session: SessionHandle, notification: Notification);
}

/// What is left of a session's state after a relayed call ran on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// It is still held: the session goes on.
    Kept,
    /// It is gone: the session ends, once the replica answering the call has recorded the
    /// call's outcome.
    Gone,
}

/// The state could not be started or reached.
pub fn unavailable(describe: &str, detail: impl std::fmt::Display) -> ErrorObject {
    Refusal::UpstreamUnavailable.error(format!("{describe} is unavailable: {detail}"))
}

/// The state stopped while the request ran: whether it took effect there is unknown.
pub fn aborted(describe: &str) -> ErrorObject {
    Refusal::RequestAborted.error(format!("{describe} stopped before answering"))
}

/// The request was cancelled by its client.
pub fn cancelled() -> ErrorObject {
    Refusal::RequestCancelled.error("the request was cancelled")
}

/// The state had stopped before the request could be sent: it did not run.
pub fn lost(describe: &str) -> ErrorObject {
    Refusal::SessionInvalid(tether_core::lineage::InvalidReason::UpstreamLost)
        .error(format!("{describe} had stopped: the request was not sent; start a new session"))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Maps of handles only: still consistent after a panic elsewhere.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How often a replica waiting on a relayed call asks whether it still runs, and checks that
/// the replica running it is alive.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// What replicas tell each other about relayed calls, as JSON.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Envelope {
    /// Run a request on the session's instance, writing its output to `stream`.
    Call {
        /// The call, numbered by the sender.
        call: u64,
        session: SessionId,
        epoch: Epoch,
        stream: StreamName,
        method: String,
        params: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        progress_token: Option<Value>,
    },
    /// The client cancelled the call.
    Cancel { call: u64 },
    /// Whether the call still runs: answered (with `request_aborted`) only if it does not.
    Probe { call: u64 },
    /// The call's outcome.
    Done {
        call: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<Value>,
    },
    /// A notification from the session's client, for its instance.
    Notify {
        session: SessionId,
        epoch: Epoch,
        method: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        params: Option<Value>,
    },
}

impl Envelope {
    fn done(call: u64, outcome: Result<Value, ErrorObject>) -> Envelope {
        match outcome {
            Ok(result) => Envelope::Done { call, result: Some(result), error: None },
            Err(error) => Envelope::Done { call, result: None, error: Some(error.to_value()) },
        }
    }
}

/// Outcomes this process waits for, by call number.
type Waiting = Mutex<HashMap<u64, oneshot::Sender<Result<Value, ErrorObject>>>>;

/// Forgets a call's place in [`Waiting`] however the wait ends.
struct Forget<'a>(&'a Waiting, u64);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(self.0).remove(&self.1);
    }
}

/// This process's side of the relay of one [`Holder`]: the calls it sent and waits on, and
/// those it runs for other replicas. What other replicas send this process (the store's owner
/// name) is taken to be this relay's: one relay per store.
pub struct Relay(Arc<Shared>);

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay").finish_non_exhaustive()
    }
}

struct Shared {
    holder: Weak<dyn Holder>,
    store: Arc<dyn Store>,
    waiting: Waiting,
    next_call: AtomicU64,
    /// Calls run here for other replicas, by sender and number, with what cancels them.
    serving: Mutex<HashMap<(ReplicaId, u64), CancellationToken>>,
    _listening: DropGuard,
}

impl Relay {
    /// Starts the relay of `holder` on the store `session`'s server uses, listening to what
    /// other replicas send, if the store is shared by replicas (`None` otherwise).
    pub fn start(holder: Weak<dyn Holder>, session: &SessionHandle) -> Option<Relay> {
        let store = &session.server().store;
        let messages = store.replica_messages()?;
        let stop = CancellationToken::new();
        let shared = Arc::new(Shared {
            holder,
            store: Arc::clone(store),
            waiting: Mutex::default(),
            next_call: AtomicU64::new(1),
            serving: Mutex::default(),
            _listening: stop.clone().drop_guard(),
        });
        tokio::spawn(listen(Arc::downgrade(&shared), messages, stop));
        Some(Relay(shared))
    }

    /// Runs a request of `session`, whose state another replica holds, there.
    pub async fn call(
        &self,
        ctx: Context,
        session: &SessionHandle,
        method: String,
        mut params: Value,
    ) -> Result<Value, ErrorObject> {
        // The replica holding the state runs it as a child of this request's trace context.
        if let Some(trace) = ctx.trace_context() {
            trace.inject(&mut params);
        }
        self.0.call(ctx, session, method, params).await
    }

    /// Relays a notification of `session`'s client to the replica holding its state.
    pub fn notify(&self, session: &SessionHandle, notification: Notification) {
        self.0.notify(session, notification);
    }
}

impl Shared {
    fn describe(&self) -> String {
        self.holder.upgrade().map_or_else(|| "the session's state".to_owned(), |holder| holder.describe())
    }

    async fn call(
        &self,
        ctx: Context,
        session: &SessionHandle,
        method: String,
        params: Value,
    ) -> Result<Value, ErrorObject> {
        let describe = &self.describe();
        let holder = match self.store.session_replica(&session.runtime().id).await {
            Ok(Some(holder)) => holder,
            Ok(None) => return Err(lost(describe)),
            Err(err) => return Err(unavailable(describe, err)),
        };
        let stream = ctx.stream().cloned().ok_or_else(|| lost(describe))?;
        let call = self.next_call.fetch_add(1, Ordering::Relaxed);
        let (done, outcome) = oneshot::channel();
        lock(&self.waiting).insert(call, done);
        let _forget = Forget(&self.waiting, call);
        // What the holder writes to the stream reaches the client only if the response is one.
        ctx.stream_response();
        let runtime = session.runtime();
        let request = Envelope::Call {
            call,
            session: runtime.id.clone(),
            epoch: runtime.epoch.clone(),
            stream,
            method,
            params,
            progress_token: ctx.progress_token().cloned(),
        };
        self.await_call(&ctx, session, (&holder, call), &request, outcome, describe).await
    }

    /// Sends `request` (call number `call`) to `holder` and waits for its outcome, probing.
    async fn await_call(
        &self,
        ctx: &Context,
        session: &SessionHandle,
        (holder, call): (&ReplicaId, u64),
        request: &Envelope,
        mut outcome: oneshot::Receiver<Result<Value, ErrorObject>>,
        describe: &str,
    ) -> Result<Value, ErrorObject> {
        match self.send(holder, request).await {
            Ok(true) => {}
            // Not received, so not run.
            Ok(false) if self.alive(holder).await => {
                return Err(unavailable(
                    describe,
                    "the replica holding the session's state did not receive the request",
                ));
            }
            Ok(false) => {
                end_session(session.clone(), holder);
                return Err(lost(describe));
            }
            Err(err) => return Err(unavailable(describe, err)),
        }
        let mut probe = tokio::time::interval_at(tokio::time::Instant::now() + PROBE_INTERVAL, PROBE_INTERVAL);
        loop {
            tokio::select! {
                outcome = &mut outcome => return outcome.unwrap_or_else(|_| Err(aborted(describe))),
                () = ctx.cancelled() => {
                    if let Err(err) = self.send(holder, &Envelope::Cancel { call }).await {
                        tracing::debug!(%err, "could not relay a cancellation");
                    }
                    return Err(cancelled());
                }
                _ = probe.tick() => {
                    if !self.alive(holder).await {
                        end_session(session.clone(), holder);
                        return Err(aborted(describe));
                    }
                    if let Err(err) = self.send(holder, &Envelope::Probe { call }).await {
                        tracing::debug!(%err, "could not probe a relayed call");
                    }
                }
            }
        }
    }

    fn notify(&self, session: &SessionHandle, notification: Notification) {
        let runtime = session.runtime();
        let (id, epoch) = (runtime.id.clone(), runtime.epoch.clone());
        let Notification { method, params } = notification;
        let store = Arc::clone(&self.store);
        tokio::spawn(async move {
            let Ok(Some(holder)) = store.session_replica(&id).await else { return };
            let notify = Envelope::Notify { session: id, epoch, method, params };
            if let Err(err) = send(store.as_ref(), &holder, &notify).await {
                tracing::debug!(%err, "could not relay a notification");
            }
        });
    }

    async fn send(&self, to: &ReplicaId, envelope: &Envelope) -> Result<bool, tether_store::StoreError> {
        send(self.store.as_ref(), to, envelope).await
    }

    /// Whether `replica` is alive; a store that cannot say is taken at its word next time.
    async fn alive(&self, replica: &ReplicaId) -> bool {
        self.store.replica_alive(replica, crate::now_ms()).await.unwrap_or(true)
    }
}

async fn send(store: &dyn Store, to: &ReplicaId, envelope: &Envelope) -> Result<bool, tether_store::StoreError> {
    let body = serde_json::to_vec(envelope)
        .expect("an envelope serializes: every key is a string, every value a `Value` or a primitive");
    store.send_to_replica(to, Bytes::from(body)).await
}

/// Whether the replica holding `session`'s instance is alive to serve it (a store that cannot
/// say now is taken at its word: the request finds out).
pub async fn holder_alive(session: SessionHandle) -> bool {
    let store = &session.server().store;
    match store.session_replica(&session.runtime().id).await {
        Ok(Some(holder)) => store.replica_alive(&holder, crate::now_ms()).await.unwrap_or(true),
        Ok(None) => false,
        Err(err) => {
            tracing::debug!(%err, "could not read which replica holds a session");
            true
        }
    }
}

/// Ends `session`, whose instance was lost with the replica `holder`, once the requests running
/// here have recorded their outcomes.
fn end_session(session: SessionHandle, holder: &ReplicaId) {
    tracing::warn!(session = session.id(), %holder, "the replica holding the session's state is gone");
    tokio::spawn(async move { session.end(SessionEnd::UpstreamLost, ABORT_GRACE).await });
}

/// Waits, at most the grace a stopped instance's session gives its requests, until `stream` (a
/// relayed call's) has its final response.
async fn recorded(session: &SessionHandle, stream: &StreamName) {
    let (store, id) = (&session.server().store, &session.runtime().id);
    let Ok(mut head) = store.watch(id, stream).await else { return };
    let ended = async {
        while let Ok(Some(range)) = store.stream_range(id, stream).await
            && range.state == StreamState::Live
            && head.changed().await.is_ok()
        {}
    };
    let _ = tokio::time::timeout(ABORT_GRACE, ended).await;
}

/// Hands what other replicas send to the relay until it is gone.
async fn listen(relay: Weak<Shared>, mut messages: broadcast::Receiver<ReplicaMessage>, stop: CancellationToken) {
    loop {
        let message = tokio::select! {
            () = stop.cancelled() => return,
            message = messages.recv() => message,
        };
        let ReplicaMessage { from, body } = match message {
            Ok(message) => message,
            // What was dropped is found out by the probes.
            Err(broadcast::error::RecvError::Lagged(dropped)) => {
                tracing::warn!(dropped, "messages from other replicas were dropped");
                continue;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let Some(relay) = relay.upgrade() else { return };
        let Some(holder) = relay.holder.upgrade() else { return };
        match serde_json::from_slice::<Envelope>(&body) {
            Ok(envelope) => relay.received(&relay, &holder, from, envelope),
            Err(err) => tracing::debug!(%err, %from, "an unreadable message from another replica"),
        }
    }
}

impl Shared {
    fn received(&self, this: &Arc<Shared>, holder: &Arc<dyn Holder>, from: ReplicaId, envelope: Envelope) {
        match envelope {
            Envelope::Call { call, session, epoch, stream, method, params, progress_token } => {
                let holding = holder.holding(&session, &epoch);
                self.serve(this, holder, holding, (from, call), (stream, progress_token), method, params);
            }
            Envelope::Cancel { call } => {
                if let Some(cancel) = lock(&self.serving).get(&(from, call)) {
                    cancel.cancel();
                }
            }
            Envelope::Probe { call } => {
                if !lock(&self.serving).contains_key(&(from.clone(), call)) {
                    // Not running here: it never arrived, or its outcome was sent and lost.
                    let done = Envelope::done(call, Err(aborted(&holder.describe())));
                    self.reply(from, done);
                }
            }
            Envelope::Done { call, result, error } => {
                let outcome = match (result, error) {
                    (Some(result), None) => Ok(result),
                    (_, error) => Err(error
                        .and_then(|error| ErrorObject::from_value(error).ok())
                        .unwrap_or_else(|| aborted(&holder.describe()))),
                };
                if let Some(done) = lock(&self.waiting).remove(&call) {
                    // The caller may have given up meanwhile.
                    let _ = done.send(outcome);
                }
            }
            Envelope::Notify { session, epoch, method, params } => {
                if let Some(session) = holder.holding(&session, &epoch) {
                    holder.notify(session, Notification { method, params });
                }
            }
        }
    }

    /// Runs a call another replica relayed on the state of `session` (if this process holds
    /// it), and sends back its outcome once its output is durable.
    #[allow(clippy::too_many_arguments)]
    fn serve(
        &self,
        this: &Arc<Shared>,
        holder: &Arc<dyn Holder>,
        session: Option<SessionHandle>,
        (from, call): (ReplicaId, u64),
        (stream, progress_token): (StreamName, Option<Value>),
        method: String,
        params: Value,
    ) {
        let describe = holder.describe();
        let cancel = CancellationToken::new();
        // Counted as running in the session, so ending it waits for the call's outcome.
        let key = RequestKey::Relayed { replica: from.clone(), call };
        let Some(session) = session.filter(|session| session.runtime().start_request(&key, &stream, cancel.clone()))
        else {
            return self.reply(from, Envelope::done(call, Err(lost(&describe))));
        };
        lock(&self.serving).insert((from.clone(), call), cancel.clone());
        let (relay, holder) = (Arc::clone(this), Arc::clone(holder));
        tokio::spawn(async move {
            let ctx = Context::relayed(&session, stream.clone(), progress_token, cancel);
            let (outcome, held) = holder.run(session.clone(), ctx.clone(), method, params).await;
            // Its output is in the stream before the replica that answers it learns its outcome.
            if let Err(err) = ctx.flush().await {
                tracing::debug!(%err, "a relayed call's output was not all written");
            }
            // Sent before it stops counting as running, so a probe never overtakes it.
            if let Err(err) = relay.send(&from, &Envelope::done(call, outcome)).await {
                tracing::warn!(%err, "could not send a relayed call's outcome back");
            }
            lock(&relay.serving).remove(&(from, call));
            if held == Held::Gone {
                // The session ends once nothing runs in it: not before the replica answering the
                // call has recorded that it was cut short.
                recorded(&session, &stream).await;
            }
            session.runtime().finish_request(&key);
        });
    }

    /// Sends `envelope` to `to`, in the background.
    fn reply(&self, to: ReplicaId, envelope: Envelope) {
        let store = Arc::clone(&self.store);
        tokio::spawn(async move {
            if let Err(err) = send(store.as_ref(), &to, &envelope).await {
                tracing::debug!(%err, "could not answer another replica");
            }
        });
    }
}
