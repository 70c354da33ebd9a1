//! Tasks (SEP-2663) on the server: a `tools/call` a handler escalates becomes a task, created
//! durably before its `CreateTaskResult` is sent; its tool then runs on in this process, asking
//! for input through the task (`tasks/update` answers it) instead of the connection, and its
//! outcome is recorded with the task. `tasks/get`, `tasks/update` and `tasks/cancel` are served
//! from the store, so any replica sharing it answers them.
//!
//! The process running a task learns of a cancel or an answer at once when it arrived here, and
//! within [`ServerConfig::task_poll_interval`](crate::ServerConfig::task_poll_interval) when it
//! arrived at another replica (it reads the task back from the store).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{Map, Value, json};
use tether_core::input_required;
use tether_core::jsonrpc::{ErrorObject, Request, RequestId, code};
use tether_core::mcp::meta;
use tether_core::tasks::{self, TaskChange, TaskRecord, TaskStatus, method};
use tether_store::{Store, StoreError, StoredTask};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::context::{Context, Input};
use crate::{Handler, ServerState, idempotency, ids, now_ms};

/// What a request that may become a task carries until it does, and its task's id after.
pub(crate) struct TaskSlot {
    /// The request's id, for the `CreateTaskResult` that answers it.
    pub request_id: RequestId,
    /// Who sent it: the only one who may see the task.
    pub principal: Option<String>,
    /// The request's (then the task's) cancellation.
    pub cancel: CancellationToken,
    /// Told when the task changed in this process (answered, cancelled).
    pub changed: Arc<Notify>,
    id: OnceLock<String>,
    /// Held while the task is being created, so two escalations create one task.
    creating: tokio::sync::Mutex<()>,
}

impl TaskSlot {
    pub fn new(request_id: RequestId, principal: Option<String>, cancel: CancellationToken) -> TaskSlot {
        TaskSlot {
            request_id,
            principal,
            cancel,
            changed: Arc::default(),
            id: OnceLock::new(),
            creating: tokio::sync::Mutex::new(()),
        }
    }

    /// The task's id, once the request became one.
    pub fn id(&self) -> Option<&str> {
        self.id.get().map(String::as_str)
    }
}

/// The tasks this process runs, by id: how to reach each one when a request about it arrives here.
#[derive(Default)]
pub(crate) struct Runners {
    running: Mutex<HashMap<String, (CancellationToken, Arc<Notify>)>>,
}

impl Runners {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (CancellationToken, Arc<Notify>)>> {
        // Plain data, changed in single statements: consistent after a panic elsewhere.
        self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Wakes the task's run to read the task again; with `cancel`, also cancels it.
    fn wake(&self, id: &str, cancel: bool) {
        if let Some((token, changed)) = self.lock().get(id) {
            if cancel {
                token.cancel();
            }
            changed.notify_one();
        }
    }
}

fn store_failed(err: StoreError) -> ErrorObject {
    ErrorObject::with_reason(code::INTERNAL_ERROR, format!("the store failed: {err}"), "store_failed")
}

/// Turns the request of `slot` into a task: records it (with the response that created it as the
/// outcome of its idempotency key `key`, so a re-send is answered with the same task), registers
/// its run here, and returns its `CreateTaskResult`. The caller answers the request with it.
pub(crate) async fn create(
    shared: &Arc<ServerState>,
    slot: &TaskSlot,
    key: Option<&str>,
) -> Result<Option<Value>, StoreError> {
    let _creating = slot.creating.lock().await;
    if slot.id().is_some() {
        return Ok(None);
    }
    let id = ids::token().map_err(|err| StoreError::Backend(err.to_string()))?;
    let config = &shared.config;
    let ttl = u64::try_from(config.task_ttl.as_millis()).unwrap_or(u64::MAX);
    let poll = u64::try_from(config.task_poll_interval.as_millis()).unwrap_or(u64::MAX).max(1);
    let record = TaskRecord::new(id.clone(), slot.principal.clone(), now_ms(), Some(ttl.max(1)), Some(poll));
    let created = record.task.created_result();
    let outcome = key.map(|key| (key.to_owned(), idempotency::encode(&Ok(created.clone()))));
    shared.store.create_task(record, outcome).await?;
    shared.task_runners.lock().insert(id.clone(), (slot.cancel.clone(), Arc::clone(&slot.changed)));
    // Set before the response goes out: from then on the connection's end no longer cancels it.
    let _ = slot.id.set(id.clone());
    tokio::spawn(watch(Arc::clone(&shared.store), id, slot.cancel.clone(), config.task_poll_interval));
    Ok(Some(created))
}

/// Cancels a running task's run once the store says it is over (cancelled at another replica).
async fn watch(store: Arc<dyn Store>, id: String, cancel: CancellationToken, every: std::time::Duration) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        if let Ok(Some(task)) = store.task(&id, now_ms()).await
            && task.record.task.status.is_final()
        {
            cancel.cancel();
            return;
        }
    }
}

/// Runs a handler for a request that may become a task: once it has, an input-required result
/// parks the task until `tasks/update` answers every request (here or at another replica), and
/// the handler runs again with the answers and its state; before, its result is the request's.
pub(crate) async fn rounds(
    handler: Arc<dyn Handler>,
    ctx: Context,
    method: String,
    params: Value,
) -> Result<Value, ErrorObject> {
    for _ in 0..input_required::MAX_ROUNDS {
        let outcome = handler.call(ctx.clone(), method.clone(), params.clone()).await;
        let Some(id) = ctx.task_id() else { return outcome };
        let result = match outcome {
            Ok(result) if input_required::asks(&result) => result,
            other => return other,
        };
        let requests = result.get("inputRequests").and_then(Value::as_object).cloned().unwrap_or_default();
        if requests.is_empty() {
            return Err(ErrorObject::with_reason(
                code::INTERNAL_ERROR,
                "a task's input-required result must ask for input",
                "input_required_invalid",
            ));
        }
        let state = result.get(input_required::STATE).cloned();
        let asked = ctx.store().update_task(&id, TaskChange::Ask { requests, state }, now_ms()).await;
        if !matches!(asked.map_err(store_failed)?, Some((_, true))) {
            // Finished meanwhile (cancelled): nothing will answer.
            return Err(idempotency::cancelled());
        }
        let input = answers(&ctx, &id).await?;
        ctx.next_round(input);
    }
    Err(ErrorObject::with_reason(
        code::INTERNAL_ERROR,
        format!("the handler still asked for input after {} rounds", input_required::MAX_ROUNDS),
        "input_required_invalid",
    ))
}

/// Waits until every input request of task `id` is answered: the answers and the state.
async fn answers(ctx: &Context, id: &str) -> Result<Input, ErrorObject> {
    let (changed, every) = ctx.task_wakeup().ok_or_else(idempotency::cancelled)?;
    loop {
        let woken = changed.notified();
        let task = ctx.store().task(id, now_ms()).await.map_err(store_failed)?;
        let Some(StoredTask { record, .. }) = task else { return Err(idempotency::cancelled()) };
        match record.task.status {
            TaskStatus::Working => {
                return Ok(Input { responses: record.input_responses, state: record.request_state });
            }
            TaskStatus::InputRequired => {}
            _ => return Err(idempotency::cancelled()),
        }
        tokio::select! {
            () = woken => {}
            () = tokio::time::sleep(every) => {}
            () = ctx.cancelled() => return Err(idempotency::cancelled()),
        }
    }
}

/// Records how a task's run ended: its outcome, or (`None`) that it stopped because it was
/// cancelled. The first final change wins: a task cancelled while its tool finished stays
/// cancelled.
pub(crate) async fn finish(shared: &ServerState, id: &str, outcome: Option<Result<Value, ErrorObject>>) {
    let change = outcome.map_or(TaskChange::Cancel, TaskChange::Finish);
    if let Err(err) = shared.store.update_task(id, change, now_ms()).await {
        tracing::error!(%err, task = id, "could not record how a task ended");
    }
    shared.task_runners.lock().remove(id);
}

/// Whether `method` is one of the extension's that tether serves itself.
pub(crate) fn serves(name: &str) -> bool {
    matches!(name, method::GET | method::UPDATE | method::CANCEL)
}

/// Serves `tasks/get`, `tasks/update` or `tasks/cancel` for `principal`: refused (-32021) to a
/// request that does not declare the extension, and (-32602) for a task that does not exist or
/// is someone else's. A task whose process is gone is failed (`request_aborted`) when read.
pub(crate) async fn serve(
    shared: &ServerState,
    principal: Option<&str>,
    request: &Request,
) -> Result<Value, ErrorObject> {
    let params = request.params.as_ref().unwrap_or(&Value::Null);
    let capabilities = params.get("_meta").and_then(|m| m.get(meta::CLIENT_CAPABILITIES)).unwrap_or(&Value::Null);
    if !tasks::declares_tasks(capabilities) {
        return Err(tasks::missing_capability(&format!("{} needs the tasks extension", request.method)));
    }
    let invalid = |message: String, reason: &str| ErrorObject::with_reason(code::INVALID_PARAMS, message, reason);
    let Some(id) = params.get("taskId").and_then(Value::as_str) else {
        return Err(invalid("params.taskId must be a string".into(), "invalid_params"));
    };
    let unknown = || invalid(format!("no task {id:?}"), "unknown_task");
    let store = &shared.store;
    let now = now_ms();
    let task = store.task(id, now).await.map_err(store_failed)?;
    let task = task.filter(|t| t.record.principal.as_deref() == principal).ok_or_else(unknown)?;
    let record = if task.abandoned && !task.record.task.status.is_final() {
        let aborted = TaskChange::Finish(Err(idempotency::aborted()));
        store.update_task(id, aborted, now).await.map_err(store_failed)?.ok_or_else(unknown)?.0.record
    } else {
        task.record
    };
    let ack = || json!({"resultType": "complete"});
    match request.method.as_str() {
        method::UPDATE => {
            let responses: Map<String, Value> = input_required::responses(params)
                .map_err(|err| invalid(err.to_string(), "invalid_input_responses"))?
                .cloned()
                .unwrap_or_default();
            store.update_task(id, TaskChange::Answer(responses), now).await.map_err(store_failed)?;
            shared.task_runners.wake(id, false);
            Ok(ack())
        }
        method::CANCEL => {
            store.update_task(id, TaskChange::Cancel, now).await.map_err(store_failed)?;
            shared.task_runners.wake(id, true);
            Ok(ack())
        }
        _ => Ok(record.detailed()),
    }
}
