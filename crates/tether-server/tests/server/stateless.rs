//! The 2026-07-28 era: stateless requests on the same endpoint.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tether_core::input_required::StateKey;
use tether_core::tasks::TaskSupport;
use tether_server::{Builder, Context, Handler, HandlerFuture, ServerConfig, ServerInfo};

use crate::common::*;

fn meta() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}})
}

/// A stateless request with matching headers.
fn stateless(client: &Client, id: i64, method: &str, mut params: Value) -> reqwest::RequestBuilder {
    if params.get("_meta").is_none() {
        params["_meta"] = meta();
    }
    stateless_post(client, json!(id), method, params)
}

#[tokio::test]
async fn server_discover_describes_the_server_without_a_session() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let response = stateless(&client, 1, "server/discover", json!({})).send().await.expect("send");
    assert_eq!(response.status(), 200);
    assert!(!response.headers().contains_key("mcp-session-id"));
    let result = json_body(response).await["result"].clone();
    assert!(
        result["supportedVersions"]
            .as_array()
            .is_some_and(|v| v.contains(&json!("2026-07-28")) && v.contains(&json!("2025-11-25")))
    );
    assert_eq!(result["resultType"], "complete");
    assert_eq!(result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "tether");
    assert!(result["ttlMs"].is_u64() && result["cacheScope"].is_string());
    assert!(result["capabilities"]["tools"].is_object());
    assert_eq!(result["capabilities"]["tools"]["listChanged"], true, "announced on subscriptions/listen");
    let extensions = &result["capabilities"]["extensions"];
    assert!(
        extensions["io.modelcontextprotocol/tasks"].is_object() && extensions["io.tether/task-streams"].is_object()
    );
}

#[tokio::test]
async fn a_subscription_is_acknowledged_then_hears_only_what_it_asked_for() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let listen = |id: i64, notifications: Value| {
        stateless(&client, id, "subscriptions/listen", json!({"_meta": meta(), "notifications": notifications})).send()
    };
    let mut tools = listen(1, json!({"toolsListChanged": true, "resourcesListChanged": true})).await.expect("listen");
    let mut prompts = listen(2, json!({"promptsListChanged": true})).await.expect("listen");
    let first = messages(&events(&mut tools, 1).await);
    assert_eq!(first[0]["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(
        first[0]["params"]["notifications"],
        json!({"toolsListChanged": true}),
        "resources announce no list changes"
    );
    assert_eq!(first[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 1);
    assert_eq!(
        messages(&events(&mut prompts, 1).await)[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        2
    );
    let call = |name: &str| stateless(&client, 9, "tools/call", json!({"name": name, "arguments": {}})).send();
    call("test_trigger_tool_change").await.expect("trigger");
    call("test_trigger_prompt_change").await.expect("trigger");
    let heard = messages(&events(&mut tools, 1).await);
    assert_eq!(heard[0]["method"], "notifications/tools/list_changed");
    assert_eq!(heard[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 1);
    let heard = messages(&events(&mut prompts, 1).await);
    assert_eq!(heard[0]["method"], "notifications/prompts/list_changed", "not the tools' change before it");
}

#[tokio::test]
async fn tool_calls_are_served_statelessly_with_result_type() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let response = stateless(&client, 1, "tools/call", json!({"name": "test_simple_text", "arguments": {}}))
        .header("mcp-session-id", "ignored")
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 200);
    assert!(!response.headers().contains_key("mcp-session-id"), "session ids are neither minted nor echoed");
    let body = json_body(response).await;
    assert_eq!(body["result"]["resultType"], "complete");
    assert_eq!(body["result"]["content"][0]["text"], "This is a simple text response for testing.");
    let list = json_body(stateless(&client, 2, "tools/list", json!({})).send().await.expect("send")).await;
    assert!(list["result"]["ttlMs"].is_u64() && list["result"]["tools"].is_array());
}

#[tokio::test]
async fn streamed_notifications_carry_no_ids() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let params = json!({"name": "count", "arguments": {"to": 3}, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}, "progressToken": 5}});
    let mut response = stateless(&client, 1, "tools/call", params).send().await.expect("send");
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let (events, ended) = drain(&mut response).await;
    assert!(ended);
    assert!(events.iter().all(|e| e.id.is_none()));
    let got = messages(&events);
    assert_eq!(got.len(), 4);
    assert_eq!(got[3]["result"]["resultType"], "complete");
}

#[tokio::test]
async fn header_rules_are_enforced_with_minus_32020() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let call = json!({"name": "test_simple_text", "arguments": {}});
    let cases = [
        set(stateless(&client, 1, "tools/list", json!({})), "mcp-method", "prompts/list"),
        set(stateless(&client, 2, "tools/call", call.clone()), "mcp-name", "wrong_tool_name"),
        set(stateless(&client, 3, "tools/list", json!({})), "mcp-method", "TOOLS/LIST"),
    ];
    for (i, case) in cases.into_iter().enumerate() {
        let response = case.send().await.expect("send");
        assert_eq!(response.status(), 400, "case {i}");
        let body = json_body(response).await;
        assert_eq!(body["error"]["code"], -32020, "case {i}");
        assert_eq!(body["id"], json!(i + 1), "the error echoes the request id");
    }
    let no_method = client
        .http
        .post(&client.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .body(request(json!(9), "tools/list", json!({"_meta": meta()})).to_string());
    assert_eq!(json_body(no_method.send().await.expect("send")).await["error"]["code"], -32020);
    let padded = set(stateless(&client, 4, "tools/call", call), "mcp-name", "  test_simple_text  ");
    assert_eq!(padded.send().await.expect("send").status(), 200, "surrounding whitespace is not a mismatch");
}

/// SEP-2243: a tool's header-mirrored parameters must say in `Mcp-Param-*` what the body says;
/// base64 values are decoded strictly, anything else compared as it is.
#[tokio::test]
async fn tool_parameters_mirrored_in_headers_must_match_the_body() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let call = |id, region: &str, headers: &[(&str, &str)]| {
        let params = json!({"name": "test_custom_headers", "arguments": {"region": region, "priority": 3}});
        headers.iter().fold(stateless(&client, id, "tools/call", params), |b, (name, value)| b.header(*name, *value))
    };
    let accepted = [
        call(1, "Hello", &[("mcp-param-region", "=?base64?SGVsbG8=?="), ("mcp-param-priority", "3")]),
        call(2, "SGVsbG8=", &[("Mcp-Param-Region", "SGVsbG8="), ("mcp-param-priority", " 3 ")]),
        call(3, "=?base64?SGVsbG8=", &[("mcp-param-region", "=?base64?SGVsbG8="), ("mcp-param-priority", "3")]),
    ];
    for (i, case) in accepted.into_iter().enumerate() {
        let response = case.send().await.expect("send");
        assert_eq!(response.status(), 200, "case {i}");
        assert!(json_body(response).await.get("result").is_some(), "case {i}");
    }
    let refused = [
        call(4, "Hello", &[("mcp-param-region", "=?base64?SGVsbG8?="), ("mcp-param-priority", "3")]),
        call(5, "Hello", &[("mcp-param-region", "=?base64?SGVs!!!bG8=?="), ("mcp-param-priority", "3")]),
        call(6, "Hello", &[("mcp-param-priority", "3")]),
        call(7, "Hello", &[("mcp-param-region", "Hello"), ("mcp-param-priority", "4")]),
        call(8, "Hello", &[("mcp-param-region", "Hello"), ("mcp-param-priority", "3"), ("mcp-param-dryrun", "true")]),
    ];
    for (i, case) in refused.into_iter().enumerate() {
        let response = case.send().await.expect("send");
        assert_eq!(response.status(), 400, "case {i}");
        let body = json_body(response).await;
        assert_eq!(body["error"]["code"], -32020, "case {i}: {body}");
        assert_eq!(body["error"]["data"]["reason"], "header_mismatch", "case {i}");
    }
}

/// SEP-2164: an unknown resource is invalid params naming its uri.
#[tokio::test]
async fn an_unknown_resource_is_invalid_params_with_its_uri() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let uri = "test://nonexistent";
    let response = stateless(&client, 1, "resources/read", json!({"uri": uri})).header("mcp-name", uri).send().await;
    let body = json_body(response.expect("send")).await;
    assert_eq!(body["error"]["code"], -32602, "{body}");
    assert_eq!(body["error"]["data"]["uri"], uri);
}

/// SEP-2322: a tool that needs input answers with what it needs and a sealed state; the state
/// comes back unchanged or the request is refused before the tool runs again.
#[tokio::test]
async fn a_multi_round_request_carries_its_state_sealed() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let call = |id, extra: Value| {
        let mut params = json!({"name": "test_input_required_result_multi_round", "arguments": {}});
        if let (Value::Object(params), Value::Object(extra)) = (&mut params, extra) {
            params.extend(extra);
        }
        stateless(&client, id, "tools/call", params)
    };
    let first = json_body(call(1, json!({})).send().await.expect("send")).await;
    assert_eq!(first["result"]["resultType"], "input_required", "{first}");
    assert_eq!(first["result"]["inputRequests"]["step1"]["method"], "elicitation/create");
    let state = first["result"]["requestState"].as_str().expect("a sealed state").to_owned();
    let answer = |key: &str, content: Value| json!({key: {"action": "accept", "content": content}});
    let second = call(2, json!({"inputResponses": answer("step1", json!({"name": "Alice"})), "requestState": state}));
    let second = json_body(second.send().await.expect("send")).await;
    let state2 = second["result"]["requestState"].as_str().expect("a new state").to_owned();
    assert_ne!(state2, state);
    let third = call(3, json!({"inputResponses": answer("step2", json!({"color": "blue"})), "requestState": state2}));
    let third = json_body(third.send().await.expect("send")).await;
    assert_eq!(third["result"]["resultType"], "complete", "{third}");
    assert_eq!(third["result"]["content"][0]["text"], "Alice likes blue");
    // The state replayed with other arguments: the request it was issued for is another one.
    let other_arguments = stateless(
        &client,
        7,
        "tools/call",
        json!({"name": "test_input_required_result_multi_round", "arguments": {"x": 1},
            "inputResponses": answer("step1", json!({"name": "Mallory"})), "requestState": state}),
    );
    for (case, request) in [
        (
            "tampered",
            call(4, json!({"inputResponses": answer("step1", json!({})), "requestState": format!("{state}-TAMPERED")})),
        ),
        ("not a string", call(5, json!({"inputResponses": answer("step1", json!({})), "requestState": 7}))),
        ("other arguments", other_arguments),
    ] {
        let response = request.send().await.expect("send");
        assert_eq!(response.status(), 400, "{case}");
        let body = json_body(response).await;
        assert_eq!(
            (body["error"]["code"].clone(), body["error"]["data"]["reason"].clone()),
            (json!(-32602), json!("invalid_request_state"))
        );
    }
    let elsewhere = stateless(
        &client,
        6,
        "tools/call",
        json!({"name": "test_input_required_result_request_state", "arguments": {}, "requestState": state}),
    );
    let body = json_body(elsewhere.send().await.expect("send")).await;
    assert_eq!(body["error"]["data"]["reason"], "invalid_request_state", "a state is bound to its tool");
    for (id, responses) in [(7, json!(null)), (8, json!({"step1": 12345}))] {
        let body = json_body(call(id, json!({"inputResponses": responses})).send().await.expect("send")).await;
        assert_eq!(body["error"]["data"]["reason"], "invalid_input_responses", "{body}");
    }
}

/// Returns the result it was built with, whatever it is asked.
struct Returns(Value);

impl Handler for Returns {
    fn info(&self) -> ServerInfo {
        tools_info("returns")
    }

    fn call(&self, _ctx: Context, _method: String, _params: Value) -> HandlerFuture {
        let result = self.0.clone();
        Box::pin(async move { Ok(result) })
    }
}

/// SEP-2322: an input-required result asks for input, carries a state, or both; one that does
/// neither is the handler's error, not an answer.
#[tokio::test]
async fn an_input_required_result_must_ask_for_something_or_carry_a_state() {
    let asks = json!({"q": {"method": "elicitation/create", "params": {"message": "name?", "requestedSchema": {}}}});
    for (case, result, refused) in [
        ("asks, no state", json!({"resultType": "input_required", "inputRequests": asks}), false),
        ("a state, asks nothing", json!({"resultType": "input_required", "requestState": {"step": 1}}), false),
        ("neither", json!({"resultType": "input_required"}), true),
    ] {
        let carries_state = result.get("requestState").is_some();
        let server = start_with(Builder::new(Returns(result)).config(config())).await;
        let client = Client::new(&server);
        let params = json!({"name": "x", "arguments": {}});
        let body = json_body(stateless(&client, 1, "tools/call", params.clone()).send().await.expect("send")).await;
        if refused {
            assert_eq!(body["error"]["data"]["reason"], "input_required_invalid", "{case}: {body}");
            continue;
        }
        assert_eq!(body["result"]["resultType"], "input_required", "{case}: {body}");
        let state = &body["result"]["requestState"];
        if !carries_state {
            assert!(state.is_null(), "{case}: no state is made up: {body}");
            continue;
        }
        // Sealed to this very request: brought back with it, it opens.
        assert!(state.is_string(), "{case}: the state goes out sealed: {body}");
        let mut again = params;
        again["requestState"] = state.clone();
        let body = json_body(stateless(&client, 2, "tools/call", again).send().await.expect("send")).await;
        assert_eq!(body["result"]["resultType"], "input_required", "{case}, brought back: {body}");
    }
}

/// Replicas configured with one key accept each other's request states; a server with another
/// key refuses them.
#[tokio::test]
async fn request_states_are_shared_by_replicas_with_one_key() {
    let keyed = |byte| ServerConfig { request_state_key: Some(StateKey::new([byte; 32])), ..config() };
    let (a, b, other) = (start(keyed(9)).await, start(keyed(9)).await, start(keyed(10)).await);
    let params = json!({"name": "test_input_required_result_request_state", "arguments": {}});
    let first =
        json_body(stateless(&Client::new(&a), 1, "tools/call", params.clone()).send().await.expect("send")).await;
    let state = first["result"]["requestState"].clone();
    let mut again = params;
    again["requestState"] = state;
    again["inputResponses"] = json!({"confirm": {"action": "accept", "content": {"ok": true}}});
    let on_b = json_body(stateless(&Client::new(&b), 2, "tools/call", again.clone()).send().await.expect("send")).await;
    assert_eq!(on_b["result"]["content"][0]["text"], "state-ok: confirmed", "{on_b}");
    let on_other = json_body(stateless(&Client::new(&other), 3, "tools/call", again).send().await.expect("send")).await;
    assert_eq!(on_other["error"]["data"]["reason"], "invalid_request_state");
}

#[tokio::test]
async fn metadata_is_validated_in_order() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let no_version = stateless(
        &client,
        101,
        "server/discover",
        json!({"_meta": {"io.modelcontextprotocol/clientCapabilities": {}}}),
    );
    let body = json_body(no_version.send().await.expect("send")).await;
    assert_eq!((body["error"]["code"].clone(), body["id"].clone()), (json!(-32602), json!(101)));
    let no_caps = stateless(
        &client,
        104,
        "server/discover",
        json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}),
    );
    assert_eq!(json_body(no_caps.send().await.expect("send")).await["error"]["code"], -32602);
    let mismatch_meta = json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "v999.0.0", "io.modelcontextprotocol/clientCapabilities": {}}});
    let mismatch = stateless(&client, 302, "server/discover", mismatch_meta.clone());
    assert_eq!(json_body(mismatch.send().await.expect("send")).await["error"]["code"], -32020);
    let unsupported =
        set(stateless(&client, 301, "server/discover", mismatch_meta), "mcp-protocol-version", "v999.0.0");
    let response = unsupported.send().await.expect("send");
    assert_eq!(response.status(), 400);
    let body = json_body(response).await;
    assert_eq!(body["error"]["code"], -32022);
    assert_eq!(body["id"], 301);
    assert_eq!(body["error"]["data"]["requested"], "v999.0.0");
    assert!(body["error"]["data"]["supported"].as_array().is_some_and(|v| !v.is_empty()));
}

#[tokio::test]
async fn removed_and_unknown_methods_are_404_and_get_delete_405() {
    let server = start(config()).await;
    let client = Client::new(&server);
    for method in ["initialize", "ping", "logging/setLevel", "resources/subscribe", "unknown/method"] {
        let response = stateless(&client, 1, method, json!({})).send().await.expect("send");
        assert_eq!(response.status(), 404, "{method}");
        assert_eq!(json_body(response).await["error"]["code"], -32601, "{method}");
    }
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let response = client
            .http
            .request(method.clone(), &client.url)
            .header("accept", "text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("last-event-id", "ignored")
            .send()
            .await
            .expect("send");
        assert_eq!(response.status(), 405, "{method}");
        assert_eq!(response.headers()["allow"], "POST");
    }
}

/// A method the revision does not have is unknown whatever else the request says: one rule for
/// the handshake's methods and the first tasks design's alike, before any header is checked.
#[tokio::test]
async fn a_method_the_revision_lacks_is_unknown_before_its_headers_are_checked() {
    let server = start(config()).await;
    let client = Client::new(&server);
    for method in ["ping", "tasks/list", "logging/setLevel"] {
        let response =
            stateless(&client, 2, method, json!({})).header("mcp-method", "tools/list").send().await.expect("send");
        assert_eq!(response.status(), 404, "{method}");
        assert_eq!(json_body(response).await["error"]["code"], -32601, "{method}");
    }
}

#[tokio::test]
async fn undeclared_client_capability_is_minus_32021() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let response = stateless(&client, 401, "tools/call", json!({"name": "test_missing_capability", "arguments": {}}))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 400);
    let body = json_body(response).await;
    assert_eq!(body["error"]["code"], -32021);
    assert_eq!(body["error"]["data"]["requiredCapabilities"], json!({"sampling": {}}));
}

#[tokio::test]
async fn logs_are_sent_only_when_the_request_asks_for_a_level() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let call = json!({"name": "test_logging_tool", "arguments": {}});
    let quiet = stateless(&client, 1, "tools/call", call.clone()).send().await.expect("send");
    assert_eq!(quiet.headers()["content-type"], "application/json", "no log notification came first");
    let mut with_level = call;
    with_level["_meta"] = meta();
    with_level["_meta"]["io.modelcontextprotocol/logLevel"] = json!("info");
    let mut loud = stateless(&client, 2, "tools/call", with_level).send().await.expect("send");
    let got = messages(&drain(&mut loud).await.0);
    assert_eq!(got[0]["method"], "notifications/message");
}

/// Streams notifications until cancelled, and records the cancellation.
struct Endless(Arc<AtomicBool>);

impl Handler for Endless {
    fn info(&self) -> ServerInfo {
        tools_info("endless")
    }

    fn call(&self, ctx: Context, _method: String, _params: Value) -> HandlerFuture {
        let cancelled = Arc::clone(&self.0);
        Box::pin(async move {
            for i in 0..2_000u32 {
                if ctx.notify("notifications/message", json!({"level": "info", "data": i})).await.is_err() {
                    break;
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(5)) => {}
                    () = ctx.cancelled() => break,
                }
            }
            tokio::select! {
                () = ctx.cancelled() => cancelled.store(true, Ordering::SeqCst),
                () = tokio::time::sleep(WAIT) => {}
            }
            Ok(json!({"content": []}))
        })
    }
}

/// [`Endless`] as a tool that may become a task, from a client that declares tasks: it never
/// escalates, so it is the connection's request until it ends.
struct EndlessMayBecomeTask(Endless);

impl Handler for EndlessMayBecomeTask {
    fn info(&self) -> ServerInfo {
        self.0.info()
    }

    fn call(&self, ctx: Context, method: String, params: Value) -> HandlerFuture {
        self.0.call(ctx, method, params)
    }

    fn task_support(&self, _tool: &str) -> TaskSupport {
        TaskSupport::Optional
    }
}

/// Calls tool `x` with `meta`, closes the response stream after three events, and returns
/// whether the handler observed its cancellation.
async fn cancelled_by_closing(server: &TestServer, meta: Value, flag: &AtomicBool) -> bool {
    let client = Client::new(server);
    let call = json!({"name": "x", "arguments": {}, "_meta": meta});
    let mut response = stateless(&client, 1, "tools/call", call).send().await.expect("send");
    assert_eq!(events(&mut response, 3).await.len(), 3);
    drop(response);
    for _ in 0..200 {
        if flag.load(Ordering::SeqCst) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test]
async fn closing_the_response_stream_cancels_the_request() {
    let flag = Arc::new(AtomicBool::new(false));
    let server = start_with(Builder::new(Endless(Arc::clone(&flag))).config(config())).await;
    assert!(cancelled_by_closing(&server, meta(), &flag).await, "the handler observed the cancellation");
}

#[tokio::test]
async fn closing_the_response_stream_cancels_a_request_that_has_not_become_a_task() {
    let flag = Arc::new(AtomicBool::new(false));
    let handler = EndlessMayBecomeTask(Endless(Arc::clone(&flag)));
    let server = start_with(Builder::new(handler).config(config())).await;
    let mut with_tasks = meta();
    with_tasks["io.modelcontextprotocol/clientCapabilities"] =
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    assert!(cancelled_by_closing(&server, with_tasks, &flag).await, "the handler observed the cancellation");
}

/// A mirrored header sent twice, or a one-value header sent as a list, is refused: an
/// intermediary reading another of the values than the server would route or authorize on
/// something other than what runs.
#[tokio::test]
async fn a_mirrored_header_sent_twice_or_as_a_list_is_refused() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let custom = json!({"name": "test_custom_headers", "arguments": {"region": "us", "priority": 3}});
    let simple = json!({"name": "test_simple_text", "arguments": {}});
    let cases = [
        (
            "two Mcp-Param-Region",
            stateless(&client, 1, "tools/call", custom.clone())
                .header("mcp-param-region", "us")
                .header("mcp-param-region", "eu")
                .header("mcp-param-priority", "3"),
        ),
        ("two Mcp-Name", stateless(&client, 2, "tools/call", simple.clone()).header("mcp-name", "test_simple_text")),
        ("two Mcp-Method", stateless(&client, 3, "tools/call", simple.clone()).header("mcp-method", "tools/call")),
        (
            "two MCP-Protocol-Version",
            stateless(&client, 4, "tools/call", simple.clone()).header("mcp-protocol-version", "2026-07-28"),
        ),
        (
            "a listed MCP-Protocol-Version",
            set(stateless(&client, 5, "tools/call", simple.clone()), "mcp-protocol-version", "2026-07-28, 2025-06-18"),
        ),
        (
            "a listed Mcp-Method",
            set(stateless(&client, 6, "tools/call", simple), "mcp-method", "tools/call,tools/list"),
        ),
    ];
    for (case, request) in cases {
        let response = request.send().await.expect("send");
        assert_eq!(response.status(), 400, "{case}");
        let body = json_body(response).await;
        assert_eq!(
            (body["error"]["code"].as_i64(), body["error"]["data"]["reason"].as_str()),
            (Some(-32020), Some("header_mismatch")),
            "{case}: {body}"
        );
    }
}

/// A raw UTF-8 value in a mirrored header is refused as such, not as a missing header.
#[tokio::test]
async fn a_raw_utf8_mirrored_header_is_named_as_not_ascii() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let call = json!({"name": "test_custom_headers", "arguments": {"region": "Zürich", "priority": 3}});
    let value = reqwest::header::HeaderValue::from_bytes("Zürich".as_bytes()).expect("obs-text is a header value");
    let request =
        stateless(&client, 1, "tools/call", call).header("mcp-param-region", value).header("mcp-param-priority", "3");
    let response = request.send().await.expect("send");
    assert_eq!(response.status(), 400);
    let message = json_body(response).await["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("not ASCII") && !message.contains("required"), "{message}");
}

/// What a client sends is quoted back in an error by a bounded prefix only.
#[tokio::test]
async fn an_error_quotes_a_bounded_prefix_of_what_was_sent() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let id = "t".repeat(100_000);
    let params = json!({"taskId": id, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}});
    let response = stateless(&client, 1, "tasks/get", params).send().await.expect("send");
    let body = json_body(response).await;
    assert_eq!(body["error"]["data"]["reason"], "unknown_task", "{}", &body.to_string()[..200]);
    assert!(body.to_string().len() < 1_000, "the error is {} bytes", body.to_string().len());
}

/// `tasks/update` with `inputResponses` that are not an object of objects is answered 400, as
/// docs/PROTOCOL.md says.
#[tokio::test]
async fn a_task_update_with_invalid_input_responses_is_400() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}});
    let call = json!({"name": "count", "arguments": {"to": 2, "interval_ms": 60_000}, "_meta": meta.clone()});
    let created = json_body(stateless(&client, 1, "tools/call", call).send().await.expect("send")).await;
    let task = created["result"]["taskId"].as_str().unwrap_or_else(|| panic!("a task: {created}")).to_owned();
    let update = json!({"taskId": task, "inputResponses": "not an object", "_meta": meta});
    let response = stateless(&client, 2, "tasks/update", update).send().await.expect("send");
    assert_eq!(response.status(), 400);
    assert_eq!(json_body(response).await["error"]["data"]["reason"], "invalid_input_responses");
}
