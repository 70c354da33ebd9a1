//! Sessionful-era protocol rules and bad input.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tether_builtin::BuiltinHandler;
use tether_server::{Authenticator, BearerToken, Builder, ServerConfig};

use crate::common::*;

#[tokio::test]
async fn initialize_mints_a_session_with_epoch_and_lineage_capability() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let body = request(
        json!(1),
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
    );
    let response = client.post(None, &body).header("mcp-session-id", "client-chosen-id").send().await.expect("send");
    assert_eq!(response.status(), 200);
    let id = response.headers()["mcp-session-id"].to_str().expect("ascii").to_owned();
    let epoch = response.headers()["x-mcp-replay-epoch"].to_str().expect("ascii").to_owned();
    assert_ne!(id, "client-chosen-id", "session ids are never taken from the client");
    assert!(id.len() >= 22 && id.bytes().all(|b| (0x21..=0x7e).contains(&b)), "{id}");
    let result = json_body(response).await["result"].clone();
    assert_eq!(result["protocolVersion"], "2025-06-18");
    assert_eq!(result["capabilities"]["experimental"]["io.tether/lineage"], json!({"version": 1, "epoch": epoch}));
    // The handler's own capabilities are kept beside what the transport adds.
    assert!(result["capabilities"]["tools"].is_object() && result["capabilities"]["logging"].is_object(), "{result}");
    let second = client.initialize("2025-11-25").await;
    assert_ne!(second.id, id);
    assert_ne!(second.epoch, epoch);
}

#[tokio::test]
async fn unsupported_initialize_version_is_answered_with_the_latest_sessionful_version() {
    let server = start(config()).await;
    let session = Client::new(&server).initialize("1999-01-01").await;
    assert_eq!(session.version, "2025-11-25");
}

#[tokio::test]
async fn requests_without_session_get_400_and_unknown_sessions_404() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let response = client.post(None, &request(json!(1), "tools/list", json!({}))).send().await.expect("send");
    assert_eq!(response.status(), 400);
    assert_eq!(reason(response).await, "missing_session_id");
    let ghost = Session { id: "no-such-session".into(), epoch: String::new(), version: "2025-11-25".into() };
    let response = client.post(Some(&ghost), &request(json!(1), "tools/list", json!({}))).send().await.expect("send");
    assert_eq!(response.status(), 404);
    assert_eq!(reason(response).await, "unknown_session");
    let response = client.get(&ghost, None).send().await.expect("send");
    assert_eq!(response.status(), 404);
}

#[tokio::test]
async fn delete_ends_the_session_and_later_requests_get_404_terminated() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let response = client.http.delete(&server.url).header("mcp-session-id", &session.id).send().await.expect("send");
    assert_eq!(response.status(), 200);
    let response = client.post(Some(&session), &request(json!(1), "ping", json!({}))).send().await.expect("send");
    assert_eq!(response.status(), 404);
    assert_eq!(reason(response).await, "terminated");
    let response = client.get(&session, None).send().await.expect("send");
    assert_eq!(reason(response).await, "terminated");
}

#[tokio::test]
async fn delete_ends_the_sessions_open_connections() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let mut standalone = client.get(&session, None).send().await.expect("send");
    assert_eq!(standalone.status(), 200);
    assert_eq!(events(&mut standalone, 1).await.len(), 1, "the priming event");
    let body =
        request(json!("long"), "tools/call", json!({"name": "count", "arguments": {"to": 1000, "interval_ms": 20}}));
    let mut running = client.post(Some(&session), &body).send().await.expect("send");
    assert_eq!(events(&mut running, 2).await.len(), 2, "priming and the first notification");
    let response = client.http.delete(&server.url).header("mcp-session-id", &session.id).send().await.expect("send");
    assert_eq!(response.status(), 200);
    let (_, ended) = drain(&mut standalone).await;
    assert!(ended, "the standalone stream ended with its session");
    let (rest, ended) = drain(&mut running).await;
    assert!(ended, "the request's stream ended with its session");
    assert!(rest.len() < 100, "ended long before the count's end: {} more events", rest.len());
}

#[tokio::test]
async fn media_types_are_checked() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let ping = request(json!(1), "ping", json!({}));
    let response = set(client.post(Some(&session), &ping), "accept", "application/json").send().await.expect("send");
    assert_eq!(response.status(), 406);
    let response = set(client.post(Some(&session), &ping), "content-type", "text/plain").send().await.expect("send");
    assert_eq!(response.status(), 415);
    assert_eq!(reason(response).await, "unsupported_media_type");
    let response = set(client.get(&session, None), "accept", "application/json").send().await.expect("send");
    assert_eq!(response.status(), 406);
}

#[tokio::test]
async fn protocol_version_header_is_checked() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let ping = request(json!(1), "ping", json!({}));
    let response =
        set(client.post(Some(&session), &ping), "mcp-protocol-version", "1999-01-01").send().await.expect("send");
    assert_eq!(response.status(), 400);
    let body = json_body(response).await;
    assert_eq!(body["error"]["code"], -32022);
    assert!(body["error"]["data"]["supported"].as_array().is_some_and(|v| v.contains(&json!("2025-11-25"))));
    // Without the header the request is served (2025-03-26 assumed for the header's purpose).
    let response = client
        .http
        .post(&server.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &session.id)
        .body(ping.to_string())
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn malformed_bodies_get_400_with_the_right_code() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let send = |body: &'static str| {
        client
            .http
            .post(&server.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &session.id)
            .body(body)
            .send()
    };
    let response = send("{not json").await.expect("send");
    assert_eq!(response.status(), 400);
    let body = json_body(response).await;
    assert_eq!(
        (body["error"]["code"].clone(), body["error"]["data"]["reason"].clone()),
        (json!(-32700), json!("parse_error"))
    );
    let response = send(r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#).await.expect("send");
    assert_eq!(response.status(), 400);
    assert_eq!(json_body(response).await["error"]["code"], -32600);
    // The session was not harmed by the bad input.
    let response = client.post(Some(&session), &request(json!(2), "ping", json!({}))).send().await.expect("send");
    assert_eq!(json_body(response).await["result"], json!({}));
}

#[tokio::test]
async fn body_over_the_limit_gets_413() {
    let server = start(ServerConfig { max_body_bytes: 1024, ..config() }).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let big =
        request(json!(1), "tools/call", json!({"name": "test_simple_text", "arguments": {"pad": "x".repeat(4096)}}));
    let response = client.post(Some(&session), &big).send().await.expect("send");
    assert_eq!(response.status(), 413);
    assert_eq!(reason(response).await, "body_too_large");
}

#[tokio::test]
async fn a_body_slower_than_the_body_timeout_gets_408() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let server = start(ServerConfig { body_timeout: Duration::from_millis(300), ..config() }).await;
    let authority = server.url.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let mut tcp = tokio::net::TcpStream::connect(&authority).await.expect("connect");
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{{\"jsonrpc\""
    );
    tcp.write_all(head.as_bytes()).await.expect("send");
    let mut answer = vec![0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut answer)).await.expect("answered");
    let answer = String::from_utf8_lossy(&answer[..read.expect("read")]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
}

#[tokio::test]
async fn foreign_origin_and_host_are_refused() {
    let server = start(ServerConfig { allowed_origins: vec!["https://app.example".into()], ..config() }).await;
    let client = Client::new(&server);
    let init = request(
        json!(1),
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
    );
    let response = client.post(None, &init).header("origin", "http://evil.example.com").send().await.expect("send");
    assert_eq!(response.status(), 403);
    assert_eq!(reason(response).await, "origin_not_allowed");
    let response = client.post(None, &init).header("host", "evil.example.com").send().await.expect("send");
    assert_eq!(response.status(), 403);
    assert_eq!(reason(response).await, "host_not_allowed");
    for origin in ["http://localhost:3000", "http://127.0.0.1", "https://app.example"] {
        let response = client.post(None, &init).header("origin", origin).send().await.expect("send");
        assert_eq!(response.status(), 200, "{origin}");
    }
}

/// RFC 9112 §3.2.2: with an absolute-form target, the target's authority is the host, whatever
/// `Host` says.
#[tokio::test]
async fn an_absolute_form_target_is_checked_as_the_host() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let server = start(config()).await;
    let authority = server.url.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    for (target, expected) in [("http://evil.example/mcp", "403"), (&*format!("http://{authority}/mcp"), "400")] {
        let mut tcp = tokio::net::TcpStream::connect(&authority).await.expect("connect");
        let head = format!(
            "POST {target} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        tcp.write_all(head.as_bytes()).await.expect("send");
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(10), tcp.read_to_string(&mut answer))
            .await
            .expect("answered")
            .expect("read");
        assert_eq!(answer.split(' ').nth(1), Some(expected), "{target}: {answer}");
        if expected == "403" {
            assert!(answer.contains("host_not_allowed"), "{answer}");
        }
    }
}

/// HTTP/2 with prior knowledge (h2c) is served: `:authority` is the host.
#[tokio::test]
async fn http2_cleartext_is_served_with_its_authority_checked() {
    let server = start(config()).await;
    let http = crate::common::http_client().http2_prior_knowledge().build().expect("client");
    let client = Client { http, url: server.url.clone() };
    let session = client.initialize("2025-11-25").await;
    let ping = request(json!(2), "ping", json!({}));
    let response = client.post(Some(&session), &ping).send().await.expect("send");
    assert_eq!((response.version(), response.status().as_u16()), (reqwest::Version::HTTP_2, 200));
    // A name that resolves to the loopback address, so only `:authority` is foreign.
    let addr: std::net::SocketAddr =
        client.url.trim_start_matches("http://").trim_end_matches("/mcp").parse().expect("addr");
    let http =
        crate::common::http_client().http2_prior_knowledge().resolve("evil.example", addr).build().expect("client");
    let foreign = Client { http, url: format!("http://evil.example:{}/mcp", addr.port()) };
    let refused = foreign.post(Some(&session), &ping).send().await.expect("send");
    assert_eq!((refused.version(), refused.status().as_u16()), (reqwest::Version::HTTP_2, 403));
    assert_eq!(reason(refused).await, "host_not_allowed");
}

#[tokio::test]
async fn too_many_sessions_get_503_with_retry_after() {
    let server = start(ServerConfig { max_sessions: 2, ..config() }).await;
    let client = Client::new(&server);
    client.initialize("2025-11-25").await;
    client.initialize("2025-11-25").await;
    let init = request(
        json!(1),
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
    );
    let response = client.post(None, &init).send().await.expect("send");
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(reason(response).await, "too_many_sessions");
}

#[tokio::test]
async fn too_many_streams_per_session_get_429() {
    let server = start(ServerConfig { max_streams_per_session: 2, ..config() }).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    // Streaming calls answer with SSE at their first notification and keep running.
    let slow = json!({"to": 100, "interval_ms": 50});
    let _a = client.call(&session, json!(1), "count", slow.clone()).await;
    let _b = client.call(&session, json!(2), "count", slow.clone()).await;
    let response = client.call(&session, json!(3), "count", slow).await;
    assert_eq!(response.status(), 429);
    assert_eq!(reason(response).await, "too_many_streams");
}

/// A resume is held to the session's limit too, unless it adds nothing to the load: the resume
/// of a running request's own stream, or of a stream a connection is attached to (it takes
/// that one's place), is never refused for it.
#[tokio::test]
async fn a_resume_is_held_to_the_session_s_limit_unless_it_adds_nothing() {
    let server = start(ServerConfig { max_streams_per_session: 2, ..config() }).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let mut done = client.call(&session, json!(1), "count", json!({"to": 1, "interval_ms": 0})).await;
    let finished = events(&mut done, 1).await[0].id.clone().expect("the priming event's id");
    drop(done);
    let slow = json!({"to": 100, "interval_ms": 50});
    let mut a = client.call(&session, json!(2), "count", slow.clone()).await;
    let running = events(&mut a, 1).await[0].id.clone().expect("the priming event's id");
    let _b = client.call(&session, json!(3), "count", slow).await;
    let response = client.get(&session, Some(&finished)).send().await.expect("resume");
    assert_eq!(response.status(), 429, "a third stream where two may be open");
    assert_eq!(reason(response).await, "too_many_streams");
    let response = client.get(&session, Some(&running)).send().await.expect("resume");
    assert_eq!(response.status(), 200, "a running request's own stream adds nothing");
    drop(a);
}

/// A batch's requests count toward the session's limit as that many requests: a batch of more
/// than the session may run is refused whole, and so is one the session's load leaves no room
/// for; the protocol layer's own answers count for nothing.
#[tokio::test]
async fn a_batch_is_held_to_the_session_s_limit_by_its_requests() {
    let server = start(ServerConfig { max_streams_per_session: 3, ..config() }).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-03-26").await;
    let get = |id: i64| request(json!(id), "tools/call", json!({"name": "counter_get", "arguments": {"key": "b"}}));
    let batch = |ids: std::ops::Range<i64>| Value::Array(ids.map(get).collect());
    let response = client.post(Some(&session), &batch(1..5)).send().await.expect("send");
    assert_eq!(response.status(), 429, "four requests where three may run");
    assert_eq!(reason(response).await, "too_many_streams");
    let mut three = batch(1..4);
    three.as_array_mut().expect("array").push(request(json!(9), "ping", json!({})));
    let response = client.post(Some(&session), &three).send().await.expect("send");
    assert_eq!(response.status(), 200, "three requests and a ping");
    assert_eq!(json_body(response).await.as_array().map(Vec::len), Some(4));
    let _running = client.call(&session, json!(10), "count", json!({"to": 100, "interval_ms": 50})).await;
    let response = client.post(Some(&session), &batch(11..14)).send().await.expect("send");
    assert_eq!(response.status(), 429, "three requests where two may start");
    let response = client.post(Some(&session), &batch(14..16)).send().await.expect("send");
    assert_eq!(response.status(), 200, "two where two may start");
}

#[tokio::test]
async fn result_without_prior_output_is_json_and_with_output_is_sse() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let response = client.call(&session, json!(1), "test_simple_text", json!({})).await;
    assert_eq!(response.headers()["content-type"], "application/json");
    assert_eq!(response.headers()["x-mcp-replay-epoch"].to_str().expect("ascii"), session.epoch);
    let body = json_body(response).await;
    assert_eq!(body["result"]["content"][0]["text"], "This is a simple text response for testing.");
    let mut response = client.call(&session, json!(2), "count", json!({"to": 3})).await;
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let (events, ended) = drain(&mut response).await;
    assert!(ended, "the stream ends after the response");
    let messages = messages(&events);
    assert_eq!(messages.len(), 4);
    assert_eq!(messages[3]["id"], 2);
    assert_eq!(messages[0]["params"]["data"]["count"], 1);
}

#[tokio::test]
async fn sessions_of_2025_11_25_get_priming_event_and_retry_older_ones_do_not() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let new = client.initialize("2025-11-25").await;
    let mut response = client.call(&new, json!(1), "count", json!({"to": 1})).await;
    let (events, _) = drain(&mut response).await;
    let id = events[0].id.clone().expect("priming id");
    assert!(events[0].data.is_empty() && events[0].retry.is_some());
    let id = tether_core::lineage::EventId::parse(&id).expect("a lineage id");
    assert_eq!((id.epoch.as_str(), id.seq), (new.epoch.as_str(), 0));
    assert!(id.tag.is_some(), "its tag, for a resume from it to be checked");
    // Every later event is the next position of the same stream.
    for (i, event) in events.iter().enumerate() {
        assert_eq!(seq(event.id.as_deref().expect("id")), i as u64);
    }
    let old = client.initialize("2025-06-18").await;
    let mut response = client.call(&old, json!(1), "count", json!({"to": 1})).await;
    let (events, _) = drain(&mut response).await;
    assert!(events.iter().all(|e| !e.data.is_empty() && e.retry.is_none()), "{events:?}");
    assert_eq!(seq(events[0].id.as_deref().expect("id")), 1);
}

#[tokio::test]
async fn progress_goes_to_the_requests_stream_with_its_token() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let body = request(
        json!(7),
        "tools/call",
        json!({"name": "test_tool_with_progress", "arguments": {}, "_meta": {"progressToken": "tok"}}),
    );
    let mut response = client.post(Some(&session), &body).send().await.expect("send");
    let messages = messages(&drain(&mut response).await.0);
    let progress: Vec<_> =
        messages.iter().filter(|m| m["method"] == "notifications/progress").map(|m| m["params"].clone()).collect();
    assert_eq!(progress.len(), 3);
    assert!(progress.iter().all(|p| p["progressToken"] == "tok" && p["total"] == 100));
    assert_eq!(messages.last().expect("result")["id"], 7);
}

#[tokio::test]
async fn server_to_client_request_is_answered_by_post() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let mut response = client.call(&session, json!(1), "test_elicitation", json!({"message": "who?"})).await;
    let events = events(&mut response, 2).await;
    let ask = messages(&events).pop().expect("elicitation request");
    assert_eq!(ask["method"], "elicitation/create");
    let answer = json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"action": "accept", "content": {"username": "u", "email": "e"}}});
    let status = client.post(Some(&session), &answer).send().await.expect("send").status();
    assert_eq!(status, 202);
    let rest = messages(&drain(&mut response).await.0);
    let text = rest.last().expect("result")["result"]["content"][0]["text"].as_str().expect("text").to_owned();
    assert!(text.starts_with("User response:") && text.contains("accept"), "{text}");
}

/// A cancelled request's stream still ends with a terminal event: the `request_cancelled` error
/// its record keeps, never silence (the spec's "SHOULD NOT respond" gives way to the rule that
/// every request's stream ends with its response).
#[tokio::test]
async fn a_cancelled_request_stops_and_its_stream_ends_with_request_cancelled() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let body =
        request(json!("slow"), "tools/call", json!({"name": "count", "arguments": {"to": 1000, "interval_ms": 20}}));
    let mut response = client.post(Some(&session), &body).send().await.expect("send");
    let first = events(&mut response, 2).await;
    assert_eq!(first.len(), 2);
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "slow", "reason": "test"}});
    assert_eq!(client.post(Some(&session), &cancel).send().await.expect("send").status(), 202);
    let (rest, ended) = drain(&mut response).await;
    assert!(ended, "the stream ends once the request is cancelled");
    assert!(rest.len() < 100, "counting stopped early: {} more events", rest.len());
    assert_cancelled(&messages(&rest));
}

/// The messages end with the one response a cancelled request gets: `request_cancelled`.
fn assert_cancelled(messages: &[Value]) {
    let responses: Vec<_> = messages.iter().filter(|m| m.get("id").is_some()).collect();
    assert_eq!(responses.len(), 1, "one response: {messages:?}");
    assert_eq!(messages.last(), Some(responses[0]), "the response is the last event");
    assert_eq!(responses[0]["error"]["data"]["reason"], "request_cancelled", "{messages:?}");
}

#[tokio::test]
async fn batches_are_accepted_only_in_2025_03_26_sessions() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let old = client.initialize("2025-03-26").await;
    let batch = json!([request(json!(1), "ping", json!({})), request(json!(2), "tools/call", json!({"name": "counter_get", "arguments": {"key": "b"}})),
        {"jsonrpc": "2.0", "method": "notifications/initialized"}]);
    let response = client.post(Some(&old), &batch).send().await.expect("send");
    assert_eq!(response.status(), 200);
    let body = json_body(response).await;
    let ids: Vec<_> = body.as_array().expect("array").iter().map(|r| r["id"].clone()).collect();
    assert_eq!(ids, [json!(1), json!(2)]);
    let with_initialize = json!([request(json!(3), "initialize", json!({})), request(json!(4), "ping", json!({}))]);
    let response = client.post(Some(&old), &with_initialize).send().await.expect("send");
    assert_eq!(response.status(), 400);
    assert_eq!(reason(response).await, "initialize_in_batch");
    let new = client.initialize("2025-11-25").await;
    let response = client.post(Some(&new), &batch).send().await.expect("send");
    assert_eq!(response.status(), 400);
    assert_eq!(reason(response).await, "batch_not_allowed");
}

#[tokio::test]
async fn a_request_id_is_executed_once_per_incarnation() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let args = json!({"key": "once", "amount": 5});
    let first = json_body(client.call(&session, json!(9), "counter_add", args.clone()).await).await;
    assert_eq!(first["result"]["structuredContent"]["value"], 5);
    // The same id and params attach to the original request's stream: its result again.
    let mut again = client.call(&session, json!(9), "counter_add", args).await;
    let replayed = messages(&drain(&mut again).await.0);
    assert_eq!(replayed.last().expect("result")["result"]["structuredContent"]["value"], 5);
    let value = json_body(client.call(&session, json!(10), "counter_get", json!({"key": "once"})).await).await;
    assert_eq!(value["result"]["structuredContent"]["value"], 5, "executed once");
    let conflict =
        json_body(client.call(&session, json!(9), "counter_add", json!({"key": "once", "amount": 6})).await).await;
    assert_eq!(conflict["error"]["code"], -32600);
    assert_eq!(conflict["error"]["data"]["reason"], "request_id_reused");
}

#[tokio::test]
async fn a_read_only_call_on_the_embedded_store_is_recorded_once_per_incarnation_too() {
    // It runs while its record is written (`Handler::read_only`), but what it wrote counts only
    // if the record says it is new.
    let (dir, server) = on_the_embedded_store("once").await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let count = |to: u64| {
        request(
            json!(7),
            "tools/call",
            json!({"name": "count", "arguments": {"to": to}, "_meta": {"progressToken": "p"}}),
        )
    };
    let ids = |events: &[tether_core::sse::Event]| events.iter().map(|e| e.id.clone()).collect::<Vec<_>>();
    let mut first = client.post(Some(&session), &count(3)).send().await.expect("send");
    let (original, ended) = drain(&mut first).await;
    assert!(ended);
    assert_eq!(messages(&original).len(), 4, "three progress notifications and the result");
    // A second run would write a stream of its own, with other event ids.
    let mut again = client.post(Some(&session), &count(3)).send().await.expect("send");
    assert_eq!(ids(&drain(&mut again).await.0), ids(&original), "the same id and params attach to the original");
    let conflict = json_body(client.post(Some(&session), &count(4)).send().await.expect("send")).await;
    assert_eq!(conflict["error"]["data"]["reason"], "request_id_reused");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server on a fresh embedded store in a directory of its own (returned, to remove).
async fn on_the_embedded_store(name: &str) -> (std::path::PathBuf, TestServer) {
    let dir = std::env::temp_dir().join(format!("tether-read-only-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = tether_store::SqliteStore::open(&dir, tether_store::Retention::default(), "test").expect("open");
    let server =
        start_with(Builder::new(BuiltinHandler::in_memory()).config(config()).store(std::sync::Arc::new(store))).await;
    (dir, server)
}

#[tokio::test]
async fn a_read_only_call_sent_again_while_it_runs_leaves_the_original_cancellable() {
    // The second run starts before the store says the id is known, and is cancelled then: it
    // must not take the original's place among the session's running requests.
    let (dir, server) = on_the_embedded_store("cancel").await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let body =
        request(json!("slow"), "tools/call", json!({"name": "count", "arguments": {"to": 1000, "interval_ms": 20}}));
    let mut original = client.post(Some(&session), &body).send().await.expect("send");
    assert_eq!(events(&mut original, 2).await.len(), 2);
    let mut again = client.post(Some(&session), &body).send().await.expect("send");
    let attached = events(&mut again, 3).await;
    assert_eq!(messages(&attached)[0]["params"]["data"]["count"], 1, "attached to the original from its start");
    // Long enough for the second run, cancelled at once, to have ended.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "slow"}});
    assert_eq!(client.post(Some(&session), &cancel).send().await.expect("send").status(), 202);
    // The re-send's connection took the original's stream over (the original's was closed for
    // its client to come back): it gets the original's end.
    let (rest, ended) = drain(&mut again).await;
    assert!(ended, "the original was not cancelled");
    assert_cancelled(&messages(&rest));
    assert!(drain(&mut original).await.1, "the superseded connection ended");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn second_plain_get_while_the_standalone_stream_is_attached_gets_409() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let mut first = client.get(&session, None).send().await.expect("send");
    assert_eq!(first.status(), 200);
    let priming = events(&mut first, 1).await;
    assert_eq!(priming.len(), 1);
    let second = client.get(&session, None).send().await.expect("send");
    assert_eq!(second.status(), 409);
    let refused = json_body(second).await;
    assert_eq!(
        (refused["error"]["code"].clone(), refused["error"]["data"]["reason"].clone()),
        (json!(-32000), json!("get_stream_attached"))
    );
    drop(first);
    // Once the first connection is gone, a new standalone stream may open.
    let mut ok = false;
    for _ in 0..50 {
        if client.get(&session, None).send().await.expect("send").status() == 200 {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok);
}

#[tokio::test]
async fn broadcast_reaches_the_standalone_stream() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let mut stream = client.get(&session, None).send().await.expect("send");
    events(&mut stream, 1).await;
    let result = json_body(client.call(&session, json!(1), "broadcast", json!({"count": 3})).await).await;
    assert_eq!(result["result"]["content"][0]["text"], "broadcast 3 of 3 notifications");
    let got = messages(&events(&mut stream, 3).await);
    let counts: Vec<_> = got.iter().map(|m| m["params"]["data"]["broadcast"].clone()).collect();
    assert_eq!(counts, [json!(1), json!(2), json!(3)]);
    assert!(got.iter().all(|m| m.get("id").is_none()), "no responses on the GET stream");
}

#[tokio::test]
async fn notify_all_reaches_every_sessions_standalone_stream_once() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let mut streams = Vec::new();
    for _ in 0..2 {
        let session = client.initialize("2025-11-25").await;
        let mut stream = client.get(&session, None).send().await.expect("send");
        events(&mut stream, 1).await;
        streams.push(stream);
    }
    // A session without a standalone stream has nowhere to receive it.
    let caller = client.initialize("2025-06-18").await;
    let result = json_body(client.call(&caller, json!(1), "notify_all", json!({"seq": 7})).await).await;
    assert_eq!(result["result"]["content"][0]["text"], "sent to 2 sessions");
    for stream in &mut streams {
        let got = messages(&events(stream, 1).await);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["method"], "notifications/message");
        assert_eq!(got[0]["params"]["data"]["seq"], 7);
    }
}

/// The largest send buffer the kernel gives a socket (`tcp_wmem`'s maximum), or 4 MiB.
fn largest_send_buffer() -> usize {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem").unwrap_or_default();
    text.split_whitespace().nth(2).and_then(|n| n.parse().ok()).unwrap_or(4 << 20)
}

#[tokio::test]
async fn a_client_that_stops_reading_never_blocks_the_producer() {
    use tokio::io::AsyncReadExt;
    let retention = tether_store::Retention { max_events_per_stream: 2_000, ..Default::default() };
    let server = start(ServerConfig { retention, ..config() }).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    // A standalone stream that nobody reads (HTTP/1.0: the body is the stream itself).
    let mut stalled = unread_stream(&server, &session, "1.0").await;
    // Far more (every event is over 100 bytes) than the kernel's largest send buffer, the 4 KiB
    // receive buffer and what the server buffers can hold: the reader must fall behind.
    let count = 2_000 + 2 * (largest_send_buffer() + (1 << 20)) / 100;
    let broadcast =
        async { json_body(client.call(&session, json!(1), "broadcast", json!({"count": count})).await).await };
    let result = tokio::time::timeout(WAIT, broadcast).await.expect("the producer was held up by the stalled reader");
    assert_eq!(result["result"]["content"][0]["text"], format!("broadcast {count} of {count} notifications"));
    // Only now is the stalled stream read: it fell behind while the producer went on, and it is
    // told exactly what it lost (in one notice or more), then gets the rest.
    let mut body = Vec::new();
    let last = format!("\"broadcast\":{count}}}");
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut buf = vec![0u8; 1 << 16];
    while !body.windows(last.len()).any(|w| w == last.as_bytes()) {
        match tokio::time::timeout_at(deadline, stalled.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => body.extend_from_slice(&buf[..n]),
            _ => panic!("the stalled stream never reached the last broadcast ({} bytes read)", body.len()),
        }
    }
    let text = String::from_utf8_lossy(&body);
    let (_, stream) = text.split_once("\r\n\r\n").expect("a response head");
    let mut decoder = tether_core::sse::Decoder::default();
    let mut input = stream.as_bytes();
    let (mut delivered, mut lost) = (Vec::new(), Vec::new());
    while let Ok(Some(event)) = decoder.decode(&mut input) {
        if event.event.as_deref() == Some("resync") {
            let notice: serde_json::Value = serde_json::from_str(&event.data).expect("notice");
            lost.extend(notice["lost_from"].as_u64().expect("from")..=notice["lost_to"].as_u64().expect("to"));
        } else if !event.data.is_empty() {
            delivered.push(seq(event.id.as_deref().expect("id")));
        }
    }
    assert!(!lost.is_empty(), "the reader never fell behind: nothing was stalled");
    let mut all: Vec<u64> = delivered.iter().chain(&lost).copied().collect();
    all.sort_unstable();
    assert_eq!(all.len(), count, "every broadcast delivered or named lost, once");
    assert!(all.iter().enumerate().all(|(i, s)| *s == i as u64 + 1), "contiguous from 1");
}

#[tokio::test]
async fn ping_and_log_level() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let pong =
        json_body(client.post(Some(&session), &request(json!("p"), "ping", json!({}))).send().await.expect("send"))
            .await;
    assert_eq!(pong, json!({"jsonrpc": "2.0", "id": "p", "result": {}}));
    let set = request(json!(1), "logging/setLevel", json!({"level": "error"}));
    assert_eq!(json_body(client.post(Some(&session), &set).send().await.expect("send")).await["result"], json!({}));
    // Info-level logs are now filtered: the logging tool answers with JSON, nothing before it.
    let response = client.call(&session, json!(2), "test_tool_with_logging", json!({})).await;
    assert_eq!(response.headers()["content-type"], "application/json");
    let bad = request(json!(3), "logging/setLevel", json!({"level": "loud"}));
    assert_eq!(json_body(client.post(Some(&session), &bad).send().await.expect("send")).await["error"]["code"], -32602);
}

#[tokio::test]
async fn bearer_token_is_required_when_configured() {
    let server = start_with(
        Builder::new(BuiltinHandler::in_memory()).config(config()).authenticator(BearerToken::new("s3cret")),
    )
    .await;
    let client = Client::new(&server);
    let init = request(
        json!(1),
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
    );
    let response = client.post(None, &init).send().await.expect("send");
    assert_eq!(response.status(), 401);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    let response = client.post(None, &init).header("authorization", "Bearer wrong").send().await.expect("send");
    assert_eq!(response.status(), 401);
    let response = client.post(None, &init).header("authorization", "Bearer s3cret").send().await.expect("send");
    assert_eq!(response.status(), 200);
    // The scheme's name is case-insensitive (RFC 9110 §11.1).
    for scheme in ["bearer", "BEARER"] {
        let response =
            client.post(None, &init).header("authorization", format!("{scheme} s3cret")).send().await.expect("send");
        assert_eq!(response.status(), 200, "{scheme}");
    }
}

/// Two principals: "Bearer alice" and "Bearer bob".
struct Names(AtomicUsize);

impl Authenticator for Names {
    fn authenticate<'a>(&'a self, authorization: Option<&'a str>) -> tether_server::Authentication<'a> {
        self.0.fetch_add(1, Ordering::Relaxed);
        let name = authorization.and_then(|given| given.strip_prefix("Bearer "));
        let identity = name.map(|name| tether_server::Identity {
            principal: name.to_owned(),
            grant: tether_server::Grant::Everything,
        });
        Box::pin(std::future::ready(identity.ok_or(tether_server::Unauthenticated::Missing)))
    }
}

#[tokio::test]
async fn a_session_belongs_to_the_principal_that_created_it() {
    let auth = Names(AtomicUsize::new(0));
    let server = start_with(Builder::new(BuiltinHandler::in_memory()).config(config()).authenticator(auth)).await;
    let client = Client::new(&server);
    let init = request(
        json!(1),
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
    );
    let response = client.post(None, &init).header("authorization", "Bearer alice").send().await.expect("send");
    let id = response.headers()["mcp-session-id"].to_str().expect("ascii").to_owned();
    let session = Session { id, epoch: String::new(), version: "2025-11-25".into() };
    let ping = request(json!(2), "ping", json!({}));
    let as_bob = client.post(Some(&session), &ping).header("authorization", "Bearer bob").send().await.expect("send");
    assert_eq!(as_bob.status(), 404);
    assert_eq!(reason(as_bob).await, "unknown_session");
    let as_alice =
        client.post(Some(&session), &ping).header("authorization", "Bearer alice").send().await.expect("send");
    assert_eq!(as_alice.status(), 200);
}

#[tokio::test]
async fn tools_list_has_the_fixture_and_streaming_tools() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let list =
        json_body(client.post(Some(&session), &request(json!(1), "tools/list", json!({}))).send().await.expect("send"))
            .await;
    let names: Vec<&str> =
        list["result"]["tools"].as_array().expect("tools").iter().filter_map(|t| t["name"].as_str()).collect();
    for name in ["count", "counter_add", "counter_get", "broadcast", "sleep", "test_reconnection", "test_simple_text"] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    let unknown = json_body(client.call(&session, json!(2), "no_such_tool", json!({})).await).await;
    assert_eq!(unknown["error"]["code"], -32602);
    let method =
        json_body(client.post(Some(&session), &request(json!(3), "no/such", json!({}))).send().await.expect("send"))
            .await;
    assert_eq!(method["error"]["code"], -32601);
}

/// Panics in a tool call when asked to; answers otherwise.
struct Panicky;

impl tether_server::Handler for Panicky {
    fn info(&self) -> tether_server::ServerInfo {
        tools_info("panicky")
    }

    fn call(
        &self,
        _ctx: tether_server::Context,
        method: String,
        params: serde_json::Value,
    ) -> tether_server::HandlerFuture {
        Box::pin(async move {
            if method == "tools/call" && params["arguments"]["panic"] == true {
                panic!("the tool failed");
            }
            Ok(json!({"content": []}))
        })
    }
}

#[tokio::test]
async fn a_panicking_handler_answers_an_internal_error_and_the_session_goes_on() {
    let server = start_with(Builder::new(Panicky).config(config())).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    // A result as the first output is answered as JSON, an error the same way.
    let answer = json_body(client.call(&session, json!(1), "x", json!({"panic": true})).await).await;
    assert_eq!((answer["id"].as_i64(), answer["error"]["code"].as_i64()), (Some(1), Some(-32603)), "{answer}");
    assert_eq!(answer["error"]["data"]["reason"], "handler_panicked");
    let answer = json_body(client.call(&session, json!(2), "x", json!({})).await).await;
    assert_eq!(answer["result"], json!({"content": []}), "{answer}");
}

/// Offers capabilities whose `experimental` is not an object, as an upstream server behind a
/// gateway may.
struct OddCapabilities;

impl tether_server::Handler for OddCapabilities {
    fn info(&self) -> tether_server::ServerInfo {
        tether_server::ServerInfo { capabilities: json!({"tools": {}, "experimental": true}), ..tools_info("odd") }
    }

    fn call(&self, _ctx: tether_server::Context, _method: String, _params: Value) -> tether_server::HandlerFuture {
        Box::pin(async { Ok(json!({"content": []})) })
    }
}

/// The capabilities a handler offers are taken as they come: tether's own experimental
/// capabilities are still advertised, and the session works.
#[tokio::test]
async fn a_handler_whose_experimental_capabilities_are_no_object_still_gets_its_sessions() {
    let server = start_with(Builder::new(OddCapabilities).config(ServerConfig { idempotency: true, ..config() })).await;
    let client = Client::new(&server);
    let body = request(
        json!(1),
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
    );
    let response = client.post(None, &body).send().await.expect("initialize is answered");
    assert_eq!(response.status(), 200);
    let result = json_body(response).await["result"].clone();
    let experimental = &result["capabilities"]["experimental"];
    assert_eq!(experimental["io.tether/lineage"]["version"], 1, "{result}");
    assert_eq!(experimental["io.tether/idempotency"]["version"], 1, "{result}");
    assert_eq!(result["capabilities"]["tools"], json!({}), "{result}");
}

/// A string id is kept with its request's record: one past 256 bytes is refused, and the error
/// does not quote it.
#[tokio::test]
async fn a_request_id_past_256_bytes_is_refused() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let ping = |id: String| json!({"jsonrpc": "2.0", "id": id, "method": "ping"});
    let response = client.post(Some(&session), &ping("i".repeat(256))).send().await.expect("send");
    assert_eq!(response.status(), 200, "256 bytes are fine");
    let response = client.post(Some(&session), &ping("i".repeat(300))).send().await.expect("send");
    assert_eq!(response.status(), 400);
    let body = json_body(response).await;
    assert_eq!(body["error"]["data"]["reason"], "invalid_message", "{body}");
    assert!(body.to_string().len() < 400, "{body}");
}

/// What a subscriber writes, for a test to read.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_handlers_panic_is_logged_with_its_request_while_no_request_span_is_made_at_the_default_level() {
    let captured = Captured::default();
    let writer = captured.clone();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(tether_server::default_log_filter())
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _logs = tracing::subscriber::set_default(logs);
    let server = start_with(Builder::new(Panicky).config(config())).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let answer = json_body(client.call(&session, json!(7), "x", json!({"panic": true})).await).await;
    assert_eq!(answer["error"]["data"]["reason"], "handler_panicked", "{answer}");
    let logged = String::from_utf8(captured.0.lock().expect("not poisoned").clone()).expect("UTF-8 lines");
    let line =
        logged.lines().find(|l| l.contains("handler panicked")).unwrap_or_else(|| panic!("not logged: {logged}"));
    assert!(
        line.contains("method=tools/call")
            && line.contains("request=7")
            && line.contains(&format!("session=\"{}\"", session.id)),
        "the error does not name its request: {line}"
    );
    assert!(!logged.contains("mcp{"), "a request span was made at the default level: {logged}");
}
