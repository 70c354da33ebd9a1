//! A rolling deploy: three `tether serve` replicas on Redis behind a round-robin balancer, each
//! replaced in turn (SIGTERM: it drains and exits; then a new process on its port) while a
//! client runs keyed calls, streamed calls and a standalone watch through the balancer. Nothing
//! is lost, nothing runs twice, and the session is never re-initialized.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{Process, free_port, serve, temp_dir};
use serde_json::{Value, json};
use tether_client::{Backoff, Client, ClientConfig, ClientEvent};
use tether_core::jsonrpc::Message;
use tether_testkit::{RedisServer, proxy};

/// What the client saw.
#[derive(Default)]
struct Seen {
    /// Each call's notifications, by the stream that carried them.
    by_stream: BTreeMap<String, Vec<u64>>,
    resumed: u64,
    reissued: u64,
    reinitialized: u64,
    divergences: Vec<String>,
}

impl Seen {
    fn record(&mut self, event: ClientEvent) {
        match event {
            ClientEvent::Message { id, message: Message::Notification(n), ack, .. } => {
                ack.done();
                let stream = id.as_deref().and_then(|id| id.split(':').nth(1)).unwrap_or_default().to_owned();
                let data = &n.params.as_ref().map(|p| p["data"].clone()).unwrap_or_default();
                if let Some(n) = data.get("count").or_else(|| data.get("broadcast")).and_then(Value::as_u64) {
                    self.by_stream.entry(stream).or_default().push(n);
                }
            }
            ClientEvent::Resumed { .. } => self.resumed += 1,
            ClientEvent::Reissued { .. } => self.reissued += 1,
            ClientEvent::Reinitialized { .. } => self.reinitialized += 1,
            ClientEvent::Divergence { reason } => self.divergences.push(format!("{}: {reason}", reason.kind())),
            _ => {}
        }
    }
}

#[test]
fn a_rolling_deploy_over_three_redis_replicas_loses_runs_twice_and_reinitializes_nothing() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let redis = rt.block_on(RedisServer::start());
    let dir = temp_dir("rolling");
    let args = [
        "--store",
        "redis",
        "--redis-url",
        &redis.url,
        "--redis-durability",
        "none",
        "--sse-retry",
        "20ms",
        "--drain-timeout",
        "30s",
    ];
    let ports = [free_port(), free_port(), free_port()];
    let replicas: Vec<Process> = ports.iter().map(|port| serve(*port, &dir, &args).0).collect();
    let upstreams: Vec<SocketAddr> = ports.iter().map(|port| SocketAddr::from(([127, 0, 0, 1], *port))).collect();
    let owned: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let dir_for_deploy = dir.clone();
    // Each replica in turn: SIGTERM, its exit (0, once drained), a new process on its port.
    let deploy = std::thread::spawn(move || {
        let args: Vec<&str> = owned.iter().map(String::as_str).collect();
        let mut replicas = replicas;
        std::thread::sleep(Duration::from_secs(2));
        for (at, port) in ports.iter().enumerate() {
            replicas[at].signal("TERM");
            let status = replicas[at].exit_within(Duration::from_secs(40));
            assert_eq!(status.code(), Some(0), "replica {at} drained and exited 0");
            replicas[at] = serve(*port, &dir_for_deploy, &args).0;
            std::thread::sleep(Duration::from_secs(2));
        }
        replicas
    });
    // Caught, so that the deploy's replicas are stopped (dropped with its thread's result) before
    // a failure is reported: the thread is not joined on an unwind, and would leave them running.
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(async {
            let balancer = proxy::start(upstreams, 0x7011, 1 << 40, 1 << 41).await;
            let mut config = ClientConfig::new(format!("http://{}/mcp", balancer.addr));
            config.backoff = Backoff {
                initial: Duration::from_millis(10),
                max: Duration::from_millis(200),
                max_attempts_without_progress: 40,
            };
            let (client, mut events) = Client::connect(config).await.expect("connect");
            client.follow_standalone().await;
            let started = Instant::now();
            let (mut seen, mut adds, mut counts, mut broadcasts) = (Seen::default(), Vec::new(), 0u64, 0u64);
            let mut after = 0;
            // Through the deploy, and a few rounds once it is over.
            while after < 3 && started.elapsed() < Duration::from_secs(120) {
                if deploy.is_finished() {
                    after += 1;
                }
                // Several at once, so that each replica is likely running one when it is stopped.
                let add = client.call_tool("counter_add", json!({"key": "rolling", "amount": 1}));
                let count = || client.call_tool("count", json!({"to": 10, "interval_ms": 40}));
                let all = async { tokio::join!(add, count(), count(), count()) };
                tokio::pin!(all);
                let (add, a, b, c) = loop {
                    tokio::select! {
                        Some(event) = events.recv() => seen.record(event),
                        outcomes = &mut all => break outcomes,
                    }
                };
                let add = add.expect("a keyed call gets its real result");
                adds.push(add["structuredContent"]["value"].as_i64().expect("the counter's value"));
                for counted in [a, b, c] {
                    assert_eq!(
                        counted.expect("a streamed call gets its result")["content"][0]["text"],
                        "counted to 10"
                    );
                    counts += 1;
                }
                if adds.len() % 3 == 0 {
                    let result = client.call_tool("broadcast", json!({"count": 3})).await.expect("broadcast");
                    assert_eq!(result["content"][0]["text"], "broadcast 3 of 3 notifications");
                    broadcasts += 1;
                }
            }
            while let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(500), events.recv()).await {
                seen.record(event);
            }
            let total = client.call_tool("counter_get", json!({"key": "rolling"})).await.expect("counter_get");
            let standalone: usize =
                seen.by_stream.iter().filter(|(s, _)| s.starts_with('g')).map(|(_, v)| v.len()).sum();
            let broken: Vec<_> = seen
                .by_stream
                .iter()
                .filter(|(stream, got)| !stream.starts_with('g') && **got != (1..=10).collect::<Vec<_>>())
                .collect();
            println!(
                "rolling deploy over 3 replicas: {} keyed calls, {counts} streamed calls, {broadcasts} broadcasts \
             ({standalone} delivered), resumes {}, re-sends {}, re-initializations {}, divergences {}, {:.1}s",
                adds.len(),
                seen.resumed,
                seen.reissued,
                seen.reinitialized,
                seen.divergences.len(),
                started.elapsed().as_secs_f64()
            );
            adds.sort_unstable();
            assert_eq!(adds, (1..=adds.len() as i64).collect::<Vec<_>>(), "each keyed call ran once");
            assert_eq!(total["structuredContent"]["value"], json!(adds.len()), "nothing ran twice");
            assert!(broken.is_empty(), "streams lost or repeated events: {broken:?}");
            assert_eq!(standalone as u64, broadcasts * 3, "every broadcast reached the watch once");
            assert_eq!(seen.reinitialized, 0, "{:?}", seen.divergences);
            assert!(seen.divergences.is_empty(), "{:?}", seen.divergences);
            client.close().await;
        })
    }));
    let deployed = deploy.join();
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(failure) = run {
        std::panic::resume_unwind(failure);
    }
    deployed.expect("the deploy");
}
