//! Two replicas of `tether serve` on a Redis that fails over under load: a Redis Cluster of three
//! primaries with a replica each, whose primary of the idempotency records is killed (kill -9),
//! replaced by its replica, started again, and then has slots moved away while calls go on; and a
//! primary behind three Sentinels, killed and replaced the same way.
//!
//! Keyed calls (`tether call` processes) and streamed calls (one client, resuming through a
//! balancer that cuts its streams) run meanwhile. Every write is fenced (`--redis-durability
//! replicated`: it reached a replica before it is acknowledged), so nothing acknowledged is lost:
//! each keyed call ran once and says so, and each stream arrives whole and once, resumed exactly.
//! Each run prints its counts.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::calls::{RUN_DEADLINE, Run, addr, faulty_proxy};
use common::streams::{Tally as Streams, fast};
use common::{free_port, parse, serve, temp_dir, tether};
use serde_json::{Value, json};
use tether_client::Client;
use tether_testkit::{RedisCluster, RedisSentinels, proxy};

/// Keyed calls per run.
const CALLS: usize = 240;
/// The notifications each streamed call sends.
const COUNT_TO: u64 = 20;
const ARGS: &str = r#"{"key": "failover", "amount": 1}"#;

/// What happened to Redis during a run, with how long each step took.
trait Disruption {
    /// Called when a third, then two thirds, of the keyed calls are done; answers what it did.
    async fn at(&mut self, third: usize) -> String;

    /// What Redis did on its own that the run did not ask for, once the calls are done.
    async fn unasked(&self) -> Option<String> {
        None
    }
}

/// How a run went.
struct Report {
    keyed: common::calls::Tally,
    counter: i64,
    streams: Streams,
    streamed_calls: u64,
    /// Streamed calls that ended in an error saying so (the store failed under them).
    streamed_failed: Vec<String>,
    said: Vec<String>,
    /// What Redis did that the run did not ask for.
    unasked: Option<String>,
}

impl Report {
    /// Values reported by more than one call, additions past one per call, and notifications
    /// that arrived twice.
    fn duplicates(&self) -> usize {
        let repeated = |values: &[u64]| {
            let mut values = values.to_vec();
            values.sort_unstable();
            values.len() - {
                values.dedup();
                values.len()
            }
        };
        let keyed: Vec<u64> = self.keyed.values.iter().map(|v| *v as u64).collect();
        repeated(&keyed)
            + usize::try_from(self.counter - CALLS as i64).unwrap_or(0)
            + self.streams.by_stream.values().map(|seen| repeated(seen)).sum::<usize>()
    }

    /// Calls told they ran whose addition is missing, and streams with a gap or cut short
    /// without a word (more short streams than calls that failed or were re-sent, saying so).
    fn silent_losses(&self) -> usize {
        let reported = self.keyed.values.len() as i64;
        let lost_additions = usize::try_from(reported - self.counter).unwrap_or(0);
        let whole: Vec<u64> = (1..=COUNT_TO).collect();
        let (mut gaps, mut short) = (0, 0);
        for seen in self.streams.by_stream.values() {
            if *seen == whole {
                continue;
            }
            match seen.iter().enumerate().all(|(i, n)| *n == i as u64 + 1) {
                true => short += 1,
                false => gaps += 1,
            }
        }
        // A stream cut short is explained by a call that failed saying so, or by an attempt the
        // client re-sent (it said so: `Reissued`), whose re-send ran on a stream of its own.
        lost_additions + gaps + usize::saturating_sub(short, self.streamed_failed.len() + self.streams.reissued.len())
    }

    fn print(&self, run: &str) {
        println!(
            "{run}: {} keyed calls ({} results, {} re-sent, {} unknown, {} failed; counter {}), {} streamed calls whole \
             ({} failed saying so, {} resumes, {} resyncs, {} re-initializations); duplicates {}, silent losses {}; {}",
            CALLS,
            self.keyed.values.len(),
            self.keyed.reissued,
            self.keyed.unknown,
            self.keyed.failed.len(),
            self.counter,
            self.streamed_calls,
            self.streamed_failed.len(),
            self.streams.resumed,
            self.streams.divergences.len(),
            self.streams.reinitialized,
            self.duplicates(),
            self.silent_losses(),
            self.said.join("; ")
        );
        if let Some(unasked) = &self.unasked {
            println!("{run}: {unasked}");
        }
    }

    /// Nothing acknowledged was lost or done twice, and every call and stream says so.
    fn assert_exact(&self, run: &str) {
        // A second failover may promote a replica without writes the first acknowledged: the
        // calls then rightly say their outcome is unknown, which this run does not test.
        assert_eq!(self.unasked, None, "{run}: Redis did only the failover the run made");
        assert_eq!(self.duplicates(), 0, "{run}: duplicates");
        assert_eq!(
            self.silent_losses(),
            0,
            "{run}: silent losses; streams not whole: {:?}; streamed calls re-sent: {:?}",
            self.streams.broken_streams(COUNT_TO, 1),
            self.streams.reissued
        );
        common::calls::assert_each_value_once(run, &self.keyed, CALLS);
        assert_eq!(self.counter, CALLS as i64, "{run}: the counter was added to once per call");
        assert!(self.streams.divergences.is_empty(), "{run}: {:?}", self.streams.divergences);
        // A call that failed saying so may have sent all its notifications before its response
        // could not be written: its stream is whole too. One the client re-sent, saying so, has
        // its notifications on two streams (the re-send relays the original's from when it
        // attached), neither whole.
        let whole = (self.streams.request_streams() - self.streams.broken_streams(COUNT_TO, 1).len()) as u64;
        let (failed, reissued) = (self.streamed_failed.len() as u64, self.streams.reissued.len() as u64);
        assert!(
            (self.streamed_calls.saturating_sub(reissued)..=self.streamed_calls + failed).contains(&whole),
            "{run}: one whole stream per call that succeeded and was not re-sent ({whole} whole, {} succeeded, \
             {failed} failed, {reissued} re-sent)",
            self.streamed_calls
        );
        assert!(self.streams.resumed > 0, "{run}: streams were resumed");
        assert!(
            self.streamed_failed.iter().all(|e| e.contains("store")),
            "{run}: streamed calls failed for another reason than the store: {:?}",
            self.streamed_failed
        );
    }
}

/// Runs the keyed and streamed calls against two replicas on `redis_url`, calling `disruption`
/// at a third and two thirds of the keyed calls.
fn under_load(
    name: &str,
    redis_url: &str,
    runtime: &tokio::runtime::Runtime,
    mut disruption: impl Disruption,
) -> Report {
    let dir = temp_dir(name);
    let args =
        ["--store", "redis", "--redis-url", redis_url, "--redis-durability", "replicated", "--sse-retry", "20ms"];
    let (a, b) = (free_port(), free_port());
    let (replica_a, direct) = serve(a, &dir.join("a"), &args);
    let (replica_b, _) = serve(b, &dir.join("b"), &args);
    let keyed_proxy = faulty_proxy(runtime, vec![addr(a), addr(b)]);
    let keyed_url = format!("http://{}/mcp", keyed_proxy.addr);
    let upstreams: Vec<SocketAddr> = vec![addr(a), addr(b)];
    let balancer = runtime.block_on(proxy::start(upstreams, 0xfa11, 400, 3_000));
    balancer.cutting.store(true, Ordering::Relaxed);
    let done = AtomicUsize::new(0);
    let finished = AtomicBool::new(false);
    let mut said = Vec::new();
    let (keyed, (streams, streamed_calls, streamed_failed)) = std::thread::scope(|scope| {
        let keyed = scope.spawn(|| {
            let value = |result: &Value| result["structuredContent"]["value"].as_i64();
            let tally =
                Run { url: &keyed_url, tool: "counter_add", args: ARGS, calls: CALLS, value, deadline: RUN_DEADLINE }
                    .go(&done);
            finished.store(true, Ordering::Relaxed);
            tally
        });
        let streamed = scope.spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async {
                let (client, mut events) =
                    Client::connect(fast(format!("http://{}/mcp", balancer.addr))).await.expect("connect");
                let (mut streams, mut calls, mut failed) = (Streams::default(), 0u64, Vec::new());
                while !finished.load(Ordering::Relaxed) {
                    let call = client.call_tool("count", json!({"to": COUNT_TO, "interval_ms": 5}));
                    tokio::pin!(call);
                    let result = loop {
                        tokio::select! {
                            Some(event) = events.recv() => streams.record(event),
                            result = &mut call => break result,
                        }
                    };
                    match result {
                        Ok(result) => {
                            assert_eq!(result["content"][0]["text"], format!("counted to {COUNT_TO}"));
                            calls += 1;
                        }
                        Err(err) => failed.push(err.to_string()),
                    }
                }
                while let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(500), events.recv()).await {
                    streams.record(event);
                }
                client.close().await;
                (streams, calls, failed)
            })
        });
        for third in 1..=2 {
            let deadline = Instant::now() + RUN_DEADLINE;
            while done.load(Ordering::Relaxed) < third * CALLS / 3 && Instant::now() < deadline && !keyed.is_finished()
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            said.push(runtime.block_on(disruption.at(third)));
        }
        (keyed.join().expect("keyed calls"), streamed.join().expect("streamed calls"))
    });
    let unasked = runtime.block_on(disruption.unasked());
    let read = tether(&["call", &direct, "counter_get", "--args", r#"{"key": "failover"}"#]);
    let lines = parse(&read.rest(Duration::from_secs(30)));
    let counter = lines.last().and_then(|l| l["result"]["structuredContent"]["value"].as_i64()).expect("counter_get");
    drop((replica_a, replica_b));
    let _ = std::fs::remove_dir_all(&dir);
    Report { keyed, counter, streams, streamed_calls, streamed_failed, said, unasked }
}

/// The cluster's disruptions: the primary of the idempotency records killed and replaced by its
/// replica, then started again (as the new primary's replica); later, slots moved away from the
/// primary of the counters.
struct ClusterFaults(RedisCluster);

impl Disruption for ClusterFaults {
    async fn at(&mut self, third: usize) -> String {
        let cluster = &mut self.0;
        if third == 1 {
            let victim = cluster.primary_of("tether:{records}:id").await;
            let killed = Instant::now();
            cluster.kill(victim).await;
            cluster.wait_healthy().await;
            let promoted = killed.elapsed();
            cluster.restart(victim).await;
            cluster.wait_healthy().await;
            format!(
                "primary killed, its replica serving after {:.1}s, the old primary back as a replica after {:.1}s",
                promoted.as_secs_f64(),
                killed.elapsed().as_secs_f64()
            )
        } else {
            let from = cluster.primary_of("tether:{counters}").await;
            let to = *cluster.primaries().await.iter().find(|p| **p != from).expect("another primary");
            let moved = Instant::now();
            cluster.reshard(from, to, 1_000).await.expect("reshard");
            cluster.wait_healthy().await;
            format!("1,000 slots moved in {:.1}s", moved.elapsed().as_secs_f64())
        }
    }
}

#[test]
fn keyed_and_streamed_calls_on_a_cluster_lose_nothing_through_a_failover_and_a_reshard() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let cluster = runtime.block_on(RedisCluster::start(3, 1));
    let url = cluster.url();
    let report = under_load("failover-cluster", &url, &runtime, ClusterFaults(cluster));
    report.print("cluster, 3 primaries and 3 replicas");
    report.assert_exact("cluster");
}

/// The Sentinels' disruption: the primary killed and replaced by its replica, then started again
/// (as the new primary's replica).
struct SentinelFaults(RedisSentinels);

impl Disruption for SentinelFaults {
    async fn at(&mut self, third: usize) -> String {
        if third != 1 {
            return String::new();
        }
        let ha = &mut self.0;
        let killed = Instant::now();
        let promoted = ha.kill_primary().await;
        ha.restart_killed().await;
        format!(
            "primary killed, the Sentinels named its replica after {:.1}s, the old primary back as a replica after \
             {:.1}s",
            promoted.as_secs_f64(),
            killed.elapsed().as_secs_f64()
        )
    }

    async fn unasked(&self) -> Option<String> {
        self.0.failed_over_again().await.then(|| "the Sentinels failed over again on their own".to_owned())
    }
}

#[test]
fn keyed_and_streamed_calls_behind_sentinels_lose_nothing_through_a_failover() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let ha = runtime.block_on(RedisSentinels::start_with(&["--save", "", "--appendonly", "no"]));
    let url = ha.url();
    let report = under_load("failover-sentinel", &url, &runtime, SentinelFaults(ha));
    report.print("Sentinels, a primary and a replica");
    report.assert_exact("sentinel");
}
