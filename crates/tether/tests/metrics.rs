//! `tether serve --metrics`: a scripted scenario, then the Prometheus text is scraped and every
//! counter checked against what the scenario did.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{free_port, parse, serve, temp_dir, tether};
use tether_testkit::proxy;

/// GETs `path` from `authority` and returns the status line and the body.
fn get(authority: &str, path: &str, headers: &[(&str, &str)]) -> (String, String) {
    let mut stream = TcpStream::connect(authority).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\n{extra}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("write");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (head.lines().next().unwrap_or_default().to_owned(), body.to_owned())
}

/// The samples of a Prometheus text exposition: `name{labels}` → value.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.rsplit_once(' ').and_then(|(name, value)| Some((name.to_owned(), value.parse().ok()?))))
        .collect()
}

#[test]
fn counters_follow_a_scripted_scenario() {
    let dir = temp_dir("metrics");
    let port = free_port();
    let (server, url) = serve(port, &dir, &["--metrics", "127.0.0.1:0", "--sse-retry", "10ms"]);
    let scrape = server.line(Duration::from_secs(10)).expect("metrics line");
    let scrape = scrape.strip_prefix("metrics on http://").and_then(|s| s.strip_suffix("/metrics")).expect("address");
    // Before any traffic: every metric described, the series known in advance at zero.
    let (_, fresh) = get(scrape, "/metrics", &[]);
    for help in ["# HELP tether_requests_total ", "# HELP tether_sessions_created_total ", "# HELP tether_draining "] {
        assert!(fresh.contains(help), "{help} missing from:\n{fresh}");
    }
    let zero = samples(&fresh);
    for series in [
        "tether_sessions_created_total",
        r#"tether_requests_total{method="tools/call",outcome="error"}"#,
        r#"tether_resyncs_sent_total{reason="evicted"}"#,
        "tether_requests_running",
        "tether_draining",
        "tether_idempotent_replays_total",
        r#"tether_tasks_ended_total{status="failed"}"#,
    ] {
        assert_eq!(zero.get(series), Some(&0.0), "{series} at zero from the start:\n{fresh}");
    }
    assert_eq!(zero.get(&format!(r#"tether_build_info{{version="{}"}}"#, env!("CARGO_PKG_VERSION"))), Some(&1.0));

    // 1. A call on a clean line: 3 notifications and the result.
    let plain = parse(&tether(&["call", &url, "count", "--args", r#"{"to": 3}"#]).rest(Duration::from_secs(30)));
    assert_eq!(plain.last().expect("outcome")["event"], "result");
    // 2. A call whose stream is cut again and again: every reconnect is a resume.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let cutter = runtime.block_on(proxy::start(vec![SocketAddr::from(([127, 0, 0, 1], port))], 7, 300, 900));
    cutter.cutting.store(true, Ordering::Relaxed);
    let through = url.replace(&format!("127.0.0.1:{port}"), &cutter.addr.to_string());
    let args = r#"{"to": 50, "interval_ms": 2}"#;
    let cut = parse(&tether(&["call", &through, "count", "--args", args]).rest(Duration::from_secs(60)));
    assert_eq!(cut.last().expect("outcome")["event"], "result", "{cut:?}");
    let resumed = cut.iter().filter(|l| l["event"] == "resumed").count();
    assert!(resumed > 0 && cutter.cuts.load(Ordering::Relaxed) > 0, "the stream was cut and resumed");
    // 3. A resume of a session that never existed.
    let cursor = "AAAAAAAAAAAAAAAAAAAAAA:r1:1:AAAAAAAAAAA";
    let (status, _) = get(
        &format!("127.0.0.1:{port}"),
        "/mcp",
        &[
            ("Accept", "text/event-stream"),
            ("Mcp-Session-Id", "no-such-session"),
            ("MCP-Protocol-Version", "2025-11-25"),
            ("Last-Event-ID", cursor),
        ],
    );
    assert!(status.contains("404"), "{status}");
    // 4. A tool the server does not have: counted as `other`, whatever its name.
    let unknown = parse(&tether(&["call", &url, "no_such_tool"]).rest(Duration::from_secs(30)));
    assert_ne!(unknown.last().expect("outcome")["event"], "result", "{unknown:?}");

    let (status, text) = get(scrape, "/metrics", &[]);
    assert!(status.contains("200"), "{status}");
    let seen = samples(&text);
    let value = |name: &str| seen.get(name).copied().unwrap_or_else(|| panic!("{name} missing from:\n{text}"));
    println!("scraped after the scenario:\n{text}");
    assert_eq!(value("tether_sessions_created_total"), 3.0);
    assert_eq!(value("tether_sessions_terminated_total"), 3.0, "every call ended its session with DELETE");
    assert_eq!(value("tether_sessions_live"), 0.0);
    assert_eq!(value("tether_events_appended_total"), 4.0 + 51.0 + 1.0, "each notification and outcome, once");
    // A reconnect cut again before its first event is a replay the client never saw continue.
    assert!(value(r#"tether_resumes_total{branch="replay",reason="none"}"#) >= resumed as f64);
    assert_eq!(value(r#"tether_resumes_total{branch="session_invalid",reason="unknown_session"}"#), 1.0);
    assert!(value("tether_events_replayed_total") >= 1.0);
    assert_eq!(value("tether_streams_live"), 0.0, "every connection closed");
    assert!(value(r#"tether_store_seconds_count{op="append"}"#) >= 2.0);
    assert_eq!(value(r#"tether_store_seconds_count{op="begin_request"}"#), 3.0, "each call began once");
    // Each call ran once, and its time is in the histogram; the method of each request is one of
    // the protocol's.
    assert_eq!(value(r#"tether_requests_total{method="tools/call",outcome="result"}"#), 2.0);
    assert_eq!(value(r#"tether_requests_total{method="tools/call",outcome="error"}"#), 1.0);
    assert_eq!(value(r#"tether_request_duration_seconds_count{method="tools/call"}"#), 3.0);
    assert!(value(r#"tether_request_duration_seconds_bucket{method="tools/call",le="60"}"#) >= 3.0);
    assert_eq!(value("tether_requests_running"), 0.0);
    // By tool: only the server's own tools are named.
    assert_eq!(value(r#"tether_tool_calls_total{tool="count",outcome="result"}"#), 2.0);
    assert_eq!(value(r#"tether_tool_call_duration_seconds_count{tool="count"}"#), 2.0);
    assert_eq!(value(r#"tether_tool_calls_total{tool="other",outcome="error"}"#), 1.0);
    assert!(value(r#"tether_tool_call_duration_seconds_bucket{tool="count",le="60"}"#) >= 2.0);
    assert!(!text.contains("no_such_tool"), "a client's tool name is no label");
    assert_eq!(value(r#"tether_http_refusals_total{status="404",reason="unknown_session"}"#), 1.0);
    // The process, as every Prometheus client library exports it.
    for name in ["process_resident_memory_bytes", "process_open_fds", "process_max_fds", "process_start_time_seconds"] {
        assert!(value(name) > 0.0, "{name}");
    }
    assert!(text.contains("# HELP process_cpu_seconds_total "), "{text}");
    assert!(seen.keys().any(|name| name.starts_with("tether_retained_bytes")), "{text}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// At `RUST_LOG=info`, each request and each session ended logs one line with its duration (the
/// access log); by default, it does not.
#[test]
fn the_access_log_has_a_line_per_request_and_session_at_info() {
    use std::process::{Command, Stdio};
    let logged = |filter: Option<&str>| -> String {
        let dir = temp_dir("metrics-access-log");
        let port = free_port();
        let mut command = Command::new(env!("CARGO_BIN_EXE_tether"));
        command.args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data-dir", dir.to_str().expect("utf-8")]);
        command.env_remove("RUST_LOG").stdout(Stdio::null()).stderr(Stdio::piped());
        if let Some(filter) = filter {
            command.env("RUST_LOG", filter);
        }
        let mut server = command.spawn().expect("tether serve");
        let url = format!("http://127.0.0.1:{port}/mcp");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "tether serve never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
        let call = parse(&tether(&["call", &url, "count", "--args", r#"{"to": 1}"#]).rest(Duration::from_secs(30)));
        assert_eq!(call.last().expect("outcome")["event"], "result");
        let _ = server.kill();
        let _ = server.wait();
        let mut stderr = String::new();
        let _ = server.stderr.take().expect("stderr").read_to_string(&mut stderr);
        let _ = std::fs::remove_dir_all(&dir);
        stderr
    };
    let info = logged(Some("info"));
    let request = info.lines().find(|l| l.contains("request ended")).unwrap_or_else(|| panic!("{info}"));
    for field in ["method=tools/call", "tool=\"count\"", "outcome=\"result\"", "duration_ms="] {
        assert!(request.contains(field), "{field} in {request}");
    }
    let session = info.lines().find(|l| l.contains("session ended")).unwrap_or_else(|| panic!("{info}"));
    assert!(session.contains("duration_s=") && session.contains("terminated"), "{session}");
    let quiet = logged(None);
    assert!(!quiet.contains("request ended"), "not by default: {quiet}");
}

/// `tether watch --metrics`: the client's own counters, described and at zero from the start;
/// when its server restarts without its sessions (the memory store), the divergence and the
/// re-initialization it led to are counted.
#[test]
fn a_watch_exposes_the_divergences_it_saw() {
    let dir = temp_dir("metrics-watch");
    let port = free_port();
    let (mut server, url) = serve(port, &dir, &["--store", "memory", "--sse-retry", "100ms"]);
    let watch = tether(&["watch", &url, "--metrics", "127.0.0.1:0"]);
    let first = parse(&[watch.line(Duration::from_secs(20)).expect("the metrics line")]);
    let scrape = first[0]["url"].as_str().expect("a metrics url").to_owned();
    let authority = scrape.trim_start_matches("http://").trim_end_matches("/metrics").to_owned();
    let (_, fresh) = get(&authority, "/metrics", &[]);
    assert!(fresh.contains("# HELP tether_client_divergences_total "), "{fresh}");
    assert_eq!(samples(&fresh).get("tether_client_reinitializations_total"), Some(&0.0), "{fresh}");
    // Until the watch holds its session's stream, then the server forgets it.
    std::thread::sleep(Duration::from_millis(500));
    server.kill9();
    let (_restarted, _) = serve(port, &dir, &["--store", "memory", "--sse-retry", "100ms"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, text) = get(&authority, "/metrics", &[]);
        let seen = samples(&text);
        if seen.get(r#"tether_client_divergences_total{kind="session_invalid"}"#) == Some(&1.0)
            && seen.get("tether_client_reinitializations_total") == Some(&1.0)
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no divergence counted:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(watch);
    let _ = std::fs::remove_dir_all(&dir);
}
