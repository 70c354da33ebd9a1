//! Processes for multi-process tests: `tether` subcommands, their output, raw HTTP calls.

#![allow(dead_code)]

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
}

/// Runs `tether ARGS...` with its stdout read line by line.
pub fn tether(args: &[&str]) -> Process {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(if std::env::var_os("TETHER_TEST_STDERR").is_some() { Stdio::inherit() } else { Stdio::null() })
        .spawn()
        .expect("spawn tether");
    let stdout = child.stdout.take().expect("stdout");
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

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
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
