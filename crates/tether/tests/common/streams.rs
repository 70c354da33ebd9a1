//! A client's streams under faults: what arrived on each, and what the client said of it
//! (resumes, divergences, re-initializations). The replica and failover runs share it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use tether_client::{Backoff, ClientConfig, ClientEvent};
use tether_core::jsonrpc::Message;
use tether_core::lineage::EventId;

/// A client that reconnects at once and keeps trying while the servers come back.
pub fn fast(url: String) -> ClientConfig {
    let mut config = ClientConfig::new(url);
    config.backoff = Backoff {
        initial: Duration::from_millis(5),
        max: Duration::from_millis(100),
        max_attempts_without_progress: 40,
    };
    config
}

/// Notifications by stream, and everything else that happened.
#[derive(Default)]
pub struct Tally {
    /// The numbers each stream's notifications carried, in the order they arrived.
    pub by_stream: BTreeMap<String, Vec<u64>>,
    /// Streams resumed after a cut.
    pub resumed: u64,
    /// What the client said diverged (a `resync` or 404 it was told of, or found).
    pub divergences: Vec<String>,
    /// Sessions begun again.
    pub reinitialized: u64,
    /// Why each re-sent call was re-sent.
    pub reissued: Vec<String>,
}

impl Tally {
    /// Counts one of the client's events (acknowledging a notification).
    pub fn record(&mut self, event: ClientEvent) {
        match event {
            ClientEvent::Message { id, message: Message::Notification(n), ack, .. } => {
                ack.done();
                let stream = id
                    .as_deref()
                    .and_then(|i| EventId::parse(i).ok())
                    .map(|i| i.stream.to_string())
                    .expect("lineage id");
                let data = &n.params.as_ref().expect("params")["data"];
                let n = data.get("count").or_else(|| data.get("broadcast")).and_then(Value::as_u64).expect("counter");
                self.by_stream.entry(stream).or_default().push(n);
            }
            ClientEvent::Resumed { .. } => self.resumed += 1,
            ClientEvent::Divergence { reason } => self.divergences.push(format!("{}: {reason}", reason.kind())),
            ClientEvent::Reinitialized { .. } => self.reinitialized += 1,
            ClientEvent::Reissued { attempt, reason, .. } => self.reissued.push(format!("{attempt}: {reason}")),
            _ => {}
        }
    }

    /// Streams whose notifications are not what they must be: exactly 1 to `count_to` for a
    /// request's stream (one call each), whole blocks of 1 to `block` for a standalone stream
    /// (one block per broadcast).
    pub fn broken_streams(&self, count_to: u64, block: u64) -> Vec<String> {
        self.by_stream
            .iter()
            .filter(|(stream, seen)| match stream.starts_with('g') {
                true => {
                    !seen.iter().enumerate().all(|(i, n)| *n == (i as u64 % block) + 1)
                        || !(seen.len() as u64).is_multiple_of(block)
                }
                false => **seen != (1..=count_to).collect::<Vec<_>>(),
            })
            .map(|(stream, seen)| format!("{stream}: {seen:?}"))
            .collect()
    }

    /// How many request streams delivered anything.
    pub fn request_streams(&self) -> usize {
        self.by_stream.keys().filter(|stream| !stream.starts_with('g')).count()
    }
}
