//! `tether serve` under the attacks every internet-facing server meets, all on loopback: idle
//! and slow connections, more connections than descriptors, more sessions than allowed (at once,
//! across a restart, across replicas), a second server on the same data directory, and a
//! `watch` killed again and again.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
const JSON: [(&str, &str); 2] =
    [("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];

fn authority(url: &str) -> &str {
    url.trim_start_matches("http://").split('/').next().expect("authority")
}

fn connect(url: &str) -> TcpStream {
    let stream = TcpStream::connect(authority(url)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
    stream
}

/// Whether the server closed `stream` within `within`: reads until end of file or a reset, and
/// drops whatever else arrives.
fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let end = Instant::now() + within;
    let mut buf = [0u8; 4096];
    while Instant::now() < end {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(err) if read_again(&err) => {}
            Err(_) => return true,
        }
    }
    false
}

/// The status of an initialize over a connection of its own (0 if there was no answer).
fn initialize(url: &str) -> u16 {
    exchange(url, "POST", &JSON, INIT, |_| false, Duration::from_secs(10)).status
}

fn reason(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["data"]["reason"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[test]
fn connections_that_send_no_complete_head_or_idle_are_closed_and_streams_are_not() {
    let dir = temp_dir("hardening-timeouts");
    let args = ["--header-timeout", "1s", "--idle-timeout", "4s"];
    let (_server, url) = serve(free_port(), &dir, &args);

    let mut silent = connect(&url);
    assert!(closed_within(&mut silent, Duration::from_secs(10)), "a connection that sends nothing");

    let mut partial = connect(&url);
    partial.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n").expect("send");
    assert!(closed_within(&mut partial, Duration::from_secs(10)), "a partial head");

    // One byte every 100 ms: the head would take 10 s; it is closed long before.
    let mut slow = connect(&url);
    let head = format!(
        "GET /mcp HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\nX-Pad: {}\r\n\r\n",
        authority(&url),
        "p".repeat(40)
    );
    let started = Instant::now();
    let mut sent = 0;
    for byte in head.as_bytes() {
        if slow.write_all(&[*byte]).is_err() || closed_within(&mut slow, Duration::from_millis(100)) {
            break;
        }
        sent += 1;
    }
    assert!(sent < head.len(), "closed before the head was complete ({sent} bytes in {:?})", started.elapsed());

    // Answered, then idle: the idle timeout applies, not the header timeout.
    let mut idle = connect(&url);
    let request = format!("DELETE /mcp HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\n\r\n", authority(&url));
    idle.write_all(request.as_bytes()).expect("send");
    let mut answer = [0u8; 12];
    idle.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    idle.read_exact(&mut answer).expect("an answer");
    assert_eq!(&answer, b"HTTP/1.1 400");
    idle.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
    assert!(!closed_within(&mut idle, Duration::from_secs(2)), "open past the header timeout");
    assert!(closed_within(&mut idle, Duration::from_secs(10)), "closed after the idle timeout");

    // A stream is a request in flight: it outlives both timeouts.
    let session = raw_session(&url);
    let mut stream = connect(&url);
    let get = format!(
        "GET /mcp HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\nMcp-Session-Id: {session}\r\n\
         MCP-Protocol-Version: 2025-11-25\r\n\r\n",
        authority(&url)
    );
    stream.write_all(get.as_bytes()).expect("send");
    assert!(!closed_within(&mut stream, Duration::from_secs(7)), "an open stream is not idle");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn connections_over_the_limit_get_a_503_and_service_returns_when_they_time_out() {
    let dir = temp_dir("hardening-connections");
    let args = ["--max-connections", "20", "--header-timeout", "4s"];
    let (_server, url) = serve(free_port(), &dir, &args);
    let mut attackers: Vec<TcpStream> = (0..20).map(|_| connect(&url)).collect();
    // The 20 are accepted before the next one is: each read its first (empty) poll.
    std::thread::sleep(Duration::from_millis(300));
    let refused = exchange(&url, "POST", &JSON, INIT, |_| false, Duration::from_secs(5));
    assert_eq!((refused.status, header(&refused.headers, "retry-after")), (503, "1"));
    assert_eq!(reason(&refused.body), "too_many_connections");
    // Closing five makes room at once.
    attackers.truncate(15);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(initialize(&url), 200);
    // The rest are closed by the header timeout, without the attacker's help.
    for attacker in &mut attackers {
        assert!(closed_within(attacker, Duration::from_secs(10)));
    }
    let statuses: Vec<u16> = (0..20).map(|_| initialize(&url)).collect();
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tether serve` with its descriptor limit set to `limit` (soft and hard) by the shell.
fn serve_with_descriptors(limit: u32, port: u16, dir: &std::path::Path, extra: &[&str]) -> (Process, String) {
    let listen = format!("127.0.0.1:{port}");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_tether"))
        .args(["serve", "--listen", &listen, "--data-dir", dir.to_str().expect("utf-8")])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let process = Process { child, lines };
    let first = process.line(Duration::from_secs(20)).expect("started");
    let url = first.strip_prefix("listening on ").expect("listening line").to_owned();
    (process, url)
}

#[test]
fn more_idle_connections_than_descriptors_are_refused_not_left_hanging() {
    let dir = temp_dir("hardening-descriptors");
    // 256 descriptors: the default limit is 192 connections.
    let (_server, url) = serve_with_descriptors(256, free_port(), &dir, &["--header-timeout", "5s"]);
    let attackers: Vec<TcpStream> = (0..300).filter_map(|_| TcpStream::connect(authority(&url)).ok()).collect();
    assert_eq!(attackers.len(), 300);
    // Past the refusals the extra attackers got, which wait a second for them to hang up.
    std::thread::sleep(Duration::from_millis(1_500));
    let started = Instant::now();
    let refused = exchange(&url, "POST", &JSON, INIT, |_| false, Duration::from_secs(10));
    println!(
        "over the descriptor-derived limit: {} {:?} in {:?}",
        refused.status,
        reason(&refused.body),
        started.elapsed()
    );
    assert_eq!((refused.status, reason(&refused.body).as_str()), (503, "too_many_connections"));
    // Once the header timeout closed the attackers' connections, service is back.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut status = 0;
    while Instant::now() < deadline {
        status = initialize(&url);
        if status == 200 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(status, 200);
    drop(attackers);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `count` initializes at once; returns the statuses.
fn initialize_at_once(urls: &[String], count: usize) -> Vec<u16> {
    let threads: Vec<_> = (0..count)
        .map(|n| {
            let url = urls[n % urls.len()].clone();
            std::thread::spawn(move || initialize(&url))
        })
        .collect();
    threads.into_iter().map(|t| t.join().expect("thread")).collect()
}

fn tally(statuses: &[u16]) -> (usize, usize) {
    (statuses.iter().filter(|s| **s == 200).count(), statuses.iter().filter(|s| **s == 503).count())
}

#[test]
fn max_sessions_holds_for_concurrent_initializes_and_across_a_restart() {
    let dir = temp_dir("hardening-sessions");
    let port = free_port();
    let (mut server, url) = serve(port, &dir, &["--max-sessions", "10"]);
    let statuses = initialize_at_once(std::slice::from_ref(&url), 32);
    println!("32 initializes at once, --max-sessions 10: {:?} (200, 503)", tally(&statuses));
    assert_eq!(tally(&statuses), (10, 22), "{statuses:?}");
    server.kill9();
    let (_server, url) = serve(port, &dir, &["--max-sessions", "10"]);
    let refused = exchange(&url, "POST", &JSON, INIT, |_| false, Duration::from_secs(10));
    assert_eq!((refused.status, reason(&refused.body).as_str()), (503, "too_many_sessions"), "the 10 are still live");
    assert!(!header(&refused.headers, "retry-after").is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn max_sessions_holds_across_redis_replicas() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let redis = rt.block_on(tether_testkit::RedisServer::start());
    let dir = temp_dir("hardening-replicas");
    let args = ["--store", "redis", "--redis-url", &redis.url, "--redis-durability", "none", "--max-sessions", "20"];
    let (_a, a) = serve(free_port(), &dir, &args);
    let (_b, b) = serve(free_port(), &dir, &args);
    let statuses = initialize_at_once(&[a, b], 40);
    println!("40 initializes over two replicas, --max-sessions 20: {:?} (200, 503)", tally(&statuses));
    assert_eq!(tally(&statuses), (20, 20), "{statuses:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts a second `serve` on `data` and returns its exit status and what it said on stderr, or
/// `None` if it started listening (and is then stopped).
fn second_server(data: &std::path::Path) -> Option<String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir", data.to_str().expect("utf-8")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut stderr = String::new();
            child.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("stderr");
            assert!(!status.success());
            return Some(stderr);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[test]
fn a_second_server_on_the_same_store_is_refused_however_the_directory_is_reached() {
    let dir = temp_dir("hardening-lock");
    let data = dir.join("data");
    let (_server, url) = serve(free_port(), &data, &[]);
    let session = raw_session(&url);
    // Whatever lock files an older layout had, deleting them changes nothing.
    for entry in std::fs::read_dir(&data).expect("data dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "lock") {
            std::fs::remove_file(&path).expect("delete the lock file");
        }
    }
    let refused = second_server(&data).expect("a second server on the directory is refused");
    assert!(refused.contains("in use by another process"), "{refused}");
    let link = dir.join("link");
    std::os::unix::fs::symlink(&data, &link).expect("symlink");
    let through_link = second_server(&link).expect("through a symlink");
    assert!(through_link.contains("in use by another process"), "{through_link}");
    let moved = dir.join("moved");
    std::fs::rename(&data, &moved).expect("move the directory");
    let after_move = second_server(&moved).expect("after a move");
    assert!(after_move.contains("in use by another process"), "{after_move}");
    // The first server still has its session.
    let ping = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    assert_eq!(post(&url, &session, &ping), 200);
    let _ = std::fs::remove_dir_all(&dir);
}
