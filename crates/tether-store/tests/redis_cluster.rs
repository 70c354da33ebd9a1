//! The shared store suite on a Redis Cluster of three primaries with a replica each (a cluster
//! of its own per test, on free loopback ports): every script and transaction touches one slot,
//! and replicas hear each other over sharded channels.

mod suite;

use std::time::Duration;

use bytes::Bytes;
use tether_store::{EventLog, RedisDurability, RedisStore, Relay, ReplicaId, SessionRecord, SessionStore};
use tether_testkit::RedisCluster;

/// A store of replica `owner` on `cluster`.
async fn open(cluster: &RedisCluster, owner: &str) -> RedisStore {
    let owner = ReplicaId::parse(owner).expect("a replica name");
    RedisStore::open(&cluster.url(), suite::retention(), &owner, RedisDurability::Unchecked).await.expect("connect")
}

async fn fresh() -> (RedisCluster, RedisStore) {
    let cluster = RedisCluster::start(3, 1).await;
    let store = open(&cluster, "owner-a").await;
    (cluster, store)
}

store_suite!(guarded: fresh().await);

/// What one replica writes, the other hears over the cluster's sharded channels: a session's
/// appends (on the session's own channel), a message for it (counted as received only when it
/// is: every subscriber of a sharded channel is on its shard), an answer, an announcement.
#[tokio::test]
async fn two_replicas_hear_each_other_over_sharded_channels() {
    let cluster = RedisCluster::start(3, 1).await;
    let (a, b) = (open(&cluster, "replica-a").await, open(&cluster, "replica-b").await);
    let (epoch, stream) = (suite::epoch('E'), suite::stream("g1"));
    // Sessions whose keys lie on different shards.
    for id in ["s1", "s2", "s3", "s4", "s5", "s6"] {
        let record = SessionRecord { expires_at_ms: u64::MAX / 4, ..suite::record(id, epoch.clone(), 0) };
        a.create_session(record, usize::MAX).await.expect("create on a");
        b.open_stream(&suite::sid(id), &epoch, &stream).await.expect("open on b");
        let mut head = b.watch(&suite::sid(id), &stream).await.expect("watch on b");
        head.borrow_and_update();
        a.append(&suite::sid(id), &epoch, &stream, Bytes::from_static(b"from a"), false).await.expect("append on a");
        tokio::time::timeout(Duration::from_secs(5), head.changed()).await.expect("b is woken").expect("open watch");
        assert_eq!(*head.borrow(), 1, "session {id}");
    }

    let replica = |name: &str| ReplicaId::parse(name).expect("a replica name");
    let mut to_b = b.replica_messages().expect("b listens");
    assert_eq!(a.send_to_replica(&replica("replica-b"), Bytes::from_static(b"hello b")).await, Ok(true));
    let received = tokio::time::timeout(Duration::from_secs(5), to_b.recv()).await.expect("in time").expect("open");
    assert_eq!(received.body, Bytes::from_static(b"hello b"));
    assert_eq!(a.send_to_replica(&replica("nobody"), Bytes::from_static(b"anyone?")).await, Ok(false));

    let mut answers = b.relayed_answers().expect("b hears answers");
    let answer = tether_store::RelayedAnswer {
        session: suite::sid("s1"),
        request_id: "7".into(),
        response: Bytes::from_static(b"{}"),
    };
    assert_eq!(a.relay_answer(answer.clone()).await, Ok(true), "b hears answers");
    let heard = tokio::time::timeout(Duration::from_secs(5), answers.recv()).await.expect("in time").expect("open");
    assert_eq!(heard.request_id, "7");

    let mut announcements = b.announcements().expect("b hears announcements");
    a.announce(Bytes::from_static(b"changed")).await.expect("announce");
    let heard =
        tokio::time::timeout(Duration::from_secs(5), announcements.recv()).await.expect("in time").expect("open");
    assert_eq!(heard, Bytes::from_static(b"changed"));
}

/// Every primary is held to the durability asked: one that fsyncs less than the others is
/// refused, whichever primary answers first.
#[tokio::test]
async fn a_primary_configured_unlike_the_others_is_refused() {
    let cluster =
        RedisCluster::start_with(3, 0, &["--save", "", "--appendonly", "yes", "--appendfsync", "always"]).await;
    let owner = ReplicaId::parse("owner-a").expect("a replica name");
    let url = cluster.url();
    let open = || RedisStore::open(&url, suite::retention(), &owner, RedisDurability::Fsync);
    open().await.expect("every primary fsyncs every write");
    let lax = cluster.primaries().await[1];
    assert_eq!(cluster.command(lax, &["CONFIG", "SET", "appendfsync", "everysec"]).await, "+OK");
    let refused = open().await.expect_err("one primary does not fsync every write");
    assert!(refused.to_string().contains("appendfsync"), "{refused}");
}
