//! `tether watch --checkpoint` across a restart of the client: the second run resumes the same
//! session from the file, proves continuity, and delivers each message exactly once.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tether(args: &[&str]) -> Process {
    let child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn tether");
    Process(child)
}

/// Lines of a process's stdout until it exits or `deadline` passes.
fn lines(process: &mut Process, deadline: Duration) -> Vec<String> {
    let stdout = process.0.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let end = Instant::now() + deadline;
    let mut out = Vec::new();
    while let Ok(line) = rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
        out.push(line);
    }
    out
}

fn post(url: &str, session: &str, body: &Value) -> u16 {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let client = reqwest_like::Client::new();
        client.post(url, session, body).await
    })
}

/// The few raw HTTP calls the test makes on the watched session, over a plain TCP socket.
mod reqwest_like {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    pub struct Client;

    impl Client {
        pub fn new() -> Client {
            Client
        }

        pub async fn post(&self, url: &str, session: &str, body: &serde_json::Value) -> u16 {
            let authority = url.trim_start_matches("http://").split('/').next().expect("authority");
            let mut stream = tokio::net::TcpStream::connect(authority).await.expect("connect");
            let body = body.to_string();
            let request = format!(
                "POST /mcp HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
                 Accept: application/json, text/event-stream\r\nMcp-Session-Id: {session}\r\n\
                 MCP-Protocol-Version: 2025-11-25\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(request.as_bytes()).await.expect("write");
            let mut response = String::new();
            stream.read_to_string(&mut response).await.expect("read");
            response.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status")
        }
    }
}

#[test]
fn a_restarted_watch_resumes_from_its_checkpoint_exactly_once() {
    let dir = std::env::temp_dir().join(format!("tether-watch-checkpoint-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let checkpoint = dir.join("watch.json");
    let mut server = tether(&["serve", "--listen", "127.0.0.1:0"]);
    let stdout = server.0.stdout.take().expect("stdout");
    let first = BufReader::new(stdout).lines().next().expect("a line").expect("utf-8");
    let url = first.strip_prefix("listening on ").expect("listening line").to_owned();

    // First run: open the standalone stream, then stop after two broadcasts.
    let mut watch = tether(&["watch", &url, "--checkpoint", checkpoint.to_str().expect("path"), "--max-events", "2"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let session = loop {
        let saved: Value =
            std::fs::read(&checkpoint).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        if saved["streams"]["get"]["last_id"].is_string() {
            break saved["session_id"].as_str().expect("session").to_owned();
        }
        assert!(Instant::now() < deadline, "the watch never checkpointed its stream");
        std::thread::sleep(Duration::from_millis(20));
    };
    let broadcast = |id: u64, count: u64| {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "broadcast", "arguments": {"count": count}}});
        assert_eq!(post(&url, &session, &call), 200);
    };
    broadcast(1, 2);
    let run1 = lines(&mut watch, Duration::from_secs(10));
    assert!(watch.0.wait().expect("exit").success(), "{run1:?}");
    // While no client is connected, three more broadcasts are retained on the stream.
    broadcast(2, 3);

    let mut watch = tether(&["watch", &url, "--checkpoint", checkpoint.to_str().expect("path"), "--max-events", "3"]);
    let run2 = lines(&mut watch, Duration::from_secs(10));
    assert!(watch.0.wait().expect("exit").success(), "{run2:?}");
    let parsed = |lines: &[String]| {
        lines.iter().map(|l| serde_json::from_str::<Value>(l).expect("JSON line")).collect::<Vec<_>>()
    };
    let (run1, run2) = (parsed(&run1), parsed(&run2));
    let numbers = |lines: &[Value]| {
        lines.iter().filter_map(|l| l["message"]["params"]["data"]["broadcast"].as_u64()).collect::<Vec<_>>()
    };
    assert_eq!(numbers(&run1), [1, 2]);
    assert_eq!(numbers(&run2), [1, 2, 3], "the second run gets the three new broadcasts, once");
    assert_eq!(run2[0]["event"], "resumed");
    assert_eq!(run2[0]["verdict"], "continuous");
    assert!(run2.iter().all(|l| l["event"] != "divergence" && l["event"] != "reinitialized"), "{run2:?}");
    let saved: Value = serde_json::from_slice(&std::fs::read(&checkpoint).expect("checkpoint")).expect("json");
    assert_eq!(saved["session_id"], session.as_str(), "the same session all along");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
