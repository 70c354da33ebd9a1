//! The shared store suite against Redis (a `redis-server` of its own per test, on a free
//! loopback port), plus what only a shared store does: two replicas see one history.

mod suite;

use std::time::Duration;
use tether_store::{EventLog, KeyRecords, Relay, ReplicaMessage, SessionStore};

use bytes::Bytes;
use tether_core::lineage::StreamState;
use tether_store::{BeginRequest, Claim, KeyState, RedisStore, ReplicaId, SessionRecord, TaskLimits};
use tether_testkit::RedisServer;

/// The replica named `name`.
fn replica(name: &str) -> ReplicaId {
    ReplicaId::parse(name).expect("a replica name")
}

/// A store of replica `owner` on `server`, which keeps what Redis keeps.
async fn open(server: &RedisServer, owner: &str) -> RedisStore {
    RedisStore::open(&server.url, suite::retention(), &replica(owner), tether_store::RedisDurability::Unchecked)
        .await
        .expect("connect")
}

async fn fresh() -> (RedisServer, RedisStore) {
    let server = RedisServer::start().await;
    let store = open(&server, "owner-a").await;
    (server, store)
}

store_suite!(guarded: fresh().await);

#[tokio::test]
async fn two_replicas_share_sessions_history_and_live_events() {
    let server = RedisServer::start().await;
    let a = open(&server, "replica-a").await;
    let b = open(&server, "replica-b").await;
    let (epoch, stream) = (suite::epoch('E'), suite::stream("g1"));
    assert_eq!(a.records().await, b.records().await, "one set of idempotency records");
    let record = SessionRecord { expires_at_ms: u64::MAX / 4, ..suite::record("shared", epoch.clone(), 0) };
    a.create_session(record.clone(), usize::MAX).await.expect("create on a");
    assert_eq!(b.create_session(record, usize::MAX).await, Err(tether_store::StoreError::DuplicateSession));
    b.open_stream(&suite::sid("shared"), &epoch, &stream).await.expect("open on b");
    let mut head = b.watch(&suite::sid("shared"), &stream).await.expect("watch on b");
    head.borrow_and_update();
    a.append(&suite::sid("shared"), &epoch, &stream, Bytes::from_static(b"from a"), false).await.expect("append on a");
    tokio::time::timeout(Duration::from_secs(5), head.changed()).await.expect("b is woken").expect("open watch");
    assert_eq!(*head.borrow(), 1);
    let events = b.read(&suite::sid("shared"), &stream, 0, 10).await.expect("read on b");
    assert_eq!(events.iter().map(|e| e.data.clone()).collect::<Vec<_>>(), [Bytes::from_static(b"from a")]);
    assert_eq!(
        b.append(&suite::sid("shared"), &epoch, &stream, Bytes::from_static(b"from b"), false).await,
        Ok(2),
        "one sequence"
    );
}

#[tokio::test]
async fn a_session_names_the_replica_that_began_it_and_replicas_reach_each_other() {
    let server = RedisServer::start().await;
    let a = open(&server, "replica-a").await;
    let b = open(&server, "replica-b").await;
    let record = SessionRecord { expires_at_ms: u64::MAX / 4, ..suite::record("held", suite::epoch('E'), 0) };
    a.create_session(record, usize::MAX).await.expect("create on a");
    assert_eq!(b.session_replica(&suite::sid("held")).await, Ok(Some(replica("replica-a"))));
    assert_eq!(b.session_replica(&suite::sid("unknown")).await, Ok(None));

    // Alive while its heartbeat is within the lease.
    let lease = suite::retention().lease_ms;
    assert_eq!(b.replica_alive(&replica("replica-a"), 1_000).await, Ok(false), "never heartbeat");
    a.sweep(1_000).await.expect("heartbeat");
    assert_eq!(b.replica_alive(&replica("replica-a"), 1_000 + lease).await, Ok(true));
    assert_eq!(b.replica_alive(&replica("replica-a"), 1_000 + lease + 1).await, Ok(false));

    // A message reaches the replica it names, stamped with its sender, and no other.
    let (mut to_a, mut to_b) = (a.replica_messages().expect("a listens"), b.replica_messages().expect("b listens"));
    assert_eq!(b.send_to_replica(&replica("replica-a"), Bytes::from_static(b"hello a")).await, Ok(true));
    let received = tokio::time::timeout(Duration::from_secs(5), to_a.recv()).await.expect("in time").expect("open");
    assert_eq!(received, ReplicaMessage { from: replica("replica-b"), body: Bytes::from_static(b"hello a") });
    assert!(to_b.try_recv().is_err(), "b heard a message for a");
    // Nobody listens as a replica that is gone.
    drop(a);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while b.send_to_replica(&replica("replica-a"), Bytes::from_static(b"anyone?")).await != Ok(false) {
        assert!(std::time::Instant::now() < deadline, "a gone replica still receives");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn replicas_admit_sessions_against_one_count() {
    let server = RedisServer::start().await;
    let a = open(&server, "replica-a").await;
    let b = open(&server, "replica-b").await;
    let epoch = suite::epoch('E');
    let attempts = (0..20).map(|n| {
        let store = if n % 2 == 0 { &a } else { &b };
        store.create_session(suite::record(&format!("r{n}"), epoch.clone(), 0), 6)
    });
    let results = futures_util::future::join_all(attempts).await;
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 6, "{results:?}");
    let ended = (0..20).find(|n| results[*n].is_ok()).expect("one admitted");
    a.end_session(&suite::sid(&format!("r{ended}")), &epoch, tether_store::SessionEnd::Terminated)
        .await
        .expect("end on a");
    b.create_session(suite::record("late", epoch.clone(), 0), 6).await.expect("the ended one's place, on b");
    assert_eq!(
        a.create_session(suite::record("later", epoch, 0), 6).await,
        Err(tether_store::StoreError::TooManySessions)
    );
}

#[tokio::test]
async fn requests_of_a_replica_whose_lease_lapsed_are_aborted() {
    let server = RedisServer::start().await;
    let dead = open(&server, "dead").await;
    let survivor = open(&server, "survivor").await;
    let epoch = suite::epoch('E');
    let (running, other) = (suite::stream("r1"), suite::stream("g1"));
    let lease = suite::retention().lease_ms;
    dead.sweep(1_000).await.expect("heartbeat");
    let record = SessionRecord { expires_at_ms: u64::MAX / 4, ..suite::record("s", epoch.clone(), 0) };
    dead.create_session(record, usize::MAX).await.expect("create");
    dead.begin_request(suite::request(&suite::sid("s"), &epoch, &suite::key("n:1"), "d", &running))
        .await
        .expect("begin");
    dead.open_stream(&suite::sid("s"), &epoch, &other).await.expect("open");
    drop(dead);
    survivor.sweep(1_000 + lease - 1).await.expect("sweep");
    let state = |range: Option<tether_core::lineage::StreamRange>| range.map(|r| r.state);
    assert_eq!(state(survivor.stream_range(&suite::sid("s"), &running).await.expect("range")), Some(StreamState::Live));
    survivor.sweep(1_000 + lease + 1).await.expect("sweep");
    assert_eq!(
        state(survivor.stream_range(&suite::sid("s"), &running).await.expect("range")),
        Some(StreamState::Aborted)
    );
    assert_eq!(state(survivor.stream_range(&suite::sid("s"), &other).await.expect("range")), Some(StreamState::Live));
}

#[tokio::test]
async fn a_lapsed_owner_aborts_only_the_requests_it_began() {
    let server = RedisServer::start().await;
    let dead = open(&server, "dead").await;
    let survivor = open(&server, "survivor").await;
    let epoch = suite::epoch('E');
    let (theirs, mine, own) = (suite::stream("r1"), suite::stream("r2"), suite::stream("r3"));
    let lease = suite::retention().lease_ms;
    dead.sweep(1_000).await.expect("heartbeat");
    survivor.sweep(1_000).await.expect("heartbeat");
    let record = SessionRecord { expires_at_ms: u64::MAX / 4, ..suite::record("s", epoch.clone(), 0) };
    survivor.create_session(record, usize::MAX).await.expect("create");
    assert_eq!(
        survivor.begin_request(suite::request(&suite::sid("s"), &epoch, &suite::key("n:1"), "d", &mine)).await,
        Ok(BeginRequest::Started)
    );
    assert_eq!(
        dead.begin_request(suite::request(&suite::sid("s"), &epoch, &suite::key("n:2"), "d", &own)).await,
        Ok(BeginRequest::Started)
    );
    // The same request id re-sent to the other replica attaches to the running request.
    let existing = dead
        .begin_request(suite::request(&suite::sid("s"), &epoch, &suite::key("n:1"), "d", &theirs))
        .await
        .expect("begin");
    assert_eq!(existing, BeginRequest::Existing { stream: mine.clone(), same_params: true });
    // As if it died between adding the stream to its set and taking it out again.
    let client = redis::Client::open(server.url.as_str()).expect("client");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
    let _: i64 = redis::AsyncCommands::sadd(&mut conn, "tether:owned:dead", "s\x1fr2").await.expect("sadd");
    drop(dead);
    survivor.sweep(1_000 + lease + 1).await.expect("sweep");
    let range = survivor.stream_range(&suite::sid("s"), &mine).await.expect("range").expect("known stream");
    assert_eq!(range.state, StreamState::Live, "the survivor's request runs on");
    let range = survivor.stream_range(&suite::sid("s"), &own).await.expect("range").expect("known stream");
    assert_eq!(range.state, StreamState::Aborted, "the request the dead owner began is aborted");
}

/// A request's stream is in its owner's set while it runs, and only then: a re-sent request id
/// and a refused begin leave nothing behind, and the stream leaves the set when it ends.
#[tokio::test]
async fn an_owners_set_holds_exactly_its_running_requests() {
    let (server, store) = fresh().await;
    let client = redis::Client::open(server.url.as_str()).expect("client");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
    let mut owned = async || -> Vec<String> {
        let mut members: Vec<String> =
            redis::AsyncCommands::smembers(&mut conn, "tether:owned:owner-a").await.expect("smembers");
        members.sort();
        members
    };
    let epoch = suite::epoch('E');
    let (first, second) = (suite::stream("r1"), suite::stream("r2"));
    let record = SessionRecord { expires_at_ms: u64::MAX / 4, ..suite::record("s", epoch.clone(), 0) };
    store.create_session(record, usize::MAX).await.expect("create");
    assert_eq!(
        store.begin_request(suite::request(&suite::sid("s"), &epoch, &suite::key("n:1"), "d", &first)).await,
        Ok(BeginRequest::Started)
    );
    assert_eq!(owned().await, ["s\x1fr1"]);
    let again = store
        .begin_request(suite::request(&suite::sid("s"), &epoch, &suite::key("n:1"), "d", &second))
        .await
        .expect("begin");
    assert_eq!(again, BeginRequest::Existing { stream: first.clone(), same_params: true });
    let stale = store
        .begin_request(suite::request(&suite::sid("s"), &suite::epoch('F'), &suite::key("n:2"), "d", &second))
        .await;
    assert_eq!(stale, Err(tether_store::StoreError::SessionGone));
    assert_eq!(owned().await, ["s\x1fr1"], "neither the re-sent id nor the refused begin stays");
    store.append(&suite::sid("s"), &epoch, &first, Bytes::from_static(b"{}"), true).await.expect("final");
    assert!(owned().await.is_empty(), "an ended request leaves the set");
}

#[tokio::test]
async fn a_key_abandoned_by_a_dead_replica_is_reported_and_taken_over_once() {
    let server = RedisServer::start().await;
    let dead = open(&server, "dead").await;
    let a = open(&server, "replica-a").await;
    let b = open(&server, "replica-b").await;
    let lease = suite::retention().lease_ms;
    assert_eq!(dead.claim_key(suite::claim("k", "d", 1_000)).await, Ok(Claim::Claimed(suite::ack(&dead, 1).await)));
    drop(dead);
    let running = |abandoned| KeyState::Running { stream: Some((suite::sid("s"), suite::stream("r1"))), abandoned };
    assert_eq!(a.key_state("k", 1_000 + lease).await, Ok(Some(running(false))));
    assert_eq!(a.take_over_key(suite::claim("k", "d", 1_000 + lease)).await, Ok(false), "its lease still runs");
    let later = 1_001 + lease;
    assert_eq!(
        b.claim_key(suite::claim("k", "d", later)).await,
        Ok(Claim::Existing { same_params: true, state: running(true), acknowledged: suite::ack(&b, 1).await })
    );
    assert_eq!(a.take_over_key(suite::claim("k", "d", later)).await, Ok(true));
    assert_eq!(b.take_over_key(suite::claim("k", "d", later)).await, Ok(false), "one replica takes it over");
    b.finish_key("k", Bytes::from_static(b"{\"result\":1}")).await.expect("finish");
    assert_eq!(b.key_state("k", later).await, Ok(Some(running(false))), "only the owner records the outcome");
    a.finish_key("k", Bytes::from_static(b"{\"result\":2}")).await.expect("finish");
    assert_eq!(b.key_state("k", later).await, Ok(Some(KeyState::Finished(Bytes::from_static(b"{\"result\":2}")))));
}

#[tokio::test]
async fn a_task_is_read_and_changed_from_any_replica_and_abandoned_with_its_owner() {
    use tether_core::tasks::{TaskChange, TaskRecord, TaskStatus};
    use tether_store::TaskStore;
    let server = RedisServer::start().await;
    let dead = open(&server, "dead").await;
    let a = open(&server, "replica-a").await;
    let b = open(&server, "replica-b").await;
    let lease = suite::retention().lease_ms;
    a.create_task(TaskRecord::new(suite::tid("live"), None, 1_000, None, None), None, TaskLimits::NONE)
        .await
        .expect("create");
    dead.create_task(TaskRecord::new(suite::tid("orphan"), None, 1_000, None, None), None, TaskLimits::NONE)
        .await
        .expect("create");
    drop(dead);
    let seen = b.task(&suite::tid("live"), 1_000 + lease).await.expect("read").expect("visible on b");
    assert!(!seen.abandoned);
    let (cancelled, changed) =
        b.update_task(&suite::tid("live"), TaskChange::Cancel, 1_100).await.expect("cancel").expect("exists");
    assert!(changed);
    assert_eq!(cancelled.record.task.status, TaskStatus::Cancelled);
    let finish = TaskChange::Finish(Ok(serde_json::json!({"content": []})));
    let (after, changed) = a.update_task(&suite::tid("live"), finish, 1_200).await.expect("finish").expect("exists");
    assert_eq!((after.record.task.status, changed), (TaskStatus::Cancelled, false), "b's cancel won on a");
    assert!(
        !a.task(&suite::tid("orphan"), 1_000 + lease).await.expect("read").expect("exists").abandoned,
        "its lease still runs"
    );
    assert!(b.task(&suite::tid("orphan"), 1_001 + lease).await.expect("read").expect("exists").abandoned);
}

#[tokio::test]
async fn request_ids_past_the_bound_are_forgotten_oldest_first() {
    let (_server, store) = fresh().await;
    suite::request_ids_past_the_bound_are_forgotten_oldest_first(&store).await;
}

#[tokio::test]
async fn tombstones_past_the_bound_are_forgotten_oldest_first() {
    let (_server, store) = fresh().await;
    let a = suite::epoch('A');
    let record = SessionRecord { expires_at_ms: u64::MAX / 4, ..suite::record("rt", a.clone(), 0) };
    store.create_session(record, usize::MAX).await.expect("create");
    // Five streams dropped one sweep apart; the bound (4) keeps the last four tombstones.
    for (n, now) in (1..=5).zip((1..).step_by(600)) {
        let name = suite::stream(&format!("t{n}"));
        store.open_stream(&suite::sid("rt"), &a, &name).await.expect("open");
        store.append(&suite::sid("rt"), &a, &name, Bytes::from_static(b"x"), true).await.expect("append");
        store.sweep(now).await.expect("sweep");
    }
    store.sweep(4_000).await.expect("sweep");
    let range = |n: u32| {
        let store = &store;
        async move { store.stream_range(&suite::sid("rt"), &suite::stream(&format!("t{n}"))).await.expect("range") }
    };
    assert_eq!(range(1).await, None, "the oldest tombstone went past the bound");
    for n in 2..=5 {
        assert_eq!(range(n).await, suite::tombstone(1, StreamState::Complete), "tombstone t{n}");
    }
}

#[tokio::test]
async fn a_stream_the_byte_cap_buried_is_not_buried_again_by_the_sweep() {
    let (server, store) = fresh().await;
    let a = suite::epoch('A');
    let record = SessionRecord { expires_at_ms: u64::MAX / 4, ..suite::record("rb", a.clone(), 0) };
    store.create_session(record, usize::MAX).await.expect("create");
    let (old, live) = (suite::stream("old"), suite::stream("live"));
    store.open_stream(&suite::sid("rb"), &a, &old).await.expect("open");
    store.open_stream(&suite::sid("rb"), &a, &live).await.expect("open");
    store.append(&suite::sid("rb"), &a, &old, Bytes::from(vec![b'o'; 600]), true).await.expect("append");
    // Over the 1,000-byte cap: the ended stream's events go, its tombstone stays.
    store.append(&suite::sid("rb"), &a, &live, Bytes::from(vec![b'l'; 600]), false).await.expect("append");
    assert_eq!(store.stream_range(&suite::sid("rb"), &old).await, Ok(suite::tombstone(1, StreamState::Complete)));
    // Its retention runs out later: the sweep finds it buried already.
    store.sweep(1).await.expect("sweep");
    store.sweep(1_000).await.expect("sweep");
    let client = redis::Client::open(server.url.as_str()).expect("client");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
    let listed: Vec<String> = redis::AsyncCommands::lrange(&mut conn, "tether:{rb}:t", 0, -1).await.expect("lrange");
    assert_eq!(listed, ["old"], "one tombstone, listed once");
    assert_eq!(store.stream_range(&suite::sid("rb"), &old).await, Ok(suite::tombstone(1, StreamState::Complete)));
}

/// A Redis that restarts from a snapshot taken while this replica ran a request goes back to
/// a time when the request was running: its stream live, its key unfinished, both owned by a
/// replica whose heartbeat goes on. Seeing Redis's run id change, the replica gives up what it
/// no longer runs, so nobody waits on it for ever: the stream reads aborted, the key abandoned.
#[tokio::test]
async fn a_replica_gives_up_what_a_redis_restarted_from_a_snapshot_says_it_still_runs() {
    let mut server = RedisServer::start_with(&["--save", "", "--appendonly", "no"]).await;
    let store = open(&server, "replica-a").await;
    let (epoch, stream) = (suite::epoch('A'), suite::stream("r1"));
    let record = SessionRecord { expires_at_ms: u64::MAX / 4, ..suite::record("s", epoch.clone(), 0) };
    store.create_session(record, usize::MAX).await.expect("create");
    let begun = store.begin_request(suite::request(&suite::sid("s"), &epoch, &suite::key("n:1"), "d", &stream)).await;
    assert_eq!(begun, Ok(BeginRequest::Started));
    assert!(matches!(store.claim_key(suite::claim("k", "d", 1_000)).await, Ok(Claim::Claimed(_))));
    let running = store
        .begin_request(suite::request(&suite::sid("s"), &epoch, &suite::key("n:2"), "d", &suite::stream("r2")))
        .await;
    assert_eq!(running, Ok(BeginRequest::Started), "a request still running after the restart");
    assert_eq!(server.command(&["SAVE"]).await, "+OK");
    store.append(&suite::sid("s"), &epoch, &stream, Bytes::from_static(b"result"), true).await.expect("finish");
    store.finish_key("k", Bytes::from_static(b"{}")).await.expect("finish the key");
    server.restart().await;
    // The first command after the restart may find the old connection broken.
    for _ in 0..50 {
        if store.sweep(2_000).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let range = store.stream_range(&suite::sid("s"), &stream).await.expect("range").expect("the stream");
    assert_eq!(range.state, StreamState::Aborted, "the request this replica finished ends aborted, not live");
    let still = store.stream_range(&suite::sid("s"), &suite::stream("r2")).await.expect("range").expect("the stream");
    assert_eq!(still.state, StreamState::Live, "the one it still runs is left to it");
    let key = store.key_state("k", 2_000).await.expect("key");
    assert!(matches!(key, Some(KeyState::Running { abandoned: true, .. })), "{key:?}");
}

/// A primary with a replica that acknowledges writes, and a store on the primary whose every
/// write must reach the replica within a second.
async fn fenced_by_a_replica() -> (RedisServer, RedisServer, RedisStore) {
    let primary = RedisServer::start().await;
    let port = primary.port().to_string();
    let follower =
        RedisServer::start_with(&["--save", "", "--appendonly", "no", "--replicaof", "127.0.0.1", &port]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !primary.command(&["INFO", "replication"]).await.contains("state=online") {
        assert!(std::time::Instant::now() < deadline, "the replica never came online");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Online is not yet acknowledging: on a loaded machine the first acknowledgement can take
    // longer than the fence's timeout, so wait for one before the store's first fenced write.
    assert_eq!(primary.command(&["WAIT", "1", "1500"]).await, ":1", "the replica never acknowledged");
    let durability = tether_store::RedisDurability::Replicated { replicas: 1, timeout_ms: 1_000 };
    let store =
        RedisStore::open(&primary.url, suite::retention(), &replica("owner-a"), durability).await.expect("connect");
    (primary, follower, store)
}

/// A write whose fence fails (its replica is gone, so `WAIT` times out) is not acknowledged, so
/// nothing of it may stay behind as if it ran: a claim is taken back (a re-send claims the key
/// anew instead of waiting on a request nobody runs), and a begun request's stream ends aborted
/// (instead of waiting live for ever).
#[tokio::test]
async fn what_a_failed_fence_leaves_is_taken_back_not_left_running() {
    let (_primary, mut follower, store) = fenced_by_a_replica().await;
    let epoch = suite::epoch('E');
    let record = SessionRecord { expires_at_ms: u64::MAX / 4, ..suite::record("s", epoch.clone(), 0) };
    store.create_session(record, usize::MAX).await.expect("create, fenced by the replica");
    follower.kill().await;

    assert!(store.claim_key(suite::claim("k", "d", 1_000)).await.is_err(), "the fence failed");
    assert_eq!(store.key_state("k", 1_000).await, Ok(None), "the claim was taken back");

    let stream = suite::stream("r1");
    let begun = store.begin_request(suite::request(&suite::sid("s"), &epoch, &suite::key("n:1"), "d", &stream)).await;
    assert!(begun.is_err(), "the fence failed: {begun:?}");
    let range = store.stream_range(&suite::sid("s"), &stream).await.expect("range").expect("the stream");
    assert_eq!(range.state, StreamState::Aborted, "the request that will not run ends aborted");
}

/// A key's outcome whose fence failed, lost by a Redis that then went back in time (restarted
/// from a snapshot taken while the request ran), is recorded by the next try: the key stays this
/// replica's until its outcome is fenced, so seeing Redis's run id change does not give it up
/// as abandoned (which the next try, no longer its owner, would leave unfinished for ever).
#[tokio::test]
async fn an_outcome_whose_fence_failed_is_recorded_after_redis_went_back_in_time() {
    let (mut primary, mut follower, store) = fenced_by_a_replica().await;
    assert!(matches!(store.claim_key(suite::claim("k", "d", 1_000)).await, Ok(Claim::Claimed(_))));
    assert_eq!(primary.command(&["SAVE"]).await, "+OK");
    follower.kill().await;
    assert!(store.finish_key("k", Bytes::from_static(b"{}")).await.is_err(), "the fence failed");
    primary.restart().await;
    follower.restart().await;
    // The first commands after the restart may find the old connection broken, or the replica
    // not yet in sync.
    let mut finished = Err(tether_store::StoreError::Backend("not tried".into()));
    for _ in 0..100 {
        if store.sweep(2_000).await.is_ok() {
            finished = store.finish_key("k", Bytes::from_static(b"{}")).await;
            if finished.is_ok() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(finished, Ok(()), "the outcome was fenced in the end");
    assert_eq!(store.key_state("k", 2_000).await, Ok(Some(KeyState::Finished(Bytes::from_static(b"{}")))));
}

/// A task's end whose fence fails is not acknowledged by a second try that finds the task ended
/// already: that try fences too, so a writer that tries until the store takes its write (the
/// server's) goes on until a replica has it.
#[tokio::test]
async fn a_task_end_tried_again_after_its_fence_failed_is_fenced_too() {
    use tether_core::tasks::{TaskChange, TaskRecord};
    use tether_store::TaskStore as _;
    let (_primary, mut follower, store) = fenced_by_a_replica().await;
    let id = tether_core::tasks::TaskId::parse("t1").expect("a task id");
    let task = TaskRecord::new(id.clone(), None, 1_000, Some(60_000), None);
    store.create_task(task, None, TaskLimits::NONE).await.expect("create, fenced by the replica");
    follower.kill().await;

    let finish = || TaskChange::Finish(Ok(serde_json::json!({"content": []})));
    assert!(store.update_task(&id, finish(), 1_100).await.is_err(), "the fence failed");
    let again = store.update_task(&id, finish(), 1_200).await;
    assert!(again.is_err(), "a second try is not acknowledged while no replica has the end: {again:?}");
}
