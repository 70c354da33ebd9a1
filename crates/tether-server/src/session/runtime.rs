//! What this process knows about a session beyond its store record: running requests, open
//! connections, pending server-to-client requests and the log level.
//!
//! The store is the truth about whether a session lives; a runtime is only a cache of
//! in-process state, made on first use for any live session, on any replica.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tether_core::jsonrpc::ErrorObject;
use tether_core::lineage::{Epoch, IdMap, SessionId, StreamName};
use tether_core::mcp::ProtocolVersion;
use tether_store::{RequestKey, SessionRecord};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

/// Severity of a log message, in increasing order (RFC 5424, as MCP's `logging` uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Debug-level detail.
    Debug,
    /// Informational.
    Info,
    /// Normal but significant.
    Notice,
    /// Warning.
    Warning,
    /// Error.
    Error,
    /// Critical.
    Critical,
    /// Action must be taken.
    Alert,
    /// System unusable.
    Emergency,
}

impl LogLevel {
    const ALL: [LogLevel; 8] = [
        LogLevel::Debug,
        LogLevel::Info,
        LogLevel::Notice,
        LogLevel::Warning,
        LogLevel::Error,
        LogLevel::Critical,
        LogLevel::Alert,
        LogLevel::Emergency,
    ];

    /// The level's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Notice => "notice",
            LogLevel::Warning => "warning",
            LogLevel::Error => "error",
            LogLevel::Critical => "critical",
            LogLevel::Alert => "alert",
            LogLevel::Emergency => "emergency",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<LogLevel> {
        LogLevel::ALL.into_iter().find(|l| l.as_str() == s)
    }
}

/// The answer a client POSTed to a server-to-client request.
pub(crate) type ClientAnswer = Result<Value, ErrorObject>;

/// In-process state of one live session.
#[derive(Debug)]
pub(crate) struct SessionRuntime {
    pub id: SessionId,
    pub epoch: Epoch,
    pub version: ProtocolVersion,
    /// When this process began serving the session.
    pub began: std::time::Instant,
    /// The capabilities the client declared in `initialize`.
    pub client_capabilities: Value,
    /// Woken when this process stops serving the session (`state.ended`). A `Notify` lives
    /// inline; a `CancellationToken` would be one more allocation per session.
    stopped: tokio::sync::Notify,
    next_request: AtomicU64,
    request_prefix: String,
    /// Whether this process can serve the session's requests: decided once, by the process
    /// that began it (yes) or by the handler when the process first serves one of them
    /// (`Handler::adopts`). Reading its streams needs no decision.
    pub adoption: tokio::sync::OnceCell<bool>,
    state: Mutex<RuntimeState>,
}

#[derive(Debug)]
struct RuntimeState {
    /// Running requests by request key.
    inflight: HashMap<RequestKey, Running>,
    /// Server-to-client requests awaiting the client's answer, by their id.
    pending: HashMap<String, oneshot::Sender<ClientAnswer>>,
    /// The generation of the connection attached to each stream; bumping it closes that one.
    attachments: IdMap<StreamName, watch::Sender<u64>>,
    /// Streams whose next connection must close as soon as it is caught up (kicked while no
    /// connection was attached).
    pending_kicks: HashSet<StreamName>,
    /// The standalone (GET) stream server-initiated messages go to.
    get_stream: Option<StreamName>,
    connections: usize,
    log_level: LogLevel,
    /// No request starts: the session is ending.
    closing: bool,
    ended: bool,
}

/// Running requests and open connections, for the per-session limit: a connection that carries
/// a running request's stream is that request's, and adds nothing; a request that is
/// [answering](SessionRuntime::answering) counts no more.
fn load(state: &RuntimeState) -> usize {
    let running: HashSet<&StreamName> = state.inflight.values().map(|running| &running.stream).collect();
    let elsewhere: usize = state
        .attachments
        .iter()
        .filter(|(stream, _)| !running.contains(stream))
        .map(|(_, tx)| tx.receiver_count())
        .sum();
    state.inflight.values().filter(|running| !running.answering).count() + elsewhere
}

/// A request registered as running in its session.
#[derive(Debug)]
struct Running {
    /// Cancels it.
    cancel: CancellationToken,
    /// The stream it writes to.
    stream: StreamName,
    /// Its outcome is being written ([`SessionRuntime::answering`]).
    answering: bool,
}

impl SessionRuntime {
    pub fn new(record: &SessionRecord, request_prefix: String) -> SessionRuntime {
        SessionRuntime {
            id: record.id.clone(),
            epoch: record.epoch.clone(),
            version: record.protocol_version,
            began: std::time::Instant::now(),
            client_capabilities: record
                .client
                .get("capabilities")
                .cloned()
                .unwrap_or_else(|| Value::Object(Default::default())),
            stopped: tokio::sync::Notify::new(),
            next_request: AtomicU64::new(0),
            request_prefix,
            adoption: tokio::sync::OnceCell::new(),
            state: Mutex::new(RuntimeState {
                inflight: HashMap::new(),
                pending: HashMap::new(),
                attachments: HashMap::default(),
                pending_kicks: HashSet::new(),
                get_stream: None,
                connections: 0,
                log_level: LogLevel::Debug,
                closing: false,
                ended: false,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, RuntimeState> {
        // The maps stay consistent across a panic elsewhere; keep serving.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether anything keeps the session active: running requests or open connections.
    pub fn is_active(&self) -> bool {
        let state = self.lock();
        !state.inflight.is_empty() || state.connections > 0
    }

    /// Requests running.
    pub fn running(&self) -> usize {
        self.lock().inflight.len()
    }

    /// Whether the session's [`load`] has reached `limit`. Each running request and each
    /// attached connection adds at most one to it, so below that bound, the case of every call
    /// not near the limit, the load is not counted: counting it looks at every running
    /// request's stream under the session's lock, which every call takes.
    pub fn at_limit(&self, limit: usize) -> bool {
        let state = self.lock();
        state.inflight.len() + state.connections >= limit && load(&state) >= limit
    }

    pub fn log_level(&self) -> LogLevel {
        self.lock().log_level
    }

    pub fn set_log_level(&self, level: LogLevel) {
        self.lock().log_level = level;
    }

    /// Registers a running request under `key`, cancelled by `token`: `false` if the session
    /// ended or is ending ([`SessionRuntime::close`]), or if a request of that key already runs
    /// (a re-sent id, which its store record answers as the original's).
    pub fn start_request(&self, key: &RequestKey, stream: &StreamName, token: CancellationToken) -> bool {
        let mut state = self.lock();
        if state.ended || state.closing || state.inflight.contains_key(key) {
            return false;
        }
        state.inflight.insert(key.clone(), Running { cancel: token, stream: stream.clone(), answering: false });
        true
    }

    /// The request of `key` has its outcome and is writing it: from now on its client may read
    /// it, and send its next request at once, so the request no longer counts toward the
    /// session's [`load`]. It stays registered (cancellable, keeping the session active) until
    /// [`SessionRuntime::finish_request`].
    pub fn answering(&self, key: &RequestKey) {
        if let Some(running) = self.lock().inflight.get_mut(key) {
            running.answering = true;
        }
    }

    /// The session is ending: no request starts from now on, and those running get to finish.
    pub fn close(&self) {
        self.lock().closing = true;
    }

    /// Whether the session ended or is ending: nothing new is taken on.
    pub fn closing(&self) -> bool {
        let state = self.lock();
        state.ended || state.closing
    }

    /// The request of `key` ended. A kick no connection took before its end is for nobody: a
    /// connection that attaches to its stream later finds it whole (kicks of streams whose
    /// requests ended would otherwise pile up for the session's life).
    pub fn finish_request(&self, key: &RequestKey) {
        let mut state = self.lock();
        let Some(finished) = state.inflight.remove(key) else { return };
        if !state.pending_kicks.is_empty() && !state.inflight.values().any(|r| r.stream == finished.stream) {
            state.pending_kicks.remove(&finished.stream);
        }
    }

    /// Cancels a running request (`notifications/cancelled`); unknown keys are ignored.
    pub fn cancel_request(&self, key: &RequestKey) {
        if let Some(running) = self.lock().inflight.get(key) {
            running.cancel.cancel();
        }
    }

    /// A new id for a server-to-client request and the receiver of its answer.
    pub fn register_client_request(&self) -> (String, oneshot::Receiver<ClientAnswer>) {
        let n = self.next_request.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}-{n}", self.request_prefix);
        let (tx, rx) = oneshot::channel();
        self.lock().pending.insert(id.clone(), tx);
        (id, rx)
    }

    pub fn forget_client_request(&self, id: &str) {
        self.lock().pending.remove(id);
    }

    /// Delivers the client's answer, or gives it back if no request with that id waits here.
    pub fn answer_client_request(&self, id: &str, answer: ClientAnswer) -> Result<(), ClientAnswer> {
        match self.lock().pending.remove(id) {
            Some(tx) => {
                // The handler may have given up (cancelled) in the meantime: nothing to do.
                let _ = tx.send(answer);
                Ok(())
            }
            None => Err(answer),
        }
    }

    /// Makes a resumed standalone stream the one server-initiated messages go to (after a
    /// restart, or on another replica, this process learns it from the resume).
    pub fn adopt_get_stream(&self, stream: &StreamName) {
        self.lock().get_stream = Some(stream.clone());
    }

    /// Attaches a connection to a new standalone stream, unless the current one has a
    /// connection attached (a second plain GET is refused).
    pub fn attach_new_get_stream(self: &Arc<Self>, stream: &StreamName) -> Option<Attachment> {
        let mut state = self.lock();
        let attached = state.get_stream.as_ref().is_some_and(|current| state.attachments.contains_key(current));
        if attached {
            return None;
        }
        state.get_stream = Some(stream.clone());
        Some(self.attach_locked(&mut state, stream))
    }

    /// Whether a connection attached to `stream` would add to the session's [`load`]: not when a
    /// running request writes to it (the request counts for it), nor when a connection is
    /// attached to it already (a resume takes that one's place).
    pub fn attaching_adds_load(&self, stream: &StreamName) -> bool {
        let state = self.lock();
        !state.attachments.contains_key(stream) && !state.inflight.values().any(|running| &running.stream == stream)
    }

    /// Attaches a connection to `stream`, closing any connection already attached to it: after
    /// a half-open connection the client's reconnect must win.
    pub fn attach(self: &Arc<Self>, stream: &StreamName) -> Attachment {
        let mut state = self.lock();
        self.attach_locked(&mut state, stream)
    }

    fn attach_locked(self: &Arc<Self>, state: &mut RuntimeState, stream: &StreamName) -> Attachment {
        state.connections += 1;
        let tx = state.attachments.entry(stream.clone()).or_insert_with(|| watch::Sender::new(0));
        let generation = *tx.borrow() + 1;
        tx.send_replace(generation);
        let mut rx = tx.subscribe();
        rx.mark_unchanged();
        // A connection that attaches after the session ended closes once caught up.
        let kicked = state.pending_kicks.remove(stream) || state.ended;
        Attachment { runtime: Arc::clone(self), stream: stream.clone(), generation, rx, kicked }
    }

    /// Resolves once this process stops serving the session (it was deleted, expired, or
    /// replaced by another incarnation).
    pub async fn ended(&self) {
        let stopped = self.stopped.notified();
        tokio::pin!(stopped);
        // Registered before the check, so an end between the two still wakes it.
        stopped.as_mut().enable();
        if self.lock().ended {
            return;
        }
        stopped.await;
    }

    /// Closes the connection attached to `stream`, if any; the client will resume.
    pub fn kick(&self, stream: &StreamName) {
        let mut state = self.lock();
        match state.attachments.get(stream) {
            Some(tx) if tx.receiver_count() > 0 => tx.send_modify(|g| *g += 1),
            _ => {
                state.pending_kicks.insert(stream.clone());
            }
        }
    }

    /// The session ended: cancel everything running and close every connection.
    pub fn end(&self) {
        let mut state = self.lock();
        state.ended = true;
        self.stopped.notify_waiters();
        for running in state.inflight.values() {
            running.cancel.cancel();
        }
        state.pending.clear();
        state.attachments.clear();
    }
}

/// A connection's claim on a stream. It ends when another connection takes the stream over,
/// when the stream is kicked, or when the session ends.
#[derive(Debug)]
pub(crate) struct Attachment {
    runtime: Arc<SessionRuntime>,
    stream: StreamName,
    generation: u64,
    rx: watch::Receiver<u64>,
    /// The stream was kicked before this connection attached: close once caught up.
    kicked: bool,
}

impl Attachment {
    /// Resolves when this connection must close.
    pub async fn superseded(&mut self) {
        if self.kicked {
            return;
        }
        loop {
            if self.rx.changed().await.is_err() || *self.rx.borrow_and_update() != self.generation {
                return;
            }
        }
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let mut state = self.runtime.lock();
        state.connections = state.connections.saturating_sub(1);
        // Each attachment holds one receiver: if this is the last, no connection is attached.
        let last = state.attachments.get(&self.stream).is_some_and(|tx| tx.receiver_count() <= 1);
        if last {
            state.attachments.remove(&self.stream);
        }
    }
}

/// A 2025-11-25 session record for unit tests: session `s`, one fixed incarnation.
#[cfg(test)]
pub(crate) fn test_record(idle_ttl_ms: u64, expires_at_ms: u64) -> SessionRecord {
    SessionRecord {
        id: SessionId::parse("s").expect("session id"),
        epoch: Epoch::parse("EEEEEEEEEEEEEEEEEEEEEE").expect("epoch"),
        principal: None,
        protocol_version: ProtocolVersion::V2025_11_25,
        client: Arc::new(serde_json::json!({})),
        idle_ttl_ms,
        expires_at_ms,
    }
}

#[cfg(test)]
mod tests {
    use tether_core::jsonrpc::RequestId;

    use super::*;

    fn runtime() -> Arc<SessionRuntime> {
        Arc::new(SessionRuntime::new(&test_record(1, 1), "p".into()))
    }

    async fn closes(attachment: &mut Attachment) -> bool {
        tokio::time::timeout(std::time::Duration::from_millis(50), attachment.superseded()).await.is_ok()
    }

    #[tokio::test]
    async fn every_kick_closes_the_connection_that_is_attached_then_or_next() {
        let runtime = runtime();
        let stream = StreamName::parse("r1").expect("stream");
        let mut first = runtime.attach(&stream);
        assert!(!closes(&mut first).await, "nothing asked it to close");
        runtime.kick(&stream);
        assert!(closes(&mut first).await, "a kick closes the attached connection");
        drop(first);
        // Kicked while no connection is attached: the next one closes once caught up.
        runtime.kick(&stream);
        let mut second = runtime.attach(&stream);
        assert!(closes(&mut second).await);
        drop(second);
        let mut third = runtime.attach(&stream);
        assert!(!closes(&mut third).await, "a kick is used up once");
    }

    #[tokio::test]
    async fn a_kick_no_connection_took_ends_with_the_stream_s_last_request() {
        let runtime = runtime();
        let stream = StreamName::parse("b1").expect("stream");
        let (one, two) = (RequestKey::of(&RequestId::Number(1)), RequestKey::of(&RequestId::Number(2)));
        assert!(runtime.start_request(&one, &stream, CancellationToken::new()));
        assert!(runtime.start_request(&two, &stream, CancellationToken::new()));
        runtime.kick(&stream);
        runtime.finish_request(&one);
        assert!(!runtime.lock().pending_kicks.is_empty(), "a request still writes to the stream");
        runtime.finish_request(&two);
        assert!(runtime.lock().pending_kicks.is_empty(), "nothing writes to the stream any more");
        let mut late = runtime.attach(&stream);
        assert!(!closes(&mut late).await, "the stream is whole: nothing to come back for");
    }

    #[tokio::test]
    async fn a_connection_that_attaches_after_the_session_ended_closes() {
        let runtime = runtime();
        runtime.end();
        let mut late = runtime.attach(&StreamName::parse("r1").expect("stream"));
        assert!(closes(&mut late).await, "nothing would ever close it otherwise");
    }

    #[test]
    fn a_closing_session_starts_nothing_and_a_running_key_is_not_taken_twice() {
        let runtime = runtime();
        let (key, stream) = (RequestKey::of(&RequestId::Number(1)), StreamName::parse("r1").expect("stream"));
        assert!(runtime.start_request(&key, &stream, CancellationToken::new()));
        assert!(!runtime.start_request(&key, &stream, CancellationToken::new()), "the same key runs once");
        runtime.close();
        let other = RequestKey::of(&RequestId::Number(2));
        assert!(!runtime.start_request(&other, &stream, CancellationToken::new()), "closing");
        assert_eq!(runtime.running(), 1, "what runs still runs");
    }

    #[test]
    fn a_running_requests_own_connection_adds_nothing_to_the_load() {
        let runtime = runtime();
        let (own, other) = (StreamName::parse("r1").expect("stream"), StreamName::parse("g1").expect("stream"));
        assert!(runtime.start_request(&RequestKey::of(&RequestId::Number(1)), &own, CancellationToken::new()));
        let _carrying = runtime.attach(&own);
        assert_eq!(load(&runtime.lock()), 1, "a request and the connection carrying its stream");
        let _standalone = runtime.attach(&other);
        assert_eq!(load(&runtime.lock()), 2);
        runtime.finish_request(&RequestKey::of(&RequestId::Number(1)));
        assert_eq!(load(&runtime.lock()), 2, "two connections once the request finished");
    }

    #[test]
    fn the_limit_is_reached_by_the_load_not_by_its_bound() {
        let runtime = runtime();
        let (own, other) = (StreamName::parse("r1").expect("stream"), StreamName::parse("g1").expect("stream"));
        assert!(!runtime.at_limit(1), "nothing runs, nothing is attached");
        assert!(runtime.start_request(&RequestKey::of(&RequestId::Number(1)), &own, CancellationToken::new()));
        let _carrying = runtime.attach(&own);
        assert!(!runtime.at_limit(2), "a request and its own connection are a load of one");
        assert!(runtime.at_limit(1));
        runtime.finish_request(&RequestKey::of(&RequestId::Number(1)));
        let _standalone = runtime.attach(&other);
        assert!(runtime.at_limit(2), "two connections, and nothing running");
        assert!(!runtime.at_limit(3));
    }

    #[tokio::test]
    async fn a_resume_takes_over_and_the_old_connection_closes() {
        let runtime = runtime();
        let stream = StreamName::parse("r1").expect("stream");
        let mut old = runtime.attach(&stream);
        let mut new = runtime.attach(&stream);
        assert!(closes(&mut old).await);
        assert!(!closes(&mut new).await);
        drop(old);
        assert!(!closes(&mut new).await, "the old connection going away does not close the new one");
        assert_eq!(load(&runtime.lock()), 1);
    }
}
