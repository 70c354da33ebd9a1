//! An OTLP/HTTP receiver on loopback: it decodes what it is sent (`/v1/traces`, `/v1/metrics`,
//! protobuf) with the official protobuf definitions and keeps it for a test to look at, as a
//! collector would receive it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// The largest export accepted.
const MAX_BODY: usize = 16 << 20;

/// A span as received, with the `service.name` of the resource that sent it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// The sender's `service.name`.
    pub service: String,
    /// The span, decoded.
    pub span: Span,
}

impl ReceivedSpan {
    /// The string value of attribute `key`, if the span has one.
    pub fn attribute(&self, key: &str) -> Option<String> {
        self.span.attributes.iter().find(|kv| kv.key == key).and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.clone()),
            any_value::Value::IntValue(i) => Some(i.to_string()),
            any_value::Value::BoolValue(b) => Some(b.to_string()),
            other => Some(format!("{other:?}")),
        })
    }
}

#[derive(Default)]
struct Received {
    spans: Vec<ReceivedSpan>,
    metrics: Vec<(String, String)>,
    /// Requests it could not decode, as `path: error`.
    refused: Vec<String>,
}

/// The receiver; it stops when dropped.
pub struct OtlpReceiver {
    /// Where it listens.
    pub addr: SocketAddr,
    received: Arc<Mutex<Received>>,
    task: tokio::task::JoinHandle<()>,
}

impl OtlpReceiver {
    /// Starts one on a free loopback port, in the current runtime (which must keep running:
    /// a multi-threaded one).
    pub async fn start() -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the OTLP receiver");
        let addr = listener.local_addr().expect("its address");
        let received = Arc::new(Mutex::new(Received::default()));
        let keeping = Arc::clone(&received);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, Arc::clone(&keeping)));
            }
        });
        OtlpReceiver { addr, received, task }
    }

    /// The base URL an exporter is given (`/v1/traces` and `/v1/metrics` beneath it).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        lock(&self.received).spans.clone()
    }

    /// Every metric received so far, as (`service.name`, metric name).
    pub fn metrics(&self) -> Vec<(String, String)> {
        lock(&self.received).metrics.clone()
    }

    /// What it could not decode.
    pub fn refused(&self) -> Vec<String> {
        lock(&self.received).refused.clone()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(received: &Mutex<Received>) -> std::sync::MutexGuard<'_, Received> {
    received.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn service_of(resource: Option<&opentelemetry_proto::tonic::resource::v1::Resource>) -> String {
    let name = resource.and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"));
    match name.and_then(|kv| kv.value.as_ref()?.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        _ => String::new(),
    }
}

/// Serves one connection: HTTP/1.1 requests with a `Content-Length` body, each answered 200
/// with an empty export response.
async fn serve(mut stream: TcpStream, received: Arc<Mutex<Received>>) {
    let mut buffer = Vec::new();
    loop {
        let Some(end) = read_head(&mut stream, &mut buffer).await else { return };
        let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
        let path = head.split_whitespace().nth(1).unwrap_or_default().to_owned();
        let length = head
            .lines()
            .filter_map(|line| line.split_once(':'))
            .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
            .and_then(|(_, value)| value.trim().parse::<usize>().ok())
            .unwrap_or(0);
        if length > MAX_BODY {
            return;
        }
        buffer.drain(..end + 4);
        while buffer.len() < length {
            let mut chunk = [0u8; 8192];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buffer.drain(..length).collect();
        keep(&path, &body, &received);
        let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Reads until `buffer` holds a whole request head; the offset of its blank line.
async fn read_head(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(end);
        }
        if buffer.len() > 64 << 10 {
            return None;
        }
        let mut chunk = [0u8; 8192];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}

fn keep(path: &str, body: &[u8], received: &Mutex<Received>) {
    let mut received = lock(received);
    match path {
        "/v1/traces" => match ExportTraceServiceRequest::decode(body) {
            Ok(export) => {
                for resource in export.resource_spans {
                    let service = service_of(resource.resource.as_ref());
                    for scope in resource.scope_spans {
                        received.spans.extend(
                            scope.spans.into_iter().map(|span| ReceivedSpan { service: service.clone(), span }),
                        );
                    }
                }
            }
            Err(err) => received.refused.push(format!("{path}: {err}")),
        },
        "/v1/metrics" => match ExportMetricsServiceRequest::decode(body) {
            Ok(export) => {
                for resource in export.resource_metrics {
                    let service = service_of(resource.resource.as_ref());
                    for scope in resource.scope_metrics {
                        received.metrics.extend(scope.metrics.into_iter().map(|m| (service.clone(), m.name)));
                    }
                }
            }
            Err(err) => received.refused.push(format!("{path}: {err}")),
        },
        other => received.refused.push(format!("{other}: not an OTLP path")),
    }
}
