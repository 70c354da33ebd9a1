//! What the server counts, through the `metrics` facade (a no-op until the application installs
//! a recorder; `tether serve --metrics` installs a Prometheus one). Names and labels are decided
//! here, once.

use std::time::Duration;

use tether_core::lineage::{InvalidReason, ResyncReason, ServerDecision};

/// A session was created by `initialize`.
pub(crate) fn session_created() {
    metrics::counter!("tether_sessions_created_total").increment(1);
}

/// A session was ended by the client's DELETE.
pub(crate) fn session_terminated() {
    metrics::counter!("tether_sessions_terminated_total").increment(1);
}

/// A session was ended by the server (`SessionHandle::end`), with why: `upstream_lost`,
/// `history_rewritten`.
pub(crate) fn session_ended_by_server(why: tether_store::SessionEnd) {
    let reason = why.reason().as_str();
    metrics::counter!("tether_sessions_ended_by_server_total", "reason" => reason).increment(1);
}

/// Sessions expired by a sweep.
pub(crate) fn sessions_expired(count: usize) {
    metrics::counter!("tether_sessions_expired_total").increment(count as u64);
}

/// Sessions this process serves (set where its set of runtimes changes).
pub(crate) fn sessions_live(live: usize) {
    metrics::gauge!("tether_sessions_live").set(live as f64);
}

/// A connection to a session stream opened (`1`) or closed (`-1`).
pub(crate) fn stream_connections(delta: f64) {
    metrics::gauge!("tether_streams_live").increment(delta);
}

/// Events made durable in the store.
pub(crate) fn events_appended(count: usize) {
    metrics::counter!("tether_events_appended_total").increment(count as u64);
}

/// Events written on connections that resumed a stream (`Last-Event-ID`).
pub(crate) fn events_replayed(count: usize) {
    metrics::counter!("tether_events_replayed_total").increment(count as u64);
}

/// How a resume was decided: `replay`, `session_invalid` or `resync`, with the reason (a
/// replay that starts with what is gone counts as the resync it starts with).
pub(crate) fn resume(decision: &ServerDecision) {
    let (branch, reason) = match decision {
        ServerDecision::Replay { starts, .. } => match starts.resync_reason() {
            Some(reason) => ("resync", reason.as_str()),
            None => ("replay", ""),
        },
        ServerDecision::SessionInvalid(reason) => ("session_invalid", InvalidReason::as_str(*reason)),
        ServerDecision::Resync(notice) => ("resync", notice.reason.as_str()),
    };
    metrics::counter!("tether_resumes_total", "branch" => branch, "reason" => reason).increment(1);
}

/// A resync event was written on a connection (a gap or an aborted request's end, on a resume
/// or a live connection that fell behind).
pub(crate) fn resync_sent(reason: ResyncReason) {
    metrics::counter!("tether_resyncs_sent_total", "reason" => reason.as_str()).increment(1);
}

/// How long a store operation took (`op`: `begin_request`, `append`, `claim_key`). Not measured
/// per read of a followed stream: that is once per event.
pub(crate) fn store_latency(op: &'static str, took: Duration) {
    metrics::histogram!("tether_store_seconds", "op" => op).record(took.as_secs_f64());
}

/// Event bytes the store retains, when it can tell.
pub(crate) fn bytes_retained(bytes: u64) {
    metrics::gauge!("tether_bytes_retained").set(bytes as f64);
}

/// Connections open now (`delta` is +1 or -1).
pub(crate) fn connections_open(delta: f64) {
    metrics::gauge!("tether_connections_open").increment(delta);
}

/// A call was refused as a task: as many ran as allowed, in all or (`principal`) of its
/// principal.
pub(crate) fn task_refused(principal: bool) {
    let cap = if principal { "per_principal" } else { "total" };
    metrics::counter!("tether_tasks_refused_total", "cap" => cap).increment(1);
}

/// A connection over `max_connections` was refused.
pub(crate) fn connection_refused() {
    metrics::counter!("tether_connections_refused_total").increment(1);
}

/// A connection was closed for doing nothing for too long.
pub(crate) fn connection_expired(why: crate::connection::Expiry) {
    metrics::counter!("tether_connections_expired_total", "reason" => why.as_str()).increment(1);
}
