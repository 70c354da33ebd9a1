//! A store that fails or holds chosen calls of a real one (feature `faults`, for tests): the
//! exact interleavings the request lifecycle must survive, such as the Nth write failing, or a
//! claim still in the store when its client goes away. Everything else is the real store's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tether_core::lineage::{Epoch, SessionId, StreamName, StreamRange};
use tether_core::tasks::{TaskChange, TaskId, TaskRecord};
use tokio::sync::{broadcast, watch};

use crate::{
    BeginRequest, Claim, EventLog, HeadWatch, KeyClaim, KeyRecords, KeyState, Relay, RelayedAnswer, ReplicaMessage,
    RequestKey, RequestRecord, SessionEnd, SessionRecord, SessionStatus, SessionStore, Store, StoreError, StoreFuture,
    StoredEvent, StoredTask, StreamPage, TaskLimits, TaskStore,
};

/// A store call a fault can be put on: the writes of a request's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Call {
    /// [`EventLog::begin_request`].
    BeginRequest,
    /// [`EventLog::begin_request_pipelined`]'s future (holds only: it cannot fail here).
    BeginRequestPipelined,
    /// [`EventLog::begin_keyed_request`].
    BeginKeyedRequest,
    /// [`EventLog::append_batch`] (and [`EventLog::append`], which goes through it).
    AppendBatch,
    /// [`EventLog::append_final`].
    AppendFinal,
    /// [`EventLog::end_stream`].
    EndStream,
    /// [`EventLog::abort_stream`].
    AbortStream,
    /// [`KeyRecords::claim_key`].
    ClaimKey,
    /// [`KeyRecords::finish_key`].
    FinishKey,
    /// [`KeyRecords::release_key`].
    ReleaseKey,
    /// [`TaskStore::task`]: a task's read.
    Task,
}

/// Calls of one kind that fail: after `skip` that succeed, the next `count`.
#[derive(Debug, Clone, Copy)]
struct Failing {
    skip: u32,
    count: u32,
}

#[derive(Default)]
struct Plan {
    failing: HashMap<Call, Failing>,
    /// Held before they reach the store.
    held: HashMap<Call, Arc<Hold>>,
    /// Held once the store did them, before they return.
    held_after: HashMap<Call, Arc<Hold>>,
    calls: HashMap<Call, u32>,
}

/// A held call: [`Hold::reached`] resolves once it waits, and it goes on once
/// [`Hold::release`] is called.
#[derive(Debug)]
pub struct Hold {
    reached: watch::Sender<bool>,
    released: watch::Sender<bool>,
}

impl Hold {
    /// Resolves once the held call is waiting.
    pub async fn reached(&self) {
        let mut reached = self.reached.subscribe();
        let _ = reached.wait_for(|reached| *reached).await;
    }

    /// Lets the held call go on.
    pub fn release(&self) {
        self.released.send_replace(true);
    }

    fn new() -> Arc<Hold> {
        Arc::new(Hold { reached: watch::Sender::new(false), released: watch::Sender::new(false) })
    }

    /// Waits here until released.
    async fn wait(&self) {
        self.reached.send_replace(true);
        let mut released = self.released.subscribe();
        let _ = released.wait_for(|released| *released).await;
    }
}

/// A [`Store`] whose chosen calls fail or wait; see the module's documentation.
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    plan: Mutex<Plan>,
}

impl FaultyStore {
    /// `inner`, with no fault planned yet.
    pub fn new(inner: Arc<dyn Store>) -> FaultyStore {
        FaultyStore { inner, plan: Mutex::default() }
    }

    fn plan(&self) -> MutexGuard<'_, Plan> {
        self.plan.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The `n`th call of `call` from now (1: the next) fails, with nothing of it done.
    pub fn fail_nth(&self, call: Call, n: u32) {
        self.fail(call, n.saturating_sub(1), 1);
    }

    /// After `skip` calls of `call` that succeed, the next `count` fail.
    pub fn fail(&self, call: Call, skip: u32, count: u32) {
        self.plan().failing.insert(call, Failing { skip, count });
    }

    /// The next call of `call` waits, before it reaches the store, until the returned hold is
    /// released.
    pub fn hold_next(&self, call: Call) -> Arc<Hold> {
        let hold = Hold::new();
        self.plan().held.insert(call, Arc::clone(&hold));
        hold
    }

    /// The next call of `call` is done in the store, then waits until the returned hold is
    /// released before it returns.
    pub fn hold_next_after(&self, call: Call) -> Arc<Hold> {
        let hold = Hold::new();
        self.plan().held_after.insert(call, Arc::clone(&hold));
        hold
    }

    /// How many calls of `call` were made.
    pub fn calls(&self, call: Call) -> u32 {
        self.plan().calls.get(&call).copied().unwrap_or(0)
    }

    /// Counts a call of `call`, holds it if planned, and fails it if planned.
    async fn enter(&self, call: Call) -> Result<(), StoreError> {
        let (hold, fails) = {
            let mut plan = self.plan();
            *plan.calls.entry(call).or_default() += 1;
            let hold = plan.held.remove(&call);
            let fails = match plan.failing.get_mut(&call) {
                Some(failing) if failing.skip > 0 => {
                    failing.skip -= 1;
                    false
                }
                Some(failing) if failing.count > 0 => {
                    failing.count -= 1;
                    true
                }
                _ => false,
            };
            (hold, fails)
        };
        if let Some(hold) = hold {
            hold.wait().await;
        }
        if fails { Err(StoreError::Backend(format!("injected failure of {call:?}"))) } else { Ok(()) }
    }

    /// Holds a call the store did, if planned, and returns what the store said.
    async fn leave<T>(&self, call: Call, done: Result<T, StoreError>) -> Result<T, StoreError> {
        let hold = self.plan().held_after.remove(&call);
        if let Some(hold) = hold {
            hold.wait().await;
        }
        done
    }
}

impl SessionStore for FaultyStore {
    fn create_session(&self, record: SessionRecord, max_live: usize) -> StoreFuture<'_, ()> {
        self.inner.create_session(record, max_live)
    }

    fn session(&self, id: &SessionId, now_ms: u64) -> StoreFuture<'_, SessionStatus> {
        self.inner.session(id, now_ms)
    }

    fn touch_session(&self, id: &SessionId, epoch: &Epoch, now_ms: u64) -> StoreFuture<'_, ()> {
        self.inner.touch_session(id, epoch, now_ms)
    }

    fn end_session(&self, id: &SessionId, epoch: &Epoch, end: SessionEnd) -> StoreFuture<'_, ()> {
        self.inner.end_session(id, epoch, end)
    }

    fn set_standalone_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        self.inner.set_standalone_stream(session, epoch, stream)
    }

    fn standalone_stream(&self, session: &SessionId) -> StoreFuture<'_, Option<StreamName>> {
        self.inner.standalone_stream(session)
    }

    fn sweep(&self, now_ms: u64) -> StoreFuture<'_, Vec<SessionId>> {
        self.inner.sweep(now_ms)
    }

    fn leave(&self) -> StoreFuture<'_, ()> {
        self.inner.leave()
    }

    fn reachable(&self) -> StoreFuture<'_, ()> {
        self.inner.reachable()
    }
}

/// The owned copy of a request's record, for a call that outlives its borrow.
struct OwnedRequest {
    session: SessionId,
    epoch: Epoch,
    key: RequestKey,
    params_digest: String,
    stream: StreamName,
}

impl OwnedRequest {
    fn of(request: &RequestRecord<'_>) -> OwnedRequest {
        OwnedRequest {
            session: request.session.clone(),
            epoch: request.epoch.clone(),
            key: request.key.clone(),
            params_digest: request.params_digest.to_owned(),
            stream: request.stream.clone(),
        }
    }

    fn record(&self) -> RequestRecord<'_> {
        RequestRecord {
            session: &self.session,
            epoch: &self.epoch,
            key: &self.key,
            params_digest: &self.params_digest,
            stream: &self.stream,
        }
    }
}

impl EventLog for FaultyStore {
    fn open_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        self.inner.open_stream(session, epoch, stream)
    }

    fn begin_request(&self, request: RequestRecord<'_>) -> StoreFuture<'_, BeginRequest> {
        let request = OwnedRequest::of(&request);
        Box::pin(async move {
            self.enter(Call::BeginRequest).await?;
            let done = self.inner.begin_request(request.record()).await;
            self.leave(Call::BeginRequest, done).await
        })
    }

    fn begin_request_pipelined(&self, request: RequestRecord<'_>) -> Option<StoreFuture<'static, BeginRequest>> {
        let begun = self.inner.begin_request_pipelined(request)?;
        let hold = {
            let mut plan = self.plan();
            *plan.calls.entry(Call::BeginRequestPipelined).or_default() += 1;
            plan.held.remove(&Call::BeginRequestPipelined)
        };
        Some(Box::pin(async move {
            if let Some(hold) = hold {
                hold.wait().await;
            }
            begun.await
        }))
    }

    fn begin_keyed_request(
        &self,
        request: RequestRecord<'_>,
        claim: KeyClaim,
    ) -> StoreFuture<'_, (BeginRequest, Option<Claim>)> {
        // A claim's failure planned: the two steps of a backend that cannot make them one, each
        // through this store, where the claim fails.
        if self.plan().failing.get(&Call::ClaimKey).is_some_and(|failing| failing.count > 0) {
            return crate::begin_then_claim(self, request, claim);
        }
        let request = OwnedRequest::of(&request);
        Box::pin(async move {
            self.enter(Call::BeginKeyedRequest).await?;
            let done = self.inner.begin_keyed_request(request.record(), claim).await;
            self.leave(Call::BeginKeyedRequest, done).await
        })
    }

    fn append_batch(
        &self,
        session: &SessionId,
        epoch: &Epoch,
        stream: &StreamName,
        events: Vec<Bytes>,
        last: bool,
    ) -> StoreFuture<'_, u64> {
        let (session, epoch, stream) = (session.clone(), epoch.clone(), stream.clone());
        Box::pin(async move {
            self.enter(Call::AppendBatch).await?;
            let done = self.inner.append_batch(&session, &epoch, &stream, events, last).await;
            self.leave(Call::AppendBatch, done).await
        })
    }

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
            self.enter(Call::AppendFinal).await?;
            let done = self.inner.append_final(&session, &epoch, &stream, events, last, &key).await;
            self.leave(Call::AppendFinal, done).await
        })
    }

    fn end_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let (session, epoch, stream) = (session.clone(), epoch.clone(), stream.clone());
        Box::pin(async move {
            self.enter(Call::EndStream).await?;
            let done = self.inner.end_stream(&session, &epoch, &stream).await;
            self.leave(Call::EndStream, done).await
        })
    }

    fn abort_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let (session, epoch, stream) = (session.clone(), epoch.clone(), stream.clone());
        Box::pin(async move {
            self.enter(Call::AbortStream).await?;
            let done = self.inner.abort_stream(&session, &epoch, &stream).await;
            self.leave(Call::AbortStream, done).await
        })
    }

    fn stream_range(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, Option<StreamRange>> {
        self.inner.stream_range(session, stream)
    }

    fn stream_request(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, Option<RequestKey>> {
        self.inner.stream_request(session, stream)
    }

    fn read(
        &self,
        session: &SessionId,
        stream: &StreamName,
        after: u64,
        max: usize,
    ) -> StoreFuture<'_, Vec<StoredEvent>> {
        self.inner.read(session, stream, after, max)
    }

    fn read_page(
        &self,
        session: &SessionId,
        stream: &StreamName,
        after: u64,
        max: usize,
    ) -> StoreFuture<'_, Option<StreamPage>> {
        self.inner.read_page(session, stream, after, max)
    }

    fn watch(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, HeadWatch> {
        self.inner.watch(session, stream)
    }

    fn retained_bytes(&self) -> StoreFuture<'_, Option<u64>> {
        self.inner.retained_bytes()
    }
}

impl KeyRecords for FaultyStore {
    fn records(&self) -> StoreFuture<'_, String> {
        self.inner.records()
    }

    fn claim_key(&self, claim: KeyClaim) -> StoreFuture<'_, Claim> {
        Box::pin(async move {
            self.enter(Call::ClaimKey).await?;
            let done = self.inner.claim_key(claim).await;
            self.leave(Call::ClaimKey, done).await
        })
    }

    fn take_over_key(&self, claim: KeyClaim) -> StoreFuture<'_, bool> {
        self.inner.take_over_key(claim)
    }

    fn key_state(&self, key: &str, now_ms: u64) -> StoreFuture<'_, Option<KeyState>> {
        self.inner.key_state(key, now_ms)
    }

    fn finish_key(&self, key: &str, outcome: Bytes) -> StoreFuture<'_, ()> {
        let key = key.to_owned();
        Box::pin(async move {
            self.enter(Call::FinishKey).await?;
            let done = self.inner.finish_key(&key, outcome).await;
            self.leave(Call::FinishKey, done).await
        })
    }

    fn release_key(&self, key: &str) -> StoreFuture<'_, ()> {
        let key = key.to_owned();
        Box::pin(async move {
            self.enter(Call::ReleaseKey).await?;
            let done = self.inner.release_key(&key).await;
            self.leave(Call::ReleaseKey, done).await
        })
    }
}

impl TaskStore for FaultyStore {
    fn create_task(&self, record: TaskRecord, key: Option<(String, Bytes)>, limits: TaskLimits) -> StoreFuture<'_, ()> {
        self.inner.create_task(record, key, limits)
    }

    fn task(&self, id: &TaskId, now_ms: u64) -> StoreFuture<'_, Option<StoredTask>> {
        let id = id.clone();
        Box::pin(async move {
            self.enter(Call::Task).await?;
            let done = self.inner.task(&id, now_ms).await;
            self.leave(Call::Task, done).await
        })
    }

    fn update_task(&self, id: &TaskId, change: TaskChange, now_ms: u64) -> StoreFuture<'_, Option<(StoredTask, bool)>> {
        self.inner.update_task(id, change, now_ms)
    }

    fn task_changes(&self) -> Option<broadcast::Receiver<TaskId>> {
        self.inner.task_changes()
    }
}

impl Relay for FaultyStore {
    fn relay_answer(&self, answer: RelayedAnswer) -> StoreFuture<'_, bool> {
        self.inner.relay_answer(answer)
    }

    fn relayed_answers(&self) -> Option<broadcast::Receiver<RelayedAnswer>> {
        self.inner.relayed_answers()
    }

    fn announce(&self, announcement: Bytes) -> StoreFuture<'_, ()> {
        self.inner.announce(announcement)
    }

    fn announcements(&self) -> Option<broadcast::Receiver<Bytes>> {
        self.inner.announcements()
    }

    fn session_replica(&self, session: &SessionId) -> StoreFuture<'_, Option<crate::ReplicaId>> {
        self.inner.session_replica(session)
    }

    fn replica_alive(&self, replica: &crate::ReplicaId, now_ms: u64) -> StoreFuture<'_, bool> {
        self.inner.replica_alive(replica, now_ms)
    }

    fn send_to_replica(&self, to: &crate::ReplicaId, body: Bytes) -> StoreFuture<'_, bool> {
        self.inner.send_to_replica(to, body)
    }

    fn replica_messages(&self) -> Option<broadcast::Receiver<ReplicaMessage>> {
        self.inner.replica_messages()
    }
}
