//! Black-box tests of `tether-server` over real loopback HTTP.

mod adoption;
mod auth;
mod common;
mod connections;
mod endpoint;
mod idempotency;
mod lifecycle;
mod protocol;
mod resume;
mod resync;
mod stateless;
mod tasks;
