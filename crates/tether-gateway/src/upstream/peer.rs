//! One initialized upstream instance: tether's requests to it under ids of tether's own, and
//! what it sends routed back to the request it belongs to.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tether_core::jsonrpc::{ErrorObject, Message, Notification, Request, RequestId, Response};
use tether_core::mcp::method;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

use tether_server::relay::{aborted, cancelled, lost, unavailable};
use tether_server::{Context, ContextError, Refusal, SessionHandle};

use super::{FromUpstream, INITIALIZE_TIMEOUT, Link, lock};

/// A request of tether's that the upstream is running.
struct Call {
    ctx: Context,
    done: oneshot::Sender<Result<Value, ErrorObject>>,
}

type Calls = Arc<Mutex<HashMap<i64, Call>>>;

/// One initialized upstream instance and the requests it is answering. Dropping it stops the
/// instance.
pub(super) struct Peer {
    /// What goes to the instance.
    pub(super) to_upstream: mpsc::Sender<Message>,
    calls: Calls,
    next_id: AtomicI64,
    /// Cancelled when the instance stopped on its own (not when tether stopped it).
    pub(super) gone: CancellationToken,
    describe: String,
    _stop: DropGuard,
}

impl Peer {
    /// Initializes the instance behind `link` with `client` (the client's `initialize` params)
    /// and starts routing what it sends. Returns it with its `initialize` result.
    pub(super) async fn start(
        link: Link,
        client: Value,
        session: Option<SessionHandle>,
        describe: String,
    ) -> Result<(Peer, Value), ErrorObject> {
        let Link { to_upstream, mut from_upstream, keep } = link;
        let initialize = Request { id: RequestId::Number(0), method: method::INITIALIZE.into(), params: Some(client) };
        to_upstream.send(Message::Request(initialize)).await.map_err(|_| unavailable(&describe, "it stopped"))?;
        let answer = tokio::time::timeout(INITIALIZE_TIMEOUT, async {
            loop {
                let Some(FromUpstream { message, .. }) = from_upstream.recv().await else {
                    return Err(unavailable(&describe, "it stopped before answering initialize"));
                };
                match message {
                    Message::Response(Response { id: Some(RequestId::Number(0)), outcome }) => {
                        return outcome.map_err(|error| unavailable(&describe, error.message));
                    }
                    // Nothing to route to before the session is set up.
                    Message::Request(request) => {
                        let _ = to_upstream.try_send(Message::Response(Response {
                            id: Some(request.id.clone()),
                            outcome: answer_locally(&request).unwrap_or_else(|| {
                                Err(Refusal::UpstreamNotInitialized.error("not before initialization"))
                            }),
                        }));
                    }
                    _ => {}
                }
            }
        })
        .await
        .map_err(|_| unavailable(&describe, "no answer to initialize"))??;
        let initialized = Notification { method: method::INITIALIZED.into(), params: None };
        to_upstream.send(Message::Notification(initialized)).await.map_err(|_| unavailable(&describe, "it stopped"))?;

        let (stop, gone) = (CancellationToken::new(), CancellationToken::new());
        let asking = Arc::new(Semaphore::new(MAX_CLIENT_REQUESTS));
        let router = Router { to_upstream: to_upstream.clone(), calls: Calls::default(), session, describe, asking };
        metrics::gauge!("tether_upstream_instances").increment(1.0);
        let peer = Peer {
            to_upstream,
            calls: Arc::clone(&router.calls),
            next_id: AtomicI64::new(1),
            gone: gone.clone(),
            describe: router.describe.clone(),
            _stop: stop.clone().drop_guard(),
        };
        tokio::spawn(async move {
            // The instance lives as long as its messages are routed.
            let _keep = keep;
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    message = from_upstream.recv() => match message {
                        Some(message) => router.route(message).await,
                        None => {
                            gone.cancel();
                            break;
                        }
                    },
                }
            }
            router.abort_all();
        });
        Ok((peer, answer))
    }

    /// Tells the instance `notification`, unless [`LINK_QUEUE`](super::LINK_QUEUE) messages to
    /// it are unread: then it is dropped and counted, so that a client flooding notifications
    /// cannot grow the gateway. A stopped instance has nobody left to tell.
    pub(super) fn notify(&self, notification: Notification) {
        let sent = self.to_upstream.try_send(Message::Notification(notification));
        if let Err(mpsc::error::TrySendError::Full(_)) = sent {
            metrics::counter!("tether_upstream_notifications_dropped_total").increment(1);
            tracing::warn!(upstream = %self.describe, "the upstream is not reading: a notification to it was dropped");
        }
    }

    /// Runs one request of tether's on the instance, as a child of the request's trace context;
    /// a cancelled request is cancelled there too.
    pub(super) async fn call(&self, ctx: Context, method: String, mut params: Value) -> Result<Value, ErrorObject> {
        if let Some(trace) = ctx.trace_context() {
            trace.inject(&mut params);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (done, outcome) = oneshot::channel();
        lock(&self.calls).insert(id, Call { ctx: ctx.clone(), done });
        let request = Request { id: RequestId::Number(id), method, params: Some(params) };
        if self.to_upstream.send(Message::Request(request)).await.is_err() {
            lock(&self.calls).remove(&id);
            // Never sent, so certainly not run: not an abort.
            return Err(lost(&self.describe));
        }
        tokio::select! {
            outcome = outcome => outcome.unwrap_or_else(|_| Err(aborted(&self.describe))),
            () = ctx.cancelled() => {
                lock(&self.calls).remove(&id);
                let cancel = Notification {
                    method: method::CANCELLED.into(),
                    params: Some(json!({"requestId": id, "reason": "cancelled by the client"})),
                };
                // A stopped instance has nothing left to cancel.
                self.notify(cancel);
                Err(cancelled())
            }
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        metrics::gauge!("tether_upstream_instances").decrement(1.0);
    }
}

/// The requests from an upstream that tether answers itself.
fn answer_locally(request: &Request) -> Option<Result<Value, ErrorObject>> {
    (request.method == method::PING).then(|| Ok(json!({})))
}

/// Routes what an instance sends to where tether delivers it.
/// Most requests of an instance to the client waiting for their answers at once; one past it is
/// refused at once.
const MAX_CLIENT_REQUESTS: usize = 64;

struct Router {
    to_upstream: mpsc::Sender<Message>,
    calls: Calls,
    /// The session, for messages that belong to no request; none in 2026-07-28.
    session: Option<SessionHandle>,
    describe: String,
    /// A permit for each request to the client waiting for its answer.
    asking: Arc<Semaphore>,
}

impl Router {
    async fn route(&self, FromUpstream { message, origin }: FromUpstream) {
        match message {
            Message::Response(response) => self.finish(response),
            Message::Notification(notification) => self.notify(notification, origin.as_ref()).await,
            Message::Request(request) => self.ask_client(request, origin.as_ref()),
        }
    }

    /// A request's outcome.
    fn finish(&self, response: Response) {
        let Some(RequestId::Number(id)) = response.id else { return };
        if let Some(call) = lock(&self.calls).remove(&id) {
            // The request may have been cancelled meanwhile.
            let _ = call.done.send(response.outcome);
        }
    }

    /// The running request a message belongs to: the one whose progress token it carries, else
    /// the one it says it originates from, else the latest.
    fn request_of(&self, token: Option<&Value>, origin: Option<&RequestId>) -> Option<Context> {
        let calls = lock(&self.calls);
        if let Some(token) = token {
            return calls.values().find(|call| call.ctx.progress_token() == Some(token)).map(|call| call.ctx.clone());
        }
        let origin = match origin {
            Some(RequestId::Number(id)) => calls.get(id),
            _ => None,
        };
        origin.or_else(|| calls.iter().max_by_key(|(id, _)| **id).map(|(_, call)| call)).map(|call| call.ctx.clone())
    }

    /// Progress goes to the stream of the request whose token it carries, a notification that
    /// says which request it belongs to to that request's stream, and any other to the
    /// session's standalone stream; without one it is dropped, as the spec has it ("SHOULD
    /// relate to the originating client request"): on stdio nothing ties a log line or a
    /// `list_changed` to whichever request happens to be running.
    async fn notify(&self, notification: Notification, origin: Option<&RequestId>) {
        let method = notification.method;
        let params = notification.params.unwrap_or(Value::Null);
        let token = (method == method::PROGRESS).then(|| params.get("progressToken")).flatten();
        let sent = match (token, origin, &self.session) {
            (None, None, Some(session)) => session.broadcast(&method, params).await.unwrap_or(false),
            // In 2026-07-28 the instance serves one request: the latest is the one.
            _ => match self.request_of(token, origin) {
                Some(ctx) => ctx.notify(&method, params).await.is_ok(),
                None => false,
            },
        };
        if !sent {
            tracing::debug!(%method, "an upstream notification had nowhere to go");
        }
    }

    /// A request to the client goes out on the stream of the request it originates from, else
    /// of the latest running one; the client's answer goes back to the upstream. Past
    /// [`MAX_CLIENT_REQUESTS`] waiting for their answers, it is refused at once.
    fn ask_client(&self, request: Request, origin: Option<&RequestId>) {
        let ctx = match answer_locally(&request) {
            Some(outcome) => {
                let _ = self.to_upstream.try_send(Message::Response(Response { id: Some(request.id), outcome }));
                return;
            }
            None => self.request_of(None, origin),
        };
        let Ok(waiting) = Arc::clone(&self.asking).try_acquire_owned() else {
            let busy = format!("{MAX_CLIENT_REQUESTS} requests to the client are waiting for their answers already");
            let refused = Response { id: Some(request.id), outcome: Err(Refusal::ClientRequestFailed.error(busy)) };
            let _ = self.to_upstream.try_send(Message::Response(refused));
            return;
        };
        let to_upstream = self.to_upstream.clone();
        tokio::spawn(async move {
            let _waiting = waiting;
            let outcome = match ctx {
                Some(ctx) => {
                    ctx.request(&request.method, request.params.unwrap_or(Value::Null)).await.map_err(|err| match err {
                        ContextError::Client { code, message } => ErrorObject { code, message, data: None },
                        err => Refusal::ClientRequestFailed.error(err.to_string()),
                    })
                }
                None => Err(Refusal::NoStream.error("no request is running whose stream could carry this request")),
            };
            // A stopped instance no longer waits for the answer.
            let _ = to_upstream.send(Message::Response(Response { id: Some(request.id), outcome })).await;
        });
    }

    /// The instance stopped: its running requests get an error, not silence.
    fn abort_all(&self) {
        for (_, call) in lock(&self.calls).drain() {
            let _ = call.done.send(Err(aborted(&self.describe)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::LINK_QUEUE;

    /// An instance that answers `initialize`, then reads nothing more: a client's notifications
    /// to it are dropped past the queue, never waited on and never held without bound.
    #[tokio::test]
    async fn notifications_to_an_upstream_that_stopped_reading_are_dropped_past_the_queue() {
        let (to_upstream, mut from_tether) = mpsc::channel(LINK_QUEUE);
        let (to_tether, from_upstream) = mpsc::channel(LINK_QUEUE);
        let upstream = tokio::spawn(async move {
            let Some(Message::Request(initialize)) = from_tether.recv().await else { panic!("initialize first") };
            let answer = Response { id: Some(initialize.id), outcome: Ok(json!({"capabilities": {}})) };
            to_tether.send(Message::Response(answer).into()).await.expect("tether listens");
            // Holds both ends and reads no more.
            (from_tether, to_tether)
        });
        let link = Link { to_upstream, from_upstream, keep: Box::new(()) };
        let (peer, _) = Peer::start(link, json!({}), None, "test".into()).await.expect("initialized");
        let (from_tether, _to_tether) = upstream.await.expect("the upstream");
        let notification = || Notification { method: "notifications/roots/list_changed".into(), params: None };
        for _ in 0..3 * LINK_QUEUE {
            peer.notify(notification());
        }
        // `initialized` took one place.
        assert_eq!(from_tether.len(), LINK_QUEUE, "the queue is full, and no fuller");
    }

    /// An instance that asks the client one request after another and reads no answer: what
    /// waits to answer it is bounded, and the requests past the bound are refused at once, not
    /// held in a task each.
    #[tokio::test]
    async fn requests_to_the_client_past_the_bound_are_refused_not_held() {
        let (to_upstream, mut from_tether) = mpsc::channel(LINK_QUEUE);
        let (to_tether, from_upstream) = mpsc::channel(LINK_QUEUE);
        let link = Link { to_upstream, from_upstream, keep: Box::new(()) };
        let upstream = tokio::spawn(async move {
            let Some(Message::Request(initialize)) = from_tether.recv().await else { panic!("initialize first") };
            let answer = Response { id: Some(initialize.id), outcome: Ok(json!({"capabilities": {}})) };
            to_tether.send(Message::Response(answer).into()).await.expect("tether listens");
            (from_tether, to_tether)
        });
        let (_peer, _) = Peer::start(link, json!({}), None, "test".into()).await.expect("initialized");
        let (from_tether, to_tether) = upstream.await.expect("the upstream");
        let asks = 3 * LINK_QUEUE;
        for n in 0..asks {
            let ask =
                Request { id: RequestId::Number(n as i64), method: "sampling/createMessage".into(), params: None };
            to_tether.send(Message::Request(ask).into()).await.expect("tether routes");
        }
        // Every ask routed: nothing waits in the link, and the answers' queue is full.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while to_tether.capacity() < LINK_QUEUE || from_tether.len() < LINK_QUEUE {
            assert!(tokio::time::Instant::now() < deadline, "the asks were not routed");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let alive = tokio::runtime::Handle::current().metrics().num_alive_tasks();
        assert!(alive <= MAX_CLIENT_REQUESTS + 2, "{alive} tasks alive for {asks} asks");
    }
}
