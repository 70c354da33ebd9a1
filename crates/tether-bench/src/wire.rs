//! The bench's MCP client: HTTP/1.1 on one keep-alive connection per worker, responses read
//! as JSON or SSE (with tether's decoder), and nothing else, so that every target is driven by
//! the same, cheap code.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tether_core::sse::{Decoder, Event};

/// The protocol revision the bench negotiates: session-based, spoken by every target.
const PROTOCOL_VERSION: &str = "2025-06-18";
/// How long one exchange may take before the bench calls the target stuck.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(120);

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Connecting or talking HTTP failed.
    #[error("http: {0}")]
    Http(String),
    /// The server answered with an unexpected status.
    #[error("{method} answered {status}: {body}")]
    Status {
        /// The JSON-RPC method or HTTP method sent.
        method: String,
        /// The status.
        status: StatusCode,
        /// The start of the body.
        body: String,
    },
    /// The answer was not what MCP says it should be.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The exchange took longer than its limit.
    #[error("timed out after {0:?}")]
    TimedOut(Duration),
}

impl From<hyper::Error> for WireError {
    fn from(err: hyper::Error) -> Self {
        WireError::Http(err.to_string())
    }
}

impl From<std::io::Error> for WireError {
    fn from(err: std::io::Error) -> Self {
        WireError::Http(err.to_string())
    }
}

/// Where a target serves MCP.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The socket address.
    pub addr: SocketAddr,
    /// The path of the MCP endpoint.
    pub path: String,
}

impl Endpoint {
    /// An endpoint from its parts.
    pub fn new(addr: SocketAddr, path: &str) -> Endpoint {
        Endpoint { addr, path: path.to_owned() }
    }

    /// Parses `http://IP:PORT/PATH` (the bench only talks to loopback addresses it started).
    pub fn parse(url: &str) -> Option<Endpoint> {
        let rest = url.strip_prefix("http://")?;
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let addr: SocketAddr = authority.replace("localhost", "127.0.0.1").parse().ok()?;
        addr.ip().is_loopback().then(|| Endpoint::new(addr, if path.is_empty() { "/" } else { path }))
    }
}

/// One HTTP/1.1 connection with keep-alive and `TCP_NODELAY`.
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    endpoint: Endpoint,
}

impl Conn {
    /// Connects to `endpoint`.
    pub async fn open(endpoint: &Endpoint) -> Result<Conn, WireError> {
        let tcp = tokio::net::TcpStream::connect(endpoint.addr).await?;
        tcp.set_nodelay(true)?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(async move {
            // Ends with the connection; its error, if any, surfaces on the next request.
            let _ = connection.await;
        });
        Ok(Conn { sender, endpoint: endpoint.clone() })
    }

    async fn send(&mut self, request: Request<Full<Bytes>>) -> Result<Response<Incoming>, WireError> {
        self.sender.ready().await?;
        Ok(self.sender.send_request(request).await?)
    }

    fn request(&self, method: Method, session: Option<&str>) -> http::request::Builder {
        let mut builder = Request::builder()
            .method(method)
            .uri(self.endpoint.path.as_str())
            .header(header::HOST, self.endpoint.addr.to_string())
            .header(header::ACCEPT, "application/json, text/event-stream");
        if let Some(session) = session {
            builder = builder.header("mcp-session-id", session).header("mcp-protocol-version", PROTOCOL_VERSION);
        }
        builder
    }

    /// POSTs one JSON-RPC message.
    pub async fn post(&mut self, session: Option<&str>, message: &Value) -> Result<Response<Incoming>, WireError> {
        let request = self
            .request(Method::POST, session)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(message.to_string())))
            .map_err(|e| WireError::Http(e.to_string()))?;
        self.send(request).await
    }

    /// Opens a GET stream of `session`, resuming after `last_event_id` if given.
    pub async fn get(&mut self, session: Option<&str>, last_event_id: Option<&str>) -> Result<Events, WireError> {
        let mut builder = self.request(Method::GET, session);
        if let Some(id) = last_event_id {
            builder = builder.header("last-event-id", id);
        }
        let request = builder.body(Full::new(Bytes::new())).map_err(|e| WireError::Http(e.to_string()))?;
        let response = self.send(request).await?;
        if response.status() != StatusCode::OK {
            return Err(status_error("GET", response).await);
        }
        Ok(Events::new(response.into_body()))
    }
}

async fn status_error(method: &str, response: Response<Incoming>) -> WireError {
    let status = response.status();
    let body = match tokio::time::timeout(Duration::from_secs(2), response.into_body().collect()).await {
        Ok(Ok(body)) => String::from_utf8_lossy(&body.to_bytes()).chars().take(200).collect(),
        _ => String::new(),
    };
    WireError::Status { method: method.to_owned(), status, body }
}

/// The events of an SSE response body.
pub struct Events {
    body: Incoming,
    decoder: Decoder,
    buffer: Bytes,
}

impl Events {
    fn new(body: Incoming) -> Events {
        Events { body, decoder: Decoder::default(), buffer: Bytes::new() }
    }

    /// The next event, or `None` when the server ends the stream.
    pub async fn next(&mut self) -> Result<Option<Event>, WireError> {
        loop {
            let mut input = &self.buffer[..];
            let decoded = self.decoder.decode(&mut input).map_err(|e| WireError::Protocol(e.to_string()))?;
            let consumed = self.buffer.len() - input.len();
            self.buffer.advance(consumed);
            if let Some(event) = decoded {
                return Ok(Some(event));
            }
            match self.body.frame().await {
                None => return Ok(None),
                Some(frame) => {
                    if let Ok(data) = frame?.into_data() {
                        self.buffer = data;
                    }
                }
            }
        }
    }
}

/// What a tool call produced.
#[derive(Debug, Clone, Default)]
pub struct CallOutcome {
    /// Notifications received before the result.
    pub notifications: u64,
    /// The SSE id of the first event with one (the cursor the `resume` scenario starts from).
    pub first_event_id: Option<String>,
}

/// An initialized MCP session over one connection.
pub struct Session {
    /// The connection the session's requests go over.
    pub conn: Conn,
    /// The session id (`None` on a stateless server).
    pub id: Option<String>,
    next_id: u64,
}

impl Session {
    /// Connects and initializes (`initialize`, then `notifications/initialized`).
    pub async fn start(endpoint: &Endpoint) -> Result<Session, WireError> {
        let conn = Conn::open(endpoint).await?;
        Session::initialize(conn).await
    }

    /// Uses the already initialized session `id` over `conn`, numbering requests from
    /// `first_request_id`.
    pub fn attach(conn: Conn, id: Option<String>, first_request_id: u64) -> Session {
        Session { conn, id, next_id: first_request_id }
    }

    /// The id the next request will carry.
    pub fn next_request_id(&self) -> u64 {
        self.next_id
    }

    /// Initializes a new session over `conn`.
    pub async fn initialize(mut conn: Conn) -> Result<Session, WireError> {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
            "clientInfo": {"name": "tether-bench", "version": env!("CARGO_PKG_VERSION")}}});
        let response = timed(conn.post(None, &init)).await?;
        if response.status() != StatusCode::OK {
            return Err(status_error("initialize", response).await);
        }
        let id = response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let mut session = Session { conn, id, next_id: 1 };
        timed(session.read_response(response, 0)).await?;
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        session.notify(&initialized).await?;
        Ok(session)
    }

    /// Sends a notification; expects 202 (or 200 from lenient servers).
    pub async fn notify(&mut self, message: &Value) -> Result<(), WireError> {
        let response = timed(self.conn.post(self.id.as_deref(), message)).await?;
        if !response.status().is_success() {
            return Err(status_error("notification", response).await);
        }
        timed(response.into_body().collect()).await?;
        Ok(())
    }

    /// Calls `tool` with `arguments` (and a progress token if `progress`), reading every
    /// notification until the result.
    pub async fn call(&mut self, tool: &str, arguments: Value, progress: bool) -> Result<CallOutcome, WireError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut params = json!({"name": tool, "arguments": arguments});
        if progress {
            params["_meta"] = json!({"progressToken": format!("p{id}")});
        }
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
        let response = timed(self.conn.post(self.id.as_deref(), &call)).await?;
        if response.status() != StatusCode::OK {
            return Err(status_error("tools/call", response).await);
        }
        timed(self.read_response(response, id)).await
    }

    /// Reads a POST's answer (JSON body or SSE stream) until the response to `id`.
    async fn read_response(&mut self, response: Response<Incoming>, id: u64) -> Result<CallOutcome, WireError> {
        let sse = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !sse {
            let body = response.into_body().collect().await?.to_bytes();
            let message: Value =
                serde_json::from_slice(&body).map_err(|e| WireError::Protocol(format!("JSON body: {e}")))?;
            check_response(&message, id)?;
            return Ok(CallOutcome::default());
        }
        let mut events = Events::new(response.into_body());
        let mut outcome = CallOutcome::default();
        while let Some(event) = events.next().await? {
            if outcome.first_event_id.is_none() && !event.data.is_empty() {
                outcome.first_event_id = event.id.clone();
            }
            match classify(&event.data, id)? {
                Kind::Response => {
                    // The server ends the stream after the response; reading to its end keeps
                    // the connection reusable (HTTP/1.1 cannot reuse a half-read response).
                    while timed(events.next()).await?.is_some() {}
                    return Ok(outcome);
                }
                Kind::Notification => outcome.notifications += 1,
                Kind::Other => {}
            }
        }
        Err(WireError::Protocol(format!("the stream ended before the response to request {id}")))
    }
}

/// What an SSE event's data holds, to the bench.
#[derive(Debug, PartialEq, Eq)]
pub enum Kind {
    /// The response to the request being read.
    Response,
    /// A notification.
    Notification,
    /// Anything else (a priming event, another request's message).
    Other,
}

/// The members of a JSON-RPC message the bench looks at; the rest is skipped without being
/// built, so reading a long stream measures the server, not the bench's allocations.
#[derive(serde::Deserialize)]
struct Peek {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    method: Option<serde::de::IgnoredAny>,
}

/// Classifies an event's data against the request id the reader waits for.
pub fn classify(data: &str, id: u64) -> Result<Kind, WireError> {
    if data.is_empty() {
        return Ok(Kind::Other);
    }
    let peek: Peek = serde_json::from_str(data).map_err(|e| WireError::Protocol(format!("SSE data: {e}")))?;
    if peek.method.is_some() {
        return Ok(if peek.id.is_none() { Kind::Notification } else { Kind::Other });
    }
    if peek.id.as_ref().and_then(Value::as_u64) == Some(id) {
        let message: Value = serde_json::from_str(data).map_err(|e| WireError::Protocol(format!("SSE data: {e}")))?;
        check_response(&message, id)?;
        return Ok(Kind::Response);
    }
    Ok(Kind::Other)
}

fn check_response(message: &Value, id: u64) -> Result<(), WireError> {
    if message.get("id").and_then(Value::as_u64) != Some(id) {
        return Err(WireError::Protocol(format!("expected the response to request {id}, got {message}")));
    }
    if let Some(error) = message.get("error") {
        return Err(WireError::Protocol(format!("request {id} failed: {error}")));
    }
    if message.pointer("/result/isError") == Some(&Value::Bool(true)) {
        return Err(WireError::Protocol(format!("tool error: {}", message["result"])));
    }
    Ok(())
}

async fn timed<T, E: Into<WireError>>(future: impl Future<Output = Result<T, E>>) -> Result<T, WireError> {
    match tokio::time::timeout(EXCHANGE_TIMEOUT, future).await {
        Ok(result) => result.map_err(Into::into),
        Err(_) => Err(WireError::TimedOut(EXCHANGE_TIMEOUT)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_loopback_urls() {
        let endpoint = Endpoint::parse("http://127.0.0.1:8808/mcp").expect("parses");
        assert_eq!(endpoint.addr.port(), 8808);
        assert_eq!(endpoint.path, "/mcp");
        assert_eq!(Endpoint::parse("http://localhost:9/").map(|e| e.addr.port()), Some(9));
        assert!(Endpoint::parse("http://10.0.0.1:80/mcp").is_none());
        assert!(Endpoint::parse("https://127.0.0.1:80/mcp").is_none());
    }

    #[test]
    fn events_are_classified_by_id() {
        let response = r#"{"jsonrpc":"2.0","id":7,"result":{"content":[]}}"#;
        assert_eq!(classify(response, 7).expect("ok"), Kind::Response);
        assert_eq!(classify(response, 8).expect("ok"), Kind::Other);
        let progress = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#;
        assert_eq!(classify(progress, 7).expect("ok"), Kind::Notification);
        assert_eq!(classify("", 7).expect("ok"), Kind::Other);
        assert!(classify(r#"{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"x"}}"#, 7).is_err());
        assert!(classify("not json", 7).is_err());
    }
}
