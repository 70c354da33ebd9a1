//! How a keyed call's attempts end against a scripted server: one whose first attempt reached the
//! server (its stream was answered, then ended without the response) and whose two re-sends'
//! connections closed before any response ends unknown, and says first that the earlier attempt
//! may have run, not only that the last "may not have arrived"; one refused while the server's
//! store is unavailable (a Redis failing over) is re-sent until it gets its result, and so is
//! the handshake; one whose key's record went while it waited for the original ends unknown,
//! not sent again.

use std::time::Duration;

use serde_json::{Value, json};
use tether_client::{Backoff, Client, ClientConfig, ClientEvent, RequestError};
use tokio::net::TcpListener;

use crate::{response, serve_one};

/// A stream that carries `message`, then closes.
fn stream(message: Value) -> String {
    format!("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/event-stream\r\n\r\ndata: {message}\n\n")
}

/// How the server answers the `n`th `tools/call` (from 1), and whether it refuses the first
/// handshake.
struct Script {
    call: fn(u32, &Value) -> String,
    refuse_first_handshake: bool,
}

/// The first `tools/call` gets a stream that ends after one notification, without its response,
/// and any later one a connection closed without a response.
fn cut(calls: u32, _: &Value) -> String {
    match calls {
        1 => stream(json!({"jsonrpc": "2.0", "method": "notifications/message",
            "params": {"level": "info", "data": "started"}})),
        _ => String::new(),
    }
}

/// What a tether server answers while its store is unavailable.
fn store_unavailable(id: &Value) -> String {
    let error = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": "the store is unavailable",
        "data": {"reason": "store_unavailable"}}});
    response("503 Service Unavailable", "Content-Type: application/json\r\nRetry-After: 1\r\n", &error.to_string())
}

/// The first `tools/call` is refused for an unavailable store, the next gets its result.
fn unavailable_then_result(calls: u32, request: &Value) -> String {
    match calls {
        1 => store_unavailable(&request["id"]),
        _ => {
            let result = json!({"jsonrpc": "2.0", "id": request["id"], "result": {"content": [], "ran": calls}});
            response("200 OK", "Content-Type: application/json\r\n", &result.to_string())
        }
    }
}

/// The first `tools/call` is answered as a tether server answers a re-send whose key's record
/// went while it waited for the original (the original ended without an outcome, or retention
/// forgot it), the next gets a result.
fn record_lost_then_result(calls: u32, request: &Value) -> String {
    match calls {
        1 => {
            let error = json!({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32603,
                "message": "the record of this idempotency key went while this request waited for the original (released, or forgotten); the request may have run",
                "data": {"reason": "idempotency_record_lost"}}});
            response("200 OK", "Content-Type: application/json\r\n", &error.to_string())
        }
        _ => unavailable_then_result(calls, request),
    }
}

/// The first `tools/call` is answered 502 by something in front of the server, with a body that
/// is no JSON-RPC (a balancer's page), the next gets its result.
fn bad_gateway_then_result(calls: u32, request: &Value) -> String {
    match calls {
        1 => response("502 Bad Gateway", "Content-Type: text/html\r\n", "<html>bad gateway</html>"),
        _ => unavailable_then_result(calls, request),
    }
}

/// Answers everything the client sends: the handshake offers idempotency keys, and each
/// `tools/call` is answered as `script` says. Bounded in connections.
async fn server(listener: TcpListener, script: Script) {
    let (mut calls, mut handshakes) = (0, 0);
    for _ in 0..32 {
        let Ok((tcp, _)) = listener.accept().await else { return };
        serve_one(tcp, |request| match request["method"].as_str() {
            Some("initialize") if script.refuse_first_handshake && handshakes == 0 => {
                handshakes += 1;
                store_unavailable(&request["id"])
            }
            Some("initialize") => {
                let result = json!({"jsonrpc": "2.0", "id": request["id"], "result": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {"experimental": {"io.tether/idempotency": {"version": 1, "records": "r"}}},
                    "serverInfo": {"name": "x", "version": "1"}}});
                response("200 OK", "Content-Type: application/json\r\nMcp-Session-Id: s1\r\n", &result.to_string())
            }
            Some("tools/call") => {
                calls += 1;
                (script.call)(calls, request)
            }
            Some(_) => response("202 Accepted", "", ""),
            // A GET (the standalone stream) has no body.
            None => response("405 Method Not Allowed", "", ""),
        })
        .await;
    }
}

/// The outcome of one keyed `tools/call` against [`server`] answering as `script` says, and the
/// re-sends it took: each one's count and reason.
async fn call_keyed(script: Script) -> (Result<Value, RequestError>, Vec<(u32, String)>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(server(listener, script));
    let mut config = ClientConfig::new(format!("http://{addr}/mcp"));
    config.backoff = Backoff {
        initial: Duration::from_millis(10),
        max: Duration::from_millis(10),
        max_attempts_without_progress: 2,
    };
    let (client, mut events) = Client::connect(config).await.expect("the handshake");
    let outcome = tokio::time::timeout(Duration::from_secs(20), client.request("tools/call", json!({"name": "t"})))
        .await
        .expect("the call ends");
    server.abort();
    let mut reissues = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let ClientEvent::Reissued { attempt, reason, .. } = event {
            reissues.push((attempt, reason));
        }
    }
    (outcome, reissues)
}

#[tokio::test]
async fn a_re_sent_call_that_may_not_have_arrived_still_says_the_first_attempt_may_have_run() {
    let (outcome, reissues) = call_keyed(Script { call: cut, refuse_first_handshake: false }).await;
    match outcome {
        Err(RequestError::OutcomeUnknown(why)) => {
            let first = "an earlier attempt may have run (the server ended the request's stream without its response)";
            assert!(why.starts_with(first), "{why}");
            assert!(why.contains("the last may too"), "{why}");
        }
        other => panic!("not an unknown outcome: {other:?}"),
    }
    let attempts: Vec<u32> = reissues.iter().map(|(attempt, _)| *attempt).collect();
    assert_eq!(attempts, [1, 2], "two re-sends, each counted: {reissues:?}");
    assert!(reissues[1].1.contains("may not have arrived"), "the second re-send's reason is its own: {reissues:?}");
}

#[tokio::test]
async fn a_keyed_call_refused_while_the_store_is_unavailable_is_re_sent_until_it_gets_its_result() {
    let (outcome, reissues) = call_keyed(Script { call: unavailable_then_result, refuse_first_handshake: true }).await;
    assert_eq!(outcome.expect("the result")["ran"], 2, "the re-sent call's result");
    assert_eq!(reissues.len(), 1, "{reissues:?}");
    assert!(reissues[0].1.contains("store was unavailable"), "{reissues:?}");
}

#[tokio::test]
async fn a_keyed_call_refused_not_now_by_something_in_front_of_the_server_is_re_sent() {
    let (outcome, reissues) = call_keyed(Script { call: bad_gateway_then_result, refuse_first_handshake: false }).await;
    assert_eq!(outcome.expect("the result")["ran"], 2, "the re-sent call's result");
    assert_eq!(reissues.len(), 1, "{reissues:?}");
    assert!(reissues[0].1.contains("502"), "{reissues:?}");
}

#[tokio::test]
async fn a_keyed_call_whose_record_went_while_it_waited_ends_unknown_and_is_not_re_sent() {
    let (outcome, reissues) = call_keyed(Script { call: record_lost_then_result, refuse_first_handshake: false }).await;
    match outcome {
        Err(RequestError::OutcomeUnknown(why)) => assert!(why.contains("may have run"), "{why}"),
        other => panic!("not an unknown outcome: {other:?}"),
    }
    assert!(reissues.is_empty(), "a re-send could run it again: {reissues:?}");
}

/// Every `tools/call` is answered with a JSON body past what one message may be.
fn oversized(_calls: u32, request: &Value) -> String {
    let padding = "x".repeat(tether_core::sse::Limits::DEFAULT.max_event);
    let result = json!({"jsonrpc": "2.0", "id": request["id"], "result": {"content": [], "padding": padding}});
    response("200 OK", "Content-Type: application/json\r\n", &result.to_string())
}

/// A JSON answer is held to what one SSE event may carry: one past it is an error, not read
/// whole into memory.
#[tokio::test]
async fn a_json_answer_past_the_bound_of_a_message_is_an_error() {
    let (outcome, _) = call_keyed(Script { call: oversized, refuse_first_handshake: false }).await;
    let Err(err) = outcome else { panic!("an answer over the bound was read whole") };
    assert!(err.to_string().contains("JSON answer over"), "{err}");
}
