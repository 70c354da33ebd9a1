//! The Redis store behind Sentinels (a primary, its replica and three Sentinels of its own, on
//! free loopback ports).

#[allow(dead_code, reason = "this file needs only the suite's records")]
mod suite;

use tether_store::{RedisDurability, RedisStore, ReplicaId, SessionRecord, SessionStore};
use tether_testkit::RedisSentinels;

/// The URL's credentials reach the primary too, not only the Sentinels: a deployment whose data
/// nodes require a password is one URL.
#[tokio::test]
async fn the_urls_credentials_reach_the_primary_the_sentinels_name() {
    let ha = RedisSentinels::start_with(&["--save", "", "--appendonly", "no"]).await;
    ha.add_user("tether", "s3cret").await;
    let owner = ReplicaId::parse("owner-a").expect("a replica name");
    let store = RedisStore::open(&ha.url_as("tether:s3cret@"), suite::retention(), &owner, RedisDurability::Unchecked)
        .await
        .expect("connect");
    let record = SessionRecord { expires_at_ms: u64::MAX / 4, ..suite::record("s", suite::epoch('E'), 0) };
    store.create_session(record, usize::MAX).await.expect("create");
    let clients = ha.primary_clients().await;
    assert!(clients.contains("user=tether"), "no connection of the URL's user to the primary: {clients}");
}
