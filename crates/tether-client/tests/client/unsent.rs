//! A request the HTTP client never writes ends as not executed after `unsent_timeout`, and a
//! GET never answered is over as an attempt, instead of either waiting for ever. Here neither
//! can be written because no connection opens: the server's accept queue is full, so the kernel
//! drops each new connection's SYN.

use std::time::Duration;

use serde_json::json;
use tether_client::{Client, ClientConfig, RequestError};
use tokio::net::{TcpSocket, TcpStream};

use crate::{response, serve_one};

#[tokio::test]
async fn a_request_never_written_ends_as_not_executed() {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let addr = socket.local_addr().expect("addr");
    // The smallest accept queue: once it holds a connection no one accepts, SYNs are dropped.
    let listener = socket.listen(0).expect("listen");
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("initialize");
        serve_one(tcp, |request| {
            let result = json!({"jsonrpc": "2.0", "id": request["id"], "result": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "x", "version": "1"}}});
            response("200 OK", "Content-Type: application/json\r\nMcp-Session-Id: s1\r\n", &result.to_string())
        })
        .await;
        let (tcp, _) = listener.accept().await.expect("initialized");
        serve_one(tcp, |_| response("202 Accepted", "", "")).await;
        listener
    });
    let mut config = ClientConfig::new(format!("http://{addr}/mcp"));
    config.unsent_timeout = Duration::from_millis(300);
    let (client, _events) = Client::connect(config).await.expect("the handshake");
    let _listener = server.await.expect("the server");
    // The queue fills up with connections no one accepts (once it is full, connecting hangs).
    let mut fillers = Vec::new();
    for _ in 0..2 {
        if let Ok(Ok(tcp)) = tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await {
            fillers.push(tcp);
        }
    }
    let outcome = tokio::time::timeout(Duration::from_secs(20), client.request("tools/list", json!({}))).await;
    match outcome {
        Ok(Err(RequestError::NotExecuted(why))) => assert!(why.contains("had not begun to write"), "{why}"),
        other => panic!("not ended as not executed: {other:?}"),
    }
    // A GET that is not answered in time is over as an attempt (and tried again later).
    let first_get = tokio::time::timeout(Duration::from_secs(20), client.follow_standalone()).await;
    assert!(first_get.is_ok(), "the standalone stream's first GET never ended");
}
