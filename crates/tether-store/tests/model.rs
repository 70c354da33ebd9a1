//! Model-based test: random sequences of store operations run against every backend and
//! against a plain in-memory model; every answer must match the model's.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use proptest::prelude::*;
use tether_core::jsonrpc::RequestId;
use tether_core::lineage::{Epoch, SessionId, StreamName, StreamState};
use tether_core::mcp::ProtocolVersion;
use tether_store::{
    BeginRequest, CounterStore, MemoryStore, RedisStore, RequestKey, RequestRecord, Retention, SessionEnd,
    SessionRecord, SessionStatus, SqliteStore, Store, StoreError,
};
use tether_testkit::RedisServer;

#[derive(Debug, Clone)]
enum Op {
    Create(u8),
    End(u8),
    Open(u8, u8),
    Append { session: u8, stream: u8, last: bool, stale: bool },
    Begin { session: u8, key: u8, digest: u8, stream: u8 },
    Read { session: u8, stream: u8, after: u8 },
    Range(u8, u8),
    Lookup(u8),
    Counter(u8, i8),
}

fn op() -> impl Strategy<Value = Op> {
    let (s, st) = (0u8..2, 0u8..3);
    prop_oneof![
        1 => s.clone().prop_map(Op::Create),
        1 => s.clone().prop_map(Op::End),
        2 => (s.clone(), st.clone()).prop_map(|(a, b)| Op::Open(a, b)),
        5 => (s.clone(), st.clone(), proptest::bool::weighted(0.1), proptest::bool::weighted(0.1))
            .prop_map(|(session, stream, last, stale)| Op::Append { session, stream, last, stale }),
        2 => (s.clone(), 0u8..3, 0u8..2, st.clone()).prop_map(|(session, key, digest, stream)| Op::Begin { session, key, digest, stream }),
        2 => (s.clone(), st.clone(), 0u8..8).prop_map(|(session, stream, after)| Op::Read { session, stream, after }),
        1 => (s.clone(), st.clone()).prop_map(|(a, b)| Op::Range(a, b)),
        1 => s.prop_map(Op::Lookup),
        1 => (0u8..2, -3i8..4).prop_map(|(k, n)| Op::Counter(k, n)),
    ]
}

#[derive(Default)]
struct ModelStream {
    events: Vec<Bytes>,
    ended: bool,
}

#[derive(Default)]
struct ModelSession {
    ever: bool,
    ended: bool,
    streams: BTreeMap<u8, ModelStream>,
    requests: HashMap<u8, (u8, u8)>,
}

/// What the backends must answer, as comparable text.
#[derive(Default)]
struct Model {
    sessions: HashMap<u8, ModelSession>,
    counters: HashMap<u8, i64>,
}

impl Model {
    fn live(&mut self, s: u8) -> Option<&mut ModelSession> {
        self.sessions.get_mut(&s).filter(|m| m.ever && !m.ended)
    }

    fn apply(&mut self, op: &Op, payload: &Bytes) -> String {
        match *op {
            Op::Create(s) => {
                let session = self.sessions.entry(s).or_default();
                if session.ever {
                    return "Err(DuplicateSession)".into();
                }
                session.ever = true;
                "Ok(())".into()
            }
            Op::End(s) => match self.live(s) {
                Some(session) => {
                    session.ended = true;
                    session.streams.clear();
                    session.requests.clear();
                    "Ok(())".into()
                }
                None => "Err(SessionGone)".into(),
            },
            Op::Open(s, st) => match self.live(s) {
                Some(session) => {
                    session.streams.entry(st).or_default();
                    "Ok(())".into()
                }
                None => "Err(SessionGone)".into(),
            },
            Op::Append { session: s, stream: st, last, stale } => {
                let Some(session) = self.live(s).filter(|_| !stale) else { return "Err(SessionGone)".into() };
                let Some(stream) = session.streams.get_mut(&st) else { return "Err(UnknownStream)".into() };
                if stream.ended {
                    return "Err(StreamEnded)".into();
                }
                stream.events.push(payload.clone());
                stream.ended = last;
                format!("Ok({})", stream.events.len())
            }
            Op::Begin { session: s, key, digest, stream: st } => {
                let Some(session) = self.live(s) else { return "Err(SessionGone)".into() };
                if let Some((d, existing)) = session.requests.get(&key) {
                    return format!(
                        "Ok(Existing {{ stream: {}, same_params: {} }})",
                        stream_name(*existing),
                        *d == digest
                    );
                }
                session.requests.insert(key, (digest, st));
                session.streams.entry(st).or_default();
                "Ok(Started)".into()
            }
            Op::Read { session: s, stream: st, after } => {
                let events: Vec<(u64, Bytes)> = self
                    .sessions
                    .get(&s)
                    .filter(|m| m.ever && !m.ended)
                    .and_then(|m| m.streams.get(&st))
                    .map(|stream| {
                        let first = usize::from(after) + 1;
                        (first..=stream.events.len()).map(|seq| (seq as u64, stream.events[seq - 1].clone())).collect()
                    })
                    .unwrap_or_default();
                format!("Ok({events:?})")
            }
            Op::Range(s, st) => {
                let range = self.sessions.get(&s).filter(|m| m.ever && !m.ended).and_then(|m| m.streams.get(&st)).map(
                    |stream| {
                        let state = if stream.ended { StreamState::Complete } else { StreamState::Live };
                        (0u64, stream.events.len() as u64, state)
                    },
                );
                format!("Ok({range:?})")
            }
            Op::Lookup(s) => match self.sessions.get(&s) {
                Some(m) if m.ever && m.ended => "Ended(Terminated)".into(),
                Some(m) if m.ever => "Live".into(),
                _ => "Unknown".into(),
            },
            Op::Counter(k, n) => {
                let value = self.counters.entry(k).or_default();
                *value += i64::from(n);
                format!("Ok({value})")
            }
        }
    }
}

fn stream_name(n: u8) -> StreamName {
    StreamName::parse(&format!("st{n}")).expect("stream")
}

fn epoch(stale: bool) -> Epoch {
    Epoch::parse(if stale { "SSSSSSSSSSSSSSSSSSSSSS" } else { "EEEEEEEEEEEEEEEEEEEEEE" }).expect("epoch")
}

fn show<T: std::fmt::Debug>(result: Result<T, StoreError>) -> String {
    format!("{result:?}")
}

/// A backend as the model drives it: the store and the counters it keeps.
trait Backend: Store + CounterStore {}

impl<T: Store + CounterStore> Backend for T {}

/// Runs `op` on a backend; session ids and counter keys carry `run` so cases never collide.
async fn apply(store: &dyn Backend, run: u64, op: &Op, payload: &Bytes) -> String {
    let sid = |s: u8| SessionId::parse(&format!("r{run}s{s}")).expect("session id");
    match *op {
        Op::Create(s) => show(
            store
                .create_session(
                    SessionRecord {
                        id: sid(s),
                        epoch: epoch(false),
                        principal: None,
                        protocol_version: ProtocolVersion::V2025_11_25,
                        client: std::sync::Arc::new(serde_json::json!({})),
                        idle_ttl_ms: 1 << 40,
                        expires_at_ms: 1 << 40,
                    },
                    usize::MAX,
                )
                .await,
        ),
        Op::End(s) => show(store.end_session(&sid(s), &epoch(false), SessionEnd::Terminated).await),
        Op::Open(s, st) => show(store.open_stream(&sid(s), &epoch(false), &stream_name(st)).await),
        Op::Append { session, stream, last, stale } => {
            show(store.append(&sid(session), &epoch(stale), &stream_name(stream), payload.clone(), last).await)
        }
        Op::Begin { session, key, digest, stream } => match store
            .begin_request(RequestRecord {
                session: &sid(session),
                epoch: &epoch(false),
                key: &RequestKey::of(&RequestId::Number(key.into())),
                params_digest: &format!("d{digest}"),
                stream: &stream_name(stream),
            })
            .await
        {
            Ok(BeginRequest::Existing { stream, same_params }) => {
                format!("Ok(Existing {{ stream: {stream}, same_params: {same_params} }})")
            }
            other => show(other),
        },
        Op::Read { session, stream, after } => {
            let events = store.read(&sid(session), &stream_name(stream), u64::from(after), usize::MAX).await;
            show(events.map(|events| events.into_iter().map(|e| (e.seq, e.data)).collect::<Vec<_>>()))
        }
        Op::Range(s, st) => {
            let range = store.stream_range(&sid(s), &stream_name(st)).await;
            show(range.map(|r| r.map(|r| (r.retained_from, r.head, r.state))))
        }
        Op::Lookup(s) => match store.session(&sid(s), 0).await {
            Ok(SessionStatus::Live(_)) => "Live".into(),
            Ok(SessionStatus::Ended(SessionEnd::Terminated)) => "Ended(Terminated)".into(),
            Ok(SessionStatus::Unknown) => "Unknown".into(),
            other => format!("{other:?}"),
        },
        Op::Counter(k, n) => show(store.counter_add(&format!("r{run}k{k}"), i64::from(n), None).await),
    }
}

fn check(store: &dyn Backend, run: u64, ops: &[Op], rt: &tokio::runtime::Runtime) -> Result<usize, TestCaseError> {
    let mut model = Model::default();
    for (i, op) in ops.iter().enumerate() {
        let payload = Bytes::from(format!("p{i}"));
        let expected = model.apply(op, &payload);
        let got = rt.block_on(apply(store, run, op, &payload));
        prop_assert_eq!(&got, &expected, "op {} {:?}", i, op);
    }
    Ok(ops.len())
}

fn retention() -> Retention {
    Retention { max_events_per_stream: 1 << 20, ..Retention::default() }
}

static RUN: AtomicU64 = AtomicU64::new(0);

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn memory_matches_the_model(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        check(&MemoryStore::new(retention()), RUN.fetch_add(1, Ordering::Relaxed), &ops, &rt)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn embedded_matches_the_model(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let run = RUN.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tether-model-{}-{run}", std::process::id()));
        let store = SqliteStore::open(&dir, retention(), "model").expect("open");
        let checked = check(&store, run, &ops, &rt);
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
        checked?;
    }
}

#[test]
fn redis_matches_the_model() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let server = rt.block_on(RedisServer::start());
    let store = rt
        .block_on(RedisStore::open(
            &server.url,
            retention(),
            &tether_store::ReplicaId::parse("model").expect("replica"),
            tether_store::RedisDurability::Unchecked,
        ))
        .expect("connect");
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(64));
    let checked = AtomicU64::new(0);
    runner
        .run(&proptest::collection::vec(op(), 1..40), |ops| {
            checked.fetch_add(1, Ordering::Relaxed);
            check(&store, RUN.fetch_add(1, Ordering::Relaxed), &ops, &rt).map(|_| ())
        })
        .expect("redis agrees with the model");
    println!("redis: {} operation sequences checked", checked.load(Ordering::Relaxed));
}
