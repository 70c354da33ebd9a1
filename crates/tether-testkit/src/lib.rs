//! Test support shared by tether's crates: real faults on real sockets, real Redis processes (one server, a cluster, Sentinels), a
//! certificate authority for real TLS, an OTLP receiver, an OAuth token issuer.

pub mod oauth;
pub mod otlp;
pub mod proxy;
mod redis;
mod redis_ha;
pub mod tls;

pub use redis::RedisServer;
pub use redis_ha::{RedisCluster, RedisSentinels, SENTINEL_PRIMARY};
