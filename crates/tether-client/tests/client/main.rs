//! The client against a real tether server, through a real fault proxy.

mod attempts;
mod auth;
mod chaos;
mod input;
mod reactions;
mod tasks;
mod telemetry;
mod unsent;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads one request (head and `Content-Length` body) and answers it with `answer(body)`, then
/// closes the connection.
pub(crate) async fn serve_one(mut tcp: TcpStream, answer: impl FnOnce(&Value) -> String) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let body = loop {
        let n = tcp.read(&mut chunk).await.expect("read");
        assert!(n > 0, "the request ended early");
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().expect("a length"));
        if buf.len() >= end + 4 + length {
            break serde_json::from_slice(&buf[end + 4..end + 4 + length]).unwrap_or(Value::Null);
        }
    };
    tcp.write_all(answer(&body).as_bytes()).await.expect("write");
    tcp.shutdown().await.expect("close");
}

pub(crate) fn response(status: &str, headers: &str, body: &str) -> String {
    format!("HTTP/1.1 {status}\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}", body.len())
}
