//! SSE response bodies. A connection to a stream writes what its [`StreamReader`] yields from
//! the store after its cursor, and waits for more; it never holds up the producer, which only
//! appends.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::stream;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderName, HeaderValue};
use tether_core::idempotency::Acknowledged;
use tether_core::jsonrpc::ErrorObject;
use tether_core::lineage::{RESYNC_EVENT, ResyncNotice, SessionId, StreamName, Tag};
use tether_core::sse::{Encoder, OutgoingEvent};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::DropGuard;

use crate::ServerState;
use crate::reader::{Ending, Item, StreamReader};
use crate::session::{Attachment, SessionRuntime};

/// An SSE response with the headers every stream carries.
pub(crate) fn response(body: Body, extra: impl IntoIterator<Item = (HeaderName, HeaderValue)>) -> Response {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(tether_core::sse::CONTENT_TYPE));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    const ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");
    headers.insert(ACCEL_BUFFERING, HeaderValue::from_static("no"));
    headers.extend(extra);
    response
}

/// The header giving the client its idempotency key's claim, as the records acknowledge it.
pub(crate) fn claim_header(claimed: &Acknowledged) -> (HeaderName, HeaderValue) {
    // Records names are base64url tokens and positions decimal: always a valid header value.
    let value = HeaderValue::from_str(&claimed.to_header()).unwrap_or_else(|_| HeaderValue::from_static(""));
    (super::names::IDEMPOTENCY_CLAIM, value)
}

/// What a connection writes before the stream's events.
pub(crate) enum Prelude {
    /// Nothing: the events follow directly.
    None,
    /// The priming event (the stream's event 0, empty data) with the `retry` hint (2025-11-25).
    Priming,
}

/// One connection to a session stream.
pub(crate) struct Connection {
    pub shared: Arc<ServerState>,
    pub runtime: Arc<SessionRuntime>,
    /// What the connection writes: the stream from its cursor.
    pub reader: StreamReader,
    pub prelude: Prelude,
    /// Whether the connection resumed the stream (`Last-Event-ID`): its events count as replayed.
    pub resumed: bool,
    pub attachment: Attachment,
}

struct Pump {
    conn: Connection,
    id_prefix: String,
    /// SEP-1699 polling: announce `retry` and close at this instant (2025-11-25 sessions).
    deadline: Option<Instant>,
    /// The reconnection delay announced with the priming event and when the connection is
    /// closed for the client to come back.
    retry_ms: u64,
    done: bool,
}

impl Connection {
    /// A connection to a stream from its start: primed where the version asks for it.
    pub fn fresh(
        shared: &Arc<ServerState>,
        runtime: Arc<SessionRuntime>,
        stream: StreamName,
        attachment: Attachment,
    ) -> Connection {
        let prelude = if runtime.version.primes_streams() { Prelude::Priming } else { Prelude::None };
        let reader = StreamReader::new(Arc::clone(&shared.store), &runtime.id, stream, 0);
        Connection { shared: Arc::clone(shared), runtime, reader, prelude, resumed: false, attachment }
    }

    /// The streaming body of this connection.
    pub fn into_body(self) -> Body {
        let polls = self.runtime.version.primes_streams();
        let config = &self.shared.config;
        let retry_ms = u64::try_from(config.sse_retry.as_millis()).unwrap_or(u64::MAX);
        let deadline = polls.then(|| Instant::now() + config.max_connection_duration);
        let id_prefix = id_prefix(self.runtime.epoch.as_str(), self.reader.stream().as_str());
        crate::telemetry::stream_connections(1.0);
        let pump = Pump { conn: self, id_prefix, deadline, retry_ms, done: false };
        Body::from_stream(stream::unfold(pump, |mut pump| async move {
            let chunk = pump.next_chunk().await?;
            Some((Ok::<_, Infallible>(chunk), pump))
        }))
    }
}

/// What every event id of `stream` in `epoch` starts with: `epoch:stream:`.
fn id_prefix(epoch: &str, stream: &str) -> String {
    let mut prefix = String::with_capacity(epoch.len() + stream.len() + 2);
    for part in [epoch, ":", stream, ":"] {
        prefix.push_str(part);
    }
    prefix
}

/// A body of one resync event and nothing else: a resume of a stream the session does not have.
pub(crate) fn notice_body(epoch: &str, notice: &ResyncNotice) -> Body {
    let mut out = Vec::new();
    write_notice(&mut out, &id_prefix(epoch, &notice.stream), notice, None);
    Body::from(out)
}

/// Writes a resync event for `notice`, whose id is its position and, where the store holds one
/// there, the tag of the event at it.
fn write_notice(out: &mut Vec<u8>, id_prefix: &str, notice: &ResyncNotice, tag: Option<Tag>) {
    let mut id = format!("{id_prefix}{}", notice.position());
    push_tag(&mut id, tag);
    let data = notice.to_json();
    encode(
        out,
        &OutgoingEvent { id: Some(&id), event: Some(RESYNC_EVENT), data: Some(data.as_bytes()), ..Default::default() },
    );
}

/// Writes the JSON-RPC error that ends each request of `stream` whose response the stream will
/// never carry, as an event without an id: it is not part of the stream's history, and
/// resuming from the notice before it must not repeat it.
async fn write_trailer(
    out: &mut Vec<u8>,
    shared: &ServerState,
    session: &SessionId,
    stream: &StreamName,
    error: ErrorObject,
) {
    let request = match shared.store.stream_request(session, stream).await {
        Ok(request) => request,
        Err(err) => {
            tracing::warn!(%err, %stream, "could not read the request of a stream that ended without its response");
            return;
        }
    };
    for response in request.map(|key| crate::request::dispatch::trailer(&key, &error)).unwrap_or_default() {
        encode(out, &OutgoingEvent { data: Some(&response), ..Default::default() });
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        crate::telemetry::stream_connections(-1.0);
    }
}

impl Pump {
    async fn next_chunk(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        if let Prelude::Priming = std::mem::replace(&mut self.conn.prelude, Prelude::None) {
            let mut out = Vec::new();
            let mut id = self.id_prefix.clone();
            id.push('0');
            push_tag(&mut id, Some(Tag::priming(self.conn.reader.stream())));
            let event =
                OutgoingEvent { id: Some(&id), retry: Some(self.retry_ms), data: Some(b""), ..Default::default() };
            encode(&mut out, &event);
            return Some(Bytes::from(out));
        }
        loop {
            let Ok(items) = self.conn.reader.read().await else { return self.finish() };
            if !items.is_empty() {
                return self.write(items).await;
            }
            if let Some(chunk) = self.wait().await {
                return chunk;
            }
        }
    }

    /// Writes what the reader yielded: events with their lineage ids, each gap as one resync
    /// event, and how the stream ended.
    async fn write(&mut self, items: Vec<Item>) -> Option<Bytes> {
        // An event's data and id, and the fields' names; a notice is under 256 bytes.
        let size = |item: &Item| match item {
            Item::Event(event) => event.data.len() + self.id_prefix.len() + 48,
            Item::Gap(..) | Item::End(_) => 256,
        };
        let mut out = Vec::with_capacity(items.iter().map(size).sum());
        let mut id = self.id_prefix.clone();
        let mut seq = itoa::Buffer::new();
        let mut replayed = 0;
        for item in items {
            match item {
                Item::Event(event) => {
                    id.truncate(self.id_prefix.len());
                    id.push_str(seq.format(event.seq));
                    push_tag(&mut id, Some(event.tag));
                    encode(&mut out, &OutgoingEvent { id: Some(&id), data: Some(&event.data), ..Default::default() });
                    replayed += 1;
                }
                Item::Gap(notice, tag) => {
                    crate::telemetry::resync_sent(notice.reason);
                    write_notice(&mut out, &self.id_prefix, &notice, tag);
                }
                Item::End(ending) => {
                    self.done = true;
                    let (session, stream) = (&self.conn.runtime.id, self.conn.reader.stream());
                    match ending {
                        Ending::Complete { response_lost: false } | Ending::Gone => {}
                        Ending::Complete { response_lost: true } => {
                            let expired = crate::request::idempotency::history_expired();
                            write_trailer(&mut out, &self.conn.shared, session, stream, expired).await;
                        }
                        Ending::Aborted(notice, tag) => {
                            crate::telemetry::resync_sent(notice.reason);
                            write_notice(&mut out, &self.id_prefix, &notice, tag);
                            let aborted = crate::request::idempotency::aborted();
                            write_trailer(&mut out, &self.conn.shared, session, stream, aborted).await;
                        }
                        // Nothing more is written from a history the client did not see; its
                        // resume is told the session is gone, and why.
                        Ending::Rewritten => {
                            let runtime = Arc::clone(&self.conn.runtime);
                            crate::session::service::end_rewritten(&self.conn.shared, &runtime, stream).await;
                        }
                    }
                }
            }
        }
        if self.conn.resumed {
            crate::telemetry::events_replayed(replayed);
        }
        if out.is_empty() { self.finish() } else { Some(Bytes::from(out)) }
    }

    /// Waits until the stream's head moves (`None`: read again) or the connection must write
    /// something else and maybe end (`Some`).
    async fn wait(&mut self) -> Option<Option<Bytes>> {
        enum Woke {
            Head(bool),
            Close,
            KeepAlive,
        }
        let keep_alive = self.conn.shared.config.keep_alive;
        let deadline = self.deadline;
        let Connection { reader, attachment, .. } = &mut self.conn;
        let woke = tokio::select! {
            changed = reader.changed() => Woke::Head(changed.is_ok()),
            () = attachment.superseded() => Woke::Close,
            () = sleep_until(deadline) => Woke::Close,
            () = tokio::time::sleep(keep_alive) => Woke::KeepAlive,
        };
        match woke {
            Woke::Head(true) => None,
            Woke::Head(false) => Some(self.finish()),
            Woke::Close => Some(self.close_for_retry()),
            Woke::KeepAlive => {
                let mut out = Vec::new();
                // An empty comment has no line break, so it always encodes.
                let _ = Encoder::comment(&mut out, "");
                Some(Some(Bytes::from(out)))
            }
        }
    }

    /// Ends the connection but not the stream: tell the client when to come back.
    fn close_for_retry(&mut self) -> Option<Bytes> {
        self.done = true;
        let retry = self.retry_ms;
        let mut out = Vec::new();
        encode(&mut out, &OutgoingEvent { retry: Some(retry), ..Default::default() });
        Some(Bytes::from(out))
    }

    fn finish(&mut self) -> Option<Bytes> {
        self.done = true;
        None
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Ends an id with `:` and the tag, if there is one.
fn push_tag(id: &mut String, tag: Option<Tag>) {
    if let Some(tag) = tag {
        id.push(':');
        tag.push_to(id);
    }
}

/// Encodes an event the server built itself.
fn encode(out: &mut Vec<u8>, event: &OutgoingEvent<'_>) {
    // Ids are lineage ids and event types are constants: neither has CR, LF or NUL.
    if let Err(err) = Encoder::event(out, event) {
        tracing::error!(%err, "server built an unencodable SSE event");
    }
}

/// The body of a 2026-07-28 response stream: messages straight from the request, no ids.
/// Dropping the body (the client closed the stream) cancels the request.
pub(crate) fn direct_body(rx: mpsc::Receiver<(Bytes, bool)>, cancel_on_drop: DropGuard, keep_alive: Duration) -> Body {
    // The guard is declared first so it drops first: the handler sees cancellation, not just
    // a closed channel.
    struct Direct {
        _cancel: DropGuard,
        rx: mpsc::Receiver<(Bytes, bool)>,
        keep_alive: Duration,
        done: bool,
    }
    let state = Direct { _cancel: cancel_on_drop, rx, keep_alive, done: false };
    Body::from_stream(stream::unfold(state, |mut state| async move {
        if state.done {
            return None;
        }
        let mut out = Vec::new();
        tokio::select! {
            message = state.rx.recv() => {
                let (bytes, last) = message?;
                encode(&mut out, &OutgoingEvent { data: Some(&bytes), ..Default::default() });
                state.done = last;
            }
            () = tokio::time::sleep(state.keep_alive) => {
                let _ = Encoder::comment(&mut out, "");
            }
        }
        Some((Ok::<_, Infallible>(Bytes::from(out)), state))
    }))
}
