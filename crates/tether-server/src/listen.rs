//! `subscriptions/listen` (SEP-2575): 2026-07-28 clients hear server-wide announcements
//! (`list_changed`, resource updates) on a stream they open, since there is no session to carry
//! them. Fire-and-forget, as the SEP says: a subscription delivers what is announced while it is
//! open (here, or at another replica when the store relays it), and nothing is replayed (work
//! that must survive a dropped connection is a task's).

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use tether_core::jsonrpc::{Notification, RequestId};
use tether_core::subscriptions::{self, Filter};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::request::context::notification;

/// Announcements a slow subscriber may fall behind by before it misses some.
const BACKLOG: usize = 256;

/// The announcements of this process, to every open subscription.
pub(crate) struct Listeners {
    announcements: broadcast::Sender<Arc<Notification>>,
}

impl Default for Listeners {
    fn default() -> Self {
        Listeners { announcements: broadcast::channel(BACKLOG).0 }
    }
}

impl Listeners {
    /// Announces `method` with `params` to every open subscription that carries it; returns how
    /// many subscriptions are open.
    pub fn announce(&self, method: &str, params: Value) -> usize {
        let params = (!params.is_null()).then_some(params);
        self.announcements.send(Arc::new(Notification { method: method.to_owned(), params })).unwrap_or(0)
    }

    /// Opens a subscription for the listen request `id` carrying `filter`: its stream (the
    /// acknowledgement first, then what it carries), ended by cancelling `closed` (the client
    /// went away).
    pub fn open(&self, id: &RequestId, filter: Filter, closed: CancellationToken) -> mpsc::Receiver<(Bytes, bool)> {
        let (tx, rx) = mpsc::channel(16);
        let mut announcements = self.announcements.subscribe();
        let subscription = id.to_value();
        let ack = notification(
            subscriptions::ACKNOWLEDGED,
            subscriptions::tagged(Some(&serde_json::json!({"notifications": filter.to_json()})), &subscription),
        );
        tokio::spawn(async move {
            if tx.send((ack, false)).await.is_err() {
                return;
            }
            loop {
                let announced = tokio::select! {
                    announced = announcements.recv() => announced,
                    () = closed.cancelled() => return,
                };
                let announced = match announced {
                    Ok(announced) => announced,
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::debug!(missed, "a subscriber fell behind; announcements were dropped");
                        continue;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                let params = announced.params.as_ref().unwrap_or(&Value::Null);
                if !filter.carries(&announced.method, params) {
                    continue;
                }
                let params = subscriptions::tagged(announced.params.as_ref(), &subscription);
                if tx.send((notification(&announced.method, params), false)).await.is_err() {
                    return;
                }
            }
        });
        rx
    }
}
