//! The `raw` target: a hyper server that reads the same JSON-RPC requests and writes the same
//! SSE bytes as an MCP server, with no MCP logic (no validation, no store, no lineage). It is
//! the ceiling of what this machine does over loopback HTTP/1.1, not an MCP implementation.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::sync::mpsc;

type Body = BoxBody<Bytes, Infallible>;

/// A response body fed by a channel. Every event already queued goes out in one frame (one
/// write), as a well-built streaming server does; a lone event goes out at once.
struct ChannelBody(mpsc::Receiver<Bytes>);

/// The most bytes gathered into one frame.
const MAX_FRAME: usize = 64 * 1024;

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let first = match self.0.poll_recv(cx) {
            Poll::Ready(Some(bytes)) => bytes,
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        let mut frame = Vec::from(first);
        while frame.len() < MAX_FRAME {
            match self.0.try_recv() {
                Ok(bytes) => frame.extend_from_slice(&bytes),
                Err(_) => break,
            }
        }
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(frame)))))
    }
}

#[derive(Default)]
struct State {
    sessions: AtomicU64,
    /// Each session's events of its last streamed call, for replay after an id.
    history: Mutex<HashMap<String, Vec<(u64, Bytes)>>>,
    /// The open standalone streams.
    listeners: Mutex<Vec<mpsc::Sender<Bytes>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Serves on `addr` until the process ends; prints `listening on http://ADDR/mcp` first.
pub async fn serve(addr: SocketAddr) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on http://{}/mcp", listener.local_addr()?);
    let state = Arc::new(State::default());
    loop {
        let (tcp, _) = listener.accept().await?;
        tcp.set_nodelay(true)?;
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| handle(Arc::clone(&state), request));
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), service).await;
        });
    }
}

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
}

fn streaming(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let mut response = Response::new(ChannelBody(rx).boxed());
    response.headers_mut().insert(header::CONTENT_TYPE, http::HeaderValue::from_static("text/event-stream"));
    response
}

fn event(id: u64, data: &str) -> Bytes {
    Bytes::from(format!("id: {id}\ndata: {data}\n\n"))
}

fn result(id: &Value, text: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{text}"}}]}}}}"#)
}

async fn handle(state: Arc<State>, request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let session = request.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    match *request.method() {
        Method::GET => {
            let last =
                request.headers().get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
            Ok(get(&state, session, last))
        }
        Method::POST => {
            let Ok(body) = request.into_body().collect().await else {
                return Ok(full(StatusCode::BAD_REQUEST, "text/plain", "unreadable body"));
            };
            let Ok(message) = serde_json::from_slice::<Value>(&body.to_bytes()) else {
                return Ok(full(StatusCode::BAD_REQUEST, "text/plain", "not JSON"));
            };
            Ok(post(&state, session, &message))
        }
        _ => Ok(full(StatusCode::OK, "text/plain", "")),
    }
}

fn get(state: &Arc<State>, session: Option<String>, last: Option<u64>) -> Response<Body> {
    let (tx, rx) = mpsc::channel(64);
    match last {
        Some(after) => {
            let events: Vec<Bytes> = lock(&state.history)
                .get(session.as_deref().unwrap_or_default())
                .map(|h| h.iter().filter(|(id, _)| *id > after).map(|(_, e)| e.clone()).collect())
                .unwrap_or_default();
            tokio::spawn(async move {
                for event in events {
                    if tx.send(event).await.is_err() {
                        break;
                    }
                }
            });
        }
        None => lock(&state.listeners).push(tx),
    }
    streaming(rx)
}

fn post(state: &Arc<State>, session: Option<String>, message: &Value) -> Response<Body> {
    let Some(id) = message.get("id") else { return full(StatusCode::ACCEPTED, "text/plain", "") };
    let json = "application/json";
    match message.get("method").and_then(Value::as_str) {
        Some("initialize") => {
            let n = state.sessions.fetch_add(1, Ordering::Relaxed);
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"protocolVersion":"2025-06-18","capabilities":{{"tools":{{}}}},"serverInfo":{{"name":"raw","version":"0"}}}}}}"#
            );
            let mut response = full(StatusCode::OK, json, body);
            if let Ok(value) = format!("raw-{n}").parse() {
                response.headers_mut().insert("mcp-session-id", value);
            }
            response
        }
        Some("tools/call") => {
            let params = &message["params"];
            match params["name"].as_str() {
                Some("notify_all") => {
                    let seq = params["arguments"]["seq"].as_u64().unwrap_or(0);
                    let data = format!(
                        r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"level":"info","data":{{"seq":{seq}}}}}}}"#
                    );
                    let mut listeners = lock(&state.listeners);
                    listeners.retain(|tx| tx.try_send(event(seq, &data)).is_ok());
                    full(StatusCode::OK, json, result(id, &format!("sent to {} sessions", listeners.len())))
                }
                _ => {
                    let to = params["arguments"]["to"].as_u64().unwrap_or(0);
                    let token = &params["_meta"]["progressToken"];
                    if to == 0 || token.is_null() {
                        return full(StatusCode::OK, json, result(id, &format!("counted to {to}")));
                    }
                    stream_count(state, session.unwrap_or_default(), id.clone(), token.clone(), to)
                }
            }
        }
        _ => full(StatusCode::OK, json, format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#)),
    }
}

/// Streams `to` progress notifications then the result, keeping them for replay.
fn stream_count(state: &Arc<State>, session: String, id: Value, token: Value, to: u64) -> Response<Body> {
    let (tx, rx) = mpsc::channel(64);
    let state = Arc::clone(state);
    tokio::spawn(async move {
        let mut history = Vec::with_capacity(usize::try_from(to).unwrap_or(0).saturating_add(1));
        for i in 1..=to {
            let data = format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":{token},"progress":{i},"total":{to}}}}}"#
            );
            let frame = event(i, &data);
            history.push((i, frame.clone()));
            if tx.send(frame).await.is_err() {
                return;
            }
        }
        // Kept before the result goes out, so a client that resumes right after it finds it.
        let last = event(to + 1, &result(&id, &format!("counted to {to}")));
        history.push((to + 1, last.clone()));
        lock(&state.history).insert(session, history);
        let _ = tx.send(last).await;
    });
    streaming(rx)
}
