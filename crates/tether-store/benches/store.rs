//! Store throughput: durable appends (group commit under concurrency), replay of 10,000
//! retained events, and a task's event (which rewrites the task's record, its kept events
//! included) against a stream's, for each backend.
//!
//! `cargo bench -p tether-store --bench store`

use std::sync::Arc;

use bytes::Bytes;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use tether_core::lineage::{Epoch, SessionId, StreamName};
use tether_core::mcp::ProtocolVersion;
use tether_core::tasks::{MAX_EVENTS, TaskChange, TaskId, TaskRecord};
use tether_store::{MemoryStore, RedisStore, Retention, SessionRecord, SqliteStore, Store, TaskLimits};
use tether_testkit::RedisServer;

const WRITERS: usize = 256;
const PER_WRITER: usize = 20;
const REPLAY: u64 = 10_000;

fn epoch() -> Epoch {
    Epoch::from_entropy([5; 16])
}

fn sid(id: &str) -> SessionId {
    SessionId::parse(id).expect("session id")
}

fn record(id: &str) -> SessionRecord {
    SessionRecord {
        id: sid(id),
        epoch: epoch(),
        principal: None,
        protocol_version: ProtocolVersion::V2025_11_25,
        client: std::sync::Arc::new(serde_json::json!({})),
        idle_ttl_ms: u64::MAX / 4,
        expires_at_ms: u64::MAX / 4,
    }
}

fn payload() -> Bytes {
    Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t","progress":1,"total":100}}"#)
}

/// Every backend; the Redis one runs on a `redis-server` of its own (persistence off, as the
/// default deployment's durability is Redis's own setting).
/// The backends by name.
type Backends = Vec<(&'static str, Arc<dyn Store>)>;

fn stores(rt: &tokio::runtime::Runtime) -> (RedisServer, Backends) {
    let retention = Retention { max_events_per_stream: 200_000, ..Retention::default() };
    let dir = std::env::temp_dir().join(format!("tether-store-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sqlite = SqliteStore::open(&dir, retention, "bench").expect("open");
    let server = rt.block_on(RedisServer::start());
    let redis = rt
        .block_on(RedisStore::open(
            &server.url,
            retention,
            &tether_store::ReplicaId::parse("bench").expect("replica"),
            tether_store::RedisDurability::Unchecked,
        ))
        .expect("redis");
    (
        server,
        vec![
            ("memory", Arc::new(MemoryStore::new(retention))),
            ("embedded", Arc::new(sqlite)),
            ("redis", Arc::new(redis)),
        ],
    )
}

fn append(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let mut group = c.benchmark_group("store_append");
    group.throughput(Throughput::Elements((WRITERS * PER_WRITER) as u64));
    group.sample_size(10);
    let (_server, stores) = stores(&rt);
    for (name, store) in stores {
        let e = epoch();
        rt.block_on(store.create_session(record("append"), usize::MAX)).expect("session");
        let streams: Vec<StreamName> =
            (0..WRITERS).map(|i| StreamName::parse(&format!("s{i}")).expect("stream")).collect();
        for stream in &streams {
            rt.block_on(store.open_stream(&sid("append"), &e, stream)).expect("stream");
        }
        group.bench_function(format!("{name}_{WRITERS}_concurrent_streams"), |b| {
            b.iter(|| {
                rt.block_on(async {
                    let writers: Vec<_> = streams
                        .iter()
                        .map(|stream| {
                            let (store, stream, e) = (Arc::clone(&store), stream.clone(), e.clone());
                            tokio::spawn(async move {
                                for _ in 0..PER_WRITER {
                                    store.append(&sid("append"), &e, &stream, payload(), false).await.expect("append");
                                }
                            })
                        })
                        .collect();
                    for writer in writers {
                        writer.await.expect("writer");
                    }
                })
            })
        });
    }
    group.finish();
}

fn replay(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let mut group = c.benchmark_group("store_replay");
    group.throughput(Throughput::Elements(REPLAY));
    let (_server, stores) = stores(&rt);
    for (name, store) in stores {
        let (e, stream) = (epoch(), StreamName::parse("replay").expect("stream"));
        rt.block_on(async {
            store.create_session(record("replay"), usize::MAX).await.expect("session");
            store.open_stream(&sid("replay"), &e, &stream).await.expect("stream");
            let writers: Vec<_> = (0..100)
                .map(|_| {
                    let (store, stream, e) = (Arc::clone(&store), stream.clone(), e.clone());
                    tokio::spawn(async move {
                        for _ in 0..(REPLAY / 100) {
                            store.append(&sid("replay"), &e, &stream, payload(), false).await.expect("append");
                        }
                    })
                })
                .collect();
            for writer in writers {
                writer.await.expect("writer");
            }
        });
        group.bench_function(format!("{name}_10000_events"), |b| {
            b.iter(|| rt.block_on(store.read(&sid("replay"), &stream, 0, usize::MAX)).expect("read").len())
        });
    }
    group.finish();
}

/// One event at a time, as a tool reports progress: a stream's append, and a task's event on a
/// new task and on one that keeps [`MAX_EVENTS`] events already (every event rewrites the
/// task's record, its kept events included).
fn task_event(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let mut group = c.benchmark_group("one_event");
    group.sample_size(20);
    let (_server, stores) = stores(&rt);
    let notify = || TaskChange::Notify {
        method: "notifications/progress".into(),
        params: serde_json::json!({"progressToken": "t", "progress": 1, "total": 100}),
    };
    for (name, store) in stores {
        let (e, stream) = (epoch(), StreamName::parse("one").expect("stream"));
        rt.block_on(async {
            store.create_session(record("one"), usize::MAX).await.expect("session");
            store.open_stream(&sid("one"), &e, &stream).await.expect("stream");
        });
        group.bench_function(format!("{name}_stream_append"), |b| {
            b.iter(|| rt.block_on(store.append(&sid("one"), &e, &stream, payload(), false)).expect("append"))
        });
        let create = |id: &TaskId| {
            let record = TaskRecord::new(id.clone(), None, 0, None, None);
            rt.block_on(store.create_task(record, None, TaskLimits::NONE)).expect("task");
        };
        let mut fresh = 0u64;
        group.bench_function(format!("{name}_task_event_first"), |b| {
            b.iter_batched(
                || {
                    fresh += 1;
                    let id = TaskId::parse(&format!("first-{fresh}")).expect("task id");
                    create(&id);
                    id
                },
                |id| rt.block_on(store.update_task(&id, notify(), 0)).expect("event"),
                BatchSize::PerIteration,
            )
        });
        let full = TaskId::parse("full").expect("task id");
        create(&full);
        for _ in 0..MAX_EVENTS {
            rt.block_on(store.update_task(&full, notify(), 0)).expect("event");
        }
        group.bench_function(format!("{name}_task_event_keeping_{MAX_EVENTS}"), |b| {
            b.iter(|| rt.block_on(store.update_task(&full, notify(), 0)).expect("event"))
        });
    }
    group.finish();
}

criterion_group!(benches, append, replay, task_event);
criterion_main!(benches);
