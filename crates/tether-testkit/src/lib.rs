//! Test support shared by tether's crates: real faults on real sockets, real Redis processes, a
//! certificate authority for real TLS, an OTLP receiver.

pub mod otlp;
pub mod proxy;
mod redis;
pub mod tls;

pub use redis::RedisServer;
