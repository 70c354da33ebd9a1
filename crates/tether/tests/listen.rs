//! `subscriptions/listen` (SEP-2575) across replicas: a subscription hears what a tool announces,
//! once, whichever Redis replica either is on.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::*;

fn meta() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}})
}

fn headers<'a>(method: &'a str, name: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    let mut headers = vec![
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", method),
    ];
    headers.extend(name.map(|name| ("Mcp-Name", name)));
    headers
}

/// Opens `subscriptions/listen` (request `id`, tool list changes) on a plain socket.
fn open_listen(url: &str, id: u64) -> TcpStream {
    let rest = url.trim_start_matches("http://");
    let (authority, path) = rest.split_at(rest.find('/').expect("a path"));
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen",
        "params": {"_meta": meta(), "notifications": {"toolsListChanged": true}}})
    .to_string();
    let mut stream = TcpStream::connect(authority).expect("connect");
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
         Mcp-Method: subscriptions/listen\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("send");
    stream
}

/// Reads from `stream` into `text` until `done` says so or `wait` passed.
fn read_for(stream: &mut TcpStream, text: &mut String, wait: Duration, done: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 4096];
    while !done(text) && Instant::now() < deadline {
        let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => text.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(_) => {}
        }
    }
}

#[test]
fn a_subscription_hears_each_announcement_once_on_whichever_replica_it_is() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let redis = runtime.block_on(tether_testkit::RedisServer::start());
    let dir = temp_dir("listen-replicas");
    let args = ["--store", "redis", "--redis-url", redis.url.as_str(), "--redis-durability", "none"];
    let (replica_a, a) = serve(free_port(), &dir.join("a"), &args);
    let (replica_b, b) = serve(free_port(), &dir.join("b"), &args);
    let (mut on_a, mut on_b) = (open_listen(&a, 1), open_listen(&b, 2));
    let (mut heard_a, mut heard_b) = (String::new(), String::new());
    let acknowledged = |text: &str| text.contains("notifications/subscriptions/acknowledged");
    read_for(&mut on_a, &mut heard_a, Duration::from_secs(5), acknowledged);
    read_for(&mut on_b, &mut heard_b, Duration::from_secs(5), acknowledged);
    assert!(acknowledged(&heard_a) && acknowledged(&heard_b), "both subscriptions are open");
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "test_trigger_tool_change", "arguments": {}, "_meta": meta()}});
    let answer = exchange(
        &a,
        "POST",
        &headers("tools/call", Some("test_trigger_tool_change")),
        &call.to_string(),
        |body| body.contains("announced"),
        Duration::from_secs(5),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let changes = |text: &str| text.matches("notifications/tools/list_changed").count();
    // Long enough for a second copy to arrive, were there one.
    for (stream, text) in [(&mut on_a, &mut heard_a), (&mut on_b, &mut heard_b)] {
        read_for(stream, text, Duration::from_secs(5), |text| changes(text) >= 1);
        read_for(stream, text, Duration::from_millis(500), |text| changes(text) >= 2);
    }
    assert_eq!(changes(&heard_a), 1, "the announcing replica's subscriber, once: {heard_a}");
    assert_eq!(changes(&heard_b), 1, "the other replica's subscriber, once: {heard_b}");
    assert!(heard_b.contains(r#""io.modelcontextprotocol/subscriptionId":2"#), "tagged with its own id: {heard_b}");
    drop((replica_a, replica_b));
    let _ = std::fs::remove_dir_all(&dir);
}
