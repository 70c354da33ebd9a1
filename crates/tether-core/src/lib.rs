//! The pure core of tether: no I/O, no async.
//!
//! - [`sse`]: the `text/event-stream` codec.
//! - [`jsonrpc`] and [`mcp`]: the messages and the protocol's names and versions.
//! - [`lineage`]: event ids, digests, and the two resumption decisions every other crate
//!   calls instead of deciding for itself.

pub mod jsonrpc;
pub mod lineage;
pub mod mcp;
pub mod sse;
