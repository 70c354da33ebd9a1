//! Wake-ups for the connections of this process that follow streams: one watch per stream,
//! shared by the backends that persist outside the process.

use std::sync::{Mutex, MutexGuard};

use tether_core::lineage::{IdMap, StreamName};
use tokio::sync::watch;

use crate::HeadWatch;

/// The watched streams of this process and their heads.
#[derive(Debug, Default)]
pub(crate) struct Heads(Mutex<IdMap<(String, StreamName), watch::Sender<u64>>>);

impl Heads {
    fn lock(&self) -> MutexGuard<'_, IdMap<(String, StreamName), watch::Sender<u64>>> {
        // Plain data behind the lock: still consistent after a panic elsewhere.
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A watch on a stream whose head is `head` now.
    pub fn subscribe(&self, session: &str, stream: &StreamName, head: u64) -> HeadWatch {
        let mut heads = self.lock();
        heads.entry((session.to_owned(), stream.clone())).or_insert_with(|| watch::Sender::new(head)).subscribe()
    }

    /// The stream's head moved (or the stream ended): wake its followers.
    pub fn notify(&self, session: &str, stream: &StreamName, head: u64) {
        if let Some(tx) = self.lock().get(&(session.to_owned(), stream.clone())) {
            tx.send_replace(head);
        }
    }

    /// The session ended: its watches close, which ends their connections.
    pub fn forget_session(&self, session: &str) {
        self.lock().retain(|(s, _), _| s != session);
    }

    /// The stream is gone: its watch closes.
    pub fn forget(&self, session: &str, stream: &StreamName) {
        self.lock().remove(&(session.to_owned(), stream.clone()));
    }

    /// Wakes the followers of `session`'s streams (after notifications of them may have been
    /// missed): they re-read.
    pub fn wake_session(&self, session: &str) {
        for ((s, _), tx) in self.lock().iter() {
            if s == session {
                tx.send_modify(|_| {});
            }
        }
    }

    /// Wakes every follower (after notifications may have been missed): they re-read.
    pub fn wake_all(&self) {
        for tx in self.lock().values() {
            tx.send_modify(|_| {});
        }
    }

    /// The streams some connection follows. Watches nobody holds any more are dropped on the
    /// way: a later [`Heads::subscribe`] makes a new one, and a follower reads the store after
    /// subscribing, so no wake-up is lost.
    pub fn followed(&self) -> Vec<(String, StreamName)> {
        let mut heads = self.lock();
        heads.retain(|_, tx| tx.receiver_count() > 0);
        heads.keys().cloned().collect()
    }
}
