//! Following a task (SEP-2663) to its outcome: a 2026-07-28 call the server answered with a
//! `CreateTaskResult` is polled with `tasks/get` until it finishes, its input requests answered
//! through the hooks with `tasks/update`, and its statuses checked in order (a finished task never
//! changes again; a task the server forgets was lost, not finished). A poll that fails in transit
//! is sent again: reads and answers are safe to repeat.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tether_core::input_required;
use tether_core::jsonrpc::{ErrorObject, code};
use tether_core::tasks::{TaskStatus, method};

use crate::backoff::Attempts;
use crate::client::{Client, InFlight};
use crate::{ClientError, ClientEvent, RequestError};

/// The shortest and longest pause between two polls, whatever the server asks.
const POLL_BOUNDS: (u64, u64) = (20, 5_000);

fn protocol(message: String) -> RequestError {
    RequestError::Client(ClientError::Protocol(message))
}

/// Follows the task `created` announced until it finishes: its result, or why it has none.
pub(crate) async fn follow(
    client: &Client,
    created: &Value,
    in_flight: Option<&InFlight>,
) -> Result<Value, RequestError> {
    let Some(id) = created.get("taskId").and_then(Value::as_str).map(str::to_owned) else {
        return Err(protocol("a CreateTaskResult without a taskId".into()));
    };
    if let Some(in_flight) = in_flight {
        in_flight.set_task(&id);
    }
    let pause =
        created.get("pollIntervalMs").and_then(Value::as_u64).unwrap_or(500).clamp(POLL_BOUNDS.0, POLL_BOUNDS.1);
    let pause = Duration::from_millis(pause);
    let mut last: Option<TaskStatus> = None;
    let mut answered: HashSet<String> = HashSet::new();
    let mut retries = Attempts::new(client.config().backoff);
    let mut seen = created.clone();
    loop {
        let status = seen.get("status").and_then(Value::as_str).and_then(TaskStatus::parse);
        let Some(status) = status else { return Err(protocol(format!("task {id} has no valid status: {seen}"))) };
        if let Some(previous) = last
            && previous != status
            && !previous.may_become(status)
        {
            return Err(protocol(format!(
                "task {id} went from {} to {}: a finished task never changes",
                previous.as_str(),
                status.as_str()
            )));
        }
        if last != Some(status) {
            last = Some(status);
            client.emit(ClientEvent::Task {
                task_id: id.clone(),
                status,
                message: seen.get("statusMessage").and_then(Value::as_str).map(str::to_owned),
            });
        }
        match status {
            TaskStatus::Completed => {
                return seen
                    .get("result")
                    .cloned()
                    .ok_or_else(|| protocol(format!("task {id} completed without a result")));
            }
            TaskStatus::Failed => {
                let error =
                    seen.get("error").and_then(|e| ErrorObject::from_value(e.clone()).ok()).unwrap_or_else(|| {
                        ErrorObject::with_reason(
                            code::INTERNAL_ERROR,
                            "the task failed without saying why",
                            "task_failed",
                        )
                    });
                return Err(RequestError::Rpc(error));
            }
            TaskStatus::Cancelled => {
                return Err(RequestError::Rpc(ErrorObject::with_reason(
                    code::INTERNAL_ERROR,
                    format!("task {id} was cancelled"),
                    "task_cancelled",
                )));
            }
            TaskStatus::InputRequired => {
                let mut answers = Map::new();
                for (key, asked, params) in input_required::requests(&seen) {
                    if answered.insert(key.to_owned()) {
                        let answer = client.config().hooks.answer(asked, params).await.map_err(RequestError::Rpc)?;
                        answers.insert(key.to_owned(), answer);
                    }
                }
                if !answers.is_empty() {
                    let update = json!({"taskId": id, "inputResponses": answers});
                    repeat(client, method::UPDATE, update, &mut retries, None).await?;
                    seen = repeat(client, method::GET, json!({"taskId": id}), &mut retries, None).await?;
                    continue;
                }
            }
            TaskStatus::Working => {}
        }
        tokio::time::sleep(pause).await;
        let progress = seen.get("lastUpdatedAt").and_then(Value::as_str).map(str::to_owned);
        seen = repeat(client, method::GET, json!({"taskId": id}), &mut retries, progress.as_deref()).await?;
    }
}

/// Sends a `tasks/*` request until it is answered: one that failed in transit is sent again
/// after the backoff (the budget refills whenever the task moved, `progress`). An unknown task
/// (-32602) was lost by the server: its outcome is unknown.
async fn repeat(
    client: &Client,
    name: &str,
    params: Value,
    retries: &mut Attempts,
    progress: Option<&str>,
) -> Result<Value, RequestError> {
    loop {
        let error = match client.send_once(name, params.clone(), None).await {
            Ok(result) => return Ok(result),
            Err(RequestError::Rpc(error)) if error.code == code::INVALID_PARAMS => {
                let id = params.get("taskId").and_then(Value::as_str).unwrap_or_default();
                return Err(RequestError::OutcomeUnknown(format!(
                    "the server no longer knows task {id}: {}",
                    error.message
                )));
            }
            Err(error @ (RequestError::Cancelled | RequestError::OutcomeUnknown(_) | RequestError::NotExecuted(_))) => {
                error
            }
            Err(other) => return Err(other),
        };
        let Some(delay) = retries.next_delay(progress, None) else { return Err(error) };
        tokio::time::sleep(delay).await;
    }
}
