//! The pure core of tether: no I/O, no async.
//!
//! - [`sse`]: the `text/event-stream` codec.
//! - [`jsonrpc`] and [`mcp`]: the messages and the protocol's names and versions.
//! - [`idempotency`]: the keys of exactly-once requests and the acknowledgement of their claim.
//! - [`param_headers`]: tool parameters mirrored in HTTP headers (SEP-2243).
//! - [`input_required`]: multi round-trip requests and their sealed state (SEP-2322).
//! - [`tasks`]: when a call becomes a task, task statuses and their wire shape (SEP-2663).
//! - [`date`]: UTC calendar dates and RFC 3339 timestamps; [`base64`]: both RFC 4648 encodings.
//! - [`translate`]: a message of one protocol era as the other reads it, for bridges between them.
//! - [`trace_context`]: W3C trace context, as `_meta` and the `traceparent` header carry it.
//! - [`lifecycle`]: how a request ends: its terminal event and what a client may say of it.
//! - [`lineage`]: event ids, digests, and the two resumption decisions every other crate
//!   calls instead of deciding for itself.

pub mod base64;
pub mod date;
pub mod idempotency;
pub mod input_required;
pub mod jsonrpc;
pub mod lifecycle;
pub mod lineage;
pub mod mcp;
pub mod methods;
pub mod param_headers;
pub mod sse;
pub mod subscriptions;
pub mod tasks;
pub mod trace_context;
pub mod translate;
