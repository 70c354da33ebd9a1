//! 1,000 connections cut at random byte offsets between a tether client and a tether server:
//! zero divergences, zero lost and zero duplicated messages.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tether_builtin::BuiltinHandler;
use tether_client::{Backoff, Client, ClientConfig, ClientEvent};
use tether_core::jsonrpc::Message;
use tether_core::lineage::EventId;
use tether_server::{Builder, ServerConfig};

use tether_testkit::proxy;

const CUTS: u64 = 1_000;
const DEADLINE: Duration = Duration::from_secs(240);
const COUNT_TO: u64 = 40;
const BROADCASTS: u64 = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_random_disconnects_lose_and_duplicate_nothing() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let upstream = listener.local_addr().expect("addr");
    let config = ServerConfig { sse_retry: Duration::from_millis(2), ..ServerConfig::default() };
    let app = Builder::new(BuiltinHandler::in_memory()).config(config).build().router("/mcp");
    let server =
        tokio::spawn(
            async move { tether_server::serve(listener, app, tether_server::ConnectionLimits::default()).await },
        );
    // Cut after 400..3000 bytes: past any response head, anywhere inside the SSE body.
    let proxy = proxy::start(vec![upstream], 0x7e7e_7e7e, 400, 3_000).await;
    let mut config = ClientConfig::new(format!("http://{}/mcp", proxy.addr));
    config.backoff = Backoff {
        initial: Duration::from_millis(2),
        max: Duration::from_millis(20),
        max_attempts_without_progress: 50,
    };
    let (client, mut events) = Client::connect(config).await.expect("connect");
    client.follow_standalone().await;
    proxy.cutting.store(true, Ordering::Relaxed);

    let started = Instant::now();
    let worker = {
        let client = client.clone();
        let cuts = Arc::clone(&proxy.cuts);
        tokio::spawn(async move {
            let (mut calls, mut broadcasts) = (0u64, 0u64);
            while cuts.load(Ordering::Relaxed) < CUTS && started.elapsed() < DEADLINE {
                let result = client.call_tool("count", json!({"to": COUNT_TO, "interval_ms": 1})).await;
                assert_eq!(result.expect("count")["content"][0]["text"], format!("counted to {COUNT_TO}"));
                calls += 1;
                if calls % 5 == 0 {
                    let result = client.call_tool("broadcast", json!({"count": BROADCASTS})).await.expect("broadcast");
                    assert_eq!(
                        result["content"][0]["text"],
                        format!("broadcast {BROADCASTS} of {BROADCASTS} notifications")
                    );
                    broadcasts += 1;
                }
            }
            (calls, broadcasts)
        })
    };
    let mut by_stream: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let (mut resumed, mut divergences) = (0u64, Vec::new());
    let mut worker = worker;
    let mut on_event = |event: ClientEvent| match event {
        ClientEvent::Message { id, message: Message::Notification(n), ack, .. } => {
            ack.done();
            let stream =
                id.as_deref().and_then(|i| EventId::parse(i).ok()).map(|i| i.stream.to_string()).expect("lineage id");
            let data = &n.params.as_ref().expect("params")["data"];
            let n = data.get("count").or_else(|| data.get("broadcast")).and_then(Value::as_u64).expect("counter");
            by_stream.entry(stream).or_default().push(n);
        }
        ClientEvent::Resumed { .. } => resumed += 1,
        ClientEvent::Divergence { reason } => divergences.push(format!("{}: {reason}", reason.kind())),
        other => divergences.push(format!("unexpected {other:?}")),
    };
    let (calls, broadcasts) = loop {
        tokio::select! {
            Some(event) = events.recv() => on_event(event),
            joined = &mut worker => break joined.expect("worker"),
        }
    };
    proxy.cutting.store(false, Ordering::Relaxed);
    // Drain what is still in flight.
    while let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(300), events.recv()).await {
        on_event(event);
    }
    let cuts = proxy.cuts.load(Ordering::Relaxed);
    let (mut lost, mut duplicated) = (0i64, 0i64);
    let mut streams = (0, 0);
    for (stream, seen) in &by_stream {
        let block = if stream.starts_with('g') { BROADCASTS } else { COUNT_TO };
        let blocks = if stream.starts_with('g') { broadcasts } else { 1 };
        let expected: Vec<u64> = (0..blocks).flat_map(|_| 1..=block).collect();
        if stream.starts_with('g') {
            streams.1 += 1;
        } else {
            streams.0 += 1;
        }
        let (e, s) = (expected.len() as i64, seen.len() as i64);
        if *seen != expected {
            lost += (e - s).max(0);
            duplicated += (s - e).max(0);
            eprintln!("stream {stream}: expected {expected:?}, saw {seen:?}");
        }
    }
    println!(
        "cuts {cuts}, resumes {resumed}, calls {calls} ({} request streams), broadcasts {broadcasts} ({} standalone streams), \
         divergences {}, lost {lost}, duplicated {duplicated}, {:.1}s",
        streams.0,
        streams.1,
        divergences.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(divergences.is_empty(), "{divergences:?}");
    assert_eq!((lost, duplicated), (0, 0));
    assert_eq!(streams.0 as u64, calls, "every call's notifications arrived on its own stream");
    assert!(cuts >= CUTS, "only {cuts} cuts before the deadline");
    client.close().await;
    server.abort();
}
