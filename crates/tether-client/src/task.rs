//! Following a task (SEP-2663) to its outcome. A 2026-07-28 call the server answered with a
//! `CreateTaskResult` is followed on the task's event stream (`tasks/stream`, tether's
//! `io.tether/task-streams`) where the server offers one, else by polling `tasks/get`. On the
//! stream every event, refusal and end is judged by [`TaskStreamValidator`]: its `seq` must be
//! the next one and its digest must chain to the previous event's; a gap, a digest that does not
//! chain, `events_gone`, or an end before the task's final status is a divergence, reported,
//! after which the task's canonical state (`tasks/get`) is followed instead. A cut stream is resumed after the last event checked. Either way input
//! requests are answered through the hooks with `tasks/update`, statuses are checked in order (a
//! finished task never changes again), and a task the server forgets was lost, not finished.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tether_core::input_required;
use tether_core::jsonrpc::{self, ErrorObject, Message, Notification, Response, code};
use tether_core::lineage::{TaskStreamBreak, TaskStreamValidator};
use tether_core::tasks::{self, NOTIFICATION_EVENT, STATUS_EVENT, TaskEvent, TaskStatus, method};

use crate::backoff::Attempts;
use crate::client::{Client, InFlight};
use crate::http::Reply;
use crate::session::parse_response;
use crate::{Ack, ClientError, ClientEvent, DivergenceReason, RequestError};

/// The shortest and longest pause between two polls, whatever the server asks.
const POLL_BOUNDS: (u64, u64) = (20, 5_000);

fn protocol(message: String) -> RequestError {
    RequestError::Client(ClientError::Protocol(message))
}

/// One task being followed: its statuses in order, the input already answered, the retry budget.
struct Followed<'a> {
    client: &'a Client,
    id: String,
    last: Option<TaskStatus>,
    /// Whether the server ever showed this task: it created it for this client, or an earlier
    /// run followed it (a checkpointed cursor).
    shown: bool,
    answered: HashSet<String>,
    retries: Attempts,
}

impl Followed<'_> {
    /// Takes `status` in: refused if it follows a final one, reported if it is new.
    fn status(&mut self, status: TaskStatus, message: Option<&str>) -> Result<(), RequestError> {
        if let Some(previous) = self.last
            && previous != status
            && !previous.may_become(status)
        {
            return Err(protocol(format!(
                "task {} went from {} to {}: a finished task never changes",
                self.id,
                previous.as_str(),
                status.as_str()
            )));
        }
        if self.last != Some(status) {
            self.last = Some(status);
            let event = ClientEvent::Task { task_id: self.id.clone(), status, message: message.map(str::to_owned) };
            self.client.emit(event);
        }
        Ok(())
    }

    /// Answers, through the hooks, the input requests of `asked` not answered yet; `true` if it
    /// sent any.
    async fn answer(&mut self, asked: &Value) -> Result<bool, RequestError> {
        let mut answers = Map::new();
        for (key, request, params) in input_required::requests(asked) {
            if self.answered.insert(key.to_owned()) {
                let answer = self.client.config().hooks.answer(request, params).await.map_err(RequestError::Rpc)?;
                answers.insert(key.to_owned(), answer);
            }
        }
        if answers.is_empty() {
            return Ok(false);
        }
        self.repeat(method::UPDATE, json!({"taskId": self.id, "inputResponses": answers}), None).await?;
        Ok(true)
    }

    /// Sends a `tasks/*` request until it is answered: one that failed in transit is sent again
    /// after the backoff (the budget refills whenever the task moved, `progress`). An unknown
    /// task (-32602) was lost by the server: its outcome is unknown.
    async fn repeat(&mut self, name: &str, params: Value, progress: Option<&str>) -> Result<Value, RequestError> {
        loop {
            let error = match self.client.send_once(name, params.clone(), None).await {
                Ok(result) => return Ok(result),
                Err(RequestError::Rpc(error)) if error.code == code::INVALID_PARAMS => return Err(self.lost(&error)),
                Err(
                    error @ (RequestError::Cancelled | RequestError::OutcomeUnknown(_) | RequestError::NotExecuted(_)),
                ) => error,
                Err(other) => return Err(other),
            };
            self.pause(progress, error).await?;
        }
    }

    /// Waits out the backoff before another attempt, or gives up with `error`.
    async fn pause(&mut self, progress: Option<&str>, error: RequestError) -> Result<(), RequestError> {
        let Some(delay) = self.retries.next_delay(progress, None) else { return Err(error) };
        tokio::time::sleep(delay).await;
        Ok(())
    }

    /// The server says it does not know the task: lost, if it ever showed it (what became of it
    /// is unknown); else the id names no task there, which is the server's error to tell.
    fn lost(&self, error: &ErrorObject) -> RequestError {
        if !self.shown && self.last.is_none() {
            return RequestError::Rpc(error.clone());
        }
        RequestError::OutcomeUnknown(format!("the server no longer knows task {}: {}", self.id, error.message))
    }

    /// The outcome of the finished task `detailed` (a `tasks/get` result) shows.
    fn outcome(&self, detailed: &Value, status: TaskStatus) -> Result<Value, RequestError> {
        let id = &self.id;
        match status {
            TaskStatus::Completed => {
                detailed.get("result").cloned().ok_or_else(|| protocol(format!("task {id} completed without a result")))
            }
            TaskStatus::Failed => Err(RequestError::Rpc(
                detailed.get("error").and_then(|e| ErrorObject::from_value(e.clone()).ok()).unwrap_or_else(|| {
                    ErrorObject::with_reason(code::INTERNAL_ERROR, "the task failed without saying why", "task_failed")
                }),
            )),
            _ => Err(RequestError::Rpc(ErrorObject::with_reason(
                code::INTERNAL_ERROR,
                format!("task {id} was cancelled"),
                "task_cancelled",
            ))),
        }
    }

    /// Follows the task by polling `tasks/get`, from `seen` (its last known state), until it
    /// finishes.
    async fn poll(&mut self, mut seen: Value, pause: Duration) -> Result<Value, RequestError> {
        loop {
            let status = seen.get("status").and_then(Value::as_str).and_then(TaskStatus::parse);
            let Some(status) = status else {
                return Err(protocol(format!("task {} has no valid status: {seen}", self.id)));
            };
            self.status(status, seen.get("statusMessage").and_then(Value::as_str))?;
            if status.is_final() {
                return self.outcome(&seen, status);
            }
            let asked = status == TaskStatus::InputRequired && self.answer(&seen).await?;
            if !asked {
                tokio::time::sleep(pause).await;
            }
            let progress = seen.get("lastUpdatedAt").and_then(Value::as_str).map(str::to_owned);
            seen = self.repeat(method::GET, json!({"taskId": self.id}), progress.as_deref()).await?;
        }
    }

    /// The task's canonical state, read once.
    async fn get(&mut self) -> Result<Value, RequestError> {
        self.repeat(method::GET, json!({"taskId": self.id}), None).await
    }
}

/// What reading one connection of a task stream came to.
enum Read {
    /// The task finished with this status (its event was checked).
    Finished(TaskStatus),
    /// The stream broke or ended early: resume after the cursor.
    Cut,
    /// The stream cannot be followed exactly: this is why.
    Broke(TaskStreamBreak),
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
    let shown = created.get("status").is_some() || client.task_cursor(&id).is_some();
    let retries = Attempts::new(client.config().backoff);
    let mut followed = Followed { client, id, last: None, shown, answered: HashSet::new(), retries };
    let outcome = follow_task(&mut followed, created, pause).await;
    // Only a task that ended (or was lost) is forgotten: a follower that was dropped leaves its
    // cursor for the next one.
    client.task_moved(&followed.id, None);
    outcome
}

/// Follows the task on its stream where the server offers one, else by polling.
async fn follow_task(followed: &mut Followed<'_>, created: &Value, pause: Duration) -> Result<Value, RequestError> {
    let client = followed.client;
    let streams =
        client.server().pointer("/capabilities/extensions").and_then(|e| e.get(tasks::STREAMS_EXTENSION)).is_some();
    if !streams {
        let seen = if created.get("status").is_some() { created.clone() } else { followed.get().await? };
        return followed.poll(seen, pause).await;
    }
    let mut validator = TaskStreamValidator::new(followed.id.clone(), client.task_cursor(&followed.id));
    loop {
        match read_stream(followed, &mut validator).await? {
            Read::Finished(status) => {
                let detailed = followed.get().await?;
                return followed.outcome(&detailed, status);
            }
            Read::Cut => {
                let progress = validator.after().map(|seq| seq.to_string());
                followed.pause(progress.as_deref(), RequestError::Cancelled).await?;
            }
            Read::Broke(broke) => {
                let reason = DivergenceReason::TaskStream { task_id: followed.id.clone(), broke };
                client.emit(ClientEvent::Divergence { reason });
                let seen = followed.get().await?;
                return followed.poll(seen, pause).await;
            }
        }
    }
}

/// What the stream's end says: its response, or the error that refused or ended it. A stream
/// that ends (or whose cursor the server does not reach, `cursor_ahead`) before the task's final
/// status, and one whose events are gone, broke; a task the server does not know was lost.
fn ended(
    followed: &Followed<'_>,
    validator: &TaskStreamValidator,
    outcome: Result<Value, ErrorObject>,
) -> Result<Read, RequestError> {
    match outcome {
        Err(error) if error.code == tasks::EVENTS_GONE => {
            let earliest = error.data.as_ref().and_then(|d| d.get("earliestSeq")).and_then(Value::as_u64);
            Ok(Read::Broke(validator.gone(earliest)))
        }
        Ok(_) => Ok(validator.ended().map_or_else(Read::Broke, |()| Read::Cut)),
        Err(error) if error.reason() == Some(tasks::CURSOR_AHEAD) => {
            Ok(validator.ended().map_or_else(Read::Broke, |()| Read::Cut))
        }
        Err(error) if error.code == code::INVALID_PARAMS => Err(followed.lost(&error)),
        Err(error) => Err(RequestError::Rpc(error)),
    }
}

/// Opens the task's stream after the last event `validator` checked, and checks and handles its
/// events until it ends.
async fn read_stream(followed: &mut Followed<'_>, validator: &mut TaskStreamValidator) -> Result<Read, RequestError> {
    let mut params = json!({"taskId": followed.id});
    if let Some(seq) = validator.after() {
        params["after"] = json!(seq);
    }
    let mut reader = match followed.client.post_stateless(method::STREAM, params).await {
        Ok(Reply::Sse(reader)) => reader,
        Ok(Reply::Json(body) | Reply::Refused(body)) => {
            return match parse_response(&body) {
                Ok(Response { outcome, .. }) => ended(followed, validator, outcome),
                Err(_) => Ok(Read::Cut),
            };
        }
        Ok(Reply::Accepted) => return Err(protocol("tasks/stream was answered with 202".into())),
        Err(_) => return Ok(Read::Cut),
    };
    loop {
        let event = match reader.next().await {
            Ok(Some(event)) => event,
            Ok(None) | Err(_) => return Ok(Read::Cut),
        };
        let message = match jsonrpc::parse_message(event.data.as_bytes()) {
            Ok(message) => message,
            Err(_) => continue,
        };
        let params = match message {
            Message::Notification(Notification { method, params: Some(params) }) if method == method::EVENT => params,
            // The response ends the stream, after the task's final event, which ends the read.
            Message::Response(Response { outcome, .. }) => return ended(followed, validator, outcome),
            _ => continue,
        };
        let Some(event) = TaskEvent::from_params(&params) else {
            return Err(protocol(format!("an unreadable task event: {params}")));
        };
        if let Err(broke) = validator.accept(&event) {
            return Ok(Read::Broke(broke));
        }
        followed.client.task_moved(&followed.id, validator.cursor());
        match event.kind.as_str() {
            STATUS_EVENT => {
                let payload = &event.payload;
                let Some(status) = event.status() else {
                    return Err(protocol(format!("a status event without a status: {payload}")));
                };
                followed.status(status, payload.get("statusMessage").and_then(Value::as_str))?;
                if status.is_final() {
                    return Ok(Read::Finished(status));
                }
                if status == TaskStatus::InputRequired {
                    followed.answer(payload).await?;
                }
            }
            NOTIFICATION_EVENT => {
                let method = event.payload.get("method").and_then(Value::as_str).unwrap_or_default().to_owned();
                let params = event.payload.get("params").cloned().filter(|p| !p.is_null());
                let message = Message::Notification(Notification { method, params });
                let id = Some(event.delivery_id(&followed.id));
                followed.client.emit(ClientEvent::Message { id, origin: None, message, ack: Ack::none() });
            }
            _ => {}
        }
    }
}
