//! The in-memory store: for tests and ephemeral servers.
//!
//! Nothing survives the process, and every session's epoch is drawn fresh, so a restarted
//! server answers old session ids with 404 instead of pretending to continue them.
//!
//! Every request takes the store's one lock, so no step done under it may cost in proportion
//! to what is retained. What grows with history (sessions, a session's streams, idempotency
//! records) is held in B-trees, which never rehash everything at once as a hash map does when
//! it grows, and queued in chunks, which never copy everything at once as a `VecDeque` does; a
//! sweep visits and forgets history in batches with the lock released in between; and what is
//! forgotten is freed after the lock is released. What may still double and copy is bounded
//! per session or stream by [`Retention`] (request ids, tombstones, one stream's events).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;
use tether_core::lineage::{Epoch, SessionId, StreamName, StreamRange, StreamState, Tag};
use tokio::sync::watch;

use crate::parted::PartedMap;
use crate::queue::ChunkedQueue;
use crate::record::{
    BeginRequest, Claim, KeyClaim, KeyState, RequestRecord, Retention, SessionEnd, SessionRecord, SessionStatus,
    StoredEvent, StreamPage,
};
use crate::{
    CounterStore, EventLog, HeadWatch, KeyRecords, Relay, RelayedAnswer, RequestKey, SessionStore, StoreError,
    StoreFuture, StoredTask, TaskLimits, TaskStore,
};
use tether_core::idempotency::Acknowledged;
use tether_core::tasks::{TaskChange, TaskId, TaskRecord};

/// A [`Store`](crate::Store) held in process memory, bounded by its [`Retention`].
#[derive(Debug)]
pub struct MemoryStore {
    retention: Retention,
    records_id: String,
    inner: Mutex<Inner>,
    /// Tasks: under a lock of their own, which requests that are not tasks never take.
    tasks: Mutex<Tasks>,
}

/// The tasks, by id, and how many of them run, in all and by principal.
#[derive(Debug, Default)]
struct Tasks {
    records: HashMap<TaskId, TaskRecord>,
    running: HashMap<Option<String>, usize>,
    running_total: usize,
}

impl Tasks {
    /// Counts a task that stopped running.
    fn finished(&mut self, principal: &Option<String>) {
        self.running_total = self.running_total.saturating_sub(1);
        if let Some(count) = self.running.get_mut(principal) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.running.remove(principal);
            }
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// Live sessions and the tombstones of ended ones, in a B-tree: it never rehashes them all
    /// at once to grow, and a sweep can visit it a batch at a time.
    sessions: BTreeMap<SessionId, Slot>,
    counters: HashMap<String, i64>,
    /// Counter additions made under an idempotency key → the value they produced.
    counter_ops: BTreeMap<String, i64>,
    keys: BTreeMap<String, KeyRecord>,
    /// How many keys were ever claimed here: each claim's position.
    claims: u64,
    /// The highest position of a claim retention forgot.
    forgotten_through: u64,
    /// The keys of `keys` with their creation times and claims' positions, oldest first, so
    /// that forgetting them never visits the others: the sweep holds the store's one lock. An
    /// entry whose key was released (or released and claimed again) no longer names its record,
    /// and is dropped when it comes up.
    key_order: ChunkedQueue<(u64, String, u64)>,
    /// The bytes of the outcomes `keys` hold: held to [`Retention::max_bytes_total`] apart from
    /// the events', for a client chooses how many keys it sends and how large their outcomes are.
    key_bytes: usize,
    total_bytes: usize,
    /// How many of `sessions` are live.
    live_sessions: usize,
}

/// An idempotency key's request. One process holds a memory store, so a running request is
/// never abandoned: it dies with the store.
#[derive(Debug)]
struct KeyRecord {
    digest: String,
    stream: Option<(SessionId, StreamName)>,
    outcome: Option<Bytes>,
    /// The claim's position.
    at: u64,
}

impl KeyRecord {
    fn state(&self) -> KeyState {
        match &self.outcome {
            Some(outcome) => KeyState::Finished(outcome.clone()),
            None => KeyState::Running { stream: self.stream.clone(), abandoned: false },
        }
    }
}

#[derive(Debug)]
enum Slot {
    Live(Box<LiveSession>),
    Ended { end: SessionEnd, at_ms: Option<u64> },
}

#[derive(Debug)]
struct LiveSession {
    record: SessionRecord,
    /// By name, hashed: a stream is looked up several times a call, and a tree of thousands
    /// compares names at every level.
    streams: PartedMap<StreamName, StreamSlot>,
    /// Request key → (params digest, stream).
    requests: HashMap<RequestKey, (String, StreamName)>,
    /// The keys of `requests`, oldest first, for its bound.
    request_order: VecDeque<RequestKey>,
    standalone: Option<StreamName>,
    bytes: usize,
    ended: Ended,
    /// Streams whose events retention dropped, oldest first: each is kept as a tombstone (its
    /// head and how it ended, no events) so a resume is told exactly what is gone, up to the
    /// bound of [`Retention::max_requests_per_session`].
    tombstones: VecDeque<StreamName>,
}

/// A session's ended streams, oldest first, so that retention finds what to drop without
/// visiting every stream: sweeps and evictions hold the store's one lock.
#[derive(Debug, Default)]
struct Ended {
    /// Streams in the order they ended, each with the time of the first sweep that saw it
    /// ended (`None` until then); retention counts from there.
    queue: ChunkedQueue<(StreamName, Option<u64>)>,
    /// How many at the back are not stamped yet.
    unstamped: usize,
}

impl Ended {
    fn push(&mut self, stream: StreamName) {
        self.queue.push_back((stream, None));
        self.unstamped += 1;
    }

    /// Stamps the streams that ended since the last sweep; says whether the first one is due
    /// to be dropped (stamped `keep_ms` or longer ago).
    fn stamp(&mut self, now_ms: u64, keep_ms: u64) -> bool {
        for (_, at) in self.queue.back_mut(self.unstamped) {
            *at = Some(now_ms);
        }
        self.unstamped = 0;
        self.due(now_ms, keep_ms)
    }

    fn due(&self, now_ms: u64, keep_ms: u64) -> bool {
        self.queue.front().is_some_and(|(_, at)| at.is_some_and(|at| now_ms.saturating_sub(at) >= keep_ms))
    }

    /// The stream that ended first, if it was stamped `keep_ms` or longer ago.
    fn pop_due(&mut self, now_ms: u64, keep_ms: u64) -> Option<StreamName> {
        if !self.due(now_ms, keep_ms) {
            return None;
        }
        self.queue.pop_front().map(|(stream, _)| stream)
    }

    /// The stream that ended first, unless it is `except` (which then ended last: an append
    /// to an ended stream is refused, so only the appending stream itself can be it).
    fn pop_oldest_except(&mut self, except: &StreamName) -> Option<StreamName> {
        if self.queue.front().is_none_or(|(stream, _)| stream == except) {
            return None;
        }
        let (stream, at) = self.queue.pop_front()?;
        if at.is_none() {
            self.unstamped -= 1;
        }
        Some(stream)
    }
}

#[derive(Debug)]
struct StreamSlot {
    events: VecDeque<StoredEvent>,
    /// The tag of the last event dropped, the one just before `events` (`None` until one is).
    before_retained: Option<Tag>,
    /// The bytes of `events`' data.
    bytes: usize,
    head: u64,
    state: StreamState,
    /// The request this stream belongs to.
    request_key: Option<RequestKey>,
    /// Made by the first watch: a response read whole when first read never needs one.
    head_tx: Option<watch::Sender<u64>>,
}

impl StreamSlot {
    fn new(name: &StreamName, request_key: Option<RequestKey>) -> StreamSlot {
        StreamSlot {
            events: VecDeque::from([StoredEvent { seq: 0, tag: Tag::priming(name), data: Bytes::new() }]),
            before_retained: None,
            bytes: 0,
            head: 0,
            state: StreamState::Live,
            request_key,
            head_tx: None,
        }
    }

    fn range(&self) -> StreamRange {
        StreamRange {
            retained_from: self.events.front().map_or(self.head + 1, |e| e.seq),
            head: self.head,
            state: self.state,
        }
    }

    /// The tag of the event at `seq`, if it is retained or is the last one dropped.
    fn tag_at(&self, seq: u64) -> Option<Tag> {
        let first = self.events.front().map_or(self.head + 1, |e| e.seq);
        if seq.checked_add(1) == Some(first) {
            return self.before_retained;
        }
        let index = usize::try_from(seq.checked_sub(first)?).ok()?;
        self.events.get(index).map(|e| e.tag)
    }

    /// Up to `max` retained events with `seq > after`, in order.
    fn events_after(&self, after: u64, max: usize) -> Vec<StoredEvent> {
        let first = self.events.front().map_or(0, |e| e.seq);
        // Sequence numbers are contiguous, so the position of `after + 1` is computed.
        let skip = usize::try_from(after.saturating_add(1).saturating_sub(first)).unwrap_or(usize::MAX);
        self.events.iter().skip(skip).take(max).cloned().collect()
    }

    /// Takes the oldest retained event out, remembering its tag.
    fn pop_oldest(&mut self) -> Option<StoredEvent> {
        let event = self.events.pop_front()?;
        self.before_retained = Some(event.tag);
        self.bytes -= event.data.len();
        Some(event)
    }

    /// Takes every retained event out, remembering the last one's tag.
    fn take_events(&mut self) -> VecDeque<StoredEvent> {
        if let Some(last) = self.events.back() {
            self.before_retained = Some(last.tag);
        }
        self.bytes = 0;
        std::mem::take(&mut self.events)
    }
}

impl LiveSession {
    /// Takes the events of ended stream `name` into `dropped`, for the caller to free once it
    /// released the lock, keeping the stream's tombstone; forgets the oldest tombstones past
    /// the bound. Returns the bytes freed.
    fn drop_events(
        &mut self,
        name: StreamName,
        retention: &Retention,
        dropped: &mut Vec<VecDeque<StoredEvent>>,
    ) -> usize {
        let Some(slot) = self.streams.get_mut(&name) else { return 0 };
        let freed = slot.bytes;
        dropped.push(slot.take_events());
        // Nobody waits on an ended stream: its followers were woken when it ended.
        slot.head_tx = None;
        self.bytes -= freed;
        self.tombstones.push_back(name);
        while self.tombstones.len() > retention.max_tombstones_per_session() {
            if let Some(oldest) = self.tombstones.pop_front() {
                self.streams.remove(&oldest);
            }
        }
        freed
    }
}

impl MemoryStore {
    /// An empty store keeping history as `retention` allows.
    pub fn new(retention: Retention) -> MemoryStore {
        // Without randomness the name is still unique enough within the host: the address of
        // this store and the time.
        let records_id = crate::new_records_id().unwrap_or_else(|_| {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            format!("m{}-{nanos}", std::process::id())
        });
        MemoryStore { retention, records_id, inner: Mutex::new(Inner::default()), tasks: Mutex::default() }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // breaks memory safety, and refusing all further requests would be worse.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Inner {
    fn live(&mut self, session: &SessionId, epoch: &Epoch) -> Result<&mut LiveSession, StoreError> {
        match self.sessions.get_mut(session) {
            Some(Slot::Live(live)) if live.record.epoch == *epoch => Ok(live),
            _ => Err(StoreError::SessionGone),
        }
    }

    fn live_any(&mut self, session: &SessionId) -> Option<&mut LiveSession> {
        match self.sessions.get_mut(session) {
            Some(Slot::Live(live)) => Some(live),
            _ => None,
        }
    }
}

fn ready<T: Send + 'static>(value: Result<T, StoreError>) -> StoreFuture<'static, T> {
    Box::pin(std::future::ready(value))
}

impl SessionStore for MemoryStore {
    fn create_session(&self, record: SessionRecord, max_live: usize) -> StoreFuture<'_, ()> {
        let mut inner = self.lock();
        if inner.sessions.contains_key(&record.id) {
            return ready(Err(StoreError::DuplicateSession));
        }
        if inner.live_sessions >= max_live {
            return ready(Err(StoreError::TooManySessions));
        }
        inner.live_sessions += 1;
        let id = record.id.clone();
        let live = LiveSession {
            record,
            streams: PartedMap::default(),
            requests: HashMap::new(),
            request_order: VecDeque::new(),
            standalone: None,
            bytes: 0,
            ended: Ended::default(),
            tombstones: VecDeque::new(),
        };
        inner.sessions.insert(id, Slot::Live(Box::new(live)));
        ready(Ok(()))
    }

    fn session(&self, id: &SessionId, _now_ms: u64) -> StoreFuture<'_, SessionStatus> {
        let status = match self.lock().sessions.get(id) {
            None => SessionStatus::Unknown,
            Some(Slot::Ended { end, .. }) => SessionStatus::Ended(*end),
            Some(Slot::Live(live)) => SessionStatus::Live(live.record.clone()),
        };
        ready(Ok(status))
    }

    fn touch_session(&self, id: &SessionId, epoch: &Epoch, now_ms: u64) -> StoreFuture<'_, ()> {
        let mut inner = self.lock();
        let result = inner.live(id, epoch).and_then(|live| {
            if now_ms >= live.record.expires_at_ms {
                return Err(StoreError::SessionGone);
            }
            live.record.expires_at_ms = now_ms.saturating_add(live.record.idle_ttl_ms);
            Ok(())
        });
        ready(result)
    }

    fn end_session(&self, id: &SessionId, epoch: &Epoch, end: SessionEnd) -> StoreFuture<'_, ()> {
        let mut inner = self.lock();
        let bytes = match inner.live(id, epoch) {
            Ok(live) => live.bytes,
            Err(err) => return ready(Err(err)),
        };
        inner.total_bytes -= bytes;
        inner.live_sessions -= 1;
        let history = inner.sessions.insert(id.to_owned(), Slot::Ended { end, at_ms: None });
        drop(inner);
        // Freed with the lock released. Dropping the streams drops their watch senders, which
        // ends every live connection.
        drop(history);
        ready(Ok(()))
    }

    fn set_standalone_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let mut inner = self.lock();
        let result = inner.live(session, epoch).map(|live| live.standalone = Some(stream.clone()));
        ready(result)
    }

    fn standalone_stream(&self, session: &SessionId) -> StoreFuture<'_, Option<StreamName>> {
        let mut inner = self.lock();
        ready(Ok(inner.live_any(session).and_then(|live| live.standalone.clone())))
    }

    fn sweep(&self, now_ms: u64) -> StoreFuture<'_, Vec<SessionId>> {
        Box::pin(async move {
            let mut expired = Vec::new();
            let mut due = Vec::new();
            let mut after = None;
            while let Some(last) = self.sweep_sessions(now_ms, after.as_ref(), &mut expired, &mut due) {
                after = Some(last);
                tokio::task::yield_now().await;
            }
            for session in due {
                while self.drop_due_streams(&session, now_ms) {
                    tokio::task::yield_now().await;
                }
            }
            forget_tasks(&mut self.tasks(), now_ms, self.retention.max_finished_tasks);
            loop {
                let (forgotten, more) = forget_keys(&mut self.lock(), now_ms, &self.retention);
                drop(forgotten);
                if !more {
                    break;
                }
                tokio::task::yield_now().await;
            }
            Ok(expired)
        })
    }
}

impl EventLog for MemoryStore {
    fn appends_at_once(&self) -> bool {
        true
    }

    fn open_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let mut inner = self.lock();
        let result = inner.live(session, epoch).map(|live| {
            live.streams.insert_if_absent(stream.clone(), || StreamSlot::new(stream, None));
        });
        ready(result)
    }

    fn begin_request(&self, request: RequestRecord<'_>) -> StoreFuture<'_, BeginRequest> {
        let RequestRecord { session, epoch, key: request_key, params_digest, stream } = request;
        let max_requests = self.retention.max_requests_per_session.max(1);
        // A new request's record and stream are built before the lock, and the records it makes
        // forgotten are freed after it: every request of every session waits for that lock.
        let (key, ordered) = (request_key.to_owned(), request_key.to_owned());
        let record = (params_digest.to_owned(), stream.clone());
        let (name, slot) = (stream.clone(), StreamSlot::new(stream, Some(request_key.to_owned())));
        let mut forgotten = Vec::new();
        let mut inner = self.lock();
        let result = inner.live(session, epoch).map(|live| {
            if let Some((digest, existing)) = live.requests.get(request_key) {
                return BeginRequest::Existing { stream: existing.clone(), same_params: digest == params_digest };
            }
            live.requests.insert(key, record);
            live.request_order.push_back(ordered);
            while live.request_order.len() > max_requests {
                if let Some(oldest) = live.request_order.pop_front() {
                    forgotten.push((live.requests.remove_entry(&oldest), oldest));
                }
            }
            // A stream a batch's earlier request opened is joined as it is.
            live.streams.insert_if_absent(name, || slot);
            BeginRequest::Started
        });
        drop(inner);
        drop(forgotten);
        ready(result)
    }

    fn append_batch(
        &self,
        session: &SessionId,
        epoch: &Epoch,
        stream: &StreamName,
        events: Vec<Bytes>,
        last: bool,
    ) -> StoreFuture<'_, u64> {
        let mut dropped = Vec::new();
        let appended = self.append_locked(session, epoch, stream, events, last, &mut dropped);
        // Freed with the lock released.
        drop(dropped);
        ready(appended)
    }

    fn end_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let mut inner = self.lock();
        let result = inner.live(session, epoch).and_then(|live| {
            let slot = live.streams.get_mut(stream).ok_or(StoreError::UnknownStream)?;
            if slot.state == StreamState::Live {
                slot.state = StreamState::Complete;
                if let Some(tx) = &slot.head_tx {
                    tx.send_replace(slot.head);
                }
                live.ended.push(stream.clone());
            }
            Ok(())
        });
        ready(result)
    }

    fn abort_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let mut inner = self.lock();
        let result = inner.live(session, epoch).and_then(|live| {
            let slot = live.streams.get_mut(stream).ok_or(StoreError::UnknownStream)?;
            if slot.state == StreamState::Live {
                slot.state = StreamState::Aborted;
                if let Some(tx) = &slot.head_tx {
                    tx.send_replace(slot.head);
                }
                live.ended.push(stream.clone());
            }
            Ok(())
        });
        ready(result)
    }

    fn stream_range(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, Option<StreamRange>> {
        let mut inner = self.lock();
        let range = inner.live_any(session).and_then(|live| live.streams.get(stream)).map(StreamSlot::range);
        ready(Ok(range))
    }

    fn stream_request(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, Option<RequestKey>> {
        let mut inner = self.lock();
        let key = inner.live_any(session).and_then(|live| live.streams.get(stream)).and_then(|s| s.request_key.clone());
        ready(Ok(key))
    }

    fn read(
        &self,
        session: &SessionId,
        stream: &StreamName,
        after: u64,
        max: usize,
    ) -> StoreFuture<'_, Vec<StoredEvent>> {
        let mut inner = self.lock();
        let events =
            inner.live_any(session).and_then(|live| live.streams.get(stream)).map(|slot| slot.events_after(after, max));
        ready(Ok(events.unwrap_or_default()))
    }

    fn read_page(
        &self,
        session: &SessionId,
        stream: &StreamName,
        after: u64,
        max: usize,
    ) -> StoreFuture<'_, Option<StreamPage>> {
        let mut inner = self.lock();
        let page = inner.live_any(session).and_then(|live| live.streams.get(stream)).map(|slot| StreamPage {
            range: slot.range(),
            at_cursor: slot.tag_at(after),
            before_retained: slot.before_retained,
            events: slot.events_after(after, max),
        });
        ready(Ok(page))
    }

    fn watch(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, HeadWatch> {
        let mut inner = self.lock();
        let result = inner
            .live_any(session)
            .and_then(|live| live.streams.get_mut(stream))
            .map(|slot| slot.head_tx.get_or_insert_with(|| watch::Sender::new(slot.head)).subscribe())
            .ok_or(StoreError::UnknownStream);
        ready(result)
    }

    fn retained_bytes(&self) -> StoreFuture<'_, Option<u64>> {
        ready(Ok(Some(self.lock().total_bytes as u64)))
    }
}

impl KeyRecords for MemoryStore {
    fn records(&self) -> StoreFuture<'_, String> {
        ready(Ok(self.records_id.clone()))
    }

    fn claim_key(&self, claim: KeyClaim) -> StoreFuture<'_, Claim> {
        let mut inner = self.lock();
        let held = inner.keys.get(&claim.key);
        if let Some(acknowledged) = &claim.acknowledged
            && acknowledged.regressed(&self.records_id, inner.claims, inner.forgotten_through, held.map(|r| r.at))
        {
            return ready(Ok(Claim::Regressed));
        }
        if let Some(record) = held {
            return ready(Ok(Claim::Existing {
                same_params: record.digest == claim.params_digest,
                state: record.state(),
                acknowledged: Acknowledged { records: self.records_id.clone(), position: record.at },
            }));
        }
        inner.claims += 1;
        let position = inner.claims;
        let record = KeyRecord { digest: claim.params_digest, stream: claim.stream, outcome: None, at: position };
        inner.key_order.push_back((claim.now_ms, claim.key.clone(), position));
        inner.keys.insert(claim.key, record);
        ready(Ok(Claim::Claimed(Acknowledged { records: self.records_id.clone(), position })))
    }

    fn take_over_key(&self, _claim: KeyClaim) -> StoreFuture<'_, bool> {
        ready(Ok(false))
    }

    fn key_state(&self, key: &str, _now_ms: u64) -> StoreFuture<'_, Option<KeyState>> {
        ready(Ok(self.lock().keys.get(key).map(KeyRecord::state)))
    }

    fn finish_key(&self, key: &str, outcome: Bytes) -> StoreFuture<'_, ()> {
        let mut inner = self.lock();
        if let Some(record) = inner.keys.get_mut(key)
            && record.outcome.is_none()
        {
            let bytes = outcome.len();
            record.outcome = Some(outcome);
            inner.key_bytes += bytes;
        }
        ready(Ok(()))
    }

    fn release_key(&self, key: &str) -> StoreFuture<'_, ()> {
        let mut inner = self.lock();
        // Its place in `key_order` goes when the sweep reaches it: forgetting a key that is
        // gone already does nothing.
        if inner.keys.get(key).is_some_and(|record| record.outcome.is_none())
            && let Some(record) = inner.keys.remove(key)
        {
            inner.forgotten_through = inner.forgotten_through.max(record.at);
        }
        ready(Ok(()))
    }
}

impl MemoryStore {
    fn tasks(&self) -> MutexGuard<'_, Tasks> {
        // Plain data, changed in single statements: consistent after a panic elsewhere.
        self.tasks.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl TaskStore for MemoryStore {
    fn create_task(&self, record: TaskRecord, key: Option<(String, Bytes)>, limits: TaskLimits) -> StoreFuture<'_, ()> {
        let mut tasks = self.tasks();
        let principal = record.principal.clone();
        if tasks.running.get(&principal).copied().unwrap_or(0) >= limits.per_principal {
            return ready(Err(StoreError::TooManyTasks { principal: true }));
        }
        if tasks.running_total >= limits.total {
            return ready(Err(StoreError::TooManyTasks { principal: false }));
        }
        if !record.task.status.is_final() {
            tasks.running_total += 1;
            *tasks.running.entry(principal).or_default() += 1;
        }
        tasks.records.insert(record.task.id.clone(), record);
        drop(tasks);
        match key {
            Some((key, outcome)) => self.finish_key(&key, outcome),
            None => ready(Ok(())),
        }
    }

    fn task(&self, id: &TaskId, _now_ms: u64) -> StoreFuture<'_, Option<StoredTask>> {
        // One process: every task here is this process's.
        ready(Ok(self.tasks().records.get(id).map(|record| StoredTask { record: record.clone(), abandoned: false })))
    }

    fn update_task(&self, id: &TaskId, change: TaskChange, now_ms: u64) -> StoreFuture<'_, Option<(StoredTask, bool)>> {
        let mut tasks = self.tasks();
        let Some(record) = tasks.records.get_mut(id) else { return ready(Ok(None)) };
        let was_running = !record.task.status.is_final();
        let changed = record.apply(change, now_ms);
        let (stored, ended) = (StoredTask { record: record.clone(), abandoned: false }, record.task.status.is_final());
        if was_running && ended {
            tasks.finished(&stored.record.principal);
        }
        ready(Ok(Some((stored, changed))))
    }
}

impl Relay for MemoryStore {
    fn relay_answer(&self, _answer: RelayedAnswer) -> StoreFuture<'_, bool> {
        // One process: the handler is here or nowhere.
        ready(Ok(false))
    }

    fn relayed_answers(&self) -> Option<tokio::sync::broadcast::Receiver<RelayedAnswer>> {
        None
    }
}

impl CounterStore for MemoryStore {
    fn counter_add(&self, key: &str, amount: i64, once: Option<&str>) -> StoreFuture<'_, i64> {
        let mut inner = self.lock();
        if let Some(value) = once.and_then(|op| inner.counter_ops.get(op)) {
            return ready(Ok(*value));
        }
        let value = inner.counters.entry(key.to_owned()).or_insert(0);
        *value = value.saturating_add(amount);
        let value = *value;
        if let Some(op) = once {
            inner.counter_ops.insert(op.to_owned(), value);
        }
        ready(Ok(value))
    }

    fn counter_get(&self, key: &str) -> StoreFuture<'_, i64> {
        ready(Ok(self.lock().counters.get(key).copied().unwrap_or(0)))
    }
}

/// Most pieces of history (a session, an ended stream's events, an idempotency record) one
/// hold of the lock visits in a sweep: requests get the lock in between, so what a sweep costs
/// them does not grow with what is retained.
const SWEEP_BATCH: usize = 1_024;

impl MemoryStore {
    /// [`EventLog::append_batch`] under the lock; the events of streams evicted to make room are
    /// put in `dropped`.
    fn append_locked(
        &self,
        session: &SessionId,
        epoch: &Epoch,
        stream: &StreamName,
        events: Vec<Bytes>,
        last: bool,
        dropped: &mut Vec<VecDeque<StoredEvent>>,
    ) -> Result<u64, StoreError> {
        let mut tags = crate::tags::fresh_n(events.len()).into_iter();
        let mut inner = self.lock();
        let Inner { sessions, total_bytes, .. } = &mut *inner;
        let live = match sessions.get_mut(session) {
            Some(Slot::Live(live)) if live.record.epoch == *epoch => live,
            _ => return Err(StoreError::SessionGone),
        };
        let slot = live.streams.get_mut(stream).ok_or(StoreError::UnknownStream)?;
        if slot.state != StreamState::Live {
            return Err(StoreError::StreamEnded);
        }
        let mut len = 0;
        for (data, tag) in events.into_iter().zip(&mut tags) {
            len += data.len();
            slot.head += 1;
            slot.events.push_back(StoredEvent { seq: slot.head, tag, data });
        }
        slot.bytes += len;
        let seq = slot.head;
        if last {
            slot.state = StreamState::Complete;
            live.ended.push(stream.clone());
        }
        live.bytes += len;
        *total_bytes += len;
        *total_bytes -= evict(live, stream, &self.retention, *total_bytes, dropped);
        if let Some(tx) = live.streams.get(stream).and_then(|slot| slot.head_tx.as_ref()) {
            tx.send_replace(seq);
        }
        Ok(seq)
    }

    /// Sweeps up to [`SWEEP_BATCH`] sessions after `after`: forgets ended ones past their
    /// tombstone time, ends live ones past their deadline (into `expired`), and stamps the
    /// others' newly ended streams, noting in `due` those with streams past their retention.
    /// Frees the expired sessions' history with the lock released. Returns the last session
    /// visited if there may be more.
    fn sweep_sessions(
        &self,
        now_ms: u64,
        after: Option<&SessionId>,
        expired: &mut Vec<SessionId>,
        due: &mut Vec<SessionId>,
    ) -> Option<SessionId> {
        let retention = self.retention;
        let mut histories = Vec::new();
        let last = {
            let mut inner = self.lock();
            let inner = &mut *inner;
            let from = after.map_or(Bound::Unbounded, Bound::Excluded);
            let mut forgotten = Vec::new();
            let mut freed = 0;
            let mut visited = 0;
            let mut last = None;
            for (id, slot) in inner.sessions.range_mut::<SessionId, _>((from, Bound::Unbounded)).take(SWEEP_BATCH) {
                visited += 1;
                last = Some(id);
                match slot {
                    Slot::Ended { at_ms, .. } => {
                        let at = *at_ms.get_or_insert(now_ms);
                        if now_ms.saturating_sub(at) >= retention.tombstone_ms {
                            forgotten.push(id.clone());
                        }
                    }
                    Slot::Live(live) if now_ms >= live.record.expires_at_ms => {
                        freed += live.bytes;
                        expired.push(id.clone());
                        let ended = Slot::Ended { end: SessionEnd::Expired, at_ms: Some(now_ms) };
                        histories.push(std::mem::replace(slot, ended));
                        inner.live_sessions -= 1;
                    }
                    Slot::Live(live) => {
                        if live.ended.stamp(now_ms, retention.ended_stream_ms) {
                            due.push(id.clone());
                        }
                    }
                }
            }
            let last = (visited == SWEEP_BATCH).then(|| last.cloned()).flatten();
            inner.total_bytes -= freed;
            for id in forgotten {
                inner.sessions.remove(&id);
            }
            last
        };
        drop(histories);
        last
    }

    /// Drops the events of up to [`SWEEP_BATCH`] of `session`'s streams past their retention
    /// and frees them with the lock released. Returns whether more are due.
    fn drop_due_streams(&self, session: &SessionId, now_ms: u64) -> bool {
        let retention = self.retention;
        let mut dropped = Vec::new();
        let more = {
            let mut inner = self.lock();
            let Inner { sessions, total_bytes, .. } = &mut *inner;
            let Some(Slot::Live(live)) = sessions.get_mut(session) else { return false };
            let mut visited = 0;
            while visited < SWEEP_BATCH
                && let Some(stream) = live.ended.pop_due(now_ms, retention.ended_stream_ms)
            {
                visited += 1;
                *total_bytes -= live.drop_events(stream, &retention, &mut dropped);
            }
            live.ended.due(now_ms, retention.ended_stream_ms)
        };
        drop(dropped);
        more
    }
}

/// Forgets up to [`SWEEP_BATCH`] idempotency records: those past their time, then the oldest
/// finished ones past the count bound, with the counter additions made under them. Returns the
/// Forgets the finished tasks that are due at `now_ms`, then, past `max_finished`, those due
/// first.
fn forget_tasks(tasks: &mut Tasks, now_ms: u64, max_finished: usize) {
    tasks.records.retain(|_, task| task.forget_at_ms().is_none_or(|at| at > now_ms));
    let mut finished: Vec<(u64, TaskId)> =
        tasks.records.iter().filter_map(|(id, task)| task.forget_at_ms().map(|at| (at, id.clone()))).collect();
    if finished.len() <= max_finished {
        return;
    }
    finished.sort_unstable();
    for (_, id) in &finished[..finished.len() - max_finished] {
        tasks.records.remove(id);
    }
}

/// records, for the caller to free once it released the lock, and whether more are due.
fn forget_keys(inner: &mut Inner, now_ms: u64, retention: &Retention) -> (Vec<KeyRecord>, bool) {
    let Inner { keys, key_order, counter_ops, forgotten_through, key_bytes, .. } = inner;
    let outcome_bytes = |record: &KeyRecord| record.outcome.as_ref().map_or(0, Bytes::len);
    let mut forgotten = Vec::new();
    while forgotten.len() < SWEEP_BATCH
        && key_order.front().is_some_and(|(created, ..)| now_ms.saturating_sub(*created) >= retention.idempotency_ms)
    {
        if let Some((_, key, at)) = key_order.pop_front()
            && let Some(record) = keys.get(&key).filter(|record| record.at == at)
        {
            *key_bytes = key_bytes.saturating_sub(outcome_bytes(record));
            forgotten.push(key);
        }
    }
    let mut excess = keys.len().saturating_sub(forgotten.len()).saturating_sub(retention.max_idempotency_records);
    // A running request's record is never forgotten for the count or the bytes: set aside, then
    // put back. Those are bounded by the requests in flight, not by history.
    let mut running = Vec::new();
    while (excess > 0 || *key_bytes > retention.max_bytes_total)
        && forgotten.len() < SWEEP_BATCH
        && let Some((created, key, at)) = key_order.pop_front()
    {
        match keys.get(&key) {
            Some(record) if record.at != at => {}
            Some(record) if record.outcome.is_none() => running.push((created, key, at)),
            Some(record) => {
                *key_bytes = key_bytes.saturating_sub(outcome_bytes(record));
                forgotten.push(key);
                excess = excess.saturating_sub(1);
            }
            None => {}
        }
    }
    for entry in running.into_iter().rev() {
        key_order.push_front(entry);
    }
    let more = forgotten.len() == SWEEP_BATCH;
    let records: Vec<KeyRecord> = forgotten
        .into_iter()
        .filter_map(|key| {
            counter_ops.remove(&key);
            keys.remove(&key)
        })
        .collect();
    *forgotten_through = records.iter().map(|record| record.at).fold(*forgotten_through, u64::max);
    (records, more)
}

/// Evicts history until `stream`, its session and the global total are within `retention`:
/// ended streams of the session go first, the earliest ended first, then the oldest events of
/// `stream` itself (never its newest). Another session's history is never evicted for this one.
/// Returns the bytes freed; the events of dropped streams are put in `dropped`, for the caller
/// to free once it released the lock.
fn evict(
    live: &mut LiveSession,
    stream: &StreamName,
    retention: &Retention,
    total_bytes: usize,
    dropped: &mut Vec<VecDeque<StoredEvent>>,
) -> usize {
    let mut freed = 0;
    let over = |bytes: usize, freed: usize| {
        bytes > retention.max_bytes_per_session || total_bytes - freed > retention.max_bytes_total
    };
    while over(live.bytes, freed) {
        let Some(name) = live.ended.pop_oldest_except(stream) else { break };
        freed += live.drop_events(name, retention, dropped);
    }
    let LiveSession { streams, bytes, .. } = live;
    if let Some(slot) = streams.get_mut(stream) {
        while slot.events.len() > 1 && (slot.events.len() > retention.max_events_per_stream || over(*bytes, freed)) {
            let Some(event) = slot.pop_oldest() else { break };
            *bytes -= event.data.len();
            freed += event.data.len();
        }
    }
    freed
}
