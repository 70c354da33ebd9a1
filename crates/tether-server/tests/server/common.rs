//! A real server on a loopback port and a small raw-HTTP client for black-box tests.

#![allow(dead_code)]

use std::time::Duration;

use serde_json::{Value, json};
use tether_builtin::BuiltinHandler;
use tether_core::sse::{Decoder, Event};
use tether_server::{Builder, ServerConfig, ServerInfo};
use tokio::task::JoinHandle;

/// Upper bound on any single wait in a test.
pub const WAIT: Duration = Duration::from_secs(10);

pub struct TestServer {
    pub url: String,
    task: JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn start(config: ServerConfig) -> TestServer {
    start_with(Builder::new(BuiltinHandler::in_memory()).config(config)).await
}

pub async fn start_with(builder: Builder) -> TestServer {
    start_limited(builder, tether_server::ConnectionLimits::default()).await
}

pub async fn start_limited(builder: Builder, limits: tether_server::ConnectionLimits) -> TestServer {
    // As `tether serve` serves it: the endpoint on its own, before a router for the rest.
    serve_app(builder.build().endpoint("/mcp", axum::Router::new()), limits).await
}

/// Serves `app` on a loopback port; its `url` is the port's `/mcp`.
pub async fn serve_app(app: impl tether_server::App, limits: tether_server::ConnectionLimits) -> TestServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let url = format!("http://{}/mcp", listener.local_addr().expect("local addr"));
    let task = tokio::spawn(async move {
        let _ = tether_server::serve(listener, app, limits).await;
    });
    TestServer { url, task }
}

/// A standalone GET stream of `session` opened on a raw socket with a 4 KiB receive buffer and
/// not read yet: a client that falls behind. `version` is the request line's HTTP version
/// (with `1.0` the body is the stream itself, not chunked).
pub async fn unread_stream(server: &TestServer, session: &Session, version: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt as _;
    let addr: std::net::SocketAddr =
        server.url.trim_start_matches("http://").split('/').next().expect("authority").parse().expect("address");
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("small receive buffer");
    let mut stream = socket.connect(addr).await.expect("connect");
    let get = format!(
        "GET /mcp HTTP/{version}\r\nHost: {addr}\r\nAccept: text/event-stream\r\nMcp-Session-Id: {}\r\n\
         MCP-Protocol-Version: {}\r\n\r\n",
        session.id, session.version
    );
    stream.write_all(get.as_bytes()).await.expect("send");
    stream
}

/// A fast config for tests: short sweep interval, otherwise defaults.
/// The info of a test handler named `name` that offers tools.
pub fn tools_info(name: &str) -> ServerInfo {
    ServerInfo { name: name.into(), version: "1".into(), instructions: None, capabilities: json!({"tools": {}}) }
}

pub fn config() -> ServerConfig {
    ServerConfig { sweep_interval: Duration::from_millis(50), ..ServerConfig::default() }
}

#[derive(Debug, Clone)]
pub struct Session {
    pub id: String,
    pub epoch: String,
    pub version: String,
}

pub struct Client {
    pub http: reqwest::Client,
    pub url: String,
}

/// An HTTP client builder: TLS is built with every client, and needs the process's provider.
pub fn http_client() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}

impl Client {
    pub fn new(server: &TestServer) -> Client {
        Client { http: http_client().build().expect("client"), url: server.url.clone() }
    }

    /// A POST with the headers a conforming client sends.
    pub fn post(&self, session: Option<&Session>, body: &Value) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.to_string());
        if let Some(session) = session {
            request = request.header("mcp-session-id", &session.id).header("mcp-protocol-version", &session.version);
        }
        request
    }

    /// A GET for an SSE stream, resuming from `cursor` if given.
    pub fn get(&self, session: &Session, cursor: Option<&str>) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .get(&self.url)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &session.id)
            .header("mcp-protocol-version", &session.version);
        if let Some(cursor) = cursor {
            request = request.header("last-event-id", cursor);
        }
        request
    }

    pub async fn initialize(&self, version: &str) -> Session {
        let body = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {"sampling": {}, "elicitation": {}},
            "clientInfo": {"name": "tests", "version": "1"}}});
        let response = self.post(None, &body).send().await.expect("initialize");
        assert_eq!(response.status(), 200);
        let header = |name: &str| response.headers().get(name).expect(name).to_str().expect("ascii").to_owned();
        let (id, epoch) = (header("mcp-session-id"), header("x-mcp-replay-epoch"));
        let result: Value = serde_json::from_slice(&response.bytes().await.expect("body")).expect("json");
        let version = result["result"]["protocolVersion"].as_str().expect("version").to_owned();
        let session = Session { id, epoch, version };
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let status = self.post(Some(&session), &initialized).send().await.expect("initialized").status();
        assert_eq!(status, 202);
        session
    }

    /// Calls a tool and returns the raw response.
    pub async fn call(&self, session: &Session, id: Value, tool: &str, args: Value) -> reqwest::Response {
        let body =
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}});
        self.post(Some(session), &body).send().await.expect("tools/call")
    }
}

/// Sets `name` to `value`, replacing any value the builder already had (`header` appends).
pub fn set(builder: reqwest::RequestBuilder, name: &'static str, value: &str) -> reqwest::RequestBuilder {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(name, value.parse().expect("valid header value"));
    builder.headers(headers)
}

pub fn request(id: Value, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// A 2026-07-28 POST of `method` with `params` as given (their `_meta` included), with the
/// headers that version asks for: `Mcp-Name` from `params.name` or `params.taskId`.
pub fn stateless_post(client: &Client, id: Value, method: &str, params: Value) -> reqwest::RequestBuilder {
    let mut builder = client
        .http
        .post(&client.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(name) = params.get("name").or_else(|| params.get("taskId")).and_then(Value::as_str) {
        builder = builder.header("mcp-name", name);
    }
    builder.body(request(id, method, params).to_string())
}

/// Reads SSE events until the stream ends, `max` events arrived, or `WAIT` passed.
pub async fn events(response: &mut reqwest::Response, max: usize) -> Vec<Event> {
    let mut decoder = Decoder::default();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while out.len() < max {
        let chunk = match tokio::time::timeout_at(deadline, response.chunk()).await {
            Ok(Ok(Some(chunk))) => chunk,
            _ => break,
        };
        let mut input = &chunk[..];
        while let Some(event) = decoder.decode(&mut input).expect("valid SSE") {
            out.push(event);
        }
    }
    out
}

/// Reads a body's bytes until it ends (bounded by `WAIT`), and whether it ended.
pub async fn body_until_end(response: &mut reqwest::Response) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Ok(Ok(Some(chunk))) => out.extend_from_slice(&chunk),
            Ok(Ok(None)) | Ok(Err(_)) => return (out, true),
            Err(_) => return (out, false),
        }
    }
}

/// Reads until the stream ends (bounded by `WAIT`), returning events and whether it ended.
pub async fn drain(response: &mut reqwest::Response) -> (Vec<Event>, bool) {
    let (body, ended) = body_until_end(response).await;
    let mut decoder = Decoder::default();
    let mut input = &body[..];
    let mut out = Vec::new();
    while let Some(event) = decoder.decode(&mut input).expect("valid SSE") {
        out.push(event);
    }
    (out, ended)
}

/// The JSON-RPC messages among events (priming events have empty data).
pub fn messages(events: &[Event]) -> Vec<Value> {
    events.iter().filter(|e| !e.data.is_empty()).map(|e| serde_json::from_str(&e.data).expect("json data")).collect()
}

/// The JSON body; of an event stream (a keyed request is answered as one), the JSON-RPC
/// response it carries.
pub async fn json_body(mut response: reqwest::Response) -> Value {
    if response.headers().get("content-type").is_some_and(|v| v == "text/event-stream") {
        let (events, _) = drain(&mut response).await;
        let mut responses =
            messages(&events).into_iter().filter(|m| m.get("result").is_some() || m.get("error").is_some());
        return responses.next_back().expect("the stream carries a response");
    }
    serde_json::from_slice(&response.bytes().await.expect("body")).expect("json body")
}

/// The `error.data.reason` of an error body.
pub async fn reason(response: reqwest::Response) -> String {
    json_body(response).await["error"]["data"]["reason"].as_str().unwrap_or_default().to_owned()
}

/// `seq` of a lineage id.
pub fn seq(id: &str) -> u64 {
    tether_core::lineage::EventId::parse(id).expect("lineage id").seq
}

/// The id a client that was sent `events` holds for position `seq` of their stream: the id it
/// was sent there (an event's, or a resync notice's), or, for a position it never saw (gone
/// before it was sent), one with a tag the server cannot hold against it either.
pub fn id_at(events: &[Event], seq: u64) -> String {
    use tether_core::lineage::{EventId, Tag};
    let ids = events.iter().filter_map(|e| e.id.as_deref()).filter_map(|id| EventId::parse(id).ok());
    let mut ids = ids.peekable();
    let any = ids.peek().cloned().expect("an event with a lineage id");
    ids.find(|id| id.seq == seq).unwrap_or(EventId { tag: Some(Tag::from_bits(0)), ..any.with_seq(seq) }).to_string()
}
