//! tether's MCP Streamable HTTP client: it proves continuity on every reconnect or
//! re-initializes.
//!
//! Every dropped stream, whether a request's or the standalone GET stream, is resumed with
//! `Last-Event-ID`, and the resume is judged by `tether_core::lineage::client_verdict`: the same
//! session, the same replay epoch, and a first event that is exactly the next one. After that,
//! every event is checked by a `StreamValidator`. A divergence is reported to the application,
//! the session is re-initialized, and requests that were pending on it are resolved: with their
//! result if it arrived, else with [`RequestError::OutcomeUnknown`].
//!
//! Nothing is re-sent blindly. A request carrying an idempotency key (every `tools/call` of a
//! tool not annotated `idempotentHint`, when the server offers `io.tether/idempotency`) is
//! re-issued under the same key until its real outcome arrives: the server runs it at most once.

mod backoff;
mod checkpoint;
mod client;
mod cursors;
mod divergence;
mod follow;
mod hooks;
mod http;
pub mod link;
pub mod oauth;
#[cfg(feature = "rmcp")]
pub mod rmcp;
mod session;
mod task;
mod telemetry;
pub mod tls;

pub use backoff::Backoff;
pub use checkpoint::{CheckpointError, CheckpointFile, StreamCursor, TaskCursor};
pub use client::Client;
pub use divergence::{DivergenceReason, TaskStreamBreak};
pub use hooks::{DefaultHooks, HookFuture, ServerRequests};
pub use telemetry::describe_metrics;

use std::path::PathBuf;
use std::sync::Arc;

use tether_core::jsonrpc::{ErrorObject, Message};
use tether_core::mcp::ProtocolVersion;

/// What to do when a resume cannot be proven continuous (opaque ids, no replay epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Treat the session as untrusted and re-initialize (seed 000's rule).
    #[default]
    Strict,
    /// Go on, and report the resume as unverified.
    Trust,
}

/// Client settings.
#[derive(Clone)]
pub struct ClientConfig {
    /// The MCP endpoint.
    pub url: String,
    /// What an unverifiable resume leads to.
    pub policy: Policy,
    /// When to reconnect.
    pub backoff: Backoff,
    /// Where to keep the checkpoint across restarts, if anywhere.
    pub checkpoint_file: Option<PathBuf>,
    /// The sessionful revision to ask for in `initialize`.
    pub protocol_version: ProtocolVersion,
    /// `clientInfo.name`.
    pub name: String,
    /// Answers the server's requests.
    pub hooks: Arc<dyn ServerRequests>,
    /// Whether `tools/call` requests carry an idempotency key when the server offers the
    /// extension (requests sent with [`Client::request_keyed`] always do).
    pub idempotency_keys: bool,
    /// Whether 2026-07-28 requests declare the tasks extension (SEP-2663), so that the server
    /// may answer a tool call with a task. The client follows such a task to its result either
    /// way ([`ClientEvent::Task`] reports its statuses).
    pub tasks: bool,
    /// Extra headers sent with every request (`Authorization`, a gateway's routing header).
    pub headers: Vec<(String, String)>,
    /// Whether a divergence re-initializes the session. Without, the client reports it
    /// ([`ClientEvent::Divergence`]), resolves what was pending as
    /// [`RequestError::OutcomeUnknown`] and closes, sending nothing more.
    pub reinitialize: bool,
    /// How long a POST may wait to be written (connecting, waiting for a connection) before it
    /// is given up as never sent: nothing of it reached the server, so it did not run. Also how
    /// long a GET (which changes nothing) may wait for its stream's head before it is tried again.
    pub unsent_timeout: std::time::Duration,
    /// How to get access tokens when the server asks for them (MCP authorization); without,
    /// a refusal of the credentials is the request's outcome.
    pub oauth: Option<oauth::OAuthConfig>,
    /// Which https servers are trusted: the platform's roots, and any authority added.
    pub trust: tls::Trust,
    /// How long connecting (the handshake, its retries included) may take: past it, connecting
    /// fails with the last attempt's cause (connection refused, DNS, TLS) rather than trying on.
    /// Without it, the retry budget of [`ClientConfig::backoff`] alone bounds it.
    pub connect_timeout: Option<std::time::Duration>,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig").field("url", &self.url).field("policy", &self.policy).finish_non_exhaustive()
    }
}

impl ClientConfig {
    /// Defaults for `url`: strict policy, default backoff, no checkpoint file, 2025-11-25,
    /// idempotency keys on, re-initialization after a divergence.
    pub fn new(url: impl Into<String>) -> ClientConfig {
        ClientConfig {
            url: url.into(),
            policy: Policy::Strict,
            backoff: Backoff::default(),
            checkpoint_file: None,
            protocol_version: ProtocolVersion::LATEST_SESSIONFUL,
            name: "tether".into(),
            hooks: Arc::new(DefaultHooks),
            idempotency_keys: true,
            tasks: false,
            headers: Vec::new(),
            reinitialize: true,
            unsent_timeout: std::time::Duration::from_secs(30),
            oauth: None,
            trust: tls::Trust::platform(),
            connect_timeout: None,
        }
    }
}

/// How a reconnect that continued the stream was judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeVerdict {
    /// Proven: the first event was exactly the next one.
    Continuous,
    /// The server repeated the last processed event (same digest); it was skipped.
    DuplicateSkipped,
    /// Not provable, and the policy is `Trust`.
    Unverified,
}

impl ResumeVerdict {
    /// The name `tether watch` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            ResumeVerdict::Continuous => "continuous",
            ResumeVerdict::DuplicateSkipped => "duplicate_skipped",
            ResumeVerdict::Unverified => "unverified",
        }
    }
}

/// The application's word that it processed a message. Until then the message's cursor is not
/// written to the checkpoint file, so a client restarted after a crash gets it again instead of
/// losing it. Dropping it without [`Ack::done`] commits nothing.
#[derive(Clone)]
pub struct Ack {
    target: Option<(std::sync::Weak<session::Session>, u64, String, StreamCursor)>,
}

impl Ack {
    pub(crate) fn new(inner: &Arc<session::Session>, generation: u64, key: String, cursor: StreamCursor) -> Ack {
        Ack { target: Some((Arc::downgrade(inner), generation, key, cursor)) }
    }

    pub(crate) fn none() -> Ack {
        Ack { target: None }
    }

    /// The message was processed: commit its cursor.
    pub fn done(self) {
        if let Some((inner, generation, key, cursor)) = self.target
            && let Some(inner) = inner.upgrade()
        {
            inner.commit(generation, &key, cursor);
        }
    }
}

impl std::fmt::Debug for Ack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ack")
    }
}

/// What the client tells the application, in order.
#[derive(Debug, Clone)]
pub enum ClientEvent {
    /// A notification (or server request) delivered on a stream, after validation.
    Message {
        /// Its event id, if it had one; a task's event has
        /// [`TaskEvent::delivery_id`](tether_core::tasks::TaskEvent::delivery_id).
        id: Option<String>,
        /// The request whose stream carried it (the id of the attempt it came on); `None` on
        /// the standalone stream and a task's.
        origin: Option<tether_core::jsonrpc::RequestId>,
        /// The message.
        message: Message,
        /// Call [`Ack::done`] once the message is processed.
        ack: Ack,
    },
    /// A reconnect continued the stream.
    Resumed {
        /// The id of the first event after the reconnect.
        id: String,
        /// How it was judged.
        verdict: ResumeVerdict,
    },
    /// The server said exactly what of a stream is gone (a `resync` event that continues it
    /// where the client is): the events of `notice.lost` will never arrive, or (`reason`
    /// `request_aborted`) the request feeding the stream died. The session is the same one and
    /// the stream goes on; a request whose response was lost ends as [`RequestError::Aborted`]
    /// or [`RequestError::OutcomeUnknown`] (and a keyed one is re-sent).
    Resynced {
        /// The id of the resync event: the stream's cursor from now on.
        id: String,
        /// What the server said.
        notice: tether_core::lineage::ResyncNotice,
        /// Call [`Ack::done`] once the report is processed: the cursor moves past the loss then.
        ack: Ack,
    },
    /// The stream is provably not the one the client was following; re-initialization follows
    /// (unless [`ClientConfig::reinitialize`] is off), except for a task's stream
    /// ([`DivergenceReason::TaskStream`]), after which the task's canonical state is followed.
    Divergence {
        /// Why: [`DivergenceReason::kind`] names it, its `Display` says what was seen.
        reason: DivergenceReason,
    },
    /// A keyed request whose outcome was unknown was sent again under the same key.
    Reissued {
        /// Its idempotency key.
        key: String,
        /// How many times it has been re-sent.
        attempt: u32,
        /// Why its outcome was unknown.
        reason: String,
    },
    /// A request that would carry an idempotency key went without one: if its outcome is lost it
    /// ends as [`RequestError::OutcomeUnknown`].
    Unkeyed {
        /// Why.
        reason: String,
    },
    /// A request the server answered with a task (SEP-2663) reached a new status; the request
    /// resolves with the task's outcome once it finishes.
    Task {
        /// The task's id.
        task_id: String,
        /// Its status.
        status: tether_core::tasks::TaskStatus,
        /// The server's word on the status, if any.
        message: Option<String>,
    },
    /// A new session replaced the diverged one.
    Reinitialized {
        /// The new session id.
        session: String,
    },
    /// A stream or the whole client stopped.
    Closed {
        /// Why.
        reason: String,
        /// `true` when the client cannot go on (re-initialization failed); `false` when only the
        /// standalone stream ended (the server offers none, or it kept closing without progress).
        fatal: bool,
    },
}

/// Why the client failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClientError {
    /// The connection failed.
    #[error("transport: {0}")]
    Transport(String),
    /// The server broke the protocol.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The server refused with an HTTP status.
    #[error("the server answered {status}: {message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The JSON-RPC error message or the body.
        message: String,
    },
    /// The checkpoint file failed.
    #[error("{0}")]
    Checkpoint(String),
    /// The client was closed.
    #[error("the client is closed")]
    Closed,
    /// The request was never written: the HTTP client did not start sending it in time.
    #[error("not sent: {0}")]
    NotSent(String),
    /// The server refused the request's credentials and no token it accepts could be had: it
    /// refused before acting on the request.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// The server's TLS certificate is not trusted (an unknown issuer, expired, for another
    /// name): nothing was sent, and trying again cannot help.
    #[error("untrusted server: {0}")]
    Untrusted(String),
}

/// Why a request has no result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    /// The server answered with a JSON-RPC error.
    #[error("error {}: {}", .0.code, .0.message)]
    Rpc(ErrorObject),
    /// The request's stream said its server stopped before the request finished
    /// (`request_aborted`): it may have partly run. A keyed request is re-sent (its record
    /// knows more: a resumable tool is completed, any other answered `request_aborted`).
    #[error("aborted: {}", .0.message)]
    Aborted(ErrorObject),
    /// The stream carrying the answer diverged or could not be resumed: the request may or may
    /// not have run. Only keyed requests are re-sent automatically, and they end here only when
    /// the re-sends ran out.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// The server refused the request before running it (its session was gone).
    #[error("not executed: {0}")]
    NotExecuted(String),
    /// 2026-07-28: the response stream broke, which cancels the request; re-issue it.
    #[error("cancelled: the response stream broke")]
    Cancelled,
    /// The caller cancelled the request ([`Client::request_cancellable`]); the server was told.
    #[error("cancelled by the caller")]
    CancelledByCaller,
    /// The client failed before the request was sent.
    #[error("{0}")]
    Client(#[from] ClientError),
}
