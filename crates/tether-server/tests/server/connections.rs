//! Connections held to their limits: a client that does not take what it is sent loses its
//! connection after the send timeout, and its slot goes to another.

use std::time::Duration;

use serde_json::json;
use tether_builtin::BuiltinHandler;
use tether_server::{Builder, ConnectionLimits};
use tokio::io::AsyncReadExt as _;

use crate::common::*;

/// A send timeout far shorter than the others, so only it can end a connection within a test.
fn limits() -> ConnectionLimits {
    ConnectionLimits {
        send_timeout: Duration::from_millis(500),
        header_timeout: Duration::from_secs(600),
        idle_timeout: Duration::from_secs(600),
        ..ConnectionLimits::default()
    }
}

/// A client that opens its stream and stops reading: once the server cannot write more, the
/// connection is closed after the send timeout instead of held for ever.
#[tokio::test]
async fn a_stream_whose_client_stops_reading_is_closed_after_the_send_timeout() {
    // Everything broadcast is retained, so there is always more to send than the sockets hold.
    let mut config = config();
    config.retention.max_events_per_stream = 1_000_000;
    config.retention.max_bytes_per_session = 1 << 30;
    config.retention.max_bytes_total = 1 << 30;
    let server = start_limited(Builder::new(BuiltinHandler::in_memory()).config(config), limits()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let mut stream = unread_stream(&server, &session, "1.1").await;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.expect("a response");
    assert_eq!(&head, b"HTTP/1.1 200");
    // Far more than the socket buffers hold, and nobody reads it.
    let total = 100_000;
    let broadcast = client.call(&session, json!(1), "broadcast", json!({"count": total})).await;
    assert_eq!(broadcast.status(), 200);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut read = Vec::new();
    let drained = tokio::time::timeout(WAIT, stream.read_to_end(&mut read)).await;
    let ended = matches!(drained, Ok(Ok(_)) | Ok(Err(_)));
    let got = String::from_utf8_lossy(&read).matches("\"broadcast\":").count();
    assert!(ended, "the server closed the stream it could not write to ({got} events read)");
    assert!(got < total, "closed before it was all written ({got} of {total})");
}

/// HTTP/2 with a receive window of 0: the response can never be sent. The connection is closed
/// after the send timeout, and with one connection allowed, the next client gets it.
#[tokio::test]
async fn an_http2_client_that_never_opens_its_window_loses_its_connection() {
    let limits = ConnectionLimits { max_connections: 1, ..limits() };
    let server = start_limited(Builder::new(BuiltinHandler::in_memory()).config(config()), limits).await;
    let http = crate::common::http_client()
        .http2_prior_knowledge()
        .http2_initial_stream_window_size(0)
        .build()
        .expect("client");
    let stalled = Client { http, url: server.url.clone() };
    let init = request(
        json!(1),
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}),
    );
    let response = stalled.post(None, &init).send().await.expect("headers are not flow-controlled");
    assert_eq!(response.status(), 200);
    let body = tokio::time::timeout(WAIT, response.bytes()).await.expect("the connection ends");
    assert!(body.is_err(), "no byte of the body could be sent");
    // The slot is free again.
    Client::new(&server).initialize("2025-11-25").await;
}
