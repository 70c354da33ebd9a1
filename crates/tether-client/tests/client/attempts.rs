//! What a keyed call's unknown outcome says once it was re-sent: the first attempt reached the
//! server (its stream was answered, then ended without the response), the re-send's connection
//! closed before any response. The outcome is unknown, and says first that the earlier attempt
//! may have run, not only that the last "may not have arrived".

use std::time::Duration;

use serde_json::json;
use tether_client::{Backoff, Client, ClientConfig, RequestError};
use tokio::net::TcpListener;

use crate::{response, serve_one};

/// Answers everything the client sends: the handshake offers idempotency keys, the first
/// `tools/call` gets a stream that ends before any event id, and any later one a connection
/// closed without a response. Bounded in connections.
async fn server(listener: TcpListener) {
    let mut calls = 0;
    for _ in 0..32 {
        let Ok((tcp, _)) = listener.accept().await else { return };
        serve_one(tcp, |request| match request["method"].as_str() {
            Some("initialize") => {
                let result = json!({"jsonrpc": "2.0", "id": request["id"], "result": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {"experimental": {"io.tether/idempotency": {"version": 1, "records": "r"}}},
                    "serverInfo": {"name": "x", "version": "1"}}});
                response("200 OK", "Content-Type: application/json\r\nMcp-Session-Id: s1\r\n", &result.to_string())
            }
            Some("tools/call") => {
                calls += 1;
                if calls == 1 {
                    let progress = json!({"jsonrpc": "2.0", "method": "notifications/message",
                        "params": {"level": "info", "data": "started"}});
                    format!(
                        "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/event-stream\r\n\r\n\
                         data: {progress}\n\n"
                    )
                } else {
                    String::new()
                }
            }
            Some(_) => response("202 Accepted", "", ""),
            // A GET (the standalone stream) has no body.
            None => response("405 Method Not Allowed", "", ""),
        })
        .await;
    }
}

#[tokio::test]
async fn a_re_sent_call_that_may_not_have_arrived_still_says_the_first_attempt_may_have_run() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(server(listener));
    let mut config = ClientConfig::new(format!("http://{addr}/mcp"));
    config.backoff = Backoff {
        initial: Duration::from_millis(10),
        max: Duration::from_millis(10),
        max_attempts_without_progress: 1,
    };
    let (client, _events) = Client::connect(config).await.expect("the handshake");
    let outcome =
        tokio::time::timeout(Duration::from_secs(20), client.request("tools/call", json!({"name": "t"}))).await;
    server.abort();
    match outcome {
        Ok(Err(RequestError::OutcomeUnknown(why))) => {
            let first = "an earlier attempt may have run (the server ended the request's stream without its response)";
            assert!(why.starts_with(first), "{why}");
            assert!(why.contains("the last may too"), "{why}");
        }
        other => panic!("not an unknown outcome: {other:?}"),
    }
}
