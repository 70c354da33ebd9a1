//! Lineage: where an event comes from and whether a resumed stream is the stream it claims
//! to be.
//!
//! Event ids are `{epoch}:{stream}:{seq}` ([`EventId`]); digests tie an id to its content
//! ([`Digest`]). The two decision procedures are pure functions: the server's
//! [`decide_resume`] (seed 004) with [`next_after`], the rule every reader of a stored stream
//! follows, and the client's [`client_verdict`] with the per-event [`StreamValidator`]
//! (seed 000). A task's event stream is judged the same way, by [`TaskStreamValidator`].

mod client;
mod digest;
mod id;
mod resync;
mod server;
mod task_stream;

pub use client::{
    Accepted, Checkpoint, Divergence, FirstEvent, Reconnect, StreamValidator, Unverifiable,
    Verdict, client_verdict, is_unavailable,
};
pub use digest::{Digest, DigestParseError};
pub use id::{
    Epoch, EventId, IdError, IdMap, ObservedId, SessionId, StreamName, Tag, base64url,
    parse_canonical_u64, push_base64url,
};
pub use resync::{RESYNC_EVENT, ResyncNotice, ResyncReason, SeqRange};
pub use server::{
    HistoryRewritten, InvalidReason, Next, ServerDecision, SessionLookup, StreamAt, StreamRange,
    StreamState, check_position, check_session, decide_resume, next_after,
};
pub use task_stream::{TaskCursor, TaskStreamBreak, TaskStreamValidator};
