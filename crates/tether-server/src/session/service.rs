//! The one owner of a session's life in this process: it begins sessions, serves them (adopting
//! one begun elsewhere before any of its requests runs here), renews, ends and sweeps them. It is
//! the only caller of the session store's writes and the only writer of the map of runtimes.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tether_core::lineage::{IdMap, InvalidReason, SessionId, StreamName, check_session};
use tether_store::{SessionEnd, SessionRecord, SessionStatus, StoreError};

use super::SessionRuntime;
use crate::refusal::Rejection;
use crate::request::context::SessionHandle;
use crate::{ServerState, telemetry};

/// The runtimes of the sessions this process serves. Read by anyone; changed only here.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    map: Mutex<IdMap<SessionId, Arc<SessionRuntime>>>,
}

impl Sessions {
    fn lock(&self) -> MutexGuard<'_, IdMap<SessionId, Arc<SessionRuntime>>> {
        self.map.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The runtime of a live session record, made if this process has none yet (or has one of
    /// an older incarnation, which ends).
    fn runtime(&self, record: &SessionRecord, request_prefix: &str) -> Arc<SessionRuntime> {
        let mut map = self.lock();
        if let Some(runtime) = map.get(&record.id)
            && runtime.epoch == record.epoch
        {
            return Arc::clone(runtime);
        }
        let runtime = Arc::new(SessionRuntime::new(record, request_prefix.to_owned()));
        if let Some(older) = map.insert(record.id.clone(), Arc::clone(&runtime)) {
            older.end();
        }
        telemetry::sessions_live(map.len());
        runtime
    }

    /// The runtime of a session this process serves, if any.
    pub fn get(&self, id: &SessionId) -> Option<Arc<SessionRuntime>> {
        self.lock().get(id).cloned()
    }

    /// Forgets a session and ends its in-process state, which it returns.
    fn remove(&self, id: &SessionId) -> Option<Arc<SessionRuntime>> {
        let mut map = self.lock();
        let runtime = map.remove(id)?;
        runtime.end();
        telemetry::sessions_live(map.len());
        Some(runtime)
    }

    /// Ends `runtime` and forgets it, unless another incarnation of its session replaced it
    /// here meanwhile: that one is left serving.
    fn retire(&self, runtime: &Arc<SessionRuntime>) {
        runtime.end();
        let mut map = self.lock();
        if map.get(&runtime.id).is_some_and(|serving| Arc::ptr_eq(serving, runtime)) {
            map.remove(&runtime.id);
            telemetry::sessions_live(map.len());
        }
    }

    /// Every runtime.
    pub fn all(&self) -> Vec<Arc<SessionRuntime>> {
        self.lock().values().cloned().collect()
    }

    /// The runtimes with running requests or open connections, and those without.
    fn by_activity(&self) -> (Vec<Arc<SessionRuntime>>, Vec<Arc<SessionRuntime>>) {
        self.lock().values().cloned().partition(|runtime| runtime.is_active())
    }
}

/// Begins a session this process initialized: admitted by the store against every live
/// session of every replica sharing it (`max_sessions`), then served here, its handler told.
pub(crate) async fn begin(
    shared: &Arc<ServerState>,
    record: &SessionRecord,
) -> Result<Arc<SessionRuntime>, StoreError> {
    shared.store.create_session(record.clone(), shared.config.max_sessions).await?;
    let runtime = shared.sessions.runtime(record, &shared.process_token);
    // Begun here: its requests are this process's to serve.
    let _ = runtime.adoption.set(true);
    telemetry::session_created();
    shared.handler.session_started(SessionHandle::new(Arc::clone(shared), Arc::clone(&runtime)));
    Ok(runtime)
}

/// The runtime of live session `record`, for reading its streams: any process can, whatever
/// began the session.
pub(crate) fn follow(shared: &ServerState, record: &SessionRecord) -> Arc<SessionRuntime> {
    shared.sessions.runtime(record, &shared.process_token)
}

/// The runtime of live session `record`, for running its requests. A session this process did
/// not begin (before a restart, or at another replica) is adopted first, once, whatever request
/// or stream came first: if the handler cannot serve it, the session ends as `upstream_lost` and
/// the request gets that 404.
pub(crate) async fn serve(shared: &Arc<ServerState>, record: &SessionRecord) -> Result<Arc<SessionRuntime>, Rejection> {
    let runtime = follow(shared, record);
    let adopt = || shared.handler.adopts(&SessionHandle::new(Arc::clone(shared), Arc::clone(&runtime)));
    let adopted = *runtime.adoption.get_or_init(adopt).await;
    if adopted {
        return Ok(runtime);
    }
    end(shared, &runtime, SessionEnd::UpstreamLost, Duration::ZERO).await;
    Err(Rejection::session_invalid(InvalidReason::UpstreamLost))
}

/// How recently a renewal makes another one needless: a busy session is written once a
/// second, not once a request (a tenth of its idle timeout if that is shorter).
const RENEWAL_INTERVAL_MS: u64 = 1_000;

/// Renews a session that was just found live, unless it was renewed within the renewal
/// interval (it then lives at least its idle timeout less that interval). If it ended in
/// between, the reason is decided again from what the store now says; a store failure is a
/// 503, not a lost session.
pub(crate) async fn renew(shared: &ServerState, record: &SessionRecord, now: u64) -> Result<(), Rejection> {
    if !renewal_due(record, now) {
        return Ok(());
    }
    match shared.store.touch_session(&record.id, &record.epoch, now).await {
        Ok(()) => Ok(()),
        Err(StoreError::SessionGone) => {
            let status = shared.store.session(&record.id, now).await.map_err(Rejection::from)?;
            let reason = match check_session(status.lookup(), now) {
                // Live again under the same id: another incarnation replaced ours.
                Ok(_) => InvalidReason::IncarnationMismatch,
                Err(reason) => reason,
            };
            Err(Rejection::session_invalid(reason))
        }
        Err(err) => Err(Rejection::from(err)),
    }
}

/// Whether `record` was last renewed longer ago than the renewal interval.
fn renewal_due(record: &SessionRecord, now: u64) -> bool {
    let interval = RENEWAL_INTERVAL_MS.min(record.idle_ttl_ms / 10);
    record.expires_at_ms.saturating_add(interval) < now.saturating_add(record.idle_ttl_ms)
}

/// Ends the session of `runtime` on the server's side, as `why`: later requests naming it (on
/// any replica) get 404 with `why`'s reason. Requests still running get up to `grace` to finish
/// first; whatever still runs after it is cancelled with the session. Ending a session that
/// already ended, or was replaced by another incarnation, does nothing.
pub(crate) async fn end(shared: &ServerState, runtime: &Arc<SessionRuntime>, why: SessionEnd, grace: Duration) {
    // From now on nothing new starts: the grace is for what runs.
    runtime.close();
    let deadline = tokio::time::Instant::now() + grace;
    while runtime.running() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match shared.store.end_session(&runtime.id, &runtime.epoch, why).await {
        Ok(()) => {
            telemetry::session_ended_by_server(why);
            telemetry::session_over(runtime, Some(why.reason().as_str()));
            tracing::info!(session = %runtime.id, ?why, "session ended by the server");
        }
        Err(err) => tracing::debug!(session = %runtime.id, %err, "the session had already ended"),
    }
    // Whatever happened in the store, this process stops serving this incarnation.
    shared.sessions.retire(runtime);
}

/// Ends live session `record` at its client's request (DELETE): 404 `terminated` from then on.
pub(crate) async fn terminate(shared: &ServerState, record: &SessionRecord) -> Result<(), Rejection> {
    shared.store.end_session(&record.id, &record.epoch, SessionEnd::Terminated).await.map_err(Rejection::from)?;
    if let Some(runtime) = shared.sessions.remove(&record.id) {
        telemetry::session_over(&runtime, None);
    }
    telemetry::session_terminated();
    tracing::debug!(session = %record.id, "session terminated by the client");
    Ok(())
}

/// Ends a session whose store went back in time under it: what a client saw of `stream` (a
/// resume's cursor, or what a connection sent) is not what the store holds. From then on every
/// request naming the session, on every replica, is told `history_rewritten`, and its client
/// starts a new one instead of going on from a history that is not the one it saw.
pub(crate) async fn end_rewritten(shared: &ServerState, runtime: &Arc<SessionRuntime>, stream: &StreamName) {
    tracing::warn!(
        session = %runtime.id,
        %stream,
        "the store no longer holds what a client saw of this stream (it went back in time: a restored backup, \
         a failover to a replica that lagged); the session ends as history_rewritten"
    );
    end(shared, runtime, SessionEnd::HistoryRewritten, Duration::ZERO).await;
}

/// One sweep of the sessions at `now`: those with running requests or open connections are
/// renewed; runtimes of sessions that ended elsewhere are dropped; the store expires idle ones.
/// Only a session the store says is gone ends here; a store hiccup is retried next sweep.
pub(crate) async fn sweep(shared: &ServerState, now: u64) {
    let (active, idle) = shared.sessions.by_activity();
    for runtime in active {
        match shared.store.touch_session(&runtime.id, &runtime.epoch, now).await {
            Ok(()) => {}
            Err(StoreError::SessionGone) => shared.sessions.retire(&runtime),
            Err(err) => tracing::warn!(%err, session = %runtime.id, "could not renew an active session"),
        }
    }
    // Idle runtimes of sessions that ended elsewhere (another replica expired or deleted them)
    // are dropped, so they neither leak nor count against the session limit.
    for runtime in idle {
        let status = shared.store.session(&runtime.id, now).await;
        let live = matches!(&status, Ok(SessionStatus::Live(record)) if record.epoch == runtime.epoch);
        if !live && status.is_ok() {
            shared.sessions.retire(&runtime);
        }
    }
    match shared.store.sweep(now).await {
        Ok(expired) => {
            for id in &expired {
                tracing::debug!(session = %id, "session expired");
                if let Some(runtime) = shared.sessions.remove(id) {
                    telemetry::session_over(&runtime, Some("expired"));
                }
            }
            telemetry::sessions_expired(expired.len());
        }
        Err(err) => tracing::warn!(%err, "store sweep failed"),
    }
}

#[cfg(test)]
mod tests {
    use tether_core::lineage::Epoch;

    use super::*;
    use crate::session::test_record as record;

    #[test]
    fn retiring_an_incarnation_leaves_the_one_that_replaced_it_serving() {
        let sessions = Sessions::default();
        let older = sessions.runtime(&record(1, 1), "p");
        let newer = SessionRecord { epoch: Epoch::parse("FFFFFFFFFFFFFFFFFFFFFF").expect("epoch"), ..record(1, 1) };
        let newer = sessions.runtime(&newer, "p");
        sessions.retire(&older);
        assert!(sessions.get(&older.id).is_some_and(|serving| Arc::ptr_eq(&serving, &newer)), "still served");
        sessions.retire(&newer);
        assert!(sessions.get(&newer.id).is_none());
    }

    #[test]
    fn a_session_is_renewed_once_per_interval_not_per_request() {
        // Renewed at 10,000 with a 60 s timeout: not again within the second, then again.
        assert!(!renewal_due(&record(60_000, 70_000), 10_000));
        assert!(!renewal_due(&record(60_000, 70_000), 11_000));
        assert!(renewal_due(&record(60_000, 70_000), 11_001));
        // A short timeout renews within a tenth of it.
        assert!(!renewal_due(&record(200, 1_200), 1_020));
        assert!(renewal_due(&record(200, 1_200), 1_021));
    }
}
