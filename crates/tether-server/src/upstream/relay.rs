//! Requests between replicas sharing a store (Redis). A session's upstream instance lives in the
//! replica that began the session; a request naming it that reaches another replica is sent to
//! that one ([`Relay::call`]), which runs it on the instance with a context writing to the
//! request's stream in the store ([`Context::relayed`]). So whatever the instance sends while the
//! request runs (progress, notifications, requests to the client) reaches the client through
//! the replica it reads from, as any output does; the client's answers reach the instance as
//! answers are relayed between replicas anyway; the outcome comes back here, and this replica
//! answers the request.
//!
//! The store delivers messages between replicas at most once, so a replica waiting on an
//! outcome probes for it: a call the holder does not know (lost on the way, or finished and its
//! outcome lost) ends as `request_aborted`. A holder whose heartbeat lapsed is gone, with its
//! instance: its calls end as `request_aborted` and its session as `upstream_lost`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tether_core::jsonrpc::{ErrorObject, Notification};
use tether_core::lineage::{Epoch, SessionId, StreamName, StreamState};
use tether_store::{ReplicaId, ReplicaMessage, RequestKey, SessionEnd, Store};
use tokio::sync::{broadcast, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{ABORT_GRACE, Upstream, aborted, cancelled, lock, lost, unavailable};
use crate::request::context::{Context, SessionHandle};

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

/// This process's side of the relay: the calls it sent and waits on, and those it runs for
/// other replicas.
pub(super) struct Relay {
    store: Arc<dyn Store>,
    waiting: Waiting,
    next_call: AtomicU64,
    /// Calls run here for other replicas, by sender and number, with what cancels them.
    serving: Mutex<HashMap<(ReplicaId, u64), CancellationToken>>,
    _listening: DropGuard,
}

impl Relay {
    /// Starts listening to what other replicas send, if `store` is shared by replicas.
    pub(super) fn start(upstream: &Arc<Upstream>, store: &Arc<dyn Store>) -> Option<Relay> {
        let messages = store.replica_messages()?;
        let stop = CancellationToken::new();
        tokio::spawn(listen(Arc::downgrade(upstream), messages, stop.clone()));
        Some(Relay {
            store: Arc::clone(store),
            waiting: Mutex::default(),
            next_call: AtomicU64::new(1),
            serving: Mutex::default(),
            _listening: stop.drop_guard(),
        })
    }

    /// Runs a request of `session`, whose instance another replica holds, there.
    pub(super) async fn call(
        &self,
        ctx: Context,
        session: &SessionHandle,
        method: String,
        params: Value,
        describe: &str,
    ) -> Result<Value, ErrorObject> {
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
                    "the replica holding the session's upstream did not receive the request",
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

    /// Relays a notification of `session`'s client to the replica holding its instance.
    pub(super) fn notify(&self, session: &SessionHandle, notification: Notification) {
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
pub(super) async fn holder_alive(session: SessionHandle) -> bool {
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
    tracing::warn!(session = session.id(), %holder, "the replica holding the session's upstream is gone");
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

/// Hands what other replicas send to `upstream` until it is gone.
async fn listen(upstream: Weak<Upstream>, mut messages: broadcast::Receiver<ReplicaMessage>, stop: CancellationToken) {
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
        let Some(upstream) = upstream.upgrade() else { return };
        let Some(Some(relay)) = upstream.relay.get() else { return };
        match serde_json::from_slice::<Envelope>(&body) {
            Ok(envelope) => relay.received(&upstream, from, envelope),
            Err(err) => tracing::debug!(%err, %from, "an unreadable message from another replica"),
        }
    }
}

impl Relay {
    fn received(&self, upstream: &Arc<Upstream>, from: ReplicaId, envelope: Envelope) {
        match envelope {
            Envelope::Call { call, session, epoch, stream, method, params, progress_token } => {
                let serving = upstream.serving(&session, &epoch);
                self.serve(upstream, serving, (from, call), (stream, progress_token), method, params);
            }
            Envelope::Cancel { call } => {
                if let Some(cancel) = lock(&self.serving).get(&(from, call)) {
                    cancel.cancel();
                }
            }
            Envelope::Probe { call } => {
                if !lock(&self.serving).contains_key(&(from.clone(), call)) {
                    // Not running here: it never arrived, or its outcome was sent and lost.
                    let done = Envelope::done(call, Err(aborted(&upstream.connect.describe())));
                    self.reply(from, done);
                }
            }
            Envelope::Done { call, result, error } => {
                let outcome = match (result, error) {
                    (Some(result), None) => Ok(result),
                    (_, error) => Err(error
                        .and_then(|error| ErrorObject::from_value(error).ok())
                        .unwrap_or_else(|| aborted(&upstream.connect.describe()))),
                };
                if let Some(done) = lock(&self.waiting).remove(&call) {
                    // The caller may have given up meanwhile.
                    let _ = done.send(outcome);
                }
            }
            Envelope::Notify { session, epoch, method, params } => {
                let peer = upstream.serving(&session, &epoch).and_then(|session| upstream.started_peer(&session));
                if let Some(peer) = peer {
                    peer.notify(Notification { method, params });
                }
            }
        }
    }

    /// Runs a call another replica relayed on the instance of `session` (if this process holds
    /// it), and sends back its outcome once its output is durable.
    fn serve(
        &self,
        upstream: &Arc<Upstream>,
        session: Option<SessionHandle>,
        (from, call): (ReplicaId, u64),
        (stream, progress_token): (StreamName, Option<Value>),
        method: String,
        params: Value,
    ) {
        let describe = upstream.connect.describe();
        let cancel = CancellationToken::new();
        // Counted as running in the session, so ending it waits for the call's outcome.
        let key = RequestKey::Relayed { replica: from.clone(), call };
        let Some(session) = session.filter(|session| session.runtime().start_request(&key, &stream, cancel.clone()))
        else {
            return self.reply(from, Envelope::done(call, Err(lost(&describe))));
        };
        lock(&self.serving).insert((from.clone(), call), cancel.clone());
        let upstream = Arc::clone(upstream);
        tokio::spawn(async move {
            let ctx = Context::relayed(&session, stream.clone(), progress_token, cancel);
            let (outcome, stopped) = match upstream.session_peer(&session).await {
                Ok(peer) => (peer.call(ctx.clone(), method, params).await, peer.gone.is_cancelled()),
                Err(error) => (Err(error), true),
            };
            // Its output is in the stream before the replica that answers it learns its outcome.
            if let Err(err) = ctx.flush().await {
                tracing::debug!(%err, "a relayed call's output was not all written");
            }
            let Some(Some(relay)) = upstream.relay.get() else { return };
            // Sent before it stops counting as running, so a probe never overtakes it.
            if let Err(err) = relay.send(&from, &Envelope::done(call, outcome)).await {
                tracing::warn!(%err, "could not send a relayed call's outcome back");
            }
            lock(&relay.serving).remove(&(from, call));
            if stopped {
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
