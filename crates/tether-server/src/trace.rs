//! OpenTelemetry: a span per MCP request with the MCP semantic conventions' attributes, child
//! spans for its handler and the store's write of its outcome, and the conventions'
//! `mcp.server.operation.duration` and `mcp.server.session.duration` metrics.
//!
//! A request's span is the child of the trace context its `params._meta` carries (SEP-414), or,
//! without one, of its HTTP `traceparent` header (which is put in `_meta` for it). The
//! handler works in its own span's context ([`Context::trace_context`](crate::Context::trace_context)),
//! which a handler calling elsewhere (a gateway) passes on.
//!
//! Everything goes through the global providers of the `opentelemetry` API. Nothing is built
//! until [`enable`] is called, which the binary does once it installed exporting providers: a
//! server that exports nothing pays nothing per request.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::HeaderMap;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId, TraceState, Tracer as _,
};
use opentelemetry::{Context as OtelContext, KeyValue, global};
use serde_json::Value;
use tether_core::jsonrpc::{ErrorObject, Request, RequestId};
use tether_core::mcp::ProtocolVersion;
use tether_core::trace_context::TraceContext;

use crate::http::names::{TRACEPARENT, TRACESTATE};

static ENABLED: AtomicBool = AtomicBool::new(false);

/// The instrumentation scope's name.
const SCOPE: &str = "tether";

/// Records spans and the conventions' metrics from now on, through the global tracer and meter
/// providers (install exporting ones first).
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Puts the HTTP `traceparent` (and `tracestate`) header in the `params._meta` of `request`
/// unless `_meta` carries a trace context of its own, which wins (SEP-414): the request's span
/// is then the header's child, and a handler passing the context on passes that. A malformed
/// header is ignored.
pub(crate) fn adopt_header(headers: &HeaderMap, request: &mut Request) {
    let Some(parent) = headers.get(TRACEPARENT).and_then(|v| v.to_str().ok()) else { return };
    if request.params.as_ref().is_some_and(|params| TraceContext::from_meta(params).is_some()) {
        return;
    }
    let state = headers.get(TRACESTATE).and_then(|v| v.to_str().ok());
    let Some(context) = TraceContext::parse(parent, state) else { return };
    let params = request.params.get_or_insert_with(|| Value::Object(serde_json::Map::new()));
    context.inject(params);
}

/// The span of one request, from its run's start to its outcome.
pub(crate) struct RequestSpan {
    cx: OtelContext,
    /// What the conventions' duration metric is recorded with.
    attributes: Vec<KeyValue>,
    began: std::time::Instant,
}

impl RequestSpan {
    /// Starts the span of request `id` of `method` (calling `tool`, for `tools/call`) with
    /// `params` in `session` (if any), spoken in `version`: `None` unless [`enable`] was called.
    pub(crate) fn start(
        method: &str,
        tool: Option<&str>,
        params: &Value,
        id: &RequestId,
        session: Option<&str>,
        version: ProtocolVersion,
    ) -> Option<RequestSpan> {
        if !enabled() {
            return None;
        }
        let name = match tool {
            Some(tool) => format!("{method} {tool}"),
            None => method.to_owned(),
        };
        let mut attributes = vec![
            KeyValue::new("mcp.method.name", method.to_owned()),
            KeyValue::new("mcp.protocol.version", version.as_str()),
            KeyValue::new("network.transport", "tcp"),
            KeyValue::new("network.protocol.name", "http"),
        ];
        if let Some(tool) = tool {
            attributes.push(KeyValue::new("gen_ai.tool.name", tool.to_owned()));
            attributes.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
        }
        let metric_attributes = attributes.clone();
        attributes.push(KeyValue::new("jsonrpc.request.id", id.to_string()));
        if let Some(session) = session {
            attributes.push(KeyValue::new("mcp.session.id", session.to_owned()));
        }
        let parent = TraceContext::from_meta(params)
            .map_or_else(OtelContext::new, |remote| OtelContext::new().with_remote_span_context(span_context(&remote)));
        let tracer = global::tracer(SCOPE);
        let span = tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(&tracer, &parent);
        Some(RequestSpan {
            cx: parent.with_span(span),
            attributes: metric_attributes,
            began: std::time::Instant::now(),
        })
    }

    /// A span of part of the request's work, `name`d, the request span's child.
    pub(crate) fn child(&self, name: &'static str) -> ChildSpan {
        let tracer = global::tracer(SCOPE);
        let span = tracer.span_builder(name).with_kind(SpanKind::Internal).start_with_context(&tracer, &self.cx);
        ChildSpan(self.cx.with_span(span))
    }

    /// Says how the request ended: `outcome`, or `None` if it was cancelled before it finished.
    /// The span itself ends when dropped, once the outcome is written.
    pub(crate) fn record(&mut self, outcome: Option<&Result<Value, ErrorObject>>) {
        let span = self.cx.span();
        let failure = match outcome {
            Some(Ok(result)) if result.get("isError").and_then(Value::as_bool) == Some(true) => {
                Some(("tool_error".to_owned(), None, "the tool reported an error".to_owned()))
            }
            Some(Ok(_)) => None,
            Some(Err(error)) => Some((error.code.to_string(), Some(error), error.message.clone())),
            None => Some(("cancelled".to_owned(), None, "cancelled before it finished".to_owned())),
        };
        if let Some((kind, error, message)) = failure {
            if let Some(error) = error {
                span.set_attribute(KeyValue::new("rpc.response.status_code", error.code.to_string()));
                if let Some(reason) = error.reason() {
                    span.set_attribute(KeyValue::new("tether.reason", reason.to_owned()));
                }
            }
            span.set_attribute(KeyValue::new("error.type", kind.clone()));
            span.set_status(Status::error(message));
            self.attributes.push(KeyValue::new("error.type", kind));
        }
    }
}

impl Drop for RequestSpan {
    fn drop(&mut self) {
        self.cx.span().end();
        OPERATION_DURATION.record(self.began.elapsed().as_secs_f64(), &self.attributes);
    }
}

/// A child span of a request's; ended when dropped.
pub(crate) struct ChildSpan(OtelContext);

impl ChildSpan {
    /// Its context, for whatever the work it spans calls.
    pub(crate) fn trace_context(&self) -> TraceContext {
        let span = self.0.span();
        let context = span.span_context();
        TraceContext {
            trace_id: context.trace_id().to_bytes(),
            span_id: context.span_id().to_bytes(),
            sampled: context.is_sampled(),
            state: Some(context.trace_state().header()).filter(|s| !s.is_empty()),
        }
    }
}

impl Drop for ChildSpan {
    fn drop(&mut self) {
        self.0.span().end();
    }
}

fn span_context(remote: &TraceContext) -> SpanContext {
    let flags = if remote.sampled { TraceFlags::SAMPLED } else { TraceFlags::default() };
    let state = remote.state.as_deref().and_then(|s| s.parse::<TraceState>().ok()).unwrap_or(TraceState::NONE);
    SpanContext::new(TraceId::from_bytes(remote.trace_id), SpanId::from_bytes(remote.span_id), flags, true, state)
}

/// Bucket boundaries of the conventions' durations, in seconds (their advice).
fn boundaries() -> Vec<f64> {
    vec![0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]
}

static OPERATION_DURATION: LazyLock<opentelemetry::metrics::Histogram<f64>> = LazyLock::new(|| {
    global::meter(SCOPE)
        .f64_histogram("mcp.server.operation.duration")
        .with_unit("s")
        .with_description("MCP request duration as observed on the receiver, until its result or error is sent.")
        .with_boundaries(boundaries())
        .build()
});

static SESSION_DURATION: LazyLock<opentelemetry::metrics::Histogram<f64>> = LazyLock::new(|| {
    global::meter(SCOPE)
        .f64_histogram("mcp.server.session.duration")
        .with_unit("s")
        .with_description("The duration of the MCP session as observed on the MCP server.")
        .with_boundaries(boundaries())
        .build()
});

/// A session of `version` this process served for `lasted` ended: terminated by its client
/// (`None`), or by the server for `reason` (`expired`, `upstream_lost`).
pub(crate) fn session_ended(version: ProtocolVersion, lasted: Duration, reason: Option<&'static str>) {
    if !enabled() {
        return;
    }
    let mut attributes = vec![
        KeyValue::new("mcp.protocol.version", version.as_str()),
        KeyValue::new("network.transport", "tcp"),
        KeyValue::new("network.protocol.name", "http"),
    ];
    if let Some(reason) = reason {
        attributes.push(KeyValue::new("error.type", reason));
    }
    SESSION_DURATION.record(lasted.as_secs_f64(), &attributes);
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;
    use serde_json::json;

    use super::*;

    const HEADER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const META: &str = "00-11111111111111111111111111111111-2222222222222222-01";

    fn request(params: Option<Value>) -> Request {
        Request { id: RequestId::Number(1), method: "tools/call".into(), params }
    }

    #[test]
    fn the_header_is_adopted_only_where_meta_has_no_context() {
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_static(HEADER));
        let mut bare = request(None);
        adopt_header(&headers, &mut bare);
        assert_eq!(
            bare.params.as_ref().and_then(TraceContext::from_meta).map(|c| c.traceparent()).as_deref(),
            Some(HEADER)
        );
        let mut own = request(Some(json!({"name": "echo", "_meta": {"traceparent": META}})));
        adopt_header(&headers, &mut own);
        assert_eq!(own.params.as_ref().and_then(|p| p["_meta"]["traceparent"].as_str()), Some(META));
        headers.insert(TRACEPARENT, HeaderValue::from_static("not a traceparent"));
        let mut ignored = request(Some(json!({"name": "echo"})));
        adopt_header(&headers, &mut ignored);
        assert_eq!(ignored.params, Some(json!({"name": "echo"})));
    }
}
