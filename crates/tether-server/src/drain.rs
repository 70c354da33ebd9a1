//! Draining: a server about to stop (a rolling deploy's SIGTERM) takes no new work, lets what
//! it runs finish, and says so to whoever routes to it.
//!
//! Once [`Drain::begin`] is called, readiness ([`Drain::is_ready`], `/readyz`) turns false at
//! once, and a new session or 2026-07-28 request is refused 503 `draining` with `Retry-After`,
//! so that a balancer or the client itself goes elsewhere. What the server already runs, and
//! every message of the sessions it serves (answers to its own questions, cancellations),
//! goes on; [`Drain::idle`] resolves once no request runs.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use tether_store::Store;
use tokio::sync::Notify;

use crate::refusal::{Refusal, Rejection};

/// Whether a server drains, and how many of its requests still run. Shared by the server (see
/// [`Builder::drain`](crate::Builder::drain)) and whoever stops it.
#[derive(Debug, Default)]
pub struct Drain {
    draining: AtomicBool,
    running: AtomicUsize,
    /// Told each time a request ends.
    ended: Notify,
}

impl Drain {
    /// A drain not begun, with nothing running.
    pub fn new() -> Arc<Drain> {
        Arc::default()
    }

    /// Begins draining: readiness turns false, and no new work is started from now on.
    pub fn begin(&self) {
        if !self.draining.swap(true, Ordering::SeqCst) {
            crate::telemetry::draining();
            tracing::info!(running = self.running(), "draining: no new sessions or requests are taken");
        }
    }

    /// Whether draining has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Whether a balancer may route new work here: the server is not draining.
    pub fn is_ready(&self) -> bool {
        !self.is_draining()
    }

    /// How many requests run now (each from its start to its terminal event).
    pub fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// Resolves once no request runs.
    pub async fn idle(&self) {
        loop {
            // Registered before looking, so that an end in between is not missed.
            let ended = self.ended.notified();
            if self.running() == 0 {
                return;
            }
            ended.await;
        }
    }

    /// Counts one request as running until the returned guard is dropped.
    pub(crate) fn start(self: &Arc<Self>) -> Running {
        let running = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        crate::telemetry::requests_running(running);
        Running(Arc::clone(self))
    }

    /// Refuses new work once draining has begun.
    pub(crate) fn admit(&self) -> Result<(), Rejection> {
        if !self.is_draining() {
            return Ok(());
        }
        Err(Refusal::Draining
            .with("the server is shutting down: start this elsewhere, or here again once it is back")
            .with_header(http::header::RETRY_AFTER, http::HeaderValue::from_static("1")))
    }
}

/// One running request; it ends when dropped.
pub(crate) struct Running(Arc<Drain>);

impl Drop for Running {
    fn drop(&mut self) {
        let running = self.0.running.fetch_sub(1, Ordering::SeqCst) - 1;
        crate::telemetry::requests_running(running);
        self.0.ended.notify_waiters();
    }
}

/// What `/readyz` checks before it tells a balancer to route new work here: the server is not
/// draining, has started (a gateway has reached its upstream), and its store answers.
#[derive(Clone)]
pub struct Readiness {
    drain: Arc<Drain>,
    store: Option<Arc<dyn Store>>,
    started: Option<Arc<OnceLock<Router>>>,
}

/// Why `/readyz` answers 503.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    /// The drain has begun.
    #[error("draining")]
    Draining,
    /// The server is still starting (see [`until_ready`](crate::until_ready)).
    #[error("starting")]
    Starting,
    /// The store did not answer, or not within two seconds.
    #[error("the store does not answer: {0}")]
    Store(String),
}

/// How long `/readyz` waits for the store to answer.
const STORE_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

impl Readiness {
    /// Ready while `drain` has not begun.
    pub fn new(drain: Arc<Drain>) -> Readiness {
        Readiness { drain, store: None, started: None }
    }

    /// Ready only while `store` answers too.
    pub fn store(mut self, store: Arc<dyn Store>) -> Readiness {
        self.store = Some(store);
        self
    }

    /// Ready only once `started` holds the server's router, as [`until_ready`](crate::until_ready)
    /// serves it.
    pub fn started(mut self, started: Arc<OnceLock<Router>>) -> Readiness {
        self.started = Some(started);
        self
    }

    /// Whether a balancer may route new work here now, and if not, why.
    pub async fn check(&self) -> Result<(), NotReady> {
        if !self.drain.is_ready() {
            return Err(NotReady::Draining);
        }
        if self.started.as_ref().is_some_and(|started| started.get().is_none()) {
            return Err(NotReady::Starting);
        }
        if let Some(store) = &self.store {
            match tokio::time::timeout(STORE_CHECK_TIMEOUT, store.reachable()).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => return Err(NotReady::Store(err.to_string())),
                Err(_) => return Err(NotReady::Store(format!("no answer within {STORE_CHECK_TIMEOUT:?}"))),
            }
        }
        Ok(())
    }
}

/// `/healthz` and `/readyz` for probes: the first answers 200 while the process serves
/// (liveness), the second 200 while `readiness` holds and 503 with the reason once it does not
/// (route no new work here).
pub fn health_router(readiness: Readiness) -> Router {
    Router::new().route("/healthz", axum::routing::get(|| async { "ok\n" })).route(
        "/readyz",
        axum::routing::get(move || {
            let readiness = readiness.clone();
            async move {
                match readiness.check().await {
                    Ok(()) => (StatusCode::OK, "ready\n".to_owned()),
                    Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
                }
            }
        }),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn idle_waits_for_every_running_request_and_begin_refuses_new_work() {
        let drain = Drain::new();
        let (first, second) = (drain.start(), drain.start());
        assert!(drain.admit().is_ok() && drain.is_ready());
        drain.begin();
        assert!(drain.admit().is_err() && !drain.is_ready());
        let waiting = tokio::spawn({
            let drain = Arc::clone(&drain);
            async move { drain.idle().await }
        });
        drop(first);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "idle with a request running");
        drop(second);
        tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("idle once none runs").expect("the waiter");
        assert_eq!(drain.running(), 0);
    }
}
