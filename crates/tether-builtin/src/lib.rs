//! The tools, resources and prompts `tether serve` offers: the conformance fixture set and
//! tools that exercise streaming, resumption and side effects.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tether_core::jsonrpc::{ErrorObject, code};
use tether_core::mcp::{Era, code as mcp_code};
use tether_core::param_headers::ParamHeader;
use tether_core::tasks::TaskSupport;
use tether_server::excerpt::quoted;
use tether_server::tools::{ToolSet, invalid_argument, text_result};
use tether_server::{Context, ContextError, Handler, HandlerFuture, InputRequired, LogLevel, Refusal, ServerInfo};
use tether_store::{CounterStore, MemoryStore, Retention, StoreError};

/// A 1×1 PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// A WAV header with no samples.
const WAV: &str = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQAAAAA=";

/// The handler behind `tether serve`.
#[derive(Debug)]
pub struct BuiltinHandler {
    tools: ToolSet,
}

fn context_error(err: ContextError) -> ErrorObject {
    err.to_error()
}

fn u64_arg(args: &Value, name: &str, default: u64, max: u64) -> Result<u64, ErrorObject> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(value) => value
            .as_u64()
            .filter(|n| *n <= max)
            .ok_or_else(|| invalid_argument(format!("{name} must be an integer from 0 to {max}"))),
    }
}

fn str_arg<'a>(args: &'a Value, name: &str) -> Result<&'a str, ErrorObject> {
    args.get(name).and_then(Value::as_str).ok_or_else(|| invalid_argument(format!("{name} must be a string")))
}

fn schema(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required})
}

fn tool(name: &str, description: &str, input_schema: Value) -> Value {
    json!({"name": name, "description": description, "inputSchema": input_schema})
}

/// `definition` annotated as a tool without effects, which running twice changes nothing
/// ([`Handler::read_only`]).
fn without_effects(mut definition: Value) -> Value {
    definition["annotations"] = json!({"readOnlyHint": true, "idempotentHint": true});
    definition
}

async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

impl BuiltinHandler {
    /// The built-in tool set, its counters kept in `counters`: the server's own store, so they
    /// are as durable and as shared between replicas as the sessions.
    pub fn new(counters: Arc<dyn CounterStore>) -> BuiltinHandler {
        let mut tools = ToolSet::new();
        add_stream_tools(&mut tools, &counters);
        add_fixture_tools(&mut tools);
        add_stateless_fixture_tools(&mut tools);
        add_input_required_tools(&mut tools);
        add_task_tools(&mut tools);
        add_announcing_tools(&mut tools);
        BuiltinHandler { tools }
    }

    /// The built-in tool set with counters in a memory store of their own: for a server whose
    /// sessions are in memory too (tests, examples), where nothing outlives the process anyway.
    pub fn in_memory() -> BuiltinHandler {
        BuiltinHandler::new(Arc::new(MemoryStore::new(Retention::default())))
    }
}

/// Tools for streaming, resumption and side effects.
fn add_stream_tools(tools: &mut ToolSet, counters: &Arc<dyn CounterStore>) {
    tools.add(
        without_effects(task_tool(
            "count",
            "Sends `to` notifications on the request's stream, `interval_ms` apart: progress if the request has a progress token, else notifications/message with data {\"count\": i}. Then a text result. Runs as a task for a client that declares tasks (the notifications are then the task's events).",
            schema(json!({"to": {"type": "integer", "minimum": 0}, "interval_ms": {"type": "integer", "minimum": 0}}), &["to"]),
            "optional",
        )),
        |ctx, args| async move {
            let to = u64_arg(&args, "to", 0, 1_000_000)?;
            escalate(&ctx).await?;
            let interval = u64_arg(&args, "interval_ms", 0, 60_000)?;
            for i in 1..=to {
                if i > 1 && interval > 0 {
                    sleep_ms(interval).await;
                }
                let sent = if ctx.has_progress_token() {
                    ctx.progress(i as f64, Some(to as f64), None).await
                } else {
                    ctx.notify("notifications/message", json!({"level": "info", "data": {"count": i}})).await
                };
                sent.map_err(context_error)?;
            }
            Ok(text_result(format!("counted to {to}")))
        },
    );
    tools.add_resumable(
        tool(
            "counter_add",
            "Adds `amount` to the store-backed counter `key` and returns the new value. Not idempotent; with an idempotency key, the addition is made once.",
            schema(json!({"key": {"type": "string"}, "amount": {"type": "integer"}}), &["key", "amount"]),
        ),
        {
            let counters = Arc::clone(counters);
            move |ctx, args| {
                let counters = Arc::clone(&counters);
                async move {
                    let key = str_arg(&args, "key")?;
                    let amount = args
                        .get("amount")
                        .and_then(Value::as_i64)
                        .ok_or_else(|| invalid_argument("amount must be an integer"))?;
                    // Under the request's idempotency key the addition is made once however often
                    // the request runs: a re-run returns the value the first run made.
                    let value = counters
                        .counter_add(key, amount, ctx.idempotency_key())
                        .await
                        .map_err(store_failure)?;
                    Ok(counter_result(value))
                }
            }
        },
    );
    tools.add(
        without_effects(tool(
            "counter_get",
            "Returns the value of the store-backed counter `key`.",
            schema(json!({"key": {"type": "string"}}), &["key"]),
        )),
        {
            let counters = Arc::clone(counters);
            move |_, args| {
                let counters = Arc::clone(&counters);
                async move {
                    let key = str_arg(&args, "key")?;
                    let value = counters.counter_get(key).await.map_err(store_failure)?;
                    Ok(counter_result(value))
                }
            }
        },
    );
    tools.add(
        tool(
            "broadcast",
            "Sends `count` notifications/message on the session's standalone GET stream, `interval_ms` apart.",
            schema(
                json!({"count": {"type": "integer", "minimum": 0}, "interval_ms": {"type": "integer", "minimum": 0}}),
                &["count"],
            ),
        ),
        |ctx, args| async move {
            let count = u64_arg(&args, "count", 0, 1_000_000)?;
            let interval = u64_arg(&args, "interval_ms", 0, 60_000)?;
            let mut delivered = 0;
            for i in 1..=count {
                if i > 1 && interval > 0 {
                    sleep_ms(interval).await;
                }
                let params = json!({"level": "info", "data": {"broadcast": i}});
                if ctx.broadcast("notifications/message", params).await.map_err(context_error)? {
                    delivered += 1;
                }
            }
            Ok(text_result(format!("broadcast {delivered} of {count} notifications")))
        },
    );
    tools.add(
        tool(
            "notify_all",
            "Sends one notifications/message with data {\"seq\": seq} to the standalone GET stream of every session this server process serves; returns how many it reached.",
            schema(json!({"seq": {"type": "integer", "minimum": 0}}), &[]),
        ),
        |ctx, args| async move {
            let seq = u64_arg(&args, "seq", 0, u64::MAX)?;
            let params = json!({"level": "info", "data": {"seq": seq}});
            let reached = ctx.notify_all("notifications/message", params).await.map_err(context_error)?;
            Ok(text_result(format!("sent to {reached} sessions")))
        },
    );
    tools.add(
        tool(
            "sleep",
            "Waits `ms` milliseconds, then returns.",
            schema(json!({"ms": {"type": "integer", "minimum": 0}}), &["ms"]),
        ),
        |ctx, args| async move {
            let ms = u64_arg(&args, "ms", 0, 3_600_000)?;
            tokio::select! {
                () = sleep_ms(ms) => Ok(text_result(format!("slept {ms} ms"))),
                () = ctx.cancelled() => Err(Refusal::RequestCancelled.error("cancelled while it slept")),
            }
        },
    );
}

fn counter_result(value: i64) -> Value {
    json!({"content": [{"type": "text", "text": value.to_string()}], "structuredContent": {"value": value}})
}

/// A counter the store could not add to or read: `store_unavailable` while its backend fails,
/// which a client answers by sending the call again (with its key, the addition is made once).
fn store_failure(err: StoreError) -> ErrorObject {
    Refusal::of_store_failure(&err).error(err.to_string())
}

fn internal(message: String) -> ErrorObject {
    ErrorObject::with_reason(code::INTERNAL_ERROR, message, "internal")
}

/// The tools the MCP conformance suite (0.1.16) expects of an "everything" server.
fn add_fixture_tools(tools: &mut ToolSet) {
    let none = || schema(json!({}), &[]);
    tools.add(tool("test_simple_text", "Returns a simple text.", none()), |_, _| async {
        Ok(text_result("This is a simple text response for testing."))
    });
    tools.add(tool("test_image_content", "Returns an image.", none()), |_, _| async {
        Ok(json!({"content": [{"type": "image", "data": PNG, "mimeType": "image/png"}]}))
    });
    tools.add(tool("test_audio_content", "Returns audio.", none()), |_, _| async {
        Ok(json!({"content": [{"type": "audio", "data": WAV, "mimeType": "audio/wav"}]}))
    });
    tools.add(tool("test_embedded_resource", "Returns an embedded resource.", none()), |_, _| async {
        Ok(json!({"content": [{"type": "resource", "resource": {
            "uri": "test://embedded-resource", "mimeType": "text/plain", "text": "This is an embedded resource content."}}]}))
    });
    tools.add(tool("test_multiple_content_types", "Returns text, image and resource.", none()), |_, _| async {
        Ok(json!({"content": [
            {"type": "text", "text": "Multiple content types test:"},
            {"type": "image", "data": PNG, "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "test://mixed-content-resource", "mimeType": "application/json",
                "text": "{\"test\":\"data\",\"value\":123}"}},
        ]}))
    });
    tools.add(tool("test_tool_with_logging", "Logs three messages while running.", none()), |ctx, _| async move {
        for (i, text) in
            ["Tool execution started", "Tool processing data", "Tool execution completed"].into_iter().enumerate()
        {
            if i > 0 {
                sleep_ms(50).await;
            }
            ctx.log(LogLevel::Info, json!(text)).await.map_err(context_error)?;
        }
        Ok(text_result("Tool with logging executed successfully"))
    });
    tools.add(tool("test_error_handling", "Always fails.", none()), |_, _| async {
        Ok(json!({"isError": true, "content": [{"type": "text", "text": "This tool intentionally returns an error for testing"}]}))
    });
    tools.add(tool("test_tool_with_progress", "Reports progress 0, 50, 100.", none()), |ctx, _| async move {
        for (i, progress) in [0.0, 50.0, 100.0].into_iter().enumerate() {
            if i > 0 {
                sleep_ms(50).await;
            }
            ctx.progress(progress, Some(100.0), None).await.map_err(context_error)?;
        }
        Ok(text_result("Tool with progress executed successfully"))
    });
    tools.add(
        tool("test_sampling", "Asks the client's LLM.", schema(json!({"prompt": {"type": "string"}}), &["prompt"])),
        |ctx, args| async move {
            let prompt = str_arg(&args, "prompt")?.to_owned();
            let params =
                json!({"messages": [{"role": "user", "content": {"type": "text", "text": prompt}}], "maxTokens": 100});
            let answer = ctx.request("sampling/createMessage", params).await.map_err(context_error)?;
            let text = answer.pointer("/content/text").and_then(Value::as_str).unwrap_or_default().to_owned();
            Ok(text_result(format!("LLM response: {text}")))
        },
    );
    tools.add(
        tool("test_elicitation", "Asks the user.", schema(json!({"message": {"type": "string"}}), &["message"])),
        |ctx, args| async move {
            let message = str_arg(&args, "message")?.to_owned();
            let params = json!({"message": message, "requestedSchema": {"type": "object", "properties": {
                "username": {"type": "string", "description": "User's response"},
                "email": {"type": "string", "description": "User's email address"}},
                "required": ["username", "email"]}});
            let answer = ctx.request("elicitation/create", params).await.map_err(context_error)?;
            Ok(text_result(format!("User response: {answer}")))
        },
    );
    tools.add(tool("test_elicitation_sep1034_defaults", "Elicitation with defaults.", none()), |ctx, _| async move {
        let params = json!({"message": "Please review and update the form fields with defaults", "requestedSchema": {
            "type": "object", "properties": {
                "name": {"type": "string", "description": "User name", "default": "John Doe"},
                "age": {"type": "integer", "description": "User age", "default": 30},
                "score": {"type": "number", "description": "User score", "default": 95.5},
                "status": {"type": "string", "description": "User status", "enum": ["active", "inactive", "pending"], "default": "active"},
                "verified": {"type": "boolean", "description": "Verification status", "default": true}}}});
        let answer = ctx.request("elicitation/create", params).await.map_err(context_error)?;
        Ok(elicitation_result(&answer))
    });
    tools.add(tool("test_elicitation_sep1330_enums", "Elicitation with enum variants.", none()), |ctx, _| async move {
        let params = json!({"message": "Please select options from the enum fields", "requestedSchema": {
            "type": "object", "properties": {
                "untitledSingle": {"type": "string", "description": "Choose one", "enum": ["option1", "option2", "option3"]},
                "titledSingle": {"type": "string", "description": "Choose one", "oneOf": [
                    {"const": "value1", "title": "First Option"}, {"const": "value2", "title": "Second Option"},
                    {"const": "value3", "title": "Third Option"}]},
                "legacyEnum": {"type": "string", "description": "Choose one", "enum": ["opt1", "opt2", "opt3"],
                    "enumNames": ["Option One", "Option Two", "Option Three"]},
                "untitledMulti": {"type": "array", "description": "Choose several",
                    "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
                "titledMulti": {"type": "array", "description": "Choose several", "items": {"anyOf": [
                    {"const": "value1", "title": "First Choice"}, {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"}]}}}}});
        let answer = ctx.request("elicitation/create", params).await.map_err(context_error)?;
        Ok(elicitation_result(&answer))
    });
    tools.add(
        json!({"name": "json_schema_2020_12_tool", "description": "Tool with JSON Schema 2020-12 features", "inputSchema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
            "$defs": {"address": {"$anchor": "addressDef", "type": "object",
                "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
            "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"},
                "contactMethod": {"type": "string", "enum": ["phone", "email"]},
                "phone": {"type": "string"}, "email": {"type": "string"}},
            "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
            "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
            "then": {"required": ["phone"]}, "else": {"required": ["email"]},
            "additionalProperties": false}}),
        |_, args| async move { Ok(text_result(format!("received {args}"))) },
    );
    tools.add(
        tool(
            "test_reconnection",
            "Closes the connection mid-call (SEP-1699); the result arrives after the client resumes.",
            none(),
        ),
        |ctx, _| async move {
            ctx.log(LogLevel::Info, json!("closing the connection; resume to get the result"))
                .await
                .map_err(context_error)?;
            ctx.close_connection();
            sleep_ms(100).await;
            Ok(text_result("Reconnection test completed"))
        },
    );
}

/// Tools the 2026-07-28 conformance scenarios call.
fn add_stateless_fixture_tools(tools: &mut ToolSet) {
    let none = || schema(json!({}), &[]);
    tools.add(
        tool("test_missing_capability", "Needs the client's sampling capability.", none()),
        |ctx, _| async move {
            if ctx.client_capabilities().get("sampling").is_none() {
                let mut error = ErrorObject::with_reason(
                    tether_core::mcp::code::MISSING_REQUIRED_CLIENT_CAPABILITY,
                    "this tool needs the client's sampling capability",
                    "missing_client_capability",
                );
                error.data =
                    Some(json!({"reason": "missing_client_capability", "requiredCapabilities": {"sampling": {}}}));
                return Err(error);
            }
            Ok(text_result("the client can sample"))
        },
    );
    tools.add(tool("test_logging_tool", "Logs at info level, then returns.", none()), |ctx, _| async move {
        ctx.log(LogLevel::Info, json!("test_logging_tool ran")).await.map_err(context_error)?;
        Ok(text_result("logged"))
    });
    tools.add(tool("test_streaming_elicitation", "Asks the user within a session; without one, says it cannot.", none()), |ctx, _| async move {
        let params = json!({"message": "Your name?", "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}}});
        match ctx.request("elicitation/create", params).await {
            Ok(answer) => Ok(elicitation_result(&answer)),
            Err(ContextError::NoSession) => Ok(text_result("elicitation needs a session; this request has none")),
            Err(err) => Err(context_error(err)),
        }
    });
    tools.add(
        tool(
            "test_custom_headers",
            "Echoes its arguments; `region`, `priority` and `dryRun` travel in Mcp-Param-* headers too (SEP-2243).",
            schema(
                json!({"region": {"type": "string", "x-mcp-header": "Region"},
                    "priority": {"type": "integer", "x-mcp-header": "Priority"},
                    "dryRun": {"type": "boolean", "x-mcp-header": "DryRun"}}),
                &["region"],
            ),
        ),
        |_, args| async move { Ok(text_result(format!("received {args}"))) },
    );
}

fn elicitation_result(answer: &Value) -> Value {
    let action = answer.get("action").and_then(Value::as_str).unwrap_or("unknown");
    let content = answer.get("content").cloned().unwrap_or(Value::Null);
    text_result(format!("Elicitation completed: action={action}, content={content}"))
}

fn resources_list() -> Value {
    json!({"resources": [
        {"uri": "test://static-text", "name": "static-text", "description": "A static text resource", "mimeType": "text/plain"},
        {"uri": "test://static-binary", "name": "static-binary", "description": "A static binary resource", "mimeType": "image/png"},
        {"uri": "test://watched-resource", "name": "watched-resource", "description": "A resource to subscribe to", "mimeType": "text/plain"},
    ]})
}

/// The params of an `elicitation/create` asking `message` for one string field, `field`.
fn elicitation(message: &str, field: &str) -> Value {
    json!({"message": message, "requestedSchema": {"type": "object",
        "properties": {field: {"type": "string"}}, "required": [field]}})
}

/// The params of a `sampling/createMessage` asking `prompt`.
fn sampling(prompt: &str, max_tokens: u64) -> Value {
    json!({"messages": [{"role": "user", "content": {"type": "text", "text": prompt}}], "maxTokens": max_tokens})
}

/// The content the user gave for input `key` (an `ElicitResult`): `None` if the request does
/// not carry the answer yet, an empty object if the user declined or cancelled, an error if the
/// answer is not an `ElicitResult`.
fn elicited(ctx: &Context, key: &str) -> Result<Option<Value>, ErrorObject> {
    let Some(answer) = ctx.input_response(key) else { return Ok(None) };
    match answer.get("action").and_then(Value::as_str) {
        Some("accept") => Ok(Some(answer.get("content").cloned().unwrap_or_else(|| json!({})))),
        Some("decline" | "cancel") => Ok(Some(json!({}))),
        _ => Err(invalid_argument(format!("inputResponses[{}] is not an elicitation result", quoted(key)))),
    }
}

/// The text a model answered input `key` with (a `CreateMessageResult`).
fn sampled(ctx: &Context, key: &str) -> Option<String> {
    let answer = ctx.input_response(key)?;
    Some(answer.pointer("/content/text").and_then(Value::as_str).unwrap_or_default().to_owned())
}

/// The root uris the client listed for input `key` (a `ListRootsResult`).
fn listed_roots(ctx: &Context, key: &str) -> Option<Vec<String>> {
    let answer = ctx.input_response(key)?;
    let roots = answer.get("roots")?.as_array()?;
    Some(roots.iter().filter_map(|r| r.get("uri").and_then(Value::as_str)).map(str::to_owned).collect())
}

/// The `name` the user gave in an elicitation's content (or a state that kept it).
fn name_in(content: &Value) -> &str {
    content.get("name").and_then(Value::as_str).unwrap_or("stranger")
}

/// The tools that announce a change of the tool or prompt list, as a server whose lists change
/// does: to every session's standalone stream and every `subscriptions/listen` stream that
/// carries it (the conformance suite's SEP-2575 checks call them).
fn add_announcing_tools(tools: &mut ToolSet) {
    for (name, what, method) in [
        ("test_trigger_tool_change", "tool", "notifications/tools/list_changed"),
        ("test_trigger_prompt_change", "prompt", "notifications/prompts/list_changed"),
    ] {
        let description = format!("Announces that the {what} list changed.");
        tools.add(tool(name, &description, schema(json!({}), &[])), move |ctx, _| async move {
            let reached = ctx.notify_all(method, json!({})).await.map_err(context_error)?;
            Ok(text_result(format!("announced to {reached} listeners")))
        });
    }
}

/// A tool definition that runs as a task `support` (`"optional"`, `"required"`).
fn task_tool(name: &str, description: &str, input_schema: Value, support: &str) -> Value {
    json!({"name": name, "description": description, "inputSchema": input_schema,
        "execution": {"taskSupport": support}})
}

/// Turns the call into a task (SEP-2663) where it may become one; the work goes on either way.
async fn escalate(ctx: &Context) -> Result<bool, ErrorObject> {
    ctx.escalate().await.map_err(context_error)
}

/// The tools the conformance suite's tasks scenarios (SEP-2663) call: `greet` answers at once;
/// the others become tasks when the client declares them, and ask for input through the task.
fn add_task_tools(tools: &mut ToolSet) {
    let none = || schema(json!({}), &[]);
    tools.add(
        tool("greet", "Greets someone, at once.", schema(json!({"name": {"type": "string"}}), &[])),
        |_, args| async move {
            Ok(text_result(format!("Hello, {}!", args.get("name").and_then(Value::as_str).unwrap_or("World"))))
        },
    );
    tools.add(
        task_tool(
            "slow_compute",
            "Works for `seconds` seconds (as a task, cancellable), then reports its label; 0 answers at once.",
            schema(json!({"seconds": {"type": "integer", "minimum": 0}, "label": {"type": "string"}}), &[]),
            "optional",
        ),
        |ctx, args| async move {
            let seconds = u64_arg(&args, "seconds", 1, 3_600)?;
            let label = args.get("label").and_then(Value::as_str).unwrap_or("compute").to_owned();
            if seconds > 0 {
                escalate(&ctx).await?;
                tokio::select! {
                    () = sleep_ms(seconds * 1_000) => {}
                    () = ctx.cancelled() => return Err(internal("cancelled".into())),
                }
            }
            Ok(text_result(format!("{label}: computed in {seconds}s")))
        },
    );
    tools.add(
        task_tool("failing_job", "A task whose tool fails after a second.", none(), "required"),
        |ctx, _| async move {
            escalate(&ctx).await?;
            sleep_ms(1_000).await;
            Ok(json!({"content": [{"type": "text", "text": "the job failed"}], "isError": true}))
        },
    );
    tools.add(
        task_tool("protocol_error_job", "A task that ends in a JSON-RPC error.", none(), "optional"),
        |ctx, _| async move {
            escalate(&ctx).await?;
            Err(internal("the job broke down".into()))
        },
    );
    tools.add(
        task_tool(
            "confirm_delete",
            "A task that asks the user to confirm before it deletes `filename`.",
            schema(json!({"filename": {"type": "string"}}), &[]),
            "optional",
        ),
        |ctx, args| async move {
            escalate(&ctx).await?;
            let filename = args.get("filename").and_then(Value::as_str).unwrap_or("file").to_owned();
            Ok(match elicited(&ctx, "confirm")? {
                Some(content) if content.get("confirm") == Some(&json!(true)) => {
                    text_result(format!("Deleted {filename}"))
                }
                Some(_) => text_result(format!("Kept {filename}")),
                None => InputRequired::new()
                    .ask(
                        "confirm",
                        "elicitation/create",
                        json!({"message": format!("Delete {filename}?"),
                        "requestedSchema": {"type": "object", "properties": {"confirm": {"type": "boolean"}},
                            "required": ["confirm"]}}),
                    )
                    .into_result(),
            })
        },
    );
    tools.add(
        task_tool("multi_input", "A task that asks two questions at once.", none(), "optional"),
        |ctx, _| async move {
            escalate(&ctx).await?;
            Ok(match (elicited(&ctx, "first")?, elicited(&ctx, "second")?) {
                (Some(first), Some(second)) => {
                    text_result(format!("Answers: {} and {}", name_in(&first), name_in(&second)))
                }
                _ => InputRequired::new()
                    .ask("first", "elicitation/create", elicitation("First name?", "name"))
                    .ask("second", "elicitation/create", elicitation("Second name?", "name"))
                    .into_result(),
            })
        },
    );
    tools.add(
        task_tool("test_tool_with_task", "Asks the user's name first, then greets them as a task.", none(), "required"),
        |ctx, _| async move {
            let Some(content) = elicited(&ctx, "user_name")? else {
                return Ok(InputRequired::new()
                    .ask("user_name", "elicitation/create", elicitation("What is your name?", "name"))
                    .into_result());
            };
            escalate(&ctx).await?;
            sleep_ms(100).await;
            Ok(text_result(format!("Hello, {}!", name_in(&content))))
        },
    );
}

/// The tools the conformance suite's multi round-trip scenarios (SEP-2322) call: each asks the
/// client for input through the result, never through a server-to-client request.
fn add_input_required_tools(tools: &mut ToolSet) {
    let none = || schema(json!({}), &[]);
    tools.add(
        tool("test_input_required_result_elicitation", "Asks the user's name, then greets them.", none()),
        |ctx, _| async move {
            Ok(match elicited(&ctx, "user_name")? {
                Some(content) => text_result(format!("Hello, {}!", name_in(&content))),
                None => InputRequired::new()
                    .ask("user_name", "elicitation/create", elicitation("What is your name?", "name"))
                    .into_result(),
            })
        },
    );
    tools.add(
        tool(
            "test_input_required_result_sampling",
            "Asks the client's model a question, then reports its answer.",
            none(),
        ),
        |ctx, _| async move {
            Ok(match sampled(&ctx, "capital_question") {
                Some(text) => text_result(format!("The model said: {text}")),
                None => InputRequired::new()
                    .ask("capital_question", "sampling/createMessage", sampling("What is the capital of France?", 100))
                    .into_result(),
            })
        },
    );
    tools.add(
        tool("test_input_required_result_list_roots", "Asks the client's roots, then lists them.", none()),
        |ctx, _| async move {
            Ok(match listed_roots(&ctx, "client_roots") {
                Some(roots) => text_result(format!("roots: {}", roots.join(", "))),
                None => InputRequired::new().ask("client_roots", "roots/list", json!({})).into_result(),
            })
        },
    );
    for (name, description) in [
        (
            "test_input_required_result_request_state",
            "Asks for a confirmation with a state, and finishes only with that state back.",
        ),
        (
            "test_input_required_result_tampered_state",
            "Asks for a confirmation with a state; a changed state is refused.",
        ),
    ] {
        tools.add(tool(name, description, none()), move |ctx, _| async move {
            let confirmed = elicited(&ctx, "confirm")?.is_some();
            if confirmed && ctx.request_state() == Some(json!({"tool": name, "asked": "confirm"})) {
                return Ok(text_result("state-ok: confirmed"));
            }
            let params = json!({"message": "Please confirm", "requestedSchema": {"type": "object",
                "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}});
            Ok(InputRequired::new()
                .ask("confirm", "elicitation/create", params)
                .state(json!({"tool": name, "asked": "confirm"}))
                .into_result())
        });
    }
    tools.add(
        tool(
            "test_input_required_result_multiple_inputs",
            "Asks for a name, a greeting and the roots at once.",
            none(),
        ),
        |ctx, _| async move {
            let name = elicited(&ctx, "user_name")?;
            let greeting = sampled(&ctx, "greeting");
            let roots = listed_roots(&ctx, "client_roots");
            if let (Some(name), Some(greeting), Some(roots), Some(_)) = (&name, &greeting, &roots, ctx.request_state())
            {
                let name = name_in(name);
                return Ok(text_result(format!("{greeting} {name} ({} roots)", roots.len())));
            }
            Ok(InputRequired::new()
                .ask("user_name", "elicitation/create", elicitation("What is your name?", "name"))
                .ask("greeting", "sampling/createMessage", sampling("Generate a greeting", 50))
                .ask("client_roots", "roots/list", json!({}))
                .state(json!({"asked": ["user_name", "greeting", "client_roots"]}))
                .into_result())
        },
    );
    tools.add(
        tool("test_input_required_result_multi_round", "Asks a name, then a colour, in two rounds.", none()),
        |ctx, _| async move {
            let step = ctx.request_state().and_then(|s| s.get("step").and_then(Value::as_u64));
            Ok(match step {
                Some(1) if let Some(answer) = elicited(&ctx, "step1")? => {
                    let name = answer.get("name").cloned().unwrap_or(Value::Null);
                    InputRequired::new()
                        .ask("step2", "elicitation/create", elicitation("What is your favourite colour?", "color"))
                        .state(json!({"step": 2, "name": name}))
                        .into_result()
                }
                Some(2) if let Some(answer) = elicited(&ctx, "step2")? => {
                    let state = ctx.request_state().unwrap_or(Value::Null);
                    let name = name_in(&state);
                    let color = answer.get("color").and_then(Value::as_str).unwrap_or("no colour");
                    text_result(format!("{name} likes {color}"))
                }
                _ => InputRequired::new()
                    .ask("step1", "elicitation/create", elicitation("What is your name?", "name"))
                    .state(json!({"step": 1}))
                    .into_result(),
            })
        },
    );
    tools.add(
        tool("test_input_required_result_capabilities", "Asks only for what the client can answer.", none()),
        |ctx, _| async move {
            if let Some(text) = sampled(&ctx, "question") {
                return Ok(text_result(format!("The model said: {text}")));
            }
            if let Some(content) = elicited(&ctx, "user_name")? {
                return Ok(text_result(format!("Hello, {}!", name_in(&content))));
            }
            let can = |capability: &str| ctx.client_capabilities().get(capability).is_some();
            let mut ask = InputRequired::new();
            if can("sampling") {
                ask = ask.ask("question", "sampling/createMessage", sampling("What is the capital of France?", 100));
            }
            if can("elicitation") {
                ask = ask.ask("user_name", "elicitation/create", elicitation("What is your name?", "name"));
            }
            if ask.is_empty() {
                let mut error = ErrorObject::with_reason(
                    mcp_code::MISSING_REQUIRED_CLIENT_CAPABILITY,
                    "this tool needs the client's sampling or elicitation capability",
                    "missing_client_capability",
                );
                error.data =
                    Some(json!({"reason": "missing_client_capability", "requiredCapabilities": {"sampling": {}}}));
                return Err(error);
            }
            Ok(ask.into_result())
        },
    );
}

fn resource_read(params: &Value, stateless: bool) -> Result<Value, ErrorObject> {
    let uri = str_arg(params, "uri")?;
    let content = match uri {
        "test://static-text" => {
            json!({"uri": uri, "mimeType": "text/plain", "text": "This is the content of the static text resource."})
        }
        "test://static-binary" => json!({"uri": uri, "mimeType": "image/png", "blob": PNG}),
        "test://watched-resource" => json!({"uri": uri, "mimeType": "text/plain", "text": "Watched resource content."}),
        _ => match uri.strip_prefix("test://template/").and_then(|rest| rest.strip_suffix("/data")) {
            Some(id) if !id.is_empty() && !id.contains('/') => {
                let text = json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")}).to_string();
                json!({"uri": uri, "mimeType": "application/json", "text": text})
            }
            _ => {
                // SEP-2164 (2026-07-28): invalid params naming the uri; earlier revisions had
                // a code of their own.
                let code = if stateless { code::INVALID_PARAMS } else { mcp_code::RESOURCE_NOT_FOUND };
                let mut error =
                    ErrorObject::with_reason(code, format!("resource {} not found", quoted(uri)), "resource_not_found");
                if let Some(Value::Object(data)) = &mut error.data {
                    data.insert("uri".into(), json!(uri));
                }
                return Err(error);
            }
        },
    };
    Ok(json!({"contents": [content]}))
}

fn prompts_list() -> Value {
    json!({"prompts": [
        {"name": "test_simple_prompt", "description": "A simple prompt without arguments"},
        {"name": "test_prompt_with_arguments", "description": "A prompt with arguments", "arguments": [
            {"name": "arg1", "description": "First test argument", "required": true},
            {"name": "arg2", "description": "Second test argument", "required": true}]},
        {"name": "test_prompt_with_embedded_resource", "description": "A prompt with an embedded resource", "arguments": [
            {"name": "resourceUri", "description": "URI of the resource to embed", "required": true}]},
        {"name": "test_prompt_with_image", "description": "A prompt with an image"},
        {"name": "test_input_required_result_prompt", "description": "Asks the client for context first (2026-07-28)"},
    ]})
}

fn prompt_get(ctx: &Context, params: &Value) -> Result<Value, ErrorObject> {
    let name = str_arg(params, "name")?;
    if name == "test_input_required_result_prompt" {
        let Some(context) = elicited(ctx, "user_context")? else {
            return Ok(InputRequired::new()
                .ask(
                    "user_context",
                    "elicitation/create",
                    elicitation("What context should the prompt use?", "context"),
                )
                .into_result());
        };
        let text = format!("Use this context: {}", context.get("context").and_then(Value::as_str).unwrap_or("none"));
        return Ok(json!({"messages": [{"role": "user", "content": {"type": "text", "text": text}}]}));
    }
    let args = params.get("arguments").cloned().unwrap_or_else(|| json!({}));
    let arg = |key: &str| args.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
    let user = |content: Value| json!({"role": "user", "content": content});
    let messages = match name {
        "test_simple_prompt" => vec![user(json!({"type": "text", "text": "This is a simple prompt for testing."}))],
        "test_prompt_with_arguments" => vec![user(json!({"type": "text",
            "text": format!("Prompt with arguments: arg1='{}', arg2='{}'", arg("arg1"), arg("arg2"))}))],
        "test_prompt_with_embedded_resource" => vec![
            user(json!({"type": "resource", "resource": {"uri": arg("resourceUri"), "mimeType": "text/plain",
                "text": "Embedded resource content for testing."}})),
            user(json!({"type": "text", "text": "Please process the embedded resource above."})),
        ],
        "test_prompt_with_image" => vec![
            user(json!({"type": "image", "data": PNG, "mimeType": "image/png"})),
            user(json!({"type": "text", "text": "Please analyze the image above."})),
        ],
        _ => return Err(invalid_argument(format!("unknown prompt {}", quoted(name)))),
    };
    Ok(json!({"messages": messages}))
}

impl Handler for BuiltinHandler {
    fn info(&self) -> ServerInfo {
        ServerInfo {
            name: "tether".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            instructions: None,
            capabilities: json!({
                "tools": {"listChanged": true},
                "resources": {"subscribe": true, "listChanged": false},
                "prompts": {"listChanged": true},
                "completions": {},
            }),
        }
    }

    fn call(&self, ctx: Context, method: String, params: Value) -> HandlerFuture {
        let ready = |result: Result<Value, ErrorObject>| -> HandlerFuture { Box::pin(std::future::ready(result)) };
        match method.as_str() {
            "tools/list" => ready(Ok(self.tools.list())),
            "tools/call" => self.tools.call(ctx, &params),
            "resources/list" => ready(Ok(resources_list())),
            "resources/templates/list" => ready(Ok(json!({"resourceTemplates": [{
                "uriTemplate": "test://template/{id}/data", "name": "template", "description": "A templated resource",
                "mimeType": "application/json"}]}))),
            "resources/read" => {
                let stateless = ctx.session().is_none_or(|s| s.protocol_version().era() == Era::Stateless);
                ready(resource_read(&params, stateless))
            }
            "resources/subscribe" | "resources/unsubscribe" => ready(Ok(json!({}))),
            "prompts/list" => ready(Ok(prompts_list())),
            "prompts/get" => ready(prompt_get(&ctx, &params)),
            "completion/complete" => ready(Ok(json!({"completion": {"values": [], "total": 0, "hasMore": false}}))),
            _ => ready(Err(ErrorObject::with_reason(
                code::METHOD_NOT_FOUND,
                format!("method {} not found", quoted(&method)),
                "method_not_found",
            ))),
        }
    }

    fn resumable(&self, method: &str, params: &Value) -> bool {
        method == "tools/call" && self.tools.is_resumable(params)
    }

    fn read_only(&self, method: &str, params: &Value) -> bool {
        method == "tools/call" && self.tools.is_read_only(params)
    }

    fn param_headers(&self, tool: &str) -> &[ParamHeader] {
        self.tools.param_headers(tool)
    }

    fn task_support(&self, tool: &str) -> TaskSupport {
        self.tools.task_support(tool)
    }
}
