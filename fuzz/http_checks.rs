// Invariants of the HTTP surface on arbitrary bytes, shared by the fuzz target (`cargo +nightly
// fuzz run http_exchange`) and the stable test that replays its corpus
// (crates/tether-server/tests/http_fuzz_corpus.rs).

/// In an input, replaced by the id and the replay epoch of a live session made for it, so the
/// fuzzer reaches what only a session's requests reach.
const SESSION_MARK: &[u8] = b"@S";
const EPOCH_MARK: &[u8] = b"@E";

/// The bytes an HTTP/2 connection starts with.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Arbitrary bytes sent on one connection to the real router (builtin tools, memory store), with
/// the clock paused so that every timeout passes at once. Nothing panics; the connection ends
/// (closed by the server, or open on an SSE stream) within two hours of the paused clock;
/// everything the server writes on an HTTP/1 connection is a sequence of well-formed HTTP/1
/// responses; every error the router answers is a JSON-RPC error with a reason.
pub fn check_http_exchange(input: &[u8]) {
    static HOOK: std::sync::Once = std::sync::Once::new();
    // A panic in a task the runtime catches (a request's) must still fail the check.
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICKED.store(true, std::sync::atomic::Ordering::SeqCst);
            previous(info);
        }));
    });
    PANICKED.store(false, std::sync::atomic::Ordering::SeqCst);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(exchange(input));
    drop(runtime);
    assert!(!PANICKED.load(std::sync::atomic::Ordering::SeqCst), "a task panicked");
}

static PANICKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

async fn exchange(input: &[u8]) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let server = tether_server::Builder::new(tether_builtin::BuiltinHandler::in_memory()).build();
    let app = server.router("/mcp").route_layer(axum::middleware::from_fn(router_errors_are_jsonrpc));
    let (session, epoch) = initialize(app.clone()).await;
    let input = replace(&replace(input, SESSION_MARK, session.as_bytes()), EPOCH_MARK, epoch.as_bytes());

    let limits = tether_server::ConnectionLimits::default();
    let (client, server_side) = tokio::io::duplex(1 << 20);
    let served = tokio::spawn(tether_server::serve_connection(server_side, app, limits));
    let (mut from_server, mut to_server) = tokio::io::split(client);
    let h2 = input.starts_with(H2_PREFACE);
    // The write side stays open: the server, not the end of the input, ends the connection.
    let writer = tokio::spawn(async move {
        let _ = to_server.write_all(&input).await;
        to_server
    });
    let mut out = Vec::new();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(2 * 3_600), async {
        let mut buf = [0u8; 8_192];
        loop {
            if !h2 && matches!(responses(&out, false), Framing::Stream) {
                return;
            }
            match from_server.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the connection neither ended nor streamed within two hours");
    if !h2 {
        responses(&out, true);
    }
    served.abort();
    writer.abort();
}

/// A live session made through the router; its id and replay epoch.
async fn initialize(app: axum::Router) -> (String, String) {
    use tower::ServiceExt as _;
    let body = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"fuzz","version":"1"}}}"#;
    let request = http::Request::post("/mcp")
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(axum::body::Body::from(body))
        .expect("a request");
    let response = app.oneshot(request).await.expect("infallible");
    assert_eq!(response.status(), 200);
    let header = |name: &str| response.headers()[name].to_str().expect("ASCII").to_owned();
    (header("mcp-session-id"), header("x-mcp-replay-epoch"))
}

fn replace(input: &[u8], mark: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.windows(mark.len()).position(|w| w == mark) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(with);
        rest = &rest[at + mark.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// Checked on the way out of the router: an error the endpoint answers says why, in JSON-RPC.
async fn router_errors_are_jsonrpc(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let response = next.run(request).await;
    let json = response.headers().get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if response.status().as_u16() < 400 && !json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 64 << 20).await.expect("a JSON body is whole");
    if parts.status.as_u16() >= 400 {
        assert_jsonrpc_error(parts.status.as_u16(), &bytes);
    } else if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&bytes) {
        assert_bounded_message(parts.status.as_u16(), &value);
    }
    axum::response::Response::from_parts(parts, axum::body::Body::from(bytes))
}

/// An error quotes a bounded prefix of what was sent, never all of it.
fn assert_bounded_message(status: u16, value: &serde_json::Value) {
    let message = value["error"]["message"].as_str().unwrap_or_default();
    assert!(message.len() <= 1_024, "{status}: an error message of {} bytes", message.len());
}

fn assert_jsonrpc_error(status: u16, body: &[u8]) {
    let value: serde_json::Value = serde_json::from_slice(body).expect("an error body is JSON");
    assert_eq!(value["jsonrpc"], "2.0", "{status}: {value}");
    assert!(value["error"]["code"].is_i64(), "{status}: {value}");
    assert!(value["error"]["data"]["reason"].is_string(), "{status}: no reason: {value}");
    assert_bounded_message(status, &value);
}

/// How what the server wrote ends.
enum Framing {
    /// Whole responses and nothing after them.
    Complete,
    /// Whole responses, then the start of one more.
    Partial,
    /// An SSE stream, whose end is not awaited.
    Stream,
}

/// Reads `out` as a sequence of HTTP/1 responses. With `closed`, the connection has ended: a
/// partial response is malformed.
fn responses(mut out: &[u8], closed: bool) -> Framing {
    loop {
        if out.is_empty() {
            return Framing::Complete;
        }
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut response = httparse::Response::new(&mut headers);
        let head = match response.parse(out) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => {
                assert!(!closed, "a partial response head: {:?}", String::from_utf8_lossy(out));
                return Framing::Partial;
            }
            Err(err) => panic!("not an HTTP response ({err}): {:?}", String::from_utf8_lossy(out)),
        };
        let status = response.code.expect("a status");
        assert!((100..=599).contains(&status), "{status}");
        let header = |name: &str| {
            response
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).to_ascii_lowercase())
        };
        let content_type = header("content-type").unwrap_or_default();
        if content_type.starts_with("text/event-stream") {
            return Framing::Stream;
        }
        let rest = &out[head..];
        let (body, used) = if matches!(status, 100..=199 | 204 | 304) {
            (Vec::new(), 0)
        } else if header("transfer-encoding").is_some_and(|te| te.contains("chunked")) {
            match dechunk(rest) {
                Some(whole) => whole,
                None => {
                    assert!(!closed, "a partial chunked body");
                    return Framing::Partial;
                }
            }
        } else if let Some(length) = header("content-length") {
            let length: usize = length.trim().parse().expect("a numeric content-length");
            if rest.len() < length {
                assert!(!closed, "a body shorter than its content-length");
                return Framing::Partial;
            }
            (rest[..length].to_vec(), length)
        } else {
            // Delimited by the close (an HTTP/1.0 answer).
            if !closed {
                return Framing::Partial;
            }
            (rest.to_vec(), rest.len())
        };
        if status >= 400 && content_type.starts_with("application/json") {
            assert_jsonrpc_error(status, &body);
        }
        out = &rest[used..];
    }
}

/// A whole chunked body and the bytes it took, or `None` if it is not all there yet.
fn dechunk(mut rest: &[u8]) -> Option<(Vec<u8>, usize)> {
    let start = rest.len();
    let mut body = Vec::new();
    loop {
        let (at, size) = match httparse::parse_chunk_size(rest).expect("a valid chunk size") {
            httparse::Status::Complete(parsed) => parsed,
            httparse::Status::Partial => return None,
        };
        let size = usize::try_from(size).expect("a chunk that fits");
        rest = &rest[at..];
        if size == 0 {
            // No trailers are sent: the final CRLF ends the body.
            if rest.len() < 2 {
                return None;
            }
            assert_eq!(&rest[..2], b"\r\n", "the end of a chunked body");
            return Some((body, start - rest.len() + 2));
        }
        if rest.len() < size + 2 {
            return None;
        }
        body.extend_from_slice(&rest[..size]);
        assert_eq!(&rest[size..size + 2], b"\r\n", "a chunk's end");
        rest = &rest[size + 2..];
    }
}
