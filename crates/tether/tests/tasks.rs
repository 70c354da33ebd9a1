//! Tasks (SEP-2663) across processes: a task outlives a `kill -9` of the embedded server with an
//! honest status, and Redis replicas read, answer and cancel each other's tasks.

mod common;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::*;

/// One 2026-07-28 request declaring the tasks extension, with the routing headers; its JSON
/// response.
fn stateless(url: &str, method: &str, mut params: Value) -> Value {
    params["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
    params["_meta"]["io.modelcontextprotocol/clientCapabilities"] =
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let name =
        params.get("name").or_else(|| params.get("taskId")).and_then(Value::as_str).unwrap_or_default().to_owned();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
    let headers = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", method),
        ("Mcp-Name", name.as_str()),
    ];
    let response = exchange(url, "POST", &headers, &body, |body| answer_of(body).is_some(), Duration::from_secs(10));
    assert_eq!(response.status, 200, "{method}: {}", response.body);
    answer_of(&response.body).expect("a JSON-RPC response")
}

/// Calls `tool` with `arguments` and returns the id of the task it became.
fn create(url: &str, tool: &str, arguments: Value) -> String {
    let created = stateless(url, "tools/call", json!({"name": tool, "arguments": arguments}));
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    created["result"]["taskId"].as_str().expect("a task id").to_owned()
}

/// `tasks/get` of task `id`: its result.
fn get(url: &str, id: &str) -> Value {
    stateless(url, "tasks/get", json!({"taskId": id}))["result"].clone()
}

/// Polls task `id` until its status is `status`, for at most ten seconds.
fn until(url: &str, id: &str, status: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let task = get(url, id);
        if task["status"] == status {
            return task;
        }
        assert!(Instant::now() < deadline, "task {id} never became {status}: {task}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_task_survives_kill_9_of_the_embedded_server_with_an_honest_status() {
    let dir = temp_dir("tasks-kill9");
    let (mut server, url) = serve(free_port(), &dir, &[]);
    let finished = create(&url, "slow_compute", json!({"seconds": 1, "label": "quick"}));
    let running = create(&url, "slow_compute", json!({"seconds": 600, "label": "slow"}));
    until(&url, &finished, "completed");
    assert_eq!(get(&url, &running)["status"], "working");
    server.kill9();
    let (restarted, url) = serve(free_port(), &dir, &[]);
    let done = get(&url, &finished);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "quick: computed in 1s");
    let aborted = get(&url, &running);
    assert_eq!(aborted["status"], "failed", "a task whose process died is not working: {aborted}");
    assert_eq!(aborted["error"]["data"]["reason"], "request_aborted");
    assert!(aborted.get("result").is_none());
    let cancel = stateless(&url, "tasks/cancel", json!({"taskId": running}));
    assert_eq!(cancel["result"]["resultType"], "complete");
    assert_eq!(get(&url, &running)["status"], "failed", "a final status never changes");
    drop(restarted);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_re_sent_creation_gets_the_same_task_before_and_after_a_kill_9() {
    let dir = temp_dir("tasks-resent");
    let (mut server, url) = serve(free_port(), &dir, &[]);
    let call = json!({"name": "slow_compute", "arguments": {"seconds": 1, "label": "once"},
        "_meta": {"io.tether/idempotencyKey": "create-once"}});
    let first = stateless(&url, "tools/call", call.clone())["result"]["taskId"].clone();
    assert!(first.is_string(), "a task");
    assert_eq!(stateless(&url, "tools/call", call.clone())["result"]["taskId"], first, "re-sent: the same task");
    let id = first.as_str().expect("an id").to_owned();
    until(&url, &id, "completed");
    server.kill9();
    let (restarted, url) = serve(free_port(), &dir, &[]);
    assert_eq!(
        stateless(&url, "tools/call", call)["result"]["taskId"],
        first,
        "re-sent after the crash: the same task"
    );
    assert_eq!(get(&url, &id)["result"]["content"][0]["text"], "once: computed in 1s", "its one run's result");
    drop(restarted);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tether_task_follows_a_task_another_process_created_to_its_result() {
    let dir = temp_dir("tasks-follow");
    let (server, url) = serve(free_port(), &dir.join("data"), &[]);
    let id = create(&url, "count", json!({"to": 12, "interval_ms": 30}));
    let checkpoint = dir.join("checkpoint.json");
    let follow = tether(&["task", &url, &id, "--checkpoint", checkpoint.to_str().expect("utf-8"), "--timeout", "30s"]);
    let lines = parse(&follow.rest(Duration::from_secs(40)));
    let counts: Vec<u64> = lines
        .iter()
        .filter(|l| l["event"] == "message")
        .filter_map(|l| l["message"]["params"]["data"]["count"].as_u64())
        .collect();
    assert_eq!(counts, (1..=12).collect::<Vec<u64>>(), "the task's events from its first: {lines:?}");
    // Each carries its own id to deduplicate on: event 0 is the task's first status.
    let ids: Vec<&str> = lines.iter().filter(|l| l["event"] == "message").filter_map(|l| l["id"].as_str()).collect();
    let expected: Vec<String> = (1..=12).map(|seq| format!("task/{id}/{seq}")).collect();
    assert_eq!(ids, expected, "{lines:?}");
    let statuses: Vec<&str> =
        lines.iter().filter(|l| l["event"] == "task").filter_map(|l| l["status"].as_str()).collect();
    assert_eq!(statuses, ["working", "completed"]);
    assert_eq!(lines.last().map(|l| l["result"]["content"][0]["text"].clone()), Some(json!("counted to 12")));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A task id is random and may begin with `-`: `tether task` takes it as the id, not as a flag.
/// One the server never showed is said to be no task there, not a task lost.
#[test]
fn tether_task_takes_an_id_that_begins_with_a_dash() {
    let dir = temp_dir("tasks-dash");
    let (server, url) = serve(free_port(), &dir, &[]);
    let mut follow = tether(&["task", &url, "-eUnknown", "--timeout", "10s"]);
    let lines = parse(&follow.rest(Duration::from_secs(15)));
    // An id the server never showed is no lost task: the server's error, exit 1.
    assert_eq!(follow.exit_within(Duration::from_secs(5)).code(), Some(1), "{lines:?}");
    let last = lines.last().cloned().unwrap_or_default();
    assert_eq!(last["event"], "error", "{lines:?}");
    let message = last["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("no task \"-eUnknown\""), "the server was asked for that task: {lines:?}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_task_created_on_one_redis_replica_is_answered_and_cancelled_on_another() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let redis = runtime.block_on(tether_testkit::RedisServer::start());
    let dir = temp_dir("tasks-replicas");
    // Polls too rare to matter: what crosses replicas here is what the store announces.
    let args = [
        "--store",
        "redis",
        "--redis-url",
        redis.url.as_str(),
        "--redis-durability",
        "none",
        "--task-poll-interval",
        "60s",
    ];
    let (replica_a, a) = serve(free_port(), &dir.join("a"), &args);
    let (replica_b, b) = serve(free_port(), &dir.join("b"), &args);

    let slow = create(&a, "slow_compute", json!({"seconds": 600, "label": "replicated"}));
    assert_eq!(get(&b, &slow)["status"], "working", "visible on the other replica");
    let ack = stateless(&b, "tasks/cancel", json!({"taskId": slow}));
    assert_eq!(ack["result"], json!({"resultType": "complete", "_meta": ack["result"]["_meta"]}));
    assert_eq!(get(&a, &slow)["status"], "cancelled", "cancelled on b, seen on a");

    let asking = create(&a, "confirm_delete", json!({"filename": "report.txt"}));
    let waiting = until(&b, &asking, "input_required");
    let key = waiting["inputRequests"].as_object().and_then(|m| m.keys().next().cloned()).expect("an input request");
    let answer = json!({key: {"action": "accept", "content": {"confirm": true}}});
    stateless(&b, "tasks/update", json!({"taskId": asking, "inputResponses": answer}));
    let done = until(&a, &asking, "completed");
    assert_eq!(done["result"]["content"][0]["text"], "Deleted report.txt", "a's run got b's answer");
    drop((replica_a, replica_b));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tether_call_task_follows_a_task_to_its_result_through_a_proxy_that_cuts_every_stream() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let redis = runtime.block_on(tether_testkit::RedisServer::start());
    let dir = temp_dir("tasks-proxy");
    let args = [
        "--store",
        "redis",
        "--redis-url",
        redis.url.as_str(),
        "--redis-durability",
        "none",
        "--task-poll-interval",
        "60s",
    ];
    let (a, b) = (free_port(), free_port());
    let (replica_a, _) = serve(a, &dir.join("a"), &args);
    let (replica_b, _) = serve(b, &dir.join("b"), &args);
    let upstreams = [a, b].map(|port| std::net::SocketAddr::from(([127, 0, 0, 1], port))).to_vec();
    let proxy = runtime.block_on(tether_testkit::proxy::start(upstreams, 0x7a5c, 200, 3_000));
    proxy.cutting.store(true, std::sync::atomic::Ordering::Relaxed);
    proxy.cut_responses.store(true, std::sync::atomic::Ordering::Relaxed);
    let url = format!("http://{}/mcp", proxy.addr);
    let call =
        tether(&["call", &url, "count", "--task", "--args", r#"{"to":60,"interval_ms":20}"#, "--timeout", "60s"]);
    let lines = parse(&call.rest(Duration::from_secs(90)));
    let count = |event: &str| lines.iter().filter(|line| line["event"] == event).count();
    let statuses: Vec<&str> =
        lines.iter().filter(|l| l["event"] == "task").filter_map(|l| l["status"].as_str()).collect();
    let cuts = proxy.cuts.load(std::sync::atomic::Ordering::Relaxed);
    let counts: Vec<u64> = lines
        .iter()
        .filter(|l| l["event"] == "message")
        .filter_map(|l| l["message"]["params"]["data"]["count"].as_u64())
        .collect();
    println!(
        "tether call --task through two replicas and a cutting proxy: {cuts} cuts, {} re-issues, {} divergences, \
         {} task events delivered, statuses {statuses:?}",
        count("reissued"),
        count("divergence"),
        counts.len()
    );
    let result = lines.iter().find(|line| line["event"] == "result").unwrap_or_else(|| panic!("no result: {lines:?}"));
    assert_eq!(result["result"]["content"][0]["text"], "counted to 60");
    assert_eq!(counts, (1..=60).collect::<Vec<u64>>(), "every event once, in order, across the cuts");
    assert_eq!(statuses, ["working", "completed"]);
    assert_eq!(count("divergence"), 0, "nothing lost, nothing out of order");
    assert!(cuts >= 3, "the proxy cut the stream again and again: {cuts}");
    drop((replica_a, replica_b, proxy));
    let _ = std::fs::remove_dir_all(&dir);
}
