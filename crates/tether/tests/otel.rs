//! OpenTelemetry, exported over OTLP/HTTP to a real receiver that decodes it with the official
//! protobuf definitions: a client's call through `tether gateway` to a `tether serve` upstream
//! is one trace. The gateway's server span is the child of the client's `_meta.traceparent`;
//! its handler span is the parent of the upstream's server span, which the gateway's request
//! carried in `_meta` (SEP-414). Spans carry the MCP semantic conventions' attributes; an HTTP
//! `traceparent` header is the parent where `_meta` has none; the conventions' duration metric
//! is exported beside them.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};
use tether_testkit::otlp::{OtlpReceiver, ReceivedSpan};

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
const HEADER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const HEADER_SPAN: &str = "b7ad6b7169203331";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// POSTs `call` in `session` with `extra` headers, reading until its answer came.
fn call(url: &str, session: &str, call: &Value, extra: &[(&str, &str)]) -> Value {
    let mut headers = vec![
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("Mcp-Session-Id", session),
        ("MCP-Protocol-Version", "2025-11-25"),
    ];
    headers.extend_from_slice(extra);
    let answered =
        exchange(url, "POST", &headers, &call.to_string(), |b| answer_of(b).is_some(), Duration::from_secs(20));
    answer_of(&answered.body).unwrap_or_else(|| panic!("no answer: {} {}", answered.status, answered.body))
}

/// The one span of `service` named `name` in trace `trace`.
fn only<'a>(spans: &'a [ReceivedSpan], service: &str, name: &str, trace: &str) -> &'a ReceivedSpan {
    let found: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.service == service && s.span.name == name && hex(&s.span.trace_id) == trace)
        .collect();
    assert_eq!(found.len(), 1, "one {service} span {name:?} in trace {trace}: {:#?}", names(spans));
    found[0]
}

fn names(spans: &[ReceivedSpan]) -> Vec<String> {
    spans.iter().map(|s| format!("{} {} {}", s.service, s.span.name, hex(&s.span.trace_id))).collect()
}

fn child_of<'a>(spans: &'a [ReceivedSpan], parent: &ReceivedSpan, name: &str) -> &'a ReceivedSpan {
    spans
        .iter()
        .find(|s| s.span.parent_span_id == parent.span.span_id && s.span.name == name)
        .unwrap_or_else(|| panic!("no {name:?} under {:?}: {:#?}", parent.span.name, names(spans)))
}

#[test]
fn a_call_through_the_gateway_is_one_trace_from_the_client_to_the_upstream() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let receiver = runtime.block_on(OtlpReceiver::start());
    let collector = receiver.url();
    let dir = temp_dir("otel");
    let (mut upstream, upstream_url) =
        serve(free_port(), &dir.join("upstream"), &["--store", "memory", "--otlp-endpoint", &collector]);
    let listen = format!("127.0.0.1:{}", free_port());
    let mut gateway = tether(&[
        "gateway",
        "--store",
        "memory",
        "--listen",
        &listen,
        "--otlp-endpoint",
        &collector,
        "--upstream",
        &upstream_url,
    ]);
    let first = gateway.line(Duration::from_secs(30)).expect("tether gateway started");
    let gateway_url = first.strip_prefix("listening on ").expect("listening line").to_owned();

    let session = raw_session(&gateway_url);
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let counted = call(
        &gateway_url,
        &session,
        &json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "count", "arguments": {"to": 2}, "_meta": {"traceparent": traceparent}}}),
        &[],
    );
    assert_eq!(counted["result"]["content"][0]["text"], "counted to 2", "{counted}");
    // Straight to the upstream: no `_meta` context, the HTTP header's; and a failing call.
    let direct = raw_session(&upstream_url);
    let header = format!("00-{HEADER_TRACE}-{HEADER_SPAN}-01");
    let failed = call(
        &upstream_url,
        &direct,
        &json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "no_such_tool", "arguments": {}}}),
        &[("traceparent", header.as_str())],
    );
    assert!(failed.get("error").is_some() || failed["result"]["isError"] == true, "{failed}");

    // Each flushes what it holds as it exits.
    gateway.signal("TERM");
    upstream.signal("TERM");
    assert_eq!(gateway.exit_within(Duration::from_secs(20)).code(), Some(0));
    assert_eq!(upstream.exit_within(Duration::from_secs(20)).code(), Some(0));
    let deadline = Instant::now() + Duration::from_secs(10);
    let spans = loop {
        let spans = receiver.spans();
        let upstream_spans = spans.iter().filter(|s| s.service == "tether").count();
        if spans.iter().any(|s| s.service == "tether-gateway") && upstream_spans >= 2 || Instant::now() > deadline {
            break spans;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(receiver.refused(), Vec::<String>::new(), "every export decodes");

    let served = only(&spans, "tether-gateway", "tools/call count", CLIENT_TRACE);
    assert_eq!(hex(&served.span.parent_span_id), CLIENT_SPAN, "the client's span is the gateway's parent");
    assert_eq!(served.span.kind, 2, "SERVER");
    for (key, value) in [
        ("mcp.method.name", "tools/call"),
        ("gen_ai.tool.name", "count"),
        ("gen_ai.operation.name", "execute_tool"),
        ("jsonrpc.request.id", "7"),
        ("mcp.protocol.version", "2025-11-25"),
        ("mcp.session.id", session.as_str()),
        ("network.transport", "tcp"),
    ] {
        assert_eq!(served.attribute(key).as_deref(), Some(value), "{key}");
    }
    assert_eq!(served.attribute("error.type"), None);
    let handling = child_of(&spans, served, "tether.handler");
    child_of(&spans, served, "tether.store.write");

    let upstream_span = only(&spans, "tether", "tools/call count", CLIENT_TRACE);
    assert_eq!(
        upstream_span.span.parent_span_id, handling.span.span_id,
        "the gateway's handler is the upstream's parent"
    );
    let upstream_session = upstream_span.attribute("mcp.session.id").expect("the upstream's session");
    assert_ne!(upstream_session, session, "the upstream's own session");
    child_of(&spans, upstream_span, "tether.handler");

    let refused = only(&spans, "tether", "tools/call no_such_tool", HEADER_TRACE);
    assert_eq!(hex(&refused.span.parent_span_id), HEADER_SPAN, "the HTTP header's span is the parent");
    assert!(refused.attribute("error.type").is_some(), "{:?}", refused.span.attributes);
    assert_eq!(refused.span.status.as_ref().map(|s| s.code), Some(2), "status ERROR");

    let metrics = receiver.metrics();
    for service in ["tether", "tether-gateway"] {
        assert!(
            metrics.iter().any(|(s, name)| s == service && name == "mcp.server.operation.duration"),
            "{service}: {metrics:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
