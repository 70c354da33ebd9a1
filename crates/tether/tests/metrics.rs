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

    let (status, text) = get(scrape, "/metrics", &[]);
    assert!(status.contains("200"), "{status}");
    let seen = samples(&text);
    let value = |name: &str| seen.get(name).copied().unwrap_or_else(|| panic!("{name} missing from:\n{text}"));
    println!("scraped after the scenario:\n{text}");
    assert_eq!(value("tether_sessions_created_total"), 2.0);
    assert_eq!(value("tether_sessions_terminated_total"), 2.0, "both calls ended their session with DELETE");
    assert_eq!(value("tether_sessions_live"), 0.0);
    assert_eq!(value("tether_events_appended_total"), 4.0 + 51.0, "each notification and result, once");
    // A reconnect cut again before its first event is a replay the client never saw continue.
    assert!(value(r#"tether_resumes_total{branch="replay",reason="none"}"#) >= resumed as f64);
    assert_eq!(value(r#"tether_resumes_total{branch="session_invalid",reason="unknown_session"}"#), 1.0);
    assert!(value("tether_events_replayed_total") >= 1.0);
    assert_eq!(value("tether_streams_live"), 0.0, "every connection closed");
    assert!(value(r#"tether_store_seconds_count{op="append"}"#) >= 2.0);
    assert_eq!(value(r#"tether_store_seconds_count{op="begin_request"}"#), 2.0, "each call began once");
    // Both calls ran once each, and their time is in the histogram; the method of each request
    // is one of the protocol's.
    assert_eq!(value(r#"tether_requests_total{method="tools/call",outcome="result"}"#), 2.0);
    assert_eq!(value(r#"tether_request_duration_seconds_count{method="tools/call"}"#), 2.0);
    assert!(value(r#"tether_request_duration_seconds_bucket{method="tools/call",le="60"}"#) >= 2.0);
    assert_eq!(value("tether_requests_running"), 0.0);
    assert!(seen.keys().any(|name| name.starts_with("tether_retained_bytes")), "{text}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
