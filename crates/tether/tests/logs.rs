//! `--log-format json`: one JSON object per line on stderr, carrying the spans of the HTTP request
//! and of the MCP request it served.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{free_port, parse, temp_dir, tether};
use serde_json::Value;

#[test]
fn json_logs_carry_the_request_spans() {
    let dir = temp_dir("logs");
    let listen = format!("127.0.0.1:{}", free_port());
    let mut server = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["--log-format", "json", "serve", "--listen", &listen, "--data-dir"])
        .arg(&dir)
        .env("RUST_LOG", "tether_server=debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tether serve");
    let mut stdout = BufReader::new(server.stdout.take().expect("stdout"));
    let mut first = String::new();
    stdout.read_line(&mut first).expect("listening line");
    let url = first.trim().strip_prefix("listening on ").expect("listening line").to_owned();
    let call = parse(&tether(&["call", &url, "count", "--args", r#"{"to": 2}"#]).rest(Duration::from_secs(30)));
    assert_eq!(call.last().expect("outcome")["event"], "result");
    let _ = server.kill();
    let _ = server.wait();
    let stderr = BufReader::new(server.stderr.take().expect("stderr"));
    let lines: Vec<Value> = stderr
        .lines()
        .map_while(Result::ok)
        .map(|line| serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}")))
        .collect();
    let spans =
        |line: &Value, name: &str| line["spans"].as_array().into_iter().flatten().find(|s| s["name"] == name).cloned();
    let http = lines.iter().find_map(|l| spans(l, "http").filter(|s| s["method"] == "POST"));
    assert!(http.is_some(), "an event inside an HTTP request's span: {lines:?}");
    let statuses: Vec<&str> = lines.iter().filter_map(|l| l["fields"]["status"].as_str()).collect();
    assert!(statuses.contains(&"200 OK") && statuses.contains(&"202 Accepted"), "HTTP answers: {statuses:?}");
    let session = lines.iter().find_map(|l| l["fields"]["session"].as_str().filter(|s| !s.is_empty()));
    let session = session.expect("the session id is logged");
    let mcp = lines.iter().find_map(|l| spans(l, "mcp")).expect("an event inside an MCP request's span");
    assert_eq!((mcp["method"].as_str(), mcp["session"].as_str()), (Some("tools/call"), Some(session)), "{mcp}");
    assert!(mcp["request"].is_string() && mcp["stream"].as_str().is_some_and(|s| s.starts_with('r')), "{mcp}");
    let _ = std::fs::remove_dir_all(&dir);
}
