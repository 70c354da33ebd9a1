//! A registry of tools: names, schemas and the async functions that run them, answering
//! `tools/list` and `tools/call`.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;

use serde_json::{Value, json};
use tether_core::jsonrpc::ErrorObject;
use tether_core::param_headers::{self, ParamHeader};
use tether_core::tasks::TaskSupport;

use crate::handler::HandlerFuture;
use crate::refusal::Refusal;
use crate::request::context::Context;

type ToolFn = Arc<dyn Fn(Context, Value) -> HandlerFuture + Send + Sync>;

/// A set of tools.
#[derive(Default, Clone)]
pub struct ToolSet {
    listed: Vec<Value>,
    by_name: HashMap<String, ToolFn>,
    resumable: HashSet<String>,
    /// Each tool's parameters mirrored in headers (SEP-2243), read from its schema once.
    headers: HashMap<String, Vec<ParamHeader>>,
    /// How each tool that supports tasks runs as one (`execution.taskSupport`), read once.
    task_support: HashMap<String, TaskSupport>,
    /// The tools whose definition says they have no effects (`annotations.readOnlyHint`).
    read_only: HashSet<String>,
}

impl std::fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolSet").field("tools", &self.by_name.keys().collect::<Vec<_>>()).finish()
    }
}

impl ToolSet {
    /// An empty set.
    pub fn new() -> ToolSet {
        ToolSet::default()
    }

    /// Adds a tool. `definition` is the tool as `tools/list` shows it (`name`, `description`,
    /// `inputSchema` kept verbatim, optional `annotations`); `run` gets the call's `arguments`
    /// and returns the `CallToolResult`. A tool whose schema declares its header-mirrored
    /// parameters (`x-mcp-header`) wrongly is not offered (clients would drop it): the error is
    /// logged.
    pub fn add<F, Fut>(&mut self, definition: Value, run: F) -> &mut ToolSet
    where
        F: Fn(Context, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ErrorObject>> + Send + 'static,
    {
        let name = definition.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
        let headers = match param_headers::declared(definition.get("inputSchema").unwrap_or(&Value::Null)) {
            Ok(headers) => headers,
            Err(err) => {
                tracing::error!(tool = %name, %err, "tool not offered: its x-mcp-header declaration is invalid");
                return self;
            }
        };
        if !headers.is_empty() {
            self.headers.insert(name.clone(), headers);
        }
        if definition.pointer("/annotations/readOnlyHint") == Some(&Value::Bool(true)) {
            self.read_only.insert(name.clone());
        }
        match tether_core::tasks::support_of(&definition) {
            TaskSupport::Never => {}
            support => {
                self.task_support.insert(name.clone(), support);
            }
        }
        self.listed.push(definition);
        self.by_name.insert(name, Arc::new(move |ctx, args| Box::pin(run(ctx, args))));
        self
    }

    /// The parameters of tool `name` mirrored in headers.
    pub fn param_headers(&self, name: &str) -> &[ParamHeader] {
        self.headers.get(name).map_or(&[], Vec::as_slice)
    }

    /// How tool `name` runs as a task, as its definition's `execution.taskSupport` says; its
    /// function decides when the call becomes one ([`Context::escalate`]).
    pub fn task_support(&self, name: &str) -> TaskSupport {
        self.task_support.get(name).copied().unwrap_or(TaskSupport::Never)
    }

    /// Adds a tool whose effects are recorded under [`Context::idempotency_key`], so running it
    /// again for the same key applies nothing twice (see [`Handler::resumable`](crate::Handler::resumable)).
    pub fn add_resumable<F, Fut>(&mut self, definition: Value, run: F) -> &mut ToolSet
    where
        F: Fn(Context, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ErrorObject>> + Send + 'static,
    {
        if let Some(name) = definition.get("name").and_then(Value::as_str) {
            self.resumable.insert(name.to_owned());
        }
        self.add(definition, run)
    }

    /// Whether `tools/call` with `params` calls a tool added with [`ToolSet::add_resumable`].
    pub fn is_resumable(&self, params: &Value) -> bool {
        params.get("name").and_then(Value::as_str).is_some_and(|name| self.resumable.contains(name))
    }

    /// Whether `tools/call` with `params` calls a tool whose definition says it has no effects
    /// (`annotations.readOnlyHint: true`; see [`Handler::read_only`](crate::Handler::read_only)).
    pub fn is_read_only(&self, params: &Value) -> bool {
        params.get("name").and_then(Value::as_str).is_some_and(|name| self.read_only.contains(name))
    }

    /// The `tools/list` result.
    pub fn list(&self) -> Value {
        json!({ "tools": self.listed })
    }

    /// Runs `tools/call` with `params` (`name`, `arguments`). An unknown tool is an invalid-params
    /// error.
    pub fn call(&self, ctx: Context, params: &Value) -> HandlerFuture {
        let name = params.get("name").and_then(Value::as_str).unwrap_or_default();
        let args = params.get("arguments").cloned().unwrap_or_else(|| json!({}));
        match self.by_name.get(name) {
            Some(run) => run(ctx, args),
            None => {
                let error = Refusal::UnknownTool.error(format!("unknown tool {}", crate::excerpt::quoted(name)));
                Box::pin(std::future::ready(Err(error)))
            }
        }
    }
}

/// A `CallToolResult` with one text item.
pub fn text_result(text: impl Into<String>) -> Value {
    json!({ "content": [{ "type": "text", "text": text.into() }] })
}

/// An invalid-params error for a tool argument.
pub fn invalid_argument(message: impl Into<String>) -> ErrorObject {
    Refusal::InvalidArguments.error(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_are_listed_verbatim_and_bad_header_declarations_are_not_offered() {
        let schema = json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
            "$defs": {"a": {"$anchor": "x", "type": "object"}}, "allOf": [{"anyOf": [{"required": ["p"]}]}],
            "if": {"required": ["p"]}, "then": {}, "else": {}, "additionalProperties": false,
            "properties": {"p": {"type": "string", "x-mcp-header": "P"}}});
        let mut tools = ToolSet::new();
        let noop = |_, _| async { Ok(json!({})) };
        tools.add(json!({"name": "kept", "inputSchema": schema}), noop);
        tools.add(
            json!({"name": "dropped", "inputSchema": {"properties": {"o": {"type": "object", "x-mcp-header": "O"}}}}),
            noop,
        );
        assert_eq!(tools.list(), json!({"tools": [{"name": "kept", "inputSchema": schema}]}));
        assert_eq!(tools.param_headers("kept").iter().map(|h| h.label.as_str()).collect::<Vec<_>>(), ["P"]);
        assert!(tools.param_headers("dropped").is_empty());
    }

    #[test]
    fn only_tools_annotated_read_only_are() {
        let mut tools = ToolSet::new();
        let noop = |_, _| async { Ok(json!({})) };
        tools.add(json!({"name": "reads", "annotations": {"readOnlyHint": true}}), noop);
        tools.add(json!({"name": "writes", "annotations": {"readOnlyHint": false}}), noop);
        tools.add(json!({"name": "unsaid"}), noop);
        assert!(tools.is_read_only(&json!({"name": "reads"})));
        assert!(!tools.is_read_only(&json!({"name": "writes"})));
        assert!(!tools.is_read_only(&json!({"name": "unsaid"})));
        assert!(!tools.is_read_only(&json!({"name": "unknown"})));
    }
}
