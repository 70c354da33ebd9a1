//! Lineage: where an event comes from and whether a resumed stream is the stream it claims
//! to be.
//!
//! Event ids are `{epoch}:{stream}:{seq}` ([`EventId`]); digests tie an id to its content
//! ([`Digest`]). The two decision procedures are pure functions: the server's
//! [`decide_resume`] (seed 004) and the client's [`client_verdict`] with the per-event
//! [`StreamValidator`] (seed 000).

mod client;
mod digest;
mod id;
mod resync;
mod server;

pub use client::{
    Checkpoint, Divergence, FirstEvent, Reconnect, SeqRange, StreamValidator, Unverifiable,
    Verdict, client_verdict,
};
pub use digest::{Digest, DigestParseError};
pub use id::{
    Epoch, EventId, IdError, IdMap, ObservedId, StreamName, base64url, parse_canonical_u64,
    push_base64url,
};
pub use resync::{RESYNC_EVENT, ResyncNotice, ResyncReason};
pub use server::{
    InvalidReason, ServerDecision, SessionLookup, StreamRange, StreamState, Then, check_session,
    decide_resume,
};
