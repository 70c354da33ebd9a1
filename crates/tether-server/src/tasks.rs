//! Tasks (SEP-2663) on the server: a `tools/call` a handler escalates becomes a task, created
//! durably before its `CreateTaskResult` is sent; its tool then runs on in this process, asking
//! for input through the task (`tasks/update` answers it) instead of the connection, and its
//! outcome is recorded with the task. `tasks/get`, `tasks/update`, `tasks/cancel` and
//! `tasks/stream` (the task's events, SEP-2694's shape) are served from the store, so any replica
//! sharing it answers them.
//!
//! The process running a task learns of a cancel or an answer at once when it arrived here or the
//! store announces changes between replicas (Redis), and otherwise within
//! [`ServerConfig::task_poll_interval`](crate::ServerConfig::task_poll_interval) (it reads the
//! task back from the store).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use serde_json::{Map, Value, json};
use tether_core::input_required;
use tether_core::jsonrpc::{ErrorObject, Message, Request, RequestId, Response};
use tether_core::mcp::meta;
use tether_core::tasks::{self, StreamRefusal, TaskChange, TaskId, TaskRecord, TaskStatus, method};
use tether_store::{Store, StoreError, StoredTask, TaskLimits};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::ContextError;
use crate::refusal::Refusal;
use crate::request::context::notification;
use crate::request::context::{Context, Input};
use crate::request::idempotency;
use crate::{ServerState, ids, now_ms};

/// What a request that may become a task carries until it does, and its task's id after.
pub(crate) struct TaskSlot {
    /// The request's id, for the `CreateTaskResult` that answers it.
    pub request_id: RequestId,
    /// Who sent it: the only one who may see the task.
    pub principal: Option<String>,
    /// The request's (then the task's) cancellation.
    pub cancel: CancellationToken,
    id: OnceLock<TaskId>,
    /// Held while the task is being created, so two escalations create one task.
    creating: tokio::sync::Mutex<()>,
}

impl TaskSlot {
    /// Cancels the request unless it became a task: decided under the lock a creation holds,
    /// so a connection that ends while the task is being created either cancels the request
    /// before it becomes one or finds it a task.
    pub async fn cancel_unless_task(&self) {
        let _creating = self.creating.lock().await;
        if self.id().is_none() {
            self.cancel.cancel();
        }
    }

    pub fn new(request_id: RequestId, principal: Option<String>, cancel: CancellationToken) -> TaskSlot {
        TaskSlot { request_id, principal, cancel, id: OnceLock::new(), creating: tokio::sync::Mutex::new(()) }
    }

    /// The task's id, once the request became one.
    pub fn id(&self) -> Option<&TaskId> {
        self.id.get()
    }
}

/// The tasks this process runs (how to cancel each), and a counter per task that whatever waits
/// here on that task watches (its run, its streams): bumped when the task changes here or, as the
/// store announces, at another replica. A change wakes only what waits on that task.
#[derive(Default)]
pub(crate) struct Runners {
    running: Mutex<HashMap<TaskId, CancellationToken>>,
    watched: Mutex<HashMap<TaskId, watch::Sender<u64>>>,
}

/// Locks plain data, changed in single statements: consistent after a panic elsewhere.
fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Runners {
    /// Applies `change` to task `id` and wakes what waits on it here.
    pub async fn update(
        &self,
        store: &dyn Store,
        id: &TaskId,
        change: TaskChange,
    ) -> Result<Option<(StoredTask, bool)>, StoreError> {
        let updated = store.update_task(id, change, now_ms()).await;
        if let Ok(Some((_, true))) = &updated {
            self.changed(id);
        }
        updated
    }

    /// A watch of task `id`'s changes, for a wait on it (run or stream).
    pub fn watch(&self, id: &TaskId) -> watch::Receiver<u64> {
        locked(&self.watched).entry(id.clone()).or_insert_with(|| watch::Sender::new(0)).subscribe()
    }

    /// Task `id` changed: what waits on it looks again. A counter nobody watches any more goes.
    pub fn changed(&self, id: &TaskId) {
        let mut watched = locked(&self.watched);
        match watched.get(id) {
            Some(counter) if counter.receiver_count() > 0 => counter.send_modify(|n| *n = n.wrapping_add(1)),
            Some(_) => {
                watched.remove(id);
            }
            None => {}
        }
    }

    /// Some changes made elsewhere were missed: everything waiting here looks again.
    pub fn changed_all(&self) {
        locked(&self.watched).retain(|_, counter| {
            counter.send_modify(|n| *n = n.wrapping_add(1));
            counter.receiver_count() > 0
        });
    }

    /// Forgets task `id`'s counter if nothing watches it any more.
    fn unwatched(&self, id: &TaskId) {
        let mut watched = locked(&self.watched);
        if watched.get(id).is_some_and(|counter| counter.receiver_count() == 0) {
            watched.remove(id);
        }
    }

    /// Cancels the run of task `id`, if it runs here.
    fn cancel(&self, id: &TaskId) {
        if let Some(token) = locked(&self.running).get(id) {
            token.cancel();
        }
    }
}

fn store_failed(err: StoreError) -> ErrorObject {
    Refusal::StoreFailed.error(format!("the store failed: {err}"))
}

/// Turns the request of `slot` into a task: records it (with the response that created it as the
/// outcome of its idempotency key `key`, so a re-send is answered with the same task), registers
/// its run here, and returns its `CreateTaskResult`. The caller answers the request with it.
pub(crate) async fn create(
    shared: &Arc<ServerState>,
    slot: &TaskSlot,
    key: Option<&str>,
) -> Result<Option<Value>, ContextError> {
    let _creating = slot.creating.lock().await;
    // Already a task; or cancelled first (its connection ended), and then it never becomes one.
    if slot.id().is_some() || slot.cancel.is_cancelled() {
        return Ok(None);
    }
    let id = ids::task_id().map_err(|err| ContextError::Random(err.to_string()))?;
    let config = &shared.config;
    let ttl = u64::try_from(config.task_ttl.as_millis()).unwrap_or(u64::MAX);
    let poll = u64::try_from(config.task_poll_interval.as_millis()).unwrap_or(u64::MAX).max(1);
    let record = TaskRecord::new(id.clone(), slot.principal.clone(), now_ms(), Some(ttl.max(1)), Some(poll));
    let created = record.task.created_result();
    let outcome = key.map(|key| (key.to_owned(), idempotency::encode(&Ok(created.clone()))));
    let limits = TaskLimits { total: config.max_tasks, per_principal: config.max_tasks_per_principal };
    if let Err(err) = shared.store.create_task(record, outcome, limits).await {
        if let StoreError::TooManyTasks { principal } = err {
            crate::telemetry::task_refused(principal);
        }
        return Err(err.into());
    }
    {
        let mut running = locked(&shared.task_runners.running);
        running.insert(id.clone(), slot.cancel.clone());
        crate::telemetry::tasks_running(running.len());
    }
    // Set before the response goes out: from then on the connection's end no longer cancels it.
    let _ = slot.id.set(id.clone());
    let changed = shared.task_runners.watch(&id);
    tokio::spawn(watch_cancel(Arc::clone(&shared.store), id, slot.cancel.clone(), changed, config.task_poll_interval));
    Ok(Some(created))
}

/// Cancels a running task's run once the store says it is over (cancelled at another replica).
async fn watch_cancel(
    store: Arc<dyn Store>,
    id: TaskId,
    cancel: CancellationToken,
    changed: watch::Receiver<u64>,
    every: std::time::Duration,
) {
    let mut wait = StoreWait::new(changed, every, cancel.clone().cancelled_owned());
    while wait.next().await {
        if let Ok(Some(task)) = store.task(&id, now_ms()).await
            && task.record.task.status.is_final()
        {
            cancel.cancel();
            return;
        }
    }
}

/// The wait of a loop that looks at the store until it says what the loop waits for: the next
/// look comes when a change is announced (by this process, or relayed from another replica), or
/// after `every` in case an announcement was lost, unless `stop` came first.
struct StoreWait<S> {
    changed: watch::Receiver<u64>,
    every: std::time::Duration,
    stop: std::pin::Pin<Box<S>>,
}

impl<S: Future<Output = ()>> StoreWait<S> {
    fn new(mut changed: watch::Receiver<u64>, every: std::time::Duration, stop: S) -> StoreWait<S> {
        changed.mark_unchanged();
        StoreWait { changed, every, stop: Box::pin(stop) }
    }

    /// Waits for the next look: `false` once `stop` came. A change announced during the look
    /// that follows wakes the wait after it.
    async fn next(&mut self) -> bool {
        tokio::select! {
            _ = self.changed.changed() => {}
            () = tokio::time::sleep(self.every) => {}
            () = &mut self.stop => return false,
        }
        self.changed.mark_unchanged();
        true
    }
}

/// Parks task `id` on what `result` (a handler's input-required result) asks for, until
/// `tasks/update` has answered every request (here or at another replica): the answers and the
/// state for the handler's next round.
pub(crate) async fn ask(ctx: &Context, id: &TaskId, result: &Value) -> Result<Input, ErrorObject> {
    let requests = result.get("inputRequests").and_then(Value::as_object).cloned().unwrap_or_default();
    if requests.is_empty() {
        return Err(Refusal::InputRequiredInvalid.error("a task's input-required result must ask for input"));
    }
    let state = result.get(input_required::STATE).cloned();
    let asked = ctx.task_runners().update(ctx.store().as_ref(), id, TaskChange::Ask { requests, state }).await;
    if !matches!(asked.map_err(store_failed)?, Some((_, true))) {
        // Finished meanwhile (cancelled): nothing will answer.
        return Err(idempotency::cancelled());
    }
    answers(ctx, id).await
}

/// Waits until every input request of task `id` is answered: the answers and the state.
async fn answers(ctx: &Context, id: &TaskId) -> Result<Input, ErrorObject> {
    let mut wait = StoreWait::new(ctx.task_runners().watch(id), ctx.task_poll_interval(), ctx.cancelled());
    loop {
        let task = ctx.store().task(id, now_ms()).await.map_err(store_failed)?;
        let Some(StoredTask { record, .. }) = task else { return Err(idempotency::cancelled()) };
        match record.task.status {
            TaskStatus::Working => {
                return Ok(Input { responses: record.input_responses, state: record.request_state });
            }
            TaskStatus::InputRequired => {}
            _ => return Err(idempotency::cancelled()),
        }
        if !wait.next().await {
            return Err(idempotency::cancelled());
        }
    }
}

/// Records how a task's run ended: its outcome, or (`None`) that it stopped because it was
/// cancelled. The first final change wins: a task cancelled while its tool finished stays
/// cancelled.
pub(crate) async fn finish(shared: &ServerState, id: &TaskId, outcome: Option<Result<Value, ErrorObject>>) {
    let status = match &outcome {
        Some(Ok(_)) => "completed",
        Some(Err(_)) => "failed",
        None => "cancelled",
    };
    let change = outcome.map_or(TaskChange::Cancel, TaskChange::Finish);
    let store = shared.store.as_ref();
    let ended =
        crate::persist::until_stored("how a task ended", || shared.task_runners.update(store, id, change.clone()))
            .await;
    if let Err(err) = ended {
        tracing::error!(%err, task = %id, "could not record how a task ended");
    }
    crate::telemetry::task_ended(status);
    {
        let mut running = locked(&shared.task_runners.running);
        running.remove(id);
        crate::telemetry::tasks_running(running.len());
    }
    shared.task_runners.unwatched(id);
}

/// Task `taskId` of a `tasks/*` request, for `principal`: refused (-32021) to a request that
/// does not declare the extension, and (-32602) for a task that does not exist or is someone
/// else's. A task whose process is gone is failed (`request_aborted`) when read.
async fn find(
    shared: &ServerState,
    principal: Option<&str>,
    request: &Request,
) -> Result<(TaskId, TaskRecord), ErrorObject> {
    let params = request.params.as_ref().unwrap_or(&Value::Null);
    let capabilities = params.get("_meta").and_then(|m| m.get(meta::CLIENT_CAPABILITIES)).unwrap_or(&Value::Null);
    if !tasks::declares_tasks(capabilities) {
        return Err(tasks::missing_capability(&format!("{} needs the tasks extension", request.method)));
    }
    let Some(id) = params.get("taskId").and_then(Value::as_str) else {
        return Err(Refusal::InvalidTaskParams.error("params.taskId must be a string"));
    };
    let unknown = || Refusal::UnknownTask.error(format!("no task {}", crate::excerpt::quoted(id)));
    // An id this server could not have minted names none of its tasks.
    let id = TaskId::parse(id).map_err(|_| unknown())?;
    let task = shared.store.task(&id, now_ms()).await.map_err(store_failed)?;
    let task = task.filter(|t| t.record.principal.as_deref() == principal).ok_or_else(unknown)?;
    let record = if task.abandoned && !task.record.task.status.is_final() {
        let aborted = TaskChange::Finish(Err(idempotency::aborted()));
        let updated = shared.task_runners.update(shared.store.as_ref(), &id, aborted).await.map_err(store_failed)?;
        updated.ok_or_else(unknown)?.0.record
    } else {
        task.record
    };
    Ok((id, record))
}

/// Serves `tasks/get`, `tasks/update` or `tasks/cancel` for `principal` (see [`find`]).
pub(crate) async fn serve(
    shared: &ServerState,
    principal: Option<&str>,
    request: &Request,
) -> Result<Value, ErrorObject> {
    let (id, record) = find(shared, principal, request).await?;
    let params = request.params.as_ref().unwrap_or(&Value::Null);
    let store = shared.store.as_ref();
    let ack = || json!({"resultType": "complete"});
    match request.method.as_str() {
        method::UPDATE => {
            let responses: Map<String, Value> = input_required::responses(params)
                .map_err(|err| Refusal::InvalidInputResponses.error(err.to_string()))?
                .cloned()
                .unwrap_or_default();
            shared.task_runners.update(store, &id, TaskChange::Answer(responses)).await.map_err(store_failed)?;
            Ok(ack())
        }
        method::CANCEL => {
            shared.task_runners.update(store, &id, TaskChange::Cancel).await.map_err(store_failed)?;
            shared.task_runners.cancel(&id);
            Ok(ack())
        }
        _ => Ok(record.detailed()),
    }
}

/// Opens `tasks/stream` (SEP-2694) for `principal`: the task's kept events after the exclusive
/// `after` cursor (all kept without one), then its live events, each with its digest chained to
/// the one before; the response (`{resultType: "complete"}`) ends the stream once the task has
/// finished and its last event went out. A cursor whose next events are no longer kept is refused
/// with `events_gone` (-32010, `earliestSeq`), at the start or when the stream falls that far
/// behind: never a silent skip. Events made at another replica arrive within the poll interval.
pub(crate) async fn stream(
    shared: &Arc<ServerState>,
    principal: Option<&str>,
    request: &Request,
    closed: CancellationToken,
) -> Result<mpsc::Receiver<(Bytes, bool)>, ErrorObject> {
    let (id, record) = find(shared, principal, request).await?;
    let after = match request.params.as_ref().and_then(|p| p.get("after")) {
        None | Some(Value::Null) => None,
        Some(after) => Some(
            after
                .as_u64()
                .ok_or_else(|| Refusal::InvalidTaskParams.error("params.after must be a non-negative integer"))?,
        ),
    };
    if let Err(refusal) = record.events_after(after) {
        return Err(refused(&id, refusal));
    }
    let (tx, rx) = mpsc::channel(64);
    let shared = Arc::clone(shared);
    let request_id = request.id.clone();
    tokio::spawn(async move {
        // Watched before the task is read again, so no change between the two is missed.
        let changes = shared.task_runners.watch(&id);
        send_events(&shared, &id, (after, &request_id), changes, &tx, &closed).await;
        shared.task_runners.unwatched(&id);
    });
    Ok(rx)
}

/// Sends task `id`'s events after `cursor` to `tx`, as they come, then the stream's response
/// (to request `request_id`) once the task has finished; stops when the stream is `closed`.
async fn send_events(
    shared: &ServerState,
    id: &TaskId,
    (mut cursor, request_id): (Option<u64>, &RequestId),
    changes: watch::Receiver<u64>,
    tx: &mpsc::Sender<(Bytes, bool)>,
    closed: &CancellationToken,
) {
    let mut wait = StoreWait::new(changes, shared.config.task_poll_interval, closed.cancelled());
    loop {
        let current = match shared.store.task(id, now_ms()).await {
            Ok(Some(task)) => task.record,
            // Forgotten (its ttl passed) or unreadable: the stream ends with the error that says so.
            Ok(None) => {
                let forgotten = format!("task {} is no longer kept", crate::excerpt::quoted(id.as_str()));
                return end_with(shared, request_id, tx, Refusal::UnknownTask.error(forgotten)).await;
            }
            Err(err) => return end_with(shared, request_id, tx, store_failed(err)).await,
        };
        let events: Vec<Bytes> = match current.events_after(cursor) {
            Ok(events) => events
                .map(|event| {
                    cursor = Some(event.seq);
                    notification(tasks::method::EVENT, event.params(id.as_str()))
                })
                .collect(),
            Err(refusal) => return end_with(shared, request_id, tx, refused(id, refusal)).await,
        };
        for event in events {
            if tx.send((event, false)).await.is_err() {
                return;
            }
        }
        if current.task.status.is_final() {
            let _ = tx.send((response(shared, request_id, Ok(json!({"resultType": "complete"}))), true)).await;
            return;
        }
        if !wait.next().await {
            return;
        }
    }
}

/// Ends a task's stream with `error`, the response to its request `request_id`.
async fn end_with(shared: &ServerState, request_id: &RequestId, tx: &mpsc::Sender<(Bytes, bool)>, error: ErrorObject) {
    let _ = tx.send((response(shared, request_id, Err(error)), true)).await;
}

/// The error a stream that cannot start (or go on) at its cursor ends with.
fn refused(id: &TaskId, refusal: StreamRefusal) -> ErrorObject {
    match refusal {
        StreamRefusal::Gone { earliest } => tasks::events_gone(id.as_str(), earliest),
        StreamRefusal::Ahead { next } => {
            let id = crate::excerpt::quoted(id.as_str());
            Refusal::CursorAhead.error(format!("task {id} has had {next} events: the cursor names none of them"))
        }
    }
}

/// The final response of a stream, decorated as every 2026-07-28 result is.
fn response(shared: &ServerState, id: &RequestId, mut outcome: Result<Value, ErrorObject>) -> Bytes {
    if let Ok(result) = &mut outcome {
        tether_core::translate::stateless_result(method::STREAM, result, &shared.server_info);
    }
    Bytes::from(Message::Response(Response { id: Some(id.clone()), outcome }).to_vec())
}

#[cfg(test)]
mod tests {
    use tether_core::jsonrpc::RequestId;

    use super::*;

    /// A connection that ends while its request is becoming a task finds it a task (and leaves
    /// it running); one that ends before cancels it, and it never becomes one.
    #[tokio::test]
    async fn a_connection_that_ends_during_the_tasks_creation_leaves_the_task_running() {
        let slot = Arc::new(TaskSlot::new(RequestId::Number(1), None, CancellationToken::new()));
        let creating = slot.creating.lock().await;
        let connection = CancellationToken::new();
        let watcher =
            tokio::spawn(crate::request::dispatch::cancel_until_escalated(connection.clone(), Arc::clone(&slot)));
        connection.cancel();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let _ = slot.id.set(TaskId::parse("t1").expect("a task id"));
        drop(creating);
        watcher.await.expect("the watcher ends");
        assert!(!slot.cancel.is_cancelled(), "the task runs on without its connection");

        let before = Arc::new(TaskSlot::new(RequestId::Number(2), None, CancellationToken::new()));
        let connection = CancellationToken::new();
        connection.cancel();
        crate::request::dispatch::cancel_until_escalated(connection, Arc::clone(&before)).await;
        assert!(before.cancel.is_cancelled(), "not a task yet: cancelled with its connection");
    }
}
