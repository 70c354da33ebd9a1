//! Server costs: one event through the store and the SSE encoder, and one tool call over
//! loopback HTTP (JSON and SSE answers, and with an idempotency key) on the memory and the
//! embedded store.
//!
//! `cargo bench -p tether-server --bench server`

use std::hint::black_box;
use std::sync::Arc;
use tether_store::{EventLog, SessionStore};

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use tether_builtin::BuiltinHandler;
use tether_core::lineage::{Epoch, SessionId, StreamName};
use tether_core::mcp::ProtocolVersion;
use tether_core::sse::{Encoder, OutgoingEvent};
use tether_server::Builder;
use tether_store::{MemoryStore, Retention, SessionRecord, SqliteStore, Store};

fn event_path(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let store = MemoryStore::new(Retention::default());
    let epoch = Epoch::from_entropy([3; 16]);
    let stream = StreamName::parse("rbench").expect("stream");
    let session = SessionId::parse("bench").expect("session id");
    let record = SessionRecord {
        id: session.clone(),
        epoch: epoch.clone(),
        principal: None,
        protocol_version: ProtocolVersion::V2025_11_25,
        client: std::sync::Arc::new(json!({})),
        idle_ttl_ms: u64::MAX / 2,
        expires_at_ms: u64::MAX / 2,
    };
    rt.block_on(async {
        store.create_session(record, usize::MAX).await.expect("session");
        store.open_stream(&session, &epoch, &stream).await.expect("stream");
    });
    let data = Bytes::from_static(
        br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t","progress":1,"total":100}}"#,
    );
    let prefix = format!("{epoch}:{stream}:");
    let mut group = c.benchmark_group("server_event");
    group.throughput(Throughput::Elements(1));
    group.bench_function("append_read_encode", |b| {
        let mut out = Vec::with_capacity(256);
        b.iter(|| {
            rt.block_on(async {
                let seq = store.append(&session, &epoch, &stream, data.clone(), false).await.expect("append");
                let events = store.read(&session, &stream, seq - 1, 1).await.expect("read");
                out.clear();
                let id = format!("{prefix}{seq}");
                Encoder::event(
                    &mut out,
                    &OutgoingEvent { id: Some(&id), data: Some(&events[0].data), ..Default::default() },
                )
                .expect("encode");
                black_box(out.len())
            })
        })
    });
    group.finish();
}

/// A server on `store`, and a session on it.
fn server_with(rt: &tokio::runtime::Runtime, store: Arc<dyn Store>) -> (String, String) {
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/mcp", listener.local_addr().expect("addr"));
        let app = Builder::new(BuiltinHandler::in_memory()).store(store).build().router("/mcp");
        tokio::spawn(async move { tether_server::serve(listener, app, tether_server::ConnectionLimits::default()).await });
        let client = http_client();
        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}});
        let response = client
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(init.to_string())
            .send()
            .await
            .expect("initialize");
        let session = response.headers()["mcp-session-id"].to_str().expect("ascii").to_owned();
        (url, session)
    })
}

/// One tool call at a time, on the memory and the embedded store, without and with an
/// idempotency key (a fresh one per call: what exactly-once execution costs).
fn tool_call(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let dir = std::env::temp_dir().join(format!("tether-bench-server-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let embedded = SqliteStore::open(&dir, Retention::default(), "bench").expect("embedded store");
    let stores: [(&str, Arc<dyn Store>); 2] =
        [("memory", Arc::new(MemoryStore::new(Retention::default()))), ("embedded", Arc::new(embedded))];
    let client = http_client();
    let mut id = 0u64;
    let mut group = c.benchmark_group("server_tool_call");
    group.throughput(Throughput::Elements(1));
    for (store_name, store) in stores {
        let (url, session) = server_with(&rt, store);
        let cases = [
            ("json", "test_simple_text", json!({}), false),
            ("sse_one_notification", "count", json!({"to": 1}), false),
            ("json_keyed", "test_simple_text", json!({}), true),
        ];
        for (name, tool, args, keyed) in cases {
            group.bench_function(format!("{store_name}/{name}"), |b| {
                b.iter(|| {
                    id += 1;
                    let mut params = json!({"name": tool, "arguments": args});
                    if keyed {
                        params["_meta"] =
                            json!({"io.tether/idempotencyKey": format!("bench-{}-{id}", std::process::id())});
                    }
                    let body = json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":params});
                    rt.block_on(async {
                        let response = client
                            .post(&url)
                            .header("content-type", "application/json")
                            .header("accept", "application/json, text/event-stream")
                            .header("mcp-session-id", &session)
                            .header("mcp-protocol-version", "2025-11-25")
                            .body(body.to_string())
                            .send()
                            .await
                            .expect("call");
                        black_box(response.bytes().await.expect("body").len())
                    })
                })
            });
        }
    }
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, event_path, tool_call);
criterion_main!(benches);

/// An HTTP client: TLS is built with every client, and needs the process's provider.
fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}
