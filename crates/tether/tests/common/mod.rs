//! Processes for multi-process tests: `tether` subcommands, their output, raw HTTP calls.

#![allow(dead_code)]

pub mod calls;
pub mod streams;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A child process that is killed (SIGKILL) and reaped when dropped.
pub struct Process {
    pub child: Child,
    pub lines: Receiver<String>,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Process {
    /// `child`, whose stdout (piped) is read line by line.
    pub fn reading(mut child: Child) -> Process {
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Process { child, lines }
    }

    /// The next stdout line, waiting at most `timeout`.
    pub fn line(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// Every stdout line until the process closes it or `deadline` passes.
    pub fn rest(&self, deadline: Duration) -> Vec<String> {
        let end = Instant::now() + deadline;
        let mut out = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(end.saturating_duration_since(Instant::now())) {
            out.push(line);
        }
        out
    }

    /// Kills the process with SIGKILL, as a crash would.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends the process `signal` (`TERM`, `INT`), as an orchestrator stopping it would.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([&format!("-{signal}"), &self.child.id().to_string()]).status();
        assert!(status.expect("kill runs").success(), "kill -{signal} {}", self.child.id());
    }

    /// Waits for the process to exit, failing the test past `within`; its status.
    pub fn exit_within(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "still running after {within:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Runs `tether ARGS...` with its stdout read line by line.
pub fn tether(args: &[&str]) -> Process {
    let child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(if std::env::var_os("TETHER_TEST_STDERR").is_some() { Stdio::inherit() } else { Stdio::null() })
        .spawn()
        .expect("spawn tether");
    Process::reading(child)
}

/// A loopback port that was free a moment ago.
///
/// Ports come from below the kernel's ephemeral range (32768 and up), which it hands to
/// `bind(0)` and to outgoing connections: a port freed by a kill -9 stays this test's to restart
/// on, not another's to take meanwhile. Each call of one test binary takes the next port (no two
/// tests share one), starting at an offset of the binary's pid; a port something else holds is
/// skipped.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7_919) % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(FIRST + (start + n) % SPAN).expect("below 32000");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between {FIRST} and {}", FIRST + SPAN)
}

/// `tether serve` on `port` with the embedded store in `dir`; returns it once it listens.
pub fn serve(port: u16, dir: &Path, extra: &[&str]) -> (Process, String) {
    let listen = format!("127.0.0.1:{port}");
    let data = dir.to_str().expect("utf-8 path");
    let mut args = vec!["serve", "--listen", &listen, "--data-dir", data];
    args.extend_from_slice(extra);
    let process = tether(&args);
    let first = process.line(Duration::from_secs(20)).expect("tether serve started");
    let url = first.strip_prefix("listening on ").expect("listening line").to_owned();
    (process, url)
}

/// POSTs a JSON-RPC message on `session` over a plain socket and returns the status (0 if the
/// connection failed, as it does when the server is killed mid-request).
pub fn post(url: &str, session: &str, body: &Value) -> u16 {
    let authority = url.trim_start_matches("http://").split('/').next().expect("authority");
    let Ok(mut stream) = TcpStream::connect(authority) else { return 0 };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let body = body.to_string();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMcp-Session-Id: {session}\r\n\
         MCP-Protocol-Version: 2025-11-25\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return 0;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);

    response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// A fresh temporary directory for one test.
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tether-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Parses JSON lines.
pub fn parse(lines: &[String]) -> Vec<Value> {
    lines.iter().map(|l| serde_json::from_str(l).expect("JSON line")).collect()
}

/// Waits until the checkpoint file names a session with a standalone cursor; returns the session.
pub fn checkpointed_session(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let saved: Value = std::fs::read(path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        if saved["streams"]["get"]["last_id"].is_string() {
            return saved["session_id"].as_str().expect("session").to_owned();
        }
        assert!(Instant::now() < deadline, "the watch never checkpointed its stream");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An HTTP response as read over a plain socket.
pub struct Exchanged {
    pub status: u16,
    /// Names in lowercase.
    pub headers: Vec<(String, String)>,
    /// De-chunked, as far as it was read.
    pub body: String,
}

/// Whether a blocking read that failed with `err` is read again: its timeout passed with nothing
/// to read, or a signal interrupted it. Neither says anything of the connection.
pub fn read_again(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted
    )
}

/// One HTTP/1.1 exchange over a plain socket with `Connection: close`: the response as read
/// until the server closes it, `enough` says so (given the body so far), or `timeout` passes.
pub fn exchange(
    url: &str,
    method: &str,
    headers: &[(&str, &str)],
    body: &str,
    enough: impl Fn(&str) -> bool,
    timeout: Duration,
) -> Exchanged {
    let rest = url.trim_start_matches("http://");
    let (authority, path) = rest.find('/').map_or((rest, "/"), |slash| rest.split_at(slash));
    let mut stream = TcpStream::connect(authority).expect("connect");
    let deadline = Instant::now() + timeout;
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).expect("send");
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    let mut failed = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let _ = stream.set_read_timeout(Some(left.min(Duration::from_millis(200))));
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(err) if read_again(&err) => {}
            Err(err) => {
                failed = Some(err);
                break;
            }
        }
        if let Some(response) = split_response(&raw)
            && enough(&response.body)
        {
            break;
        }
    }
    let waited = timeout.saturating_sub(deadline.saturating_duration_since(Instant::now()));
    split_response(&raw).unwrap_or_else(|| {
        panic!("no HTTP response to {method} {path} after {waited:?} ({failed:?}): {:?}", String::from_utf8_lossy(&raw))
    })
}

fn split_response(raw: &[u8]) -> Option<Exchanged> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers.iter().any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    Some(Exchanged { status, headers, body: if chunked { dechunk(body) } else { body.to_owned() } })
}

/// The data of a chunked body read so far (a last partial chunk included).
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else { break };
        if size == 0 {
            break;
        }
        let end = size.min(rest.len());
        out.push_str(&rest[..end]);
        body = rest.get(end..).unwrap_or("").trim_start_matches("\r\n");
    }
    out
}

/// The SSE events of a body: (id, event type, data) each.
pub fn sse_events(body: &str) -> Vec<(Option<String>, Option<String>, String)> {
    let mut decoder = tether_core::sse::Decoder::default();
    let mut input = body.as_bytes();
    let mut out = Vec::new();
    while let Ok(Some(event)) = decoder.decode(&mut input) {
        out.push((event.id, event.event, event.data));
    }
    out
}

/// The JSON-RPC response a body carries: the body itself if it is JSON, else the response
/// among its SSE events (a keyed request is answered as a stream).
pub fn answer_of(body: &str) -> Option<Value> {
    if let Ok(value) = serde_json::from_str::<Value>(body) {
        return Some(value);
    }
    sse_events(body)
        .into_iter()
        .filter_map(|(_, _, data)| serde_json::from_str::<Value>(&data).ok())
        .find(|message| message.get("result").is_some() || message.get("error").is_some())
}

/// A header's value.
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
    headers.iter().find(|(n, _)| n == name).map_or("", |(_, v)| v.as_str())
}

/// Creates a 2025-11-25 session over a plain socket; returns its id.
pub fn raw_session(url: &str) -> String {
    let json = [("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let response = exchange(url, "POST", &json, init, |_| false, Duration::from_secs(10));
    assert_eq!(response.status, 200);
    let session = header(&response.headers, "mcp-session-id").to_owned();
    let mut with_session = json.to_vec();
    with_session.push(("Mcp-Session-Id", &session));
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    assert_eq!(exchange(url, "POST", &with_session, initialized, |_| false, Duration::from_secs(10)).status, 202);
    session
}
