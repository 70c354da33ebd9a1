//! Tasks (SEP-2663, the `io.modelcontextprotocol/tasks` extension of 2026-07-28) as pure
//! decisions and wire shapes: whether a call becomes a task, which status may follow which, and
//! what a task looks like on the wire. Where the tasks live (the stores) and who runs them (the
//! server) build on these.
//!
//! Wire names follow the conformance suite (0.2.0-alpha.12): `ttlMs`, `pollIntervalMs`, flat
//! `CreateTaskResult` (`resultType: "task"` and the task's own fields), no `requestState`.

use serde_json::{Map, Value, json};

use crate::date::rfc3339;
use crate::jsonrpc::ErrorObject;
use crate::mcp::code::MISSING_REQUIRED_CLIENT_CAPABILITY;

/// The extension's name, in the server's and the client's `capabilities.extensions`.
pub const EXTENSION: &str = "io.modelcontextprotocol/tasks";

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

/// A task as `CreateTaskResult` and `tasks/get` show it.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// Its id: the server's, opaque to the client.
    pub id: String,
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
        fields.insert("taskId".into(), json!(self.id));
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

#[cfg(test)]
mod tests {
    use super::*;

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
            id: "t1".into(),
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
}
