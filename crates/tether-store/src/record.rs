//! The records a store keeps.

use bytes::Bytes;
use tether_core::lineage::{Epoch, InvalidReason, SessionId, SessionLookup, StreamAt, StreamName, StreamRange, Tag};
use tether_core::mcp::ProtocolVersion;

use crate::RequestKey;
use tether_core::idempotency::Acknowledged;

/// A session as the server created it.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    /// The session id handed to the client.
    pub id: SessionId,
    /// The incarnation's replay epoch.
    pub epoch: Epoch,
    /// Who created the session; only they may use it. `None` without authentication.
    pub principal: Option<String>,
    /// The negotiated protocol version.
    pub protocol_version: ProtocolVersion,
    /// The client's `initialize` params (capabilities, client info), so any replica can serve it.
    /// Shared: every lookup of a live session returns its record.
    pub client: std::sync::Arc<serde_json::Value>,
    /// How long the session lives without activity.
    pub idle_ttl_ms: u64,
    /// When it expires unless renewed, in milliseconds since the Unix epoch.
    pub expires_at_ms: u64,
}

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// By DELETE or by the server.
    Terminated,
    /// By idle expiry.
    Expired,
    /// By the server, because the upstream server it fronts (a gateway's) stopped serving it.
    UpstreamLost,
    /// By the server, because the store went back in time under it: a client's cursor named
    /// history the store no longer holds.
    HistoryRewritten,
}

impl SessionEnd {
    /// Why a request naming a session that ended this way is refused.
    pub fn reason(self) -> InvalidReason {
        match self {
            SessionEnd::Terminated => InvalidReason::Terminated,
            SessionEnd::Expired => InvalidReason::Expired,
            SessionEnd::UpstreamLost => InvalidReason::UpstreamLost,
            SessionEnd::HistoryRewritten => InvalidReason::HistoryRewritten,
        }
    }
}

/// What a store knows about a session id.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionStatus {
    /// Never issued, or forgotten.
    Unknown,
    /// Ended, and remembered as such.
    Ended(SessionEnd),
    /// A live record; it may be past its deadline if no sweep has run since.
    Live(SessionRecord),
}

impl SessionStatus {
    /// The view the lineage decisions take.
    pub fn lookup(&self) -> SessionLookup<'_> {
        match self {
            SessionStatus::Unknown => SessionLookup::Unknown,
            SessionStatus::Ended(SessionEnd::Terminated) => SessionLookup::Terminated,
            SessionStatus::Ended(SessionEnd::Expired) => SessionLookup::Expired,
            SessionStatus::Ended(SessionEnd::UpstreamLost) => SessionLookup::UpstreamLost,
            SessionStatus::Ended(SessionEnd::HistoryRewritten) => SessionLookup::HistoryRewritten,
            SessionStatus::Live(record) => {
                SessionLookup::Live { epoch: &record.epoch, expires_at_ms: record.expires_at_ms }
            }
        }
    }
}

/// One retained event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// Its position in the stream.
    pub seq: u64,
    /// The tag the store drew for it: the fourth part of its id.
    pub tag: Tag,
    /// Its data: a JSON-RPC message, or empty for the priming event.
    pub data: Bytes,
}

/// A stream's range and events after a cursor, read at one moment:
/// [`EventLog::read_page`](crate::EventLog::read_page).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamPage {
    /// What is retained of the stream.
    pub range: StreamRange,
    /// The tag of the event at the cursor's position, while the store can tell it: the event is
    /// retained, or is the last one before those retained.
    pub at_cursor: Option<Tag>,
    /// The tag of the last event before those retained (`retained_from - 1`), if any was ever
    /// dropped: the id of a notice saying what is gone ends there.
    pub before_retained: Option<Tag>,
    /// Retained events after the cursor, in order.
    pub events: Vec<StoredEvent>,
}

impl StreamPage {
    /// What the page tells of the stream at its cursor.
    pub fn at(&self) -> StreamAt {
        StreamAt { range: self.range, tag: self.at_cursor }
    }
}

/// What a request is recorded with when it begins: the incarnation it was sent in, its key
/// there, the digest of its params (a request sent again with the same key is compared against
/// it) and the stream its output goes to.
#[derive(Debug, Clone, Copy)]
pub struct RequestRecord<'a> {
    /// The session the request was sent in.
    pub session: &'a SessionId,
    /// The incarnation of the session it was sent in.
    pub epoch: &'a Epoch,
    /// Its key in the session.
    pub key: &'a RequestKey,
    /// The digest of its params.
    pub params_digest: &'a str,
    /// The stream its output goes to.
    pub stream: &'a StreamName,
}

/// The outcome of [`EventLog::begin_request`](crate::EventLog::begin_request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeginRequest {
    /// New request: its stream is open and it should run.
    Started,
    /// The request id was already used in this incarnation.
    Existing {
        /// The stream of the original request.
        stream: StreamName,
        /// Whether the params are the same as the original's.
        same_params: bool,
    },
}

/// A request carrying an idempotency key, as [`KeyRecords::claim_key`](crate::KeyRecords::claim_key)
/// records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyClaim {
    /// The key, qualified by the principal that sent it (the server makes it opaque and safe).
    pub key: String,
    /// The digest of the request's method and params, so a reuse with other params is told apart.
    pub params_digest: String,
    /// The session stream its events go to, if it runs in a session (2026-07-28 requests don't).
    pub stream: Option<(SessionId, StreamName)>,
    /// Now, in milliseconds since the Unix epoch.
    pub now_ms: u64,
    /// What the client was told of the key's claim when it sent it before, if it was told.
    pub acknowledged: Option<Acknowledged>,
}

impl KeyClaim {
    /// The session and stream its events go to, as two columns.
    pub(crate) fn columns(&self) -> (Option<&str>, Option<&str>) {
        match &self.stream {
            Some((session, stream)) => (Some(session.as_str()), Some(stream.as_str())),
            None => (None, None),
        }
    }
}

/// Where an idempotency key's request stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyState {
    /// Not finished: running, or `abandoned` by a process that stopped before finishing it (its
    /// effects may be partly applied).
    Running {
        /// The session stream carrying its events, if any.
        stream: Option<(SessionId, StreamName)>,
        /// Its process is gone.
        abandoned: bool,
    },
    /// Finished, with the recorded outcome (`{"result": …}` or `{"error": …}`).
    Finished(Bytes),
}

/// The outcome of [`KeyRecords::claim_key`](crate::KeyRecords::claim_key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key was new: it is now recorded as running in this process, with this
    /// acknowledgement for the client.
    Claimed(Acknowledged),
    /// The key is known.
    Existing {
        /// Whether the params digest matches the recorded one.
        same_params: bool,
        /// Where the recorded request stands.
        state: KeyState,
        /// Its claim, as the records acknowledge it.
        acknowledged: Acknowledged,
    },
    /// The records no longer hold the claim they acknowledged to the client
    /// ([`Acknowledged::regressed`]): the request may have run, and must not run again.
    Regressed,
}

/// How much history a store keeps, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// How long an ended stream stays replayable.
    pub ended_stream_ms: u64,
    /// How long an ended session is remembered as terminated or expired.
    pub tombstone_ms: u64,
    /// Most events retained per stream; older ones are evicted.
    pub max_events_per_stream: usize,
    /// Most event bytes retained per session.
    pub max_bytes_per_session: usize,
    /// Most event bytes retained in all, by the memory backend, and apart from them most bytes
    /// of idempotency outcomes (past it, the oldest finished records are forgotten first). The
    /// durable backends are bounded per session; their total is the disk's or Redis's to bound.
    pub max_bytes_total: usize,
    /// How long a process sharing the store (Redis) may go without a heartbeat before its running
    /// requests are aborted. The embedded store needs none: one process has it at a time.
    pub lease_ms: u64,
    /// How long an idempotency key's record is kept.
    pub idempotency_ms: u64,
    /// Most idempotency records kept; past it, the oldest finished ones are forgotten first.
    pub max_idempotency_records: usize,
    /// Most request ids the memory and Redis stores remember per session, each outliving its
    /// stream so that a re-sent id is attached to its request or told its history expired
    /// instead of running again. Past it, the oldest are forgotten: ids must not be reused within
    /// a session, so only a re-send of a request that old would run again. The embedded store
    /// keeps every id of a live session, on disk.
    pub max_requests_per_session: usize,
    /// Most finished tasks kept (each until its ttl); past it, the sweep forgets those due
    /// first, so that a client finishing tasks faster than they expire cannot grow the store.
    pub max_finished_tasks: usize,
}

impl Retention {
    /// Most tombstones of streams whose events were dropped the memory and Redis stores keep
    /// per session: as many as request ids, whose streams they mostly are.
    pub fn max_tombstones_per_session(&self) -> usize {
        self.max_requests_per_session.max(1)
    }
}

impl Default for Retention {
    /// Five minutes of ended streams, thirty of tombstones, 10,000 events per stream, 64 MiB
    /// per session, 1 GiB in all, a ten-second lease, idempotency records for 24 hours, at most
    /// a million of them, the last 10,000 request ids of each session, and 10,000 finished
    /// tasks.
    fn default() -> Self {
        Retention {
            ended_stream_ms: 5 * 60_000,
            tombstone_ms: 30 * 60_000,
            max_events_per_stream: 10_000,
            max_bytes_per_session: 64 << 20,
            max_bytes_total: 1 << 30,
            lease_ms: 10_000,
            idempotency_ms: 24 * 3_600_000,
            max_idempotency_records: 1_000_000,
            max_requests_per_session: 10_000,
            max_finished_tasks: 10_000,
        }
    }
}
