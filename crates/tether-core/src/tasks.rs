//! Tasks (SEP-2663, the `io.modelcontextprotocol/tasks` extension of 2026-07-28) as pure
//! decisions and wire shapes: whether a call becomes a task, which status may follow which, and
//! what a task looks like on the wire. Where the tasks live (the stores) and who runs them (the
//! server) build on these.
//!
//! Wire names follow the conformance suite (0.2.0-alpha.12): `ttlMs`, `pollIntervalMs`, flat
//! `CreateTaskResult` (`resultType: "task"` and the task's own fields), no `requestState`.

use std::collections::VecDeque;

use serde_json::{Map, Value, json};

use crate::date::rfc3339;
use crate::jsonrpc::ErrorObject;
use crate::lineage::Digest;
use crate::mcp::code::MISSING_REQUIRED_CLIENT_CAPABILITY;

/// The extension's name, in the server's and the client's `capabilities.extensions`.
pub const EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// tether's extension for resumable task event streams (`tasks/stream`, in the shape of
/// SEP-2694, an open proposal): its wire names are the SEP's, so it can become the SEP's.
pub const STREAMS_EXTENSION: &str = "io.tether/task-streams";

/// The `resultType` of a call answered with a task.
pub const RESULT_TYPE: &str = "task";

/// How a tool runs as a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskSupport {
    /// Never: its calls are answered at once.
    Never,
    /// If the client supports tasks; otherwise at once.
    Optional,
    /// Only as a task: a client without tasks cannot call it.
    Required,
}

/// What a `tools/call` becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Creation {
    /// Run and answered in the response.
    Immediate,
    /// A task: created (durably) before the response, which is its `CreateTaskResult`.
    Task,
    /// Refused: the tool needs tasks and the request's client does not declare them.
    MissingCapability,
}

/// What a call of a tool with `support` becomes, for a request whose client declares tasks or
/// not (in 2026-07-28 each request declares its own capabilities; nothing is remembered).
pub fn creation(support: TaskSupport, client_has_tasks: bool) -> Creation {
    match (support, client_has_tasks) {
        (TaskSupport::Never, _) | (TaskSupport::Optional, false) => Creation::Immediate,
        (TaskSupport::Optional | TaskSupport::Required, true) => Creation::Task,
        (TaskSupport::Required, false) => Creation::MissingCapability,
    }
}

/// Whether `client_capabilities` (a request's `_meta` capabilities) declare the extension.
pub fn declares_tasks(client_capabilities: &Value) -> bool {
    client_capabilities
        .get("extensions")
        .and_then(|e| e.get(EXTENSION))
        .is_some()
}

/// The refusal of a request that needs tasks from a client that does not declare them (-32021,
/// naming what it needs, as `MissingRequiredClientCapabilityError` requires).
pub fn missing_capability(message: &str) -> ErrorObject {
    ErrorObject {
        code: MISSING_REQUIRED_CLIENT_CAPABILITY,
        message: message.to_owned(),
        data: Some(json!({
            "reason": "missing_client_capability",
            "requiredCapabilities": {"extensions": {EXTENSION: {}}},
        })),
    }
}

/// Where a task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskStatus {
    /// Running.
    Working,
    /// Waiting for the client's answers (`tasks/update`).
    InputRequired,
    /// Finished with a result (a tool's own error, `isError`, included).
    Completed,
    /// Finished with a JSON-RPC error.
    Failed,
    /// Cancelled before it finished.
    Cancelled,
}

impl TaskStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Working => "working",
            TaskStatus::InputRequired => "input_required",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }

    /// Whether the task has finished: its status never changes again.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled
        )
    }

    /// Whether a task in this status may move to `next`: between working and waiting for input
    /// while it runs, to a final status from either, and never out of a final one.
    pub fn may_become(self, next: TaskStatus) -> bool {
        !self.is_final() && self != next
    }

    /// The status a finished run ends a task in: a result (even a tool's error) completes it, a
    /// JSON-RPC error fails it.
    pub fn of_outcome(outcome: &Result<Value, ErrorObject>) -> TaskStatus {
        match outcome {
            Ok(_) => TaskStatus::Completed,
            Err(_) => TaskStatus::Failed,
        }
    }
}

/// A task's id: minted by the server that created the task, opaque to clients, parsed once
/// where it enters (a request's `taskId`, a store record, an announcement between replicas).
/// Shared, not copied, when cloned.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(std::sync::Arc<str>);

/// A task id that is empty, too long, or holds control characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a task id is 1 to {} bytes without control characters",
    TaskId::MAX_LEN
)]
pub struct InvalidTaskId;

impl TaskId {
    /// Longest task id accepted.
    pub const MAX_LEN: usize = 256;

    /// Parses a task id.
    pub fn parse(s: &str) -> Result<TaskId, InvalidTaskId> {
        if (1..=Self::MAX_LEN).contains(&s.len()) && !s.chars().any(char::is_control) {
            Ok(TaskId(std::sync::Arc::from(s)))
        } else {
            Err(InvalidTaskId)
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for TaskId {
    type Err = InvalidTaskId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskId::parse(s)
    }
}

/// Maps keyed by task id are looked up by the text a request or a record holds.
impl std::borrow::Borrow<str> for TaskId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// A task as `CreateTaskResult` and `tasks/get` show it.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// Its id: the server's, opaque to the client.
    pub id: TaskId,
    /// Where it stands.
    pub status: TaskStatus,
    /// A human-readable word on the status, if any.
    pub status_message: Option<String>,
    /// When it was created, in milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// When its status last changed.
    pub last_updated_at_ms: u64,
    /// How long it is kept after it was created; `None`: for as long as the server keeps it.
    pub ttl_ms: Option<u64>,
    /// How often a client should poll it.
    pub poll_interval_ms: Option<u64>,
}

impl Task {
    /// The task's own wire fields (`taskId`, `status`, `createdAt`, `lastUpdatedAt`, `ttlMs`,
    /// `pollIntervalMs`, `statusMessage`), to which a result adds its `resultType` and, in
    /// `tasks/get`, the result, error or input requests its status carries.
    pub fn to_wire(&self) -> Map<String, Value> {
        let mut fields = Map::new();
        fields.insert("taskId".into(), json!(self.id.as_str()));
        fields.insert("status".into(), json!(self.status.as_str()));
        if let Some(message) = &self.status_message {
            fields.insert("statusMessage".into(), json!(message));
        }
        fields.insert("createdAt".into(), json!(rfc3339(self.created_at_ms)));
        fields.insert(
            "lastUpdatedAt".into(),
            json!(rfc3339(self.last_updated_at_ms)),
        );
        fields.insert(
            "ttlMs".into(),
            self.ttl_ms.map_or(Value::Null, |ttl| json!(ttl)),
        );
        if let Some(interval) = self.poll_interval_ms {
            fields.insert("pollIntervalMs".into(), json!(interval));
        }
        fields
    }

    /// The `CreateTaskResult` answering the call that created it.
    pub fn created_result(&self) -> Value {
        let mut fields = self.to_wire();
        fields.insert("resultType".into(), json!(RESULT_TYPE));
        Value::Object(fields)
    }
}

/// The methods of the extension that tether serves itself.
pub mod method {
    /// Reads a task: its status and, once it has them, its result, error or input requests.
    pub const GET: &str = "tasks/get";
    /// Answers a task's input requests.
    pub const UPDATE: &str = "tasks/update";
    /// Cancels a task.
    pub const CANCEL: &str = "tasks/cancel";
    /// Streams a task's events from a cursor (SEP-2694).
    pub const STREAM: &str = "tasks/stream";
    /// One event of a task stream (SEP-2694).
    pub const EVENT: &str = "notifications/tasks/event";
}

/// How a tool's definition says it runs as a task (`execution.taskSupport`: `"optional"`,
/// `"required"`; anything else, or nothing, is [`TaskSupport::Never`]).
pub fn support_of(definition: &Value) -> TaskSupport {
    match definition
        .get("execution")
        .and_then(|e| e.get("taskSupport"))
        .and_then(Value::as_str)
    {
        Some("optional") => TaskSupport::Optional,
        Some("required") => TaskSupport::Required,
        _ => TaskSupport::Never,
    }
}

impl TaskStatus {
    /// The status with wire name `name`.
    pub fn parse(name: &str) -> Option<TaskStatus> {
        [
            TaskStatus::Working,
            TaskStatus::InputRequired,
            TaskStatus::Completed,
            TaskStatus::Failed,
            TaskStatus::Cancelled,
        ]
        .into_iter()
        .find(|status| status.as_str() == name)
    }
}

/// Everything a server keeps of a task: what the client sees, who may see it, and what the run
/// needs between its rounds. Stores keep it as [`TaskRecord::to_json`] and change it only through
/// [`TaskRecord::apply`], inside one atomic step, so two replicas changing one task (a cancel
/// here, a result there) never both win.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRecord {
    /// The task as the client sees it.
    pub task: Task,
    /// Who created it; only they may read, answer or cancel it. `None` without authentication.
    pub principal: Option<String>,
    /// How it ended, once it has: a result (completed) or a JSON-RPC error (failed).
    pub outcome: Option<Result<Value, ErrorObject>>,
    /// The input requests still unanswered, by key (status `input_required`).
    pub input_requests: Map<String, Value>,
    /// The answers received in this round, by key: handed to the next round of the tool.
    pub input_responses: Map<String, Value>,
    /// The tool's state between rounds, as it returned it (kept by the server, never sent).
    pub request_state: Option<Value>,
    /// The task's newest events, oldest first: at most [`MAX_EVENTS`].
    pub events: VecDeque<TaskEvent>,
    /// The sequence number its next event gets: how many it ever had.
    pub next_seq: u64,
}

/// Most events a task keeps; a cursor before the oldest kept is told they are gone.
pub const MAX_EVENTS: usize = 256;

/// The type of the event a status change records (vendor-prefixed, as SEP-2694 asks): its payload
/// is the status, its message, when it changed, and the input requests of `input_required`.
pub const STATUS_EVENT: &str = "io.tether.task.status";

/// The type of the event a notification the tool sent records (progress, a log): its payload is
/// the notification's `method` and `params`.
pub const NOTIFICATION_EVENT: &str = "io.tether.task.notification";

/// The `_meta` key under which a task event carries its digest.
pub const DIGEST_META: &str = "io.tether/digest";

/// One event of a task's stream (SEP-2694), with the digest that chains it to the one before.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskEvent {
    /// Its position: 0 for the task's first event, then one more for each.
    pub seq: u64,
    /// What happened ([`STATUS_EVENT`], [`NOTIFICATION_EVENT`]).
    pub kind: String,
    /// What it carries: a JSON object.
    pub payload: Value,
    /// SHA-256 over the previous event's digest (the task id for the first) and this event: a
    /// client that checks it knows that what it was sent follows what it had, exactly.
    pub digest: Digest,
}

impl TaskEvent {
    /// The event of task `task` after the one whose digest is `previous` (`None`: the first).
    pub fn chained(
        task: &str,
        previous: Option<&Digest>,
        seq: u64,
        kind: &str,
        payload: Value,
    ) -> TaskEvent {
        let digest = TaskEvent::digest_of(task, previous, seq, kind, &payload);
        TaskEvent {
            seq,
            kind: kind.to_owned(),
            payload,
            digest,
        }
    }

    /// The events of task `task` from its first, each `(kind, payload)` chained to the one
    /// before: a whole history as a server would send it.
    pub fn chain<K: AsRef<str>>(
        task: &str,
        events: impl IntoIterator<Item = (K, Value)>,
    ) -> Vec<TaskEvent> {
        let mut previous: Option<Digest> = None;
        events
            .into_iter()
            .zip(0u64..)
            .map(|((kind, payload), seq)| {
                let event =
                    TaskEvent::chained(task, previous.as_ref(), seq, kind.as_ref(), payload);
                previous = Some(event.digest);
                event
            })
            .collect()
    }

    /// The digest event `seq` of task `task` must carry after `previous`.
    pub fn digest_of(
        task: &str,
        previous: Option<&Digest>,
        seq: u64,
        kind: &str,
        payload: &Value,
    ) -> Digest {
        let before = previous.map_or_else(|| task.to_owned(), Digest::to_string);
        let event = json!({"seq": seq, "type": kind, "payload": payload});
        Digest::of(&before, event.to_string().as_bytes())
    }

    /// The status it carries, if it is a status event.
    pub fn status(&self) -> Option<TaskStatus> {
        if self.kind != STATUS_EVENT {
            return None;
        }
        self.payload
            .get("status")
            .and_then(Value::as_str)
            .and_then(TaskStatus::parse)
    }

    /// The id under which a client delivers it beside a stream's events, for whoever reads
    /// them to deduplicate on: `task/{task}/{seq}`, one per event of every task (the seq is what
    /// follows the last `/`), and never one of tether's SSE event ids, which have no `/` before
    /// their first `:`.
    pub fn delivery_id(&self, task: &str) -> String {
        format!("task/{task}/{}", self.seq)
    }

    /// The params of the `notifications/tasks/event` that delivers it.
    pub fn params(&self, task: &str) -> Value {
        json!({
            "taskId": task,
            "seq": self.seq,
            "type": self.kind,
            "payload": self.payload,
            "_meta": {
                "io.modelcontextprotocol/related-task": {"taskId": task},
                DIGEST_META: self.digest.to_string(),
            },
        })
    }

    /// Reads an event from the params of a `notifications/tasks/event` (its digest as sent).
    pub fn from_params(params: &Value) -> Option<TaskEvent> {
        Some(TaskEvent {
            seq: params.get("seq")?.as_u64()?,
            kind: params.get("type")?.as_str()?.to_owned(),
            payload: params.get("payload").filter(|p| p.is_object())?.clone(),
            digest: params
                .get("_meta")?
                .get(DIGEST_META)?
                .as_str()?
                .parse()
                .ok()?,
        })
    }
}

/// Why a task stream cannot start at a cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamRefusal {
    /// Events after the cursor are no longer kept: the oldest kept is `earliest`.
    Gone {
        /// The oldest event kept.
        earliest: u64,
    },
    /// The cursor names an event the task never had: it has had `next` events.
    Ahead {
        /// How many events the task has had.
        next: u64,
    },
}

/// The `events_gone` error (SEP-2694: -32010, `data: {reason, taskId, earliestSeq}`).
pub fn events_gone(task: &str, earliest: u64) -> ErrorObject {
    ErrorObject {
        code: EVENTS_GONE,
        message: "Task events are no longer available".into(),
        data: Some(json!({"reason": "events_gone", "taskId": task, "earliestSeq": earliest})),
    }
}

/// The code of [`events_gone`].
pub const EVENTS_GONE: i64 = -32010;

/// The `data.reason` of a `tasks/stream` refused because its cursor names an event the task's
/// history does not hold (-32602): the server's history is shorter than what its client saw.
pub const CURSOR_AHEAD: &str = "cursor_ahead";

/// A change to a task, applied by [`TaskRecord::apply`].
#[derive(Debug, Clone, PartialEq)]
pub enum TaskChange {
    /// The running tool asks for input: the task waits for `requests`, keeping `state`.
    Ask {
        /// The input requests, by key.
        requests: Map<String, Value>,
        /// The tool's state for its next round.
        state: Option<Value>,
    },
    /// The client answers some input requests (`tasks/update`): answered keys leave the pending
    /// ones, unknown keys are ignored, and once none is pending the task works again.
    Answer(Map<String, Value>),
    /// The run ended with this outcome.
    Finish(Result<Value, ErrorObject>),
    /// The client cancels the task.
    Cancel,
    /// The running tool sent a notification: recorded as an event of the task.
    Notify {
        /// The notification's method.
        method: String,
        /// Its params.
        params: Value,
    },
}

/// Why a stored task could not be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unreadable task record: {0}")]
pub struct TaskRecordError(String);

impl TaskRecord {
    /// A task created at `now_ms`, working.
    pub fn new(
        id: TaskId,
        principal: Option<String>,
        now_ms: u64,
        ttl_ms: Option<u64>,
        poll_interval_ms: Option<u64>,
    ) -> TaskRecord {
        let mut record = TaskRecord {
            task: Task {
                id,
                status: TaskStatus::Working,
                status_message: None,
                created_at_ms: now_ms,
                last_updated_at_ms: now_ms,
                ttl_ms,
                poll_interval_ms,
            },
            principal,
            outcome: None,
            input_requests: Map::new(),
            input_responses: Map::new(),
            request_state: None,
            events: VecDeque::new(),
            next_seq: 0,
        };
        record.record_status();
        record
    }

    /// Appends the event of the task's current status.
    fn record_status(&mut self) {
        let mut payload = Map::new();
        payload.insert("status".into(), json!(self.task.status.as_str()));
        if let Some(message) = &self.task.status_message {
            payload.insert("statusMessage".into(), json!(message));
        }
        payload.insert(
            "lastUpdatedAt".into(),
            json!(rfc3339(self.task.last_updated_at_ms)),
        );
        if self.task.status == TaskStatus::InputRequired {
            payload.insert(
                "inputRequests".into(),
                Value::Object(self.input_requests.clone()),
            );
        }
        self.record_event(STATUS_EVENT, Value::Object(payload));
    }

    /// Appends an event, dropping the oldest past [`MAX_EVENTS`].
    fn record_event(&mut self, kind: &str, payload: Value) {
        let previous = self.events.back().map(|event| event.digest);
        let event = TaskEvent::chained(
            self.task.id.as_str(),
            previous.as_ref(),
            self.next_seq,
            kind,
            payload,
        );
        self.events.push_back(event);
        self.next_seq += 1;
        while self.events.len() > MAX_EVENTS {
            self.events.pop_front();
        }
    }

    /// The kept events after `after` (all kept without a cursor), or why the stream cannot
    /// start there: never a silent skip.
    pub fn events_after(
        &self,
        after: Option<u64>,
    ) -> Result<impl Iterator<Item = &TaskEvent>, StreamRefusal> {
        let earliest = self.events.front().map_or(self.next_seq, |event| event.seq);
        if let Some(after) = after {
            if after >= self.next_seq {
                return Err(StreamRefusal::Ahead {
                    next: self.next_seq,
                });
            }
            if after + 1 < earliest {
                return Err(StreamRefusal::Gone { earliest });
            }
        }
        Ok(self
            .events
            .iter()
            .filter(move |event| after.is_none_or(|after| event.seq > after)))
    }

    /// Applies `change` at `now_ms`; `false` if it changes nothing (a final task never changes,
    /// input is asked and answered only while the task runs).
    pub fn apply(&mut self, change: TaskChange, now_ms: u64) -> bool {
        let status = self.task.status;
        let next = match change {
            TaskChange::Ask { requests, state } => {
                if !status.may_become(TaskStatus::InputRequired) || requests.is_empty() {
                    return false;
                }
                self.input_requests = requests;
                self.input_responses = Map::new();
                self.request_state = state;
                TaskStatus::InputRequired
            }
            TaskChange::Answer(responses) => {
                if status != TaskStatus::InputRequired {
                    return false;
                }
                let mut answered = false;
                for (key, response) in responses {
                    if self.input_requests.remove(&key).is_some() {
                        self.input_responses.insert(key, response);
                        answered = true;
                    }
                }
                if !self.input_requests.is_empty() {
                    if answered {
                        self.task.last_updated_at_ms = now_ms;
                    }
                    return answered;
                }
                TaskStatus::Working
            }
            TaskChange::Finish(outcome) => {
                let next = TaskStatus::of_outcome(&outcome);
                if !status.may_become(next) {
                    return false;
                }
                self.outcome = Some(outcome);
                next
            }
            TaskChange::Cancel => {
                if !status.may_become(TaskStatus::Cancelled) {
                    return false;
                }
                TaskStatus::Cancelled
            }
            TaskChange::Notify { method, params } => {
                if status.is_final() {
                    return false;
                }
                self.record_event(
                    NOTIFICATION_EVENT,
                    json!({"method": method, "params": params}),
                );
                return true;
            }
        };
        if next.is_final() {
            self.input_requests = Map::new();
            self.input_responses = Map::new();
            self.request_state = None;
        }
        self.task.status = next;
        self.task.last_updated_at_ms = now_ms;
        self.record_status();
        true
    }

    /// When a store may forget the task: `ttl_ms` after it was created, once it has finished
    /// (a running task is kept until it ends, whatever its ttl). `None`: never.
    pub fn forget_at_ms(&self) -> Option<u64> {
        let ttl = self.task.ttl_ms?;
        self.task
            .status
            .is_final()
            .then(|| self.task.created_at_ms.saturating_add(ttl))
    }

    /// The `tasks/get` result: the task, `resultType: "complete"`, and what its status carries
    /// (the result, the error or the pending input requests). Never the state.
    pub fn detailed(&self) -> Value {
        let mut fields = self.task.to_wire();
        fields.insert("resultType".into(), json!("complete"));
        match (&self.outcome, self.task.status) {
            (Some(Ok(result)), TaskStatus::Completed) => {
                fields.insert("result".into(), result.clone());
            }
            (Some(Err(error)), TaskStatus::Failed) => {
                fields.insert("error".into(), error.to_value());
            }
            (_, TaskStatus::InputRequired) => {
                fields.insert(
                    "inputRequests".into(),
                    Value::Object(self.input_requests.clone()),
                );
            }
            _ => {}
        }
        Value::Object(fields)
    }

    /// The record as stores keep it.
    pub fn to_json(&self) -> Value {
        let task = &self.task;
        let mut fields = Map::new();
        fields.insert("id".into(), json!(task.id.as_str()));
        fields.insert("status".into(), json!(task.status.as_str()));
        fields.insert("statusMessage".into(), json!(task.status_message));
        fields.insert("createdAtMs".into(), json!(task.created_at_ms));
        fields.insert("lastUpdatedAtMs".into(), json!(task.last_updated_at_ms));
        fields.insert("ttlMs".into(), json!(task.ttl_ms));
        fields.insert("pollIntervalMs".into(), json!(task.poll_interval_ms));
        fields.insert("principal".into(), json!(self.principal));
        match &self.outcome {
            Some(Ok(result)) => {
                fields.insert("result".into(), result.clone());
            }
            Some(Err(error)) => {
                fields.insert("error".into(), error.to_value());
            }
            None => {}
        }
        fields.insert(
            "inputRequests".into(),
            Value::Object(self.input_requests.clone()),
        );
        fields.insert(
            "inputResponses".into(),
            Value::Object(self.input_responses.clone()),
        );
        if let Some(state) = &self.request_state {
            fields.insert("requestState".into(), state.clone());
        }
        let events: Vec<Value> = self
            .events
            .iter()
            .map(|event| {
                json!({"seq": event.seq, "type": event.kind, "payload": event.payload,
                    "digest": event.digest.to_string()})
            })
            .collect();
        fields.insert("events".into(), Value::Array(events));
        fields.insert("nextSeq".into(), json!(self.next_seq));
        Value::Object(fields)
    }

    /// Reads back what [`TaskRecord::to_json`] wrote.
    pub fn from_json(value: &Value) -> Result<TaskRecord, TaskRecordError> {
        let bad = |what: &str| TaskRecordError(what.to_owned());
        let text = |name: &str| value.get(name).and_then(Value::as_str);
        let number = |name: &str| value.get(name).and_then(Value::as_u64);
        let object = |name: &str| {
            value
                .get(name)
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default()
        };
        let status = text("status")
            .and_then(TaskStatus::parse)
            .ok_or_else(|| bad("status"))?;
        let outcome = match (value.get("result"), value.get("error")) {
            (Some(result), _) => Some(Ok(result.clone())),
            (None, Some(error)) => Some(Err(
                ErrorObject::from_value(error.clone()).map_err(|_| bad("error"))?
            )),
            (None, None) => None,
        };
        Ok(TaskRecord {
            task: Task {
                id: text("id")
                    .and_then(|id| TaskId::parse(id).ok())
                    .ok_or_else(|| bad("id"))?,
                status,
                status_message: text("statusMessage").map(str::to_owned),
                created_at_ms: number("createdAtMs").ok_or_else(|| bad("createdAtMs"))?,
                last_updated_at_ms: number("lastUpdatedAtMs")
                    .ok_or_else(|| bad("lastUpdatedAtMs"))?,
                ttl_ms: number("ttlMs"),
                poll_interval_ms: number("pollIntervalMs"),
            },
            principal: text("principal").map(str::to_owned),
            outcome,
            input_requests: object("inputRequests"),
            input_responses: object("inputResponses"),
            request_state: value.get("requestState").cloned(),
            events: value
                .get("events")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|event| {
                    Some(TaskEvent {
                        seq: event.get("seq")?.as_u64()?,
                        kind: event.get("type")?.as_str()?.to_owned(),
                        payload: event.get("payload")?.clone(),
                        digest: event.get("digest")?.as_str()?.parse().ok()?,
                    })
                })
                .collect::<Option<_>>()
                .ok_or_else(|| bad("events"))?,
            next_seq: number("nextSeq").ok_or_else(|| bad("nextSeq"))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_id_is_bounded_text_without_control_characters() {
        let id = TaskId::parse("Tk-1_ä").expect("a task id");
        assert_eq!(
            (id.as_str(), id.to_string()),
            ("Tk-1_ä", "Tk-1_ä".to_owned())
        );
        assert_eq!("t".parse::<TaskId>(), TaskId::parse("t"));
        for bad in ["", "a\nb", "a\u{7f}", &"t".repeat(TaskId::MAX_LEN + 1)] {
            assert_eq!(TaskId::parse(bad), Err(InvalidTaskId), "{bad:?}");
        }
        assert!(TaskId::parse(&"t".repeat(TaskId::MAX_LEN)).is_ok());
        let map: std::collections::HashMap<TaskId, u8> = [(id.clone(), 1)].into();
        assert_eq!(map.get("Tk-1_ä"), Some(&1), "looked up by its text");
    }

    #[test]
    fn a_call_becomes_a_task_only_where_both_sides_allow_it() {
        use Creation::*;
        use TaskSupport::*;
        let cases = [
            (Never, false, Immediate),
            (Never, true, Immediate),
            (Optional, false, Immediate),
            (Optional, true, Task),
            (Required, true, Task),
            (Required, false, MissingCapability),
        ];
        for (support, declared, expected) in cases {
            assert_eq!(
                creation(support, declared),
                expected,
                "{support:?} {declared}"
            );
        }
        assert!(declares_tasks(&json!({"extensions": {EXTENSION: {}}})));
        assert!(!declares_tasks(&json!({"sampling": {}})));
        let refusal = missing_capability("needs tasks");
        assert_eq!(refusal.code, -32021);
        assert_eq!(
            refusal.data.expect("data")["requiredCapabilities"]["extensions"][EXTENSION],
            json!({})
        );
    }

    #[test]
    fn a_final_status_never_changes_and_a_running_task_may_wait_for_input() {
        use TaskStatus::*;
        let all = [Working, InputRequired, Completed, Failed, Cancelled];
        for from in all {
            for to in all {
                let allowed = matches!(
                    (from, to),
                    (Working, InputRequired | Completed | Failed | Cancelled)
                        | (InputRequired, Working | Completed | Failed | Cancelled)
                );
                assert_eq!(from.may_become(to), allowed, "{from:?} -> {to:?}");
            }
        }
        assert_eq!(
            TaskStatus::of_outcome(&Ok(json!({"isError": true}))),
            Completed,
            "a tool's error completes"
        );
        assert_eq!(
            TaskStatus::of_outcome(&Err(ErrorObject::with_reason(-32603, "x", "x"))),
            Failed
        );
    }

    #[test]
    fn a_created_task_has_the_wire_fields_and_none_of_the_old_ones() {
        let task = Task {
            id: TaskId::parse("t1").expect("a task id"),
            status: TaskStatus::Working,
            status_message: None,
            created_at_ms: 1_764_633_600_123,
            last_updated_at_ms: 1_764_633_600_123,
            ttl_ms: Some(3_600_000),
            poll_interval_ms: Some(500),
        };
        let result = task.created_result();
        assert_eq!(result["resultType"], "task");
        assert_eq!(result["taskId"], "t1");
        assert_eq!(result["status"], "working");
        assert_eq!(result["createdAt"], "2025-12-02T00:00:00.123Z");
        assert_eq!(
            (result["ttlMs"].clone(), result["pollIntervalMs"].clone()),
            (json!(3_600_000), json!(500))
        );
        for absent in [
            "ttl",
            "pollInterval",
            "requestState",
            "task",
            "result",
            "error",
            "inputRequests",
        ] {
            assert!(result.get(absent).is_none(), "{absent}");
        }
        assert_eq!(
            Task {
                ttl_ms: None,
                ..task
            }
            .created_result()["ttlMs"],
            Value::Null
        );
    }

    fn record() -> TaskRecord {
        TaskRecord::new(
            TaskId::parse("t1").expect("a task id"),
            Some("alice".into()),
            1_000,
            Some(60_000),
            Some(250),
        )
    }

    fn map(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn input_is_answered_key_by_key_and_the_task_works_again_once_all_are() {
        let mut task = record();
        let asked = map(
            json!({"a": {"method": "elicitation/create"}, "b": {"method": "elicitation/create"}}),
        );
        assert!(task.apply(
            TaskChange::Ask {
                requests: asked,
                state: Some(json!({"round": 1}))
            },
            2_000
        ));
        assert_eq!(task.task.status, TaskStatus::InputRequired);
        assert!(task.apply(
            TaskChange::Answer(map(json!({"a": {"action": "accept"}, "zz": {}}))),
            3_000
        ));
        assert_eq!(
            task.task.status,
            TaskStatus::InputRequired,
            "b is still pending"
        );
        let shown = task.detailed();
        assert_eq!(shown["inputRequests"].as_object().map(|m| m.len()), Some(1));
        assert!(shown["inputRequests"].get("b").is_some());
        assert!(
            shown.get("requestState").is_none(),
            "the state is never shown"
        );
        assert!(
            !task.apply(TaskChange::Answer(map(json!({"zz": {}}))), 3_500),
            "unknown keys change nothing"
        );
        assert!(task.apply(
            TaskChange::Answer(map(json!({"b": {"action": "decline"}}))),
            4_000
        ));
        assert_eq!(task.task.status, TaskStatus::Working);
        assert_eq!(task.input_responses.len(), 2);
        assert_eq!(task.request_state, Some(json!({"round": 1})));
        assert_eq!(task.task.last_updated_at_ms, 4_000);
    }

    #[test]
    fn the_first_final_change_wins_and_clears_the_input() {
        let mut task = record();
        assert!(task.apply(
            TaskChange::Ask {
                requests: map(json!({"a": {}})),
                state: None
            },
            2_000
        ));
        assert!(task.apply(TaskChange::Cancel, 3_000));
        assert_eq!(task.task.status, TaskStatus::Cancelled);
        assert!(task.input_requests.is_empty());
        assert!(
            !task.apply(TaskChange::Finish(Ok(json!({"content": []}))), 4_000),
            "a late result loses"
        );
        assert!(!task.apply(TaskChange::Cancel, 4_000));
        assert_eq!(
            (task.task.status, task.outcome.clone()),
            (TaskStatus::Cancelled, None)
        );
        assert_eq!(task.task.last_updated_at_ms, 3_000);
        let mut failed = record();
        assert!(
            !failed.apply(TaskChange::Answer(map(json!({"a": {}}))), 2_000),
            "nothing was asked"
        );
        assert!(failed.apply(
            TaskChange::Finish(Err(ErrorObject::with_reason(-32603, "boom", "x"))),
            2_000
        ));
        let shown = failed.detailed();
        assert_eq!(
            (shown["status"].clone(), shown["error"]["code"].clone()),
            (json!("failed"), json!(-32603))
        );
        assert!(shown.get("result").is_none());
        assert_eq!(failed.forget_at_ms(), Some(61_000));
        assert_eq!(record().forget_at_ms(), None, "a running task is kept");
    }

    #[test]
    fn a_record_reads_back_as_it_was_written() {
        let mut task = record();
        task.apply(
            TaskChange::Ask {
                requests: map(json!({"a": {"method": "m"}})),
                state: Some(json!([1])),
            },
            2_000,
        );
        task.apply(TaskChange::Answer(map(json!({"a": {"x": 1}}))), 2_500);
        assert_eq!(TaskRecord::from_json(&task.to_json()), Ok(task.clone()));
        task.apply(
            TaskChange::Finish(Err(ErrorObject {
                code: -1,
                message: "m".into(),
                data: None,
            })),
            3_000,
        );
        assert_eq!(TaskRecord::from_json(&task.to_json()), Ok(task));
        let done = {
            let mut done =
                TaskRecord::new(TaskId::parse("t2").expect("a task id"), None, 5, None, None);
            done.apply(
                TaskChange::Finish(Ok(json!({"content": [{"type": "text", "text": "hi"}]}))),
                6,
            );
            done
        };
        assert_eq!(TaskRecord::from_json(&done.to_json()), Ok(done.clone()));
        assert_eq!(done.detailed()["result"]["content"][0]["text"], "hi");
        assert!(TaskRecord::from_json(&json!({"id": "t"})).is_err());
        assert_eq!(
            support_of(&json!({"execution": {"taskSupport": "required"}})),
            TaskSupport::Required
        );
        assert_eq!(
            support_of(&json!({"execution": {"taskSupport": "forbidden"}})),
            TaskSupport::Never
        );
        assert_eq!(support_of(&json!({})), TaskSupport::Never);
    }

    #[test]
    fn every_status_change_and_notification_is_an_event_chained_to_the_one_before() {
        let mut task = record();
        task.apply(
            TaskChange::Notify {
                method: "notifications/progress".into(),
                params: json!({"progress": 1}),
            },
            1_500,
        );
        task.apply(
            TaskChange::Ask {
                requests: map(json!({"a": {"method": "m"}})),
                state: None,
            },
            2_000,
        );
        task.apply(TaskChange::Answer(map(json!({"a": {}}))), 2_500);
        task.apply(TaskChange::Finish(Ok(json!({"content": []}))), 3_000);
        assert!(
            !task.apply(
                TaskChange::Notify {
                    method: "x".into(),
                    params: json!({})
                },
                3_100
            ),
            "nothing after the end"
        );
        let kinds: Vec<(u64, &str, Value)> = task
            .events
            .iter()
            .map(|e| {
                (
                    e.seq,
                    e.kind.as_str(),
                    e.payload.get("status").cloned().unwrap_or(Value::Null),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                (0, STATUS_EVENT, json!("working")),
                (1, NOTIFICATION_EVENT, Value::Null),
                (2, STATUS_EVENT, json!("input_required")),
                (3, STATUS_EVENT, json!("working")),
                (4, STATUS_EVENT, json!("completed")),
            ]
        );
        assert_eq!(task.events[2].payload["inputRequests"]["a"]["method"], "m");
        let mut previous = None;
        for event in &task.events {
            assert_eq!(
                event.digest,
                TaskEvent::digest_of(
                    "t1",
                    previous.as_ref(),
                    event.seq,
                    &event.kind,
                    &event.payload
                )
            );
            assert_eq!(
                TaskEvent::from_params(&event.params("t1")).as_ref(),
                Some(event)
            );
            previous = Some(event.digest);
        }
        let after: Vec<u64> = task
            .events_after(Some(2))
            .map(|e| e.map(|e| e.seq).collect())
            .unwrap_or_default();
        assert_eq!(after, [3, 4]);
        assert_eq!(task.events_after(None).map(|e| e.count()).ok(), Some(5));
        assert_eq!(
            task.events_after(Some(4)).map(|e| e.count()).ok(),
            Some(0),
            "caught up"
        );
        assert_eq!(
            task.events_after(Some(5)).err(),
            Some(StreamRefusal::Ahead { next: 5 })
        );
        assert_eq!(TaskRecord::from_json(&task.to_json()), Ok(task));
    }

    #[test]
    fn a_cursor_before_the_oldest_kept_event_is_told_they_are_gone() {
        let mut task = record();
        for n in 0..MAX_EVENTS as u64 + 9 {
            task.apply(
                TaskChange::Notify {
                    method: "m".into(),
                    params: json!({"n": n}),
                },
                2_000,
            );
        }
        let earliest = task.events[0].seq;
        assert_eq!((earliest, task.events.len()), (10, MAX_EVENTS));
        assert_eq!(
            task.events_after(Some(8)).err(),
            Some(StreamRefusal::Gone { earliest: 10 })
        );
        assert_eq!(
            task.events_after(Some(9)).map(|e| e.count()).ok(),
            Some(MAX_EVENTS),
            "exactly what follows 9"
        );
        assert_eq!(
            task.events_after(None)
                .map(|e| e.map(|e| e.seq).next())
                .ok()
                .flatten(),
            Some(10)
        );
        let gone = events_gone("t1", earliest);
        assert_eq!(
            (gone.code, gone.data.map(|d| d["earliestSeq"].clone())),
            (-32010, Some(json!(10)))
        );
    }
}
