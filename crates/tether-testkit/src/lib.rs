//! Test support shared by tether's crates: real faults on real sockets, real Redis processes.

pub mod proxy;
mod redis;

pub use redis::RedisServer;
