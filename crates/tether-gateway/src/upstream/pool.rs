//! The instances that serve 2026-07-28 requests, kept initialized between requests.
//!
//! A 2026-07-28 request has no session, and starting an instance for each one (a child process,
//! an upstream session) costs more than most requests. So an instance that answered a request
//! is kept, idle, for the next request that declares the same client (the same `initialize`
//! params: revision, capabilities and info), as that client's own session would be reused. An
//! instance serves one request at a time, so that what it sends without naming a request goes
//! to the one it is serving. At most a set number of instances live at once, idle or busy: a
//! request past the bound takes the place of the longest idle instance, or waits for one to be
//! returned. An idle instance is stopped after [`IDLE_TIMEOUT`].

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_json::Value;
use tether_core::jsonrpc::ErrorObject;
use tether_server::relay;
use tokio::sync::Notify;

use super::lock;
use super::peer::Peer;

/// How long an instance may stay idle in the pool before it is stopped.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The instances kept for 2026-07-28 requests.
pub(super) struct Pool {
    limit: AtomicUsize,
    state: Mutex<State>,
    /// Told each time an instance is returned or stopped: a place may have come free.
    freed: Notify,
}

#[derive(Default)]
struct State {
    /// Idle instances, the longest idle first.
    idle: VecDeque<Idle>,
    /// Instances alive (idle, serving, or starting).
    live: usize,
    /// Names each idle instance, so that its expiry finds it (or finds it gone).
    next_mark: u64,
}

/// Whom an instance serves: the client its `initialize` params declare, and the principal the
/// requests authenticated as (an HTTP upstream may be told it), so that an instance is never
/// lent to another principal's request.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Declared {
    /// The `initialize` params.
    pub params: Value,
    /// The principal, if the gateway authenticates.
    pub principal: Option<String>,
}

struct Idle {
    client: Declared,
    peer: Peer,
    mark: u64,
}

/// Where a request's instance comes from.
pub(super) enum Place {
    /// An idle instance, initialized as the request's client.
    Reused(Lease),
    /// A place for an instance the caller starts, initialized as the request's client.
    Start(Reserved),
}

/// A place in the pool, held while its instance starts; given back if it never does.
pub(super) struct Reserved {
    slot: Slot,
    client: Declared,
}

/// An instance serving one request; returned to the pool by [`Lease::finish`], stopped if dropped
/// otherwise.
pub(super) struct Lease {
    slot: Slot,
    client: Declared,
    peer: Peer,
}

/// One of the pool's places: given back when dropped, unless it passed to an idle instance.
struct Slot {
    pool: Arc<Pool>,
    held: bool,
}

impl Pool {
    /// A pool of at most `limit` instances.
    pub(super) fn new(limit: NonZeroUsize) -> Arc<Pool> {
        Arc::new(Pool { limit: AtomicUsize::new(limit.get()), state: Mutex::default(), freed: Notify::new() })
    }

    /// Sets the most instances alive at once, before any is started.
    pub(super) fn set_limit(&self, limit: NonZeroUsize) {
        self.limit.store(limit.get(), Ordering::Relaxed);
    }

    /// An instance for a request whose client `client` declares: an idle one of the same client,
    /// else a place to start one. Waits while every place is taken by a busy instance, until
    /// one is returned or `cancelled` resolves (the request was cancelled).
    pub(super) async fn place(
        self: &Arc<Self>,
        client: Declared,
        cancelled: impl Future<Output = ()>,
    ) -> Result<Place, ErrorObject> {
        let mut cancelled = std::pin::pin!(cancelled);
        loop {
            // Registered before looking, so that a return in between is not missed.
            let freed = self.freed.notified();
            {
                let mut state = lock(&self.state);
                let stopped = state.drop_gone();
                let at = state.idle.iter().position(|idle| idle.client == client);
                if let Some(Idle { peer, .. }) = at.and_then(|at| state.idle.remove(at)) {
                    drop(state);
                    self.freed_places(stopped);
                    return Ok(Place::Reused(Lease { slot: Slot::new(self), client, peer }));
                }
                let free = state.live < self.limit.load(Ordering::Relaxed);
                // Full: the longest idle instance, another client's, gives up its place.
                let evicted = if free { None } else { state.idle.pop_front() };
                if free || evicted.is_some() {
                    if free {
                        state.live += 1;
                    }
                    drop(state);
                    drop(evicted);
                    self.freed_places(stopped);
                    return Ok(Place::Start(Reserved { slot: Slot::new(self), client }));
                }
                drop(state);
                self.freed_places(stopped);
            }
            tokio::select! {
                () = freed => {}
                () = &mut cancelled => return Err(relay::cancelled()),
            }
        }
    }

    /// Wakes a waiter for each of `count` places that came free.
    fn freed_places(&self, count: usize) {
        for _ in 0..count {
            self.freed.notify_one();
        }
    }

    /// Keeps `peer`, idle, for the next request of `client`; stops it after [`IDLE_TIMEOUT`]
    /// unless a request took it meanwhile.
    fn keep(self: &Arc<Self>, client: Declared, peer: Peer) {
        let mark = {
            let mut state = lock(&self.state);
            state.next_mark += 1;
            let mark = state.next_mark;
            state.idle.push_back(Idle { client, peer, mark });
            mark
        };
        self.freed.notify_one();
        let pool: Weak<Pool> = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(IDLE_TIMEOUT).await;
            if let Some(pool) = pool.upgrade() {
                pool.expire(mark);
            }
        });
    }

    /// Stops the idle instance named `mark`, if it is still idle.
    fn expire(&self, mark: u64) {
        let expired = {
            let mut state = lock(&self.state);
            let at = state.idle.iter().position(|idle| idle.mark == mark);
            let expired = at.and_then(|at| state.idle.remove(at));
            if expired.is_some() {
                state.live -= 1;
            }
            expired
        };
        if expired.is_some() {
            drop(expired);
            self.freed.notify_one();
        }
    }

    /// Gives one place back: its instance stopped, or never started.
    fn release(&self) {
        lock(&self.state).live -= 1;
        self.freed.notify_one();
    }

    /// How many instances are idle, for tests.
    #[cfg(test)]
    fn idle(&self) -> usize {
        lock(&self.state).idle.len()
    }
}

impl State {
    /// Forgets idle instances that stopped on their own; how many.
    fn drop_gone(&mut self) -> usize {
        let before = self.idle.len();
        self.idle.retain(|idle| !idle.peer.gone.is_cancelled());
        let stopped = before - self.idle.len();
        self.live -= stopped;
        stopped
    }
}

impl Slot {
    fn new(pool: &Arc<Pool>) -> Slot {
        Slot { pool: Arc::clone(pool), held: true }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.held {
            self.pool.release();
        }
    }
}

impl Reserved {
    /// Whom to start the instance for.
    pub(super) fn client(&self) -> &Declared {
        &self.client
    }

    /// The instance started in this place, now serving the request.
    pub(super) fn started(self, peer: Peer) -> Lease {
        Lease { slot: self.slot, client: self.client, peer }
    }
}

impl Lease {
    /// The instance.
    pub(super) fn peer(&self) -> &Peer {
        &self.peer
    }

    /// The request is over: the instance goes back to the pool if it answered (`answered`) and
    /// still runs, else it is stopped and its place given back. An instance whose request was
    /// cancelled may still be at work on it, and what it sends would reach the next request.
    pub(super) fn finish(self, answered: bool) {
        let Lease { mut slot, client, peer } = self;
        if answered && !peer.gone.is_cancelled() {
            // The place passes to the idle instance.
            slot.held = false;
            slot.pool.keep(client, peer);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::pending;

    use serde_json::json;
    use tether_core::jsonrpc::{Message, Response};
    use tokio::sync::mpsc;

    use super::*;
    use crate::upstream::{LINK_QUEUE, Link};

    /// An instance that answers `initialize`, then reads on until tether stops it; `stopped`
    /// resolves then.
    async fn instance() -> (Peer, tokio::task::JoinHandle<()>) {
        let (to_upstream, mut from_tether) = mpsc::channel(LINK_QUEUE);
        let (to_tether, from_upstream) = mpsc::channel(LINK_QUEUE);
        let stopped = tokio::spawn(async move {
            let Some(Message::Request(initialize)) = from_tether.recv().await else { panic!("initialize first") };
            let answer = Response { id: Some(initialize.id), outcome: Ok(json!({"capabilities": {}})) };
            to_tether.send(Message::Response(answer).into()).await.expect("tether listens");
            while from_tether.recv().await.is_some() {}
        });
        let link = Link { to_upstream, from_upstream, keep: Box::new(()) };
        let (peer, _) = Peer::start(link, json!({}), None, "test".into()).await.expect("initialized");
        (peer, stopped)
    }

    fn declared(params: Value) -> Declared {
        Declared { params, principal: None }
    }

    async fn lease(pool: &Arc<Pool>, client: &Declared) -> (Lease, bool) {
        match pool.place(client.clone(), pending()).await.expect("a place") {
            Place::Reused(lease) => (lease, true),
            Place::Start(reserved) => (reserved.started(instance().await.0), false),
        }
    }

    #[tokio::test]
    async fn an_answered_instance_serves_the_next_request_of_the_same_client_only() {
        let pool = Pool::new(NonZeroUsize::new(4).expect("not 0"));
        let (a, b) = (declared(json!({"clientInfo": "a"})), declared(json!({"clientInfo": "b"})));
        let (first, reused) = lease(&pool, &a).await;
        assert!(!reused);
        first.finish(true);
        assert_eq!(pool.idle(), 1);
        let (other, reused) = lease(&pool, &b).await;
        assert!(!reused, "another client's instance was reused");
        let (again, reused) = lease(&pool, &a).await;
        assert!(reused, "the idle instance of the same client was not reused");
        // Cancelled: the instance may still be at work, so it is not kept.
        again.finish(false);
        other.finish(true);
        assert_eq!(pool.idle(), 1);
        assert_eq!(lock(&pool.state).live, 1);
    }

    #[tokio::test]
    async fn an_instance_is_never_lent_to_another_principal_of_the_same_client() {
        let pool = Pool::new(NonZeroUsize::new(4).expect("not 0"));
        let of = |principal: &str| Declared { params: json!({"clientInfo": "a"}), principal: Some(principal.into()) };
        let (alices, _) = lease(&pool, &of("alice")).await;
        alices.finish(true);
        let (bobs, reused) = lease(&pool, &of("bob")).await;
        assert!(!reused, "alice's instance was lent to bob");
        bobs.finish(true);
        let (_, reused) = lease(&pool, &of("alice")).await;
        assert!(reused, "alice's idle instance was not reused for her");
    }

    #[tokio::test]
    async fn an_instance_that_stopped_is_not_kept_nor_counted() {
        let pool = Pool::new(NonZeroUsize::new(1).expect("not 0"));
        let client = declared(json!({}));
        let (reserved, stopped) = match pool.place(client.clone(), pending()).await.expect("a place") {
            Place::Start(reserved) => {
                let (peer, stopped) = instance().await;
                (reserved.started(peer), stopped)
            }
            Place::Reused(_) => panic!("an empty pool reused an instance"),
        };
        stopped.abort();
        let _ = stopped.await;
        tokio::time::timeout(Duration::from_secs(5), reserved.peer().gone.cancelled()).await.expect("seen gone");
        reserved.finish(true);
        assert_eq!((pool.idle(), lock(&pool.state).live), (0, 0));
    }

    #[tokio::test]
    async fn past_the_bound_a_request_waits_for_a_return_then_takes_an_idle_instances_place() {
        let pool = Pool::new(NonZeroUsize::new(1).expect("not 0"));
        let (a, b) = (declared(json!({"clientInfo": "a"})), declared(json!({"clientInfo": "b"})));
        let (busy, _) = lease(&pool, &a).await;
        let waiting = tokio::spawn({
            let pool = Arc::clone(&pool);
            async move { lease(&pool, &b).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a second instance started past the bound");
        busy.finish(true);
        let (_lease, reused) =
            tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("woken").expect("the waiter");
        assert!(!reused);
        assert_eq!((pool.idle(), lock(&pool.state).live), (0, 1), "the idle instance gave up its place");
    }

    #[tokio::test]
    async fn a_waiting_request_that_is_cancelled_gives_up() {
        let pool = Pool::new(NonZeroUsize::new(1).expect("not 0"));
        let (_busy, _) = lease(&pool, &declared(json!({}))).await;
        let refused = pool.place(declared(json!({"other": true})), std::future::ready(())).await;
        assert!(refused.is_err());
        assert_eq!(lock(&pool.state).live, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_instance_is_stopped_after_the_idle_timeout() {
        let pool = Pool::new(NonZeroUsize::new(2).expect("not 0"));
        let (lease_, _) = lease(&pool, &declared(json!({}))).await;
        lease_.finish(true);
        tokio::time::sleep(IDLE_TIMEOUT - Duration::from_secs(1)).await;
        assert_eq!(pool.idle(), 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!((pool.idle(), lock(&pool.state).live), (0, 0));
    }
}
