//! Writes that end what others wait on (a request's stream, a key's outcome, a task's end),
//! tried until the store takes them.
//!
//! Left undone, such a write keeps its readers waiting for ever: a re-send waits on a key still
//! running, a client on a stream still live, a poller on a task still working, and no other
//! replica ends them while this process lives (its heartbeat says it runs them). A store that
//! fails answers nobody else either, so trying until it answers again (a Redis failover takes
//! seconds, and a fenced write is refused until a replica is back) takes nothing from anyone.
//! The way out is this process stopping: its lease then lapses, and the other replicas end what
//! it ran as aborted.

use std::future::Future;
use std::time::Duration;

use tether_store::StoreError;

/// The pause after the first failure; each next one is twice as long, up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_secs(1);
/// Past the first failure, one warning every this many.
const WARN_EVERY: u32 = 30;

/// Does `write` until the store takes it or refuses it for a reason trying again cannot change
/// (anything but [`StoreError::Backend`]), and answers how it ended. `what` names the write in
/// the warnings.
pub(crate) async fn until_stored<T, F, Fut>(what: &'static str, mut write: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut pause = FIRST_PAUSE;
    let mut failures = 0u32;
    loop {
        match write().await {
            Err(StoreError::Backend(err)) => {
                failures = failures.saturating_add(1);
                if failures % WARN_EVERY == 1 {
                    tracing::warn!(%err, failures, "could not record {what}; trying again until the store takes it");
                }
            }
            done => return done,
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A store that fails for longer than any fixed number of tries would cover (a minute: a
    /// failover whose fenced writes wait for a replica) still gets the write, and a refusal that
    /// trying again cannot change ends the tries at once.
    #[tokio::test(start_paused = true)]
    async fn a_write_is_tried_until_the_store_takes_it_and_not_past_a_refusal() {
        let tries = AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let written = until_stored("a test write", || async {
            let n = tries.fetch_add(1, Ordering::SeqCst);
            if started.elapsed() < Duration::from_secs(60) {
                Err(StoreError::Backend(format!("down ({n})")))
            } else {
                Ok(n)
            }
        })
        .await;
        assert!(written.is_ok(), "{written:?}");
        assert!(started.elapsed() >= Duration::from_secs(60), "not before the store answers");
        assert!(started.elapsed() < Duration::from_secs(62), "within a pause of it: {:?}", started.elapsed());
        // 50, 100, …, 800 ms, then a second at a time.
        let tries = tries.load(Ordering::SeqCst);
        assert!((60..=70).contains(&tries), "pauses that grow to a second, then stay: {tries}");

        let refused = AtomicU32::new(0);
        let answer: Result<(), _> = until_stored("a test write", || async {
            refused.fetch_add(1, Ordering::SeqCst);
            Err(StoreError::SessionGone)
        })
        .await;
        assert_eq!(answer, Err(StoreError::SessionGone));
        assert_eq!(refused.load(Ordering::SeqCst), 1, "a refusal is not tried again");
    }
}
