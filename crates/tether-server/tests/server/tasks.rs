//! Tasks (SEP-2663) over real HTTP: a call becomes a task only where its handler escalates it, a
//! re-sent creation returns the same task without running its tool again, and the connection's
//! end no longer cancels a request once it has become a task.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tether_builtin::BuiltinHandler;
use tether_core::tasks::TaskSupport;
use tether_server::{Builder, Context, Handler, HandlerFuture, ServerInfo};

use crate::common::*;

/// One tool, `work`, that supports tasks: it counts its runs, escalates, waits `ms`, then answers.
struct Work(Arc<AtomicUsize>);

impl Handler for Work {
    fn info(&self) -> ServerInfo {
        tools_info("work")
    }

    fn call(&self, ctx: Context, _method: String, params: Value) -> HandlerFuture {
        let runs = Arc::clone(&self.0);
        Box::pin(async move {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            let escalated = ctx.escalate().await.map_err(|e| e.to_error())?;
            for note in 0..params["arguments"]["notes"].as_u64().unwrap_or(0) {
                let _ = ctx.notify("notifications/progress", json!({"progressToken": "t", "progress": note})).await;
            }
            let ms = params["arguments"]["ms"].as_u64().unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(json!({"content": [{"type": "text", "text": format!("run {run}, task {escalated}")}]}))
        })
    }

    fn task_support(&self, _tool: &str) -> TaskSupport {
        TaskSupport::Optional
    }
}

/// A 2026-07-28 request, declaring tasks if `tasks`, with an idempotency key if `key`.
fn stateless(
    client: &Client,
    method: &str,
    mut params: Value,
    tasks: bool,
    key: Option<&str>,
) -> reqwest::RequestBuilder {
    let capabilities = if tasks { json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}) } else { json!({}) };
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    });
    if let Some(key) = key {
        params["_meta"]["io.tether/idempotencyKey"] = json!(key);
    }
    stateless_post(client, json!(1), method, params)
}

/// Sends a request and reads its JSON response, within `WAIT`.
async fn send(client: &Client, method: &str, params: Value, tasks: bool, key: Option<&str>) -> Value {
    let exchange = async {
        let response = stateless(client, method, params, tasks, key).send().await.expect(method);
        json_body(response).await
    };
    tokio::time::timeout(WAIT, exchange).await.unwrap_or_else(|_| panic!("{method} was not answered in time"))
}

/// Polls task `id` until it has finished, for at most `WAIT`.
async fn finished(client: &Client, id: &str) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let task = send(client, "tasks/get", json!({"taskId": id}), true, None).await["result"].clone();
        if matches!(task["status"].as_str(), Some("completed" | "failed" | "cancelled")) {
            return task;
        }
        assert!(tokio::time::Instant::now() < deadline, "task {id} never finished: {task}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_re_sent_creation_returns_the_same_task_and_runs_its_tool_once() {
    let runs = Arc::new(AtomicUsize::new(0));
    let server = start_with(Builder::new(Work(Arc::clone(&runs))).config(config())).await;
    let client = Client::new(&server);
    let call = json!({"name": "work", "arguments": {"ms": 300}});
    let key = Some("create-once");
    let (first, second) = tokio::join!(
        send(&client, "tools/call", call.clone(), true, key),
        send(&client, "tools/call", call.clone(), true, key)
    );
    let id = first["result"]["taskId"].as_str().expect("a task").to_owned();
    assert_eq!(first["result"]["resultType"], "task");
    assert_eq!(second["result"]["taskId"], json!(id), "the concurrent re-send got the same task");
    let task = finished(&client, &id).await;
    assert_eq!(task["result"]["content"][0]["text"], "run 1, task true");
    let third = send(&client, "tools/call", call, true, key).await;
    assert_eq!(third["result"]["taskId"], json!(id), "a re-send after it finished too");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the tool ran once");
}

#[tokio::test]
async fn a_call_becomes_a_task_only_for_a_client_that_declares_tasks() {
    let runs = Arc::new(AtomicUsize::new(0));
    let server = start_with(Builder::new(Work(Arc::clone(&runs))).config(config())).await;
    let client = Client::new(&server);
    let plain = send(&client, "tools/call", json!({"name": "work", "arguments": {}}), false, None).await;
    assert_eq!(plain["result"]["resultType"], "complete");
    assert_eq!(plain["result"]["content"][0]["text"], "run 1, task false");
    let declared = send(&client, "tools/call", json!({"name": "work", "arguments": {}}), true, None).await;
    assert_eq!(declared["result"]["resultType"], "task", "the same tool, for a client that declares tasks");
    let refused = send(&client, "tasks/get", json!({"taskId": "nope"}), false, None).await;
    assert_eq!(refused["error"]["code"], -32021, "{refused}");
    let unknown = send(&client, "tasks/get", json!({"taskId": "nope"}), true, None).await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
}

#[tokio::test]
async fn a_task_runs_on_after_its_connection_closed_and_is_cancelled_only_by_tasks_cancel() {
    let runs = Arc::new(AtomicUsize::new(0));
    let server = start_with(Builder::new(Work(Arc::clone(&runs))).config(config())).await;
    let client = Client::new(&server);
    let quick = send(&client, "tools/call", json!({"name": "work", "arguments": {"ms": 200}}), true, None).await;
    let quick = quick["result"]["taskId"].as_str().expect("a task").to_owned();
    assert_eq!(finished(&client, &quick).await["status"], "completed", "the closed response did not cancel it");
    let slow = send(&client, "tools/call", json!({"name": "work", "arguments": {"ms": 60_000}}), true, None).await;
    let slow = slow["result"]["taskId"].as_str().expect("a task").to_owned();
    let ack = send(&client, "tasks/cancel", json!({"taskId": slow}), true, None).await;
    assert_eq!(ack["result"]["resultType"], "complete");
    assert!(ack["result"].get("status").is_none(), "an ack, not the task");
    let task = finished(&client, &slow).await;
    assert_eq!(task["status"], "cancelled");
    assert!(task.get("result").is_none() && task.get("error").is_none());
}

#[tokio::test]
async fn a_task_that_needs_input_waits_for_it_and_runs_on_with_the_answer() {
    let server = start_with(Builder::new(BuiltinHandler::in_memory()).config(config())).await;
    let client = Client::new(&server);
    let call = json!({"name": "confirm_delete", "arguments": {"filename": "report.txt"}});
    let created = send(&client, "tools/call", call, true, None).await;
    let id = created["result"]["taskId"].as_str().expect("a task").to_owned();
    let deadline = tokio::time::Instant::now() + WAIT;
    let waiting = loop {
        let task = send(&client, "tasks/get", json!({"taskId": id}), true, None).await["result"].clone();
        if task["status"] == "input_required" {
            break task;
        }
        assert_eq!(task["status"], "working", "it waits for its input: {task}");
        assert!(tokio::time::Instant::now() < deadline, "task {id} never asked for input");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let key = waiting["inputRequests"].as_object().and_then(|m| m.keys().next().cloned()).expect("an input request");
    let answer = json!({key: {"action": "accept", "content": {"confirm": true}}});
    send(&client, "tasks/update", json!({"taskId": id, "inputResponses": answer}), true, None).await;
    let done = finished(&client, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "Deleted report.txt");
}

/// Opens `tasks/stream` on task `id` after `after`: the notifications' params and the final
/// response, read to the end (bounded by `WAIT`).
async fn stream(client: &Client, id: &str, after: Option<u64>) -> (Vec<Value>, Value) {
    let mut params = json!({"taskId": id});
    if let Some(after) = after {
        params["after"] = json!(after);
    }
    let mut response = stateless(client, "tasks/stream", params, true, None).send().await.expect("tasks/stream");
    if response.headers().get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"application/json")) {
        return (Vec::new(), json_body(response).await);
    }
    let (events, ended) = drain(&mut response).await;
    assert!(ended, "the stream ends once the task has finished");
    let mut messages = messages(&events);
    let last = messages.pop().expect("a final response");
    assert!(messages.iter().all(|m| m["method"] == "notifications/tasks/event"));
    (messages.into_iter().map(|m| m["params"].clone()).collect(), last)
}

#[tokio::test]
async fn a_task_stream_replays_exactly_after_its_cursor_with_each_event_chained_to_the_last() {
    use tether_core::lineage::Digest;
    use tether_core::tasks::TaskEvent;
    let runs = Arc::new(AtomicUsize::new(0));
    let server = start_with(Builder::new(Work(Arc::clone(&runs))).config(config())).await;
    let client = Client::new(&server);
    let created =
        send(&client, "tools/call", json!({"name": "work", "arguments": {"notes": 3, "ms": 100}}), true, None);
    let id = created.await["result"]["taskId"].as_str().expect("a task").to_owned();
    let (live, end) = stream(&client, &id, None).await;
    assert_eq!(end["result"]["resultType"], "complete", "{end}");
    let seqs: Vec<u64> = live.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert_eq!(seqs, [0, 1, 2, 3, 4], "working, three notes, completed");
    assert_eq!(live.last().map(|e| e["payload"]["status"].clone()), Some(json!("completed")));
    let mut previous: Option<Digest> = None;
    for params in &live {
        let event = TaskEvent::from_params(params).expect("an event with its digest");
        let expected = TaskEvent::digest_of(&id, previous.as_ref(), event.seq, &event.kind, &event.payload);
        assert_eq!(event.digest, expected, "event {} is chained to the one before", event.seq);
        previous = Some(event.digest);
    }
    let (replayed, _) = stream(&client, &id, Some(2)).await;
    assert_eq!(replayed, live[3..], "exactly what followed the cursor, the same events");
    let (none, end) = stream(&client, &id, Some(4)).await;
    assert!(none.is_empty() && end["result"]["resultType"] == "complete", "caught up with a finished task");
    let (_, ahead) = stream(&client, &id, Some(5)).await;
    assert_eq!(
        (ahead["error"]["code"].clone(), ahead["error"]["data"]["reason"].clone()),
        (json!(-32602), json!("cursor_ahead"))
    );
}

#[tokio::test]
async fn a_cursor_older_than_what_a_task_keeps_is_told_events_gone_never_skipped() {
    let runs = Arc::new(AtomicUsize::new(0));
    let server = start_with(Builder::new(Work(Arc::clone(&runs))).config(config())).await;
    let client = Client::new(&server);
    let notes = tether_core::tasks::MAX_EVENTS as u64 + 10;
    let created = send(&client, "tools/call", json!({"name": "work", "arguments": {"notes": notes}}), true, None);
    let id = created.await["result"]["taskId"].as_str().expect("a task").to_owned();
    finished(&client, &id).await;
    let (_, gone) = stream(&client, &id, Some(3)).await;
    assert_eq!(gone["error"]["code"], -32010, "{gone}");
    let earliest = gone["error"]["data"]["earliestSeq"].as_u64().expect("earliestSeq");
    assert_eq!(gone["error"]["data"]["reason"], "events_gone");
    assert_eq!(gone["error"]["data"]["taskId"], json!(id));
    assert_eq!(earliest, notes + 2 - tether_core::tasks::MAX_EVENTS as u64, "the oldest kept");
    let (resumed, _) = stream(&client, &id, Some(earliest - 1)).await;
    assert_eq!(resumed.first().map(|e| e["seq"].clone()), Some(json!(earliest)), "from the oldest kept, as told");
}

/// Running tasks are capped per principal: one more is refused with 429 `too_many_tasks`, and
/// creates nothing; a task that ends makes room.
#[tokio::test]
async fn running_tasks_past_the_cap_are_refused_with_429() {
    let config = tether_server::ServerConfig { max_tasks_per_principal: 3, ..config() };
    let server = start_with(Builder::new(BuiltinHandler::in_memory()).config(config)).await;
    let client = Client::new(&server);
    let call = json!({"name": "count", "arguments": {"to": 2, "interval_ms": 60_000}});
    let mut ids = Vec::new();
    for _ in 0..3 {
        let created = send(&client, "tools/call", call.clone(), true, None).await;
        ids.push(created["result"]["taskId"].as_str().unwrap_or_else(|| panic!("a task: {created}")).to_owned());
    }
    let refused = stateless(&client, "tools/call", call.clone(), true, None).send().await.expect("send");
    assert_eq!(refused.status(), 429);
    let body = json_body(refused).await;
    assert_eq!(body["error"]["data"]["reason"], "too_many_tasks", "{body}");
    send(&client, "tasks/cancel", json!({"taskId": ids[0]}), true, None).await;
    assert_eq!(finished(&client, &ids[0]).await["status"], "cancelled");
    let created = send(&client, "tools/call", call, true, None).await;
    assert!(created["result"]["taskId"].is_string(), "room again: {created}");
}

/// Two principals, each with a token of their own: neither reads, cancels or resumes the
/// other's task or session.
#[tokio::test]
async fn one_principal_cannot_reach_anothers_task_or_session() {
    let tokens = [("alice".to_owned(), "a1".to_owned()), ("bob".to_owned(), "b2".to_owned())];
    let auth = tether_server::BearerToken::with_principals(tokens).expect("tokens");
    let server = start_with(Builder::new(BuiltinHandler::in_memory()).config(config()).authenticator(auth)).await;
    let client = Client::new(&server);
    let as_ = |token: &str, request: reqwest::RequestBuilder| request.bearer_auth(token);
    let call = json!({"name": "count", "arguments": {"to": 2, "interval_ms": 60_000}});
    let created =
        json_body(as_("a1", stateless(&client, "tools/call", call, true, None)).send().await.expect("send")).await;
    let task = created["result"]["taskId"].as_str().unwrap_or_else(|| panic!("a task: {created}")).to_owned();
    for method in ["tasks/get", "tasks/cancel"] {
        let theirs = as_("b2", stateless(&client, method, json!({"taskId": task}), true, None));
        let body = json_body(theirs.send().await.expect("send")).await;
        assert_eq!(body["error"]["data"]["reason"], "unknown_task", "bob's {method}: {body}");
    }
    let own = as_("a1", stateless(&client, "tasks/get", json!({"taskId": task}), true, None));
    assert_eq!(json_body(own.send().await.expect("send")).await["result"]["status"], "working", "not cancelled by bob");

    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "alice", "version": "1"}}});
    let response = as_("a1", client.post(None, &initialize)).send().await.expect("initialize");
    let id = response.headers()["mcp-session-id"].to_str().expect("ascii").to_owned();
    let session = Session { id, epoch: String::new(), version: "2025-11-25".into() };
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    assert_eq!(as_("b2", client.post(Some(&session), &ping)).send().await.expect("send").status(), 404, "bob's ping");
    assert_eq!(as_("b2", client.get(&session, None)).send().await.expect("send").status(), 404, "bob's GET");
    let delete = client.http.delete(&server.url).header("mcp-session-id", &session.id);
    assert_eq!(as_("b2", delete).send().await.expect("send").status(), 404, "bob's DELETE");
    assert_eq!(as_("a1", client.post(Some(&session), &ping)).send().await.expect("send").status(), 200, "alice's");
}

/// A task's stream ends with its request's response whatever happens to the task's record: a
/// store that cannot read it any more ends the stream with the error that says so, never with
/// nothing.
#[tokio::test]
async fn a_task_stream_whose_task_cannot_be_read_ends_with_an_error() {
    use tether_store::faults::{Call, FaultyStore};
    let store = Arc::new(FaultyStore::new(Arc::new(tether_store::MemoryStore::new(Default::default()))));
    let runs = Arc::new(AtomicUsize::new(0));
    let builder = Builder::new(Work(Arc::clone(&runs))).store(Arc::clone(&store) as _).config(config());
    let server = start_with(builder).await;
    let client = Client::new(&server);
    let created = send(&client, "tools/call", json!({"name": "work", "arguments": {"ms": 300}}), true, None);
    let id = created.await["result"]["taskId"].as_str().expect("a task").to_owned();
    let mut response =
        stateless(&client, "tasks/stream", json!({"taskId": id}), true, None).send().await.expect("send");
    let first = events(&mut response, 1).await;
    assert_eq!(messages(&first)[0]["params"]["seq"], 0, "the task's first event");
    store.fail(Call::Task, 0, u32::MAX);
    let (events, ended) = drain(&mut response).await;
    assert!(ended);
    let last = messages(&events).pop().expect("a response ends the stream");
    assert_eq!(
        (last["id"].clone(), last["error"]["data"]["reason"].clone()),
        (json!(1), json!("store_failed")),
        "{last}"
    );
}
