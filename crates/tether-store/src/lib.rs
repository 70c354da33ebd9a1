//! Storage for tether: sessions with their incarnations, streams of events and request records
//! behind one [`Store`] trait cut by concern, and the built-in tools' counters beside it.
//!
//! Every write that belongs to a session names the incarnation (its [`Epoch`]) it expects and
//! fails if the session has moved on, so a stale writer can never extend a new incarnation's
//! history. Reads never renew anything: the server decides on what it read, and renews a session
//! only through [`SessionStore::touch_session`].

#[cfg(feature = "faults")]
pub mod faults;
mod heads;
mod memory;
mod parted;
mod queue;
mod record;
mod redis;
mod replica;
mod request_key;
mod sqlite;
mod tags;

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use tether_core::lineage::{Epoch, SessionId, StreamName, StreamRange};
use tether_core::tasks::{TaskChange, TaskId, TaskRecord};

pub use memory::MemoryStore;
pub use record::{
    BeginRequest, Claim, KeyClaim, KeyState, RequestRecord, Retention, SessionEnd, SessionRecord, SessionStatus,
    StoredEvent, StreamPage,
};
pub use redis::{RedisDurability, RedisStore};
pub use replica::{InvalidReplicaId, ReplicaId};
pub use request_key::{MalformedKey, RequestKey};
pub use sqlite::SqliteStore;

/// A boxed future returned by [`Store`] methods, so the trait works as `dyn Store`.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The session does not exist, has ended, or is in another incarnation than the writer's.
    #[error("session is gone or in another incarnation")]
    SessionGone,
    /// A session with this id already exists (ids are never reused).
    #[error("session id already exists")]
    DuplicateSession,
    /// As many sessions as allowed are live already.
    #[error("too many live sessions")]
    TooManySessions,
    /// As many tasks as allowed run already: in all, or (`principal`) of the creating principal.
    #[error("too many running tasks{}", if *principal { " of this principal" } else { "" })]
    TooManyTasks {
        /// The principal's own cap was reached, not the server's.
        principal: bool,
    },
    /// The stream does not exist in this session.
    #[error("no such stream")]
    UnknownStream,
    /// The stream has ended and takes no more events.
    #[error("stream has ended")]
    StreamEnded,
    /// The backend failed (I/O, connection, corruption).
    #[error("store backend: {0}")]
    Backend(String),
}

/// A fresh random name for a set of idempotency records.
fn new_records_id() -> Result<String, StoreError> {
    let mut bytes = [0u8; 12];
    getrandom::fill(&mut bytes).map_err(|e| StoreError::Backend(format!("no randomness: {e}")))?;
    Ok(tether_core::lineage::base64url(&bytes))
}

/// Watches a stream's head: the value is the highest sequence number written, and it changes
/// whenever an event is appended or the stream ends.
pub type HeadWatch = tokio::sync::watch::Receiver<u64>;

/// A client's answer to a server-to-client request, relayed between replicas: the session, the
/// request id (as the server minted it) and the JSON-RPC response bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayedAnswer {
    /// The session the request belongs to.
    pub session: SessionId,
    /// The id of the server-to-client request.
    pub request_id: String,
    /// The client's JSON-RPC response.
    pub response: Bytes,
}

/// A message one replica sent another ([`Relay::send_to_replica`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaMessage {
    /// The replica that sent it.
    pub from: ReplicaId,
    /// What it sent.
    pub body: Bytes,
}

/// Where sessions, events and request records live: every concern of the store the server's
/// guarantees rest on, held as one `Arc<dyn Store>`. Implemented for whatever implements the
/// five. Counters are not among them: they are state of the built-in tools
/// ([`CounterStore`]), which each backend also keeps.
///
/// Implementations must make each method atomic: in particular [`EventLog::append`] checks the
/// incarnation and assigns the next sequence number in one step, and
/// [`EventLog::begin_request`] records the request and opens its stream in one step.
pub trait Store: SessionStore + EventLog + KeyRecords + Relay + TaskStore + 'static {}

impl<T: SessionStore + EventLog + KeyRecords + Relay + TaskStore + 'static> Store for T {}

/// Sessions: created under a limit, renewed, ended, expired by the sweep, each with its
/// incarnation (epoch) and its standalone stream.
pub trait SessionStore: Send + Sync {
    /// Records a new session, unless `max_live` sessions are live already: then it fails with
    /// [`StoreError::TooManySessions`]. Live sessions are counted in the same step, over every
    /// process sharing the store and across restarts of a durable one. Fails with
    /// [`StoreError::DuplicateSession`] if the id was ever used.
    fn create_session(&self, record: SessionRecord, max_live: usize) -> StoreFuture<'_, ()>;

    /// Reads a session's status at `now_ms` without renewing it.
    fn session(&self, id: &SessionId, now_ms: u64) -> StoreFuture<'_, SessionStatus>;

    /// Renews a live session of incarnation `epoch` until `now_ms + idle_ttl`. Fails with
    /// [`StoreError::SessionGone`] if it is unknown, ended, expired at `now_ms`, or rotated.
    fn touch_session(&self, id: &SessionId, epoch: &Epoch, now_ms: u64) -> StoreFuture<'_, ()>;

    /// Ends a session of incarnation `epoch`; later lookups report how it ended.
    fn end_session(&self, id: &SessionId, epoch: &Epoch, end: SessionEnd) -> StoreFuture<'_, ()>;

    /// Makes `stream` the session's standalone stream: where server-initiated messages go, on
    /// whichever replica they are produced.
    fn set_standalone_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()>;

    /// The session's standalone stream, if the client opened one.
    fn standalone_stream(&self, session: &SessionId) -> StoreFuture<'_, Option<StreamName>>;

    /// Applies retention at `now_ms`: drops ended streams past their retention, forgets ended
    /// sessions past their tombstone time and finished tasks past their ttl, and marks sessions past their deadline expired. It is
    /// also this process's heartbeat where processes share a store (Redis): requests owned by a
    /// process whose heartbeat is older than the lease are marked aborted. Idempotency records
    /// past their time, and the oldest finished ones past the count bound, are forgotten.
    /// Returns the ids of sessions it expired.
    fn sweep(&self, now_ms: u64) -> StoreFuture<'_, Vec<SessionId>>;

    /// This process stops serving with requests still running (its drain timed out): what it
    /// runs ends aborted, its keys and tasks read as abandoned, and where processes share the
    /// store it is gone to the others at once, not after the request lease. It heartbeats no
    /// more. A store that serves a single
    /// process finds what was left running when it is next opened, and does nothing here.
    fn leave(&self) -> StoreFuture<'_, ()> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Whether the store answers now, for a readiness probe: a round trip to Redis, a read of the
    /// embedded store (which fails for good once a flush to disk failed).
    fn reachable(&self) -> StoreFuture<'_, ()> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// The event log: streams, their events, and the request records that open them. A keyed
/// request begins and ends with its key's record in one step where the backend can, hence
/// [`KeyRecords`] beneath it.
pub trait EventLog: KeyRecords {
    /// Opens a stream whose event 0 is the priming event (empty data).
    fn open_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()>;

    /// Records `request` and opens its stream, unless its key is already recorded in this
    /// incarnation: then it reports the existing one.
    fn begin_request(&self, request: RequestRecord<'_>) -> StoreFuture<'_, BeginRequest>;

    /// [`EventLog::begin_request`] for a request without effects (a read-only tool), pipelined:
    /// `Some` if the store has ordered the record by the time this returns, before every write
    /// to it issued afterwards, so that the caller may run the request and write its output at
    /// once, without waiting for the answer. The answer comes once the record is decided, which
    /// may be before it is durable: what is written after the call becomes durable, and visible,
    /// only after the record. If the key was known (the answer is `Existing`), `stream` was never
    /// opened, so every write to it fails with [`StoreError::UnknownStream`] and changes nothing.
    /// A crash before the record is durable loses it, and the same request sent again runs
    /// again, which changes nothing. The answer does not borrow the store, so it may be awaited
    /// in a task of the request's own.
    ///
    /// `None` if the store cannot order a write before its future runs (the memory and Redis
    /// stores, whose [`EventLog::begin_request`] answers about as soon anyway): then use that.
    fn begin_request_pipelined(&self, _request: RequestRecord<'_>) -> Option<StoreFuture<'static, BeginRequest>> {
        None
    }

    /// [`EventLog::begin_request`] and, if the request started, [`KeyRecords::claim_key`] for its
    /// idempotency key (`Some` exactly then): in one step where the backend can (the embedded
    /// store: one transaction, one disk flush).
    fn begin_keyed_request(
        &self,
        request: RequestRecord<'_>,
        claim: KeyClaim,
    ) -> StoreFuture<'_, (BeginRequest, Option<Claim>)> {
        begin_then_claim(self, request, claim)
    }

    /// Appends an event and returns its sequence number. With `last`, the stream ends after it
    /// (a request's final response). Fails if the session is not in incarnation `epoch`.
    fn append(
        &self,
        session: &SessionId,
        epoch: &Epoch,
        stream: &StreamName,
        data: Bytes,
        last: bool,
    ) -> StoreFuture<'_, u64> {
        self.append_batch(session, epoch, stream, vec![data], last)
    }

    /// Whether an append is done when it returns, at the cost of a lock (the memory store):
    /// a request's output is then written as it is sent, in the request's own task, instead of
    /// by a writer task that batches what queued up while the store flushed or answered.
    fn appends_at_once(&self) -> bool {
        false
    }

    /// Appends `events` in order in one step (the embedded store: one transaction and one disk
    /// flush; Redis: one script call), ending the stream after them if `last`; returns the
    /// sequence number of the last. Retention ends as if they had come one by one. A stream's
    /// writer hands over whatever queued up meanwhile, so a backend that took a step per event
    /// would pay a flush or a round trip per event.
    fn append_batch(
        &self,
        session: &SessionId,
        epoch: &Epoch,
        stream: &StreamName,
        events: Vec<Bytes>,
        last: bool,
    ) -> StoreFuture<'_, u64>;

    /// Appends a request's final `events`, the last of them its response, ending the stream
    /// after them if `last` (a request that shares its stream with others, as the requests of
    /// a batch do, leaves it open), and records that response as the outcome of idempotency key
    /// `key`: in one step where the backend can (the embedded store: one transaction, one disk
    /// flush). The outcome is recorded even if the append fails (the session ended meanwhile):
    /// the request ran, and a re-send must learn how.
    fn append_final(
        &self,
        session: &SessionId,
        epoch: &Epoch,
        stream: &StreamName,
        events: Vec<Bytes>,
        last: bool,
        key: &str,
    ) -> StoreFuture<'_, u64> {
        let (session, epoch, stream, key) = (session.clone(), epoch.clone(), stream.clone(), key.to_owned());
        Box::pin(async move {
            let outcome = events.last().cloned().unwrap_or_default();
            let appended = self.append_batch(&session, &epoch, &stream, events, last).await;
            self.finish_key(&key, outcome).await?;
            appended
        })
    }

    /// Ends a stream without a final event (a batch's, once each of its requests answered on
    /// it). Idempotent.
    fn end_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()>;

    /// Ends a live request stream as aborted: it will not get its response (the response could
    /// not be written, or the request could not run), and readers end it with a
    /// `request_aborted` notice and error. A stream that already ended is left as it is.
    fn abort_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()>;

    /// What is retained of a stream, or `None` if the session never had such a stream. A
    /// request's stream whose owning process is gone is reported `Aborted`. A stream whose
    /// events retention dropped is still reported, retaining nothing (its tombstone: head and
    /// how it ended), for as long as its session lives (the memory and Redis stores: for the
    /// session's last [`Retention::max_requests_per_session`] dropped streams), so a resume is
    /// told exactly what is gone instead of being told the stream never existed.
    fn stream_range(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, Option<StreamRange>>;

    /// The key of the request a stream belongs to, if it is a request's stream (tombstones
    /// included).
    fn stream_request(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, Option<RequestKey>>;

    /// Up to `max` retained events with `seq > after`, in order.
    fn read(
        &self,
        session: &SessionId,
        stream: &StreamName,
        after: u64,
        max: usize,
    ) -> StoreFuture<'_, Vec<StoredEvent>>;

    /// [`EventLog::stream_range`] and [`EventLog::read`] together, read at one moment, for
    /// whoever follows a stream, with the tags a follower checks its history against
    /// ([`StreamPage::at_cursor`], [`StreamPage::before_retained`]): if the range says the
    /// stream ended, every event it ended with is among those read, so an empty page of an ended
    /// stream means "nothing more". `None` if the session has no such stream.
    fn read_page(
        &self,
        session: &SessionId,
        stream: &StreamName,
        after: u64,
        max: usize,
    ) -> StoreFuture<'_, Option<StreamPage>>;

    /// A watch on the stream's head, for following live events.
    fn watch(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, HeadWatch>;

    /// Event bytes retained for live sessions, if the backend keeps the sum (Redis spreads it
    /// over every session's hash and answers `None`).
    fn retained_bytes(&self) -> StoreFuture<'_, Option<u64>>;
}

/// [`EventLog::begin_keyed_request`] in two steps, for a backend that cannot make it one: the
/// request's record, then its key's claim. A claim that fails after the record was made aborts
/// the request's stream (once; if that fails too, the stream is aborted when this process
/// leaves the store): nothing will run the request, and a re-send of its id that attaches to the
/// stream must be told so, not wait for a response that never comes.
pub fn begin_then_claim<'a, S: EventLog + ?Sized>(
    store: &'a S,
    request: RequestRecord<'_>,
    claim: KeyClaim,
) -> StoreFuture<'a, (BeginRequest, Option<Claim>)> {
    let (session, epoch, key, params_digest, stream) = (
        request.session.clone(),
        request.epoch.clone(),
        request.key.clone(),
        request.params_digest.to_owned(),
        request.stream.clone(),
    );
    Box::pin(async move {
        let request = RequestRecord {
            session: &session,
            epoch: &epoch,
            key: &key,
            params_digest: &params_digest,
            stream: &stream,
        };
        let begun = store.begin_request(request).await?;
        if let BeginRequest::Existing { .. } = begun {
            return Ok((begun, None));
        }
        match store.claim_key(claim).await {
            Ok(claimed) => Ok((begun, Some(claimed))),
            Err(err) => {
                let _ = store.abort_stream(&session, &epoch, &stream).await;
                Err(err)
            }
        }
    })
}

/// Idempotency records: which request a key ran, where it stands, how it ended.
pub trait KeyRecords: Send + Sync {
    /// Names the place idempotency records live: the same for every process sharing this store,
    /// and across restarts of a durable one; new for every memory store, and new once a shared
    /// store lost its records (a Redis that restarted empty), so it is read from the store each
    /// time. Clients re-issue a keyed request only to a server reporting the name it was first
    /// sent under, so a re-issue never reaches records that never saw the first attempt.
    fn records(&self) -> StoreFuture<'_, String>;

    /// Records an idempotency key as running in this process, unless it is recorded already:
    /// then reports where that request stands. One atomic step, so two requests with one key
    /// never both run. A claim the client was acknowledged before that the records no longer
    /// hold ([`Acknowledged::regressed`](tether_core::idempotency::Acknowledged::regressed)) is
    /// [`Claim::Regressed`], and claims nothing.
    fn claim_key(&self, claim: KeyClaim) -> StoreFuture<'_, Claim>;

    /// Claims, for this process, a key whose request was abandoned (its process stopped before
    /// finishing it) with the same params digest: `true` if this process now owns it. For
    /// requests whose effects are themselves keyed, so running them again applies nothing twice.
    fn take_over_key(&self, claim: KeyClaim) -> StoreFuture<'_, bool>;

    /// Where the request of an idempotency key stands, if the key is recorded.
    fn key_state(&self, key: &str, now_ms: u64) -> StoreFuture<'_, Option<KeyState>>;

    /// Records the outcome of this process's running request for `key` (`{"result": …}` or
    /// `{"error": …}`). A key another process took over meanwhile is left alone.
    fn finish_key(&self, key: &str, outcome: Bytes) -> StoreFuture<'_, ()>;

    /// Forgets this process's claim of `key`, whose request did not run (it could not start) or
    /// must run again (the store failed under a handler that keys its own effects): a re-send
    /// claims the key anew and runs it. The claim counts as forgotten, so a client that was
    /// acknowledged it is not told the records went back in time. A key with an outcome, or
    /// another process's, is left alone.
    fn release_key(&self, key: &str) -> StoreFuture<'_, ()>;
}

/// A task as the store holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredTask {
    /// The task.
    pub record: TaskRecord,
    /// The process running it is gone (the embedded store: another process wrote it; Redis: its
    /// owner's heartbeat lapsed), so an unfinished task will never finish by itself.
    pub abandoned: bool,
}

/// The most tasks that may run at once (working or waiting for input): in all, and of one
/// principal (all unauthenticated clients are one principal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLimits {
    /// Over every principal.
    pub total: usize,
    /// Of one principal.
    pub per_principal: usize,
}

impl TaskLimits {
    /// No cap: for tests of other behaviour.
    pub const NONE: TaskLimits = TaskLimits { total: usize::MAX, per_principal: usize::MAX };
}

/// Tasks (SEP-2663): created durably before the client learns their id, read and changed by any
/// process sharing the store, and owned by the process that runs them, so that a task whose
/// process died is known to be abandoned instead of reading "working" forever.
pub trait TaskStore: Send + Sync {
    /// Records a new task, run by this process. With `key` (an idempotency key's store name and
    /// the outcome to record for it: the response that created the task), the key's request
    /// finishes with it, so a re-sent creation is answered with the same task: in one step
    /// where the backend can (the embedded store: one transaction), else the task first. Fails
    /// with [`StoreError::TooManyTasks`], creating nothing, if `limits` tasks run already,
    /// counted in the same step over every process sharing the store.
    fn create_task(&self, record: TaskRecord, key: Option<(String, Bytes)>, limits: TaskLimits) -> StoreFuture<'_, ()>;

    /// The task with id `id`, if it exists and has not been forgotten.
    fn task(&self, id: &TaskId, now_ms: u64) -> StoreFuture<'_, Option<StoredTask>>;

    /// Applies `change` to task `id` at `now_ms` ([`TaskRecord::apply`]) in one atomic step: the
    /// task as it is afterwards, and whether it changed; `None` if there is no such task.
    fn update_task(&self, id: &TaskId, change: TaskChange, now_ms: u64) -> StoreFuture<'_, Option<(StoredTask, bool)>>;

    /// The ids of tasks changed by other processes sharing the store, as they change (a hint:
    /// whoever waits on a task reads it again); `None` for stores that serve a single process.
    fn task_changes(&self) -> Option<tokio::sync::broadcast::Receiver<TaskId>> {
        None
    }
}

/// The relay between replicas sharing the store: clients' answers, and server-wide
/// announcements.
pub trait Relay: Send + Sync {
    /// Relays a client's answer to the replica whose handler waits for it. Stores that serve a
    /// single process have nobody to relay to and answer `Ok(false)`.
    fn relay_answer(&self, answer: RelayedAnswer) -> StoreFuture<'_, bool>;

    /// Answers relayed by other replicas, for this process's waiting handlers; `None` for stores
    /// that serve a single process.
    fn relayed_answers(&self) -> Option<tokio::sync::broadcast::Receiver<RelayedAnswer>>;

    /// Announces a server-wide notification (a serialized JSON-RPC notification: `list_changed`,
    /// `resources/updated`) to the other replicas, for their `subscriptions/listen` streams. Stores
    /// that serve a single process have nobody to tell.
    fn announce(&self, _announcement: Bytes) -> StoreFuture<'_, ()> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Announcements made by other replicas (never this process's own); `None` for stores that
    /// serve a single process.
    fn announcements(&self) -> Option<tokio::sync::broadcast::Receiver<Bytes>> {
        None
    }

    /// The replica that created `session`, where state of it that is kept in no store lives (a
    /// gateway's upstream instance); `None` for stores that serve a single process.
    fn session_replica(&self, _session: &SessionId) -> StoreFuture<'_, Option<ReplicaId>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Whether the replica named `replica` heartbeat within the request lease before `now_ms`.
    /// One that did not is gone: the sweep aborts its requests, and nothing it held is reachable.
    fn replica_alive(&self, _replica: &ReplicaId, _now_ms: u64) -> StoreFuture<'_, bool> {
        Box::pin(std::future::ready(Ok(false)))
    }

    /// Sends `body` to the replica named `to` (this process included): `Ok(false)` if it does not
    /// listen (it is gone, or the store serves a single process). At most once: a receiver whose
    /// connection to the store drops meanwhile misses it, so whoever waits on an answer asks
    /// again.
    fn send_to_replica(&self, _to: &ReplicaId, _body: Bytes) -> StoreFuture<'_, bool> {
        Box::pin(std::future::ready(Ok(false)))
    }

    /// The messages replicas send this process; `None` for stores that serve a single process.
    fn replica_messages(&self) -> Option<tokio::sync::broadcast::Receiver<ReplicaMessage>> {
        None
    }
}

/// Durable counters, for tools that keep state (the built-in `counter_add`), kept by the same
/// backend as the sessions so they are as durable and as shared between replicas.
pub trait CounterStore: Send + Sync {
    /// Adds `amount` to counter `key` and returns the new value. With `once` (the idempotency key
    /// of the request adding), an addition already made under that key is not made again: its
    /// resulting value is returned. It is remembered at least as long as the key's record.
    fn counter_add(&self, key: &str, amount: i64, once: Option<&str>) -> StoreFuture<'_, i64>;

    /// The value of counter `key` (0 if never set).
    fn counter_get(&self, key: &str) -> StoreFuture<'_, i64>;
}
