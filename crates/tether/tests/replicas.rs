//! Replicas of `tether serve` behind a round-robin balancer that also cuts streams at random:
//! on a shared Redis store every reconnect may land on the other replica and still resumes
//! exactly; on memory stores every switch is detected, never silent; and seed 004's incident
//! (a session that expires during a partition) ends in 404 and re-initialization, with the side
//! effect executed once.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::streams::{Tally, fast};
use common::{free_port, serve, temp_dir};
use serde_json::{Value, json};
use tether_client::{Backoff, Client, ClientConfig, RequestError};
use tether_testkit::{RedisServer, proxy};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

#[test]
fn two_redis_replicas_behind_a_cutting_balancer_lose_and_duplicate_nothing() {
    let rt = runtime();
    let redis = rt.block_on(RedisServer::start());
    let dir = temp_dir("replicas-redis");
    let args = ["--store", "redis", "--redis-url", &redis.url, "--redis-durability", "none", "--sse-retry", "10ms"];
    let (p1, p2) = (free_port(), free_port());
    let (_a, _) = serve(p1, &dir, &args);
    let (_b, _) = serve(p2, &dir, &args);
    let upstreams: Vec<SocketAddr> = [p1, p2].iter().map(|p| SocketAddr::from(([127, 0, 0, 1], *p))).collect();
    rt.block_on(async {
        let balancer = proxy::start(upstreams, 0x5eed, 400, 3_000).await;
        let (client, mut events) =
            Client::connect(fast(format!("http://{}/mcp", balancer.addr))).await.expect("connect");
        client.follow_standalone().await;
        balancer.cutting.store(true, Ordering::Relaxed);
        let started = Instant::now();
        let (mut tally, mut calls, mut broadcasts) = (Tally::default(), 0u64, 0u64);
        while balancer.cuts.load(Ordering::Relaxed) < 200 && started.elapsed() < Duration::from_secs(90) {
            let call = client.call_tool("count", json!({"to": 30, "interval_ms": 2}));
            tokio::pin!(call);
            let result = loop {
                tokio::select! {
                    Some(event) = events.recv() => tally.record(event),
                    result = &mut call => break result,
                }
            };
            assert_eq!(result.expect("count")["content"][0]["text"], "counted to 30");
            calls += 1;
            if calls % 4 == 0 {
                let result = client.call_tool("broadcast", json!({"count": 5})).await.expect("broadcast");
                assert_eq!(
                    result["content"][0]["text"], "broadcast 5 of 5 notifications",
                    "the shared store knows the stream"
                );
                broadcasts += 1;
            }
        }
        balancer.cutting.store(false, Ordering::Relaxed);
        while let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(500), events.recv()).await {
            tally.record(event);
        }
        let broken = tally.broken_streams(30, 5);
        let standalone: u64 =
            tally.by_stream.iter().filter(|(s, _)| s.starts_with('g')).map(|(_, v)| v.len() as u64).sum();
        println!(
            "replicas on redis: cuts {}, resumes {}, calls {calls}, broadcasts {broadcasts} ({standalone} delivered), \
             divergences {}, broken streams {}, {:.1}s",
            balancer.cuts.load(Ordering::Relaxed),
            tally.resumed,
            tally.divergences.len(),
            broken.len(),
            started.elapsed().as_secs_f64()
        );
        assert!(tally.divergences.is_empty(), "{:?}", tally.divergences);
        assert!(broken.is_empty(), "{broken:?}");
        assert_eq!(tally.request_streams() as u64, calls, "one complete stream per call");
        assert_eq!(standalone, broadcasts * 5, "every broadcast arrived once");
        assert!(balancer.cuts.load(Ordering::Relaxed) >= 200);
        assert!(tally.resumed > 0, "streams were resumed, not only restarted");
        client.close().await;
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn memory_replicas_without_a_shared_store_are_detected_never_silent() {
    let rt = runtime();
    let dir = temp_dir("replicas-memory");
    let args = ["--store", "memory", "--sse-retry", "10ms"];
    let (p1, p2) = (free_port(), free_port());
    let (_a, _) = serve(p1, &dir, &args);
    let (_b, _) = serve(p2, &dir, &args);
    let upstreams: Vec<SocketAddr> = [p1, p2].iter().map(|p| SocketAddr::from(([127, 0, 0, 1], *p))).collect();
    rt.block_on(async {
        // Budgets around a call's stream (about 3 KB): some calls are cut, some complete.
        let balancer = proxy::start(upstreams, 0xbad, 1_000, 6_000).await;
        // Unkeyed calls: this is about what the client sees of the replicas' divergence. (Keyed,
        // a call re-issued to the other replica is not re-sent: its records are another's.)
        let mut config = fast(format!("http://{}/mcp", balancer.addr));
        config.idempotency_keys = false;
        let (client, mut events) = Client::connect(config).await.expect("connect");
        balancer.cutting.store(true, Ordering::Relaxed);
        let mut tally = Tally::default();
        let (mut results, mut unknown, mut refused) = (0, 0, 0);
        for _ in 0..20 {
            let before: Vec<String> = tally.by_stream.keys().cloned().collect();
            let call = client.call_tool("count", json!({"to": 20, "interval_ms": 2}));
            tokio::pin!(call);
            let result = loop {
                tokio::select! {
                    Some(event) = events.recv() => tally.record(event),
                    result = &mut call => break result,
                }
            };
            // Everything the client delivered before the result is queued already.
            while let Ok(event) = events.try_recv() {
                tally.record(event);
            }
            match result {
                Ok(_) => {
                    // A call that got its result got all of its notifications, on one stream.
                    let fresh: Vec<&Vec<u64>> =
                        tally.by_stream.iter().filter(|(s, _)| !before.contains(s)).map(|(_, seen)| seen).collect();
                    assert_eq!(fresh, [&(1..=20).collect::<Vec<_>>()], "a result with its stream incomplete");
                    results += 1;
                }
                Err(RequestError::OutcomeUnknown(_)) => unknown += 1,
                Err(RequestError::NotExecuted(_)) => refused += 1,
                Err(other) => panic!("unexpected outcome {other}"),
            }
        }
        while let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(300), events.recv()).await {
            tally.record(event);
        }
        println!(
            "replicas on memory: results {results}, outcome unknown {unknown}, not executed {refused}, divergences {}, \
             re-initializations {}",
            tally.divergences.len(),
            tally.reinitialized
        );
        // Every request that reached the other replica, or resumed there, was a visible 404:
        // the session does not exist there. Nothing continued silently, nothing arrived twice.
        assert!(
            !tally.divergences.is_empty() && tally.divergences.iter().all(|d| d.starts_with("session_invalid")),
            "{:?}",
            tally.divergences
        );
        assert!(tally.reinitialized as usize >= tally.divergences.len());
        assert!(results > 0 && unknown > 0, "both a complete call and a cut one were seen");
        let duplicated: Vec<_> =
            tally.by_stream.values().filter(|seen| seen.iter().enumerate().any(|(i, n)| *n != i as u64 + 1)).collect();
        assert!(duplicated.is_empty(), "{duplicated:?}");
        client.close().await;
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn session_that_expires_during_a_partition_gets_404_and_the_side_effect_runs_once() {
    // Seed 004's incident, scaled: idle TTL 2s, retention 1s, a 3s partition, and a call in
    // flight whose answer is lost when the partition starts.
    let rt = runtime();
    let dir = temp_dir("partition");
    let port = free_port();
    let (_server, direct) =
        serve(port, &dir, &["--session-idle-ttl", "2s", "--retention", "1s", "--sse-retry", "10ms"]);
    rt.block_on(async {
        // A budget of 0: once cutting, every response (JSON answers too) loses its whole body.
        let proxy = proxy::start(vec![SocketAddr::from(([127, 0, 0, 1], port))], 1, 0, 0).await;
        let mut config = fast(format!("http://{}/mcp", proxy.addr));
        config.backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(500),
            max_attempts_without_progress: 40,
        };
        let (client, mut events) = Client::connect(config).await.expect("connect");
        client.follow_standalone().await;
        let before = client.session_id().expect("session");
        let (observer, _) = Client::connect(ClientConfig::new(direct)).await.expect("connect directly");
        let counted =
            || async { observer.call_tool("counter_get", json!({"key": "once"})).await.expect("counter_get") };
        proxy.cut_responses.store(true, Ordering::Relaxed);
        proxy.cutting.store(true, Ordering::Relaxed);
        let call = tokio::spawn({
            let client = client.clone();
            async move { client.call_tool("counter_add", json!({"key": "once", "amount": 1})).await }
        });
        // The server ran it (as seen past the proxy); its answer is lost; then the partition.
        let deadline = Instant::now() + Duration::from_secs(10);
        while counted().await["structuredContent"]["value"] != 1 {
            assert!(Instant::now() < deadline, "the call never ran");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        proxy.partitioned.store(true, Ordering::Relaxed);
        proxy.cutting.store(false, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(3)).await;
        proxy.partitioned.store(false, Ordering::Relaxed);
        let outcome = tokio::time::timeout(Duration::from_secs(30), call).await.expect("the call ended").expect("task");
        let mut tally = Tally::default();
        while let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(300), events.recv()).await {
            tally.record(event);
        }
        println!("partition: divergences {:?}, re-initializations {}", tally.divergences, tally.reinitialized);
        assert_eq!(tally.divergences.len(), 1, "{:?}", tally.divergences);
        assert!(tally.divergences[0].starts_with("session_invalid"), "{:?}", tally.divergences);
        assert!(tally.divergences[0].contains("404"), "{:?}", tally.divergences);
        assert_eq!(tally.reinitialized, 1);
        assert_ne!(client.session_id().expect("session"), before, "a new session");
        // The call re-sent under its key in the new session got the first run's outcome.
        assert_eq!(outcome.expect("the call's real outcome")["structuredContent"]["value"], 1);
        assert_eq!(counted().await["structuredContent"]["value"], 1, "executed exactly once");
        client.close().await;
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sends a request over HTTP/1.0 (so the body is not chunked) and returns a line reader on the
/// response, positioned after the head, and the head.
fn http10(port: u16, session: Option<&str>, body: &Value) -> (std::io::BufReader<std::net::TcpStream>, String) {
    use std::io::{BufRead, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let body = body.to_string();
    let session =
        session.map(|s| format!("Mcp-Session-Id: {s}\r\nMCP-Protocol-Version: 2025-11-25\r\n")).unwrap_or_default();
    let request = format!(
        "POST /mcp HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\n{session}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("write");
    let mut reader = std::io::BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("head");
        if line == "\r\n" || line.is_empty() {
            return (reader, head);
        }
        head.push_str(&line);
    }
}

/// The next SSE `data:` line's JSON.
fn next_data(reader: &mut std::io::BufReader<std::net::TcpStream>) -> Value {
    use std::io::BufRead;
    loop {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).expect("read") > 0, "the stream ended");
        if let Some(data) = line.strip_prefix("data: ") {
            return serde_json::from_str(data.trim()).expect("json");
        }
    }
}

#[test]
fn an_answer_posted_to_another_replica_reaches_the_waiting_tool() {
    let rt = runtime();
    let redis = rt.block_on(RedisServer::start());
    let dir = temp_dir("replicas-answer");
    let args = ["--store", "redis", "--redis-url", &redis.url, "--redis-durability", "none"];
    let (a, b) = (free_port(), free_port());
    let (_ra, _) = serve(a, &dir, &args);
    let (_rb, _) = serve(b, &dir, &args);
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25",
        "capabilities": {"elicitation": {}}, "clientInfo": {"name": "t", "version": "1"}}});
    let (_, head) = http10(a, None, &init);
    let session = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().starts_with("mcp-session-id:").then(|| l[15..].trim().to_owned()))
        .expect("session id");
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "test_elicitation", "arguments": {"message": "who?"}}});
    let (mut stream, _) = http10(a, Some(&session), &call);
    let ask = loop {
        let message = next_data(&mut stream);
        if message["method"] == "elicitation/create" {
            break message;
        }
    };
    // The answer goes to the other replica, as a load balancer may send it.
    let answer = json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"action": "accept", "content": {"username": "u", "email": "e"}}});
    assert_eq!(common::post(&format!("http://127.0.0.1:{b}/mcp"), &session, &answer), 202);
    let result = next_data(&mut stream);
    assert_eq!(result["id"], 1);
    let text = result["result"]["content"][0]["text"].as_str().expect("text");
    assert!(text.starts_with("User response:") && text.contains("accept"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
