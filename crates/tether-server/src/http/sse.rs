//! SSE response bodies. A connection to a stream reads events from the store after its cursor,
//! writes them, and waits for more; it never holds up the producer, which only appends.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::stream;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderName, HeaderValue};
use tether_core::jsonrpc::{self, Message, RequestId};
use tether_core::lineage::{RESYNC_EVENT, ResyncNotice, StreamName, StreamState};
use tether_core::sse::{Encoder, OutgoingEvent};
use tether_store::{HeadWatch, StoredEvent, StreamPage};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::DropGuard;

use crate::Shared;
use crate::session::{Attachment, SessionRuntime};

/// Events read from the store per round trip.
const READ_BATCH: usize = 256;

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

/// What a connection writes before the stream's events.
pub(crate) enum Prelude {
    /// Nothing: the events follow directly.
    None,
    /// The priming event (the stream's event 0, empty data) with the `retry` hint (2025-11-25).
    Priming,
    /// A resync event: the replay cannot be exact. For a request whose producer died, its
    /// JSON-RPC error response follows, so clients waiting for the result stop waiting.
    Resync(ResyncNotice, Option<RequestId>),
}

/// One connection to a session stream.
pub(crate) struct Connection {
    pub shared: Arc<Shared>,
    pub runtime: Arc<SessionRuntime>,
    pub stream: StreamName,
    /// The last sequence number written (or skipped by a resync).
    pub cursor: u64,
    pub prelude: Prelude,
    /// Whether to keep following once the retained events are written.
    pub follow: bool,
    /// Whether the connection resumed the stream (`Last-Event-ID`): its events count as replayed.
    pub resumed: bool,
    pub attachment: Attachment,
}

struct Pump {
    conn: Connection,
    id_prefix: String,
    head: Option<HeadWatch>,
    /// SEP-1699 polling: announce `retry` and close at this instant (2025-11-25 sessions).
    deadline: Option<Instant>,
    retry_ms: Option<u64>,
    done: bool,
}

impl Connection {
    /// A connection to a new stream, from its start: primed where the version asks for it.
    pub fn fresh(
        shared: &Arc<Shared>,
        runtime: Arc<SessionRuntime>,
        stream: StreamName,
        attachment: Attachment,
    ) -> Connection {
        let prelude = if runtime.version.primes_streams() { Prelude::Priming } else { Prelude::None };
        Connection {
            shared: Arc::clone(shared),
            runtime,
            stream,
            cursor: 0,
            prelude,
            follow: true,
            resumed: false,
            attachment,
        }
    }

    /// The streaming body of this connection.
    pub fn into_body(self) -> Body {
        let polls = self.runtime.version.primes_streams();
        let config = &self.shared.config;
        let retry_ms = polls.then(|| u64::try_from(config.sse_retry.as_millis()).unwrap_or(u64::MAX));
        let deadline = polls.then(|| Instant::now() + config.max_connection_duration);
        let id_prefix = format!("{}:{}:", self.runtime.epoch, self.stream);
        crate::telemetry::stream_connections(1.0);
        let pump = Pump { conn: self, id_prefix, head: None, deadline, retry_ms, done: false };
        Body::from_stream(stream::unfold(pump, |mut pump| async move {
            let chunk = pump.next_chunk().await?;
            Some((Ok::<_, Infallible>(chunk), pump))
        }))
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
        let mut out = Vec::new();
        match std::mem::replace(&mut self.conn.prelude, Prelude::None) {
            Prelude::None => {}
            Prelude::Priming => {
                let id = format!("{}0", self.id_prefix);
                let event =
                    OutgoingEvent { id: Some(&id), retry: self.retry_ms, data: Some(b""), ..Default::default() };
                encode(&mut out, &event);
                return Some(Bytes::from(out));
            }
            Prelude::Resync(notice, aborted) => {
                let id = format!("{}{}", self.id_prefix, notice.head);
                let data = notice.to_json();
                let event = OutgoingEvent {
                    id: Some(&id),
                    event: Some(RESYNC_EVENT),
                    data: Some(data.as_bytes()),
                    ..Default::default()
                };
                encode(&mut out, &event);
                if let Some(request) = aborted {
                    let error = crate::idempotency::aborted();
                    let response = Message::Response(jsonrpc::Response::error(Some(request), error)).to_vec();
                    // No id: it is not part of the stream's history, and resuming from the
                    // resync event's id must not repeat it.
                    encode(&mut out, &OutgoingEvent { data: Some(&response), ..Default::default() });
                }
                return Some(Bytes::from(out));
            }
        }
        loop {
            // A stream is watched only once it has to be waited for: most responses are whole
            // by the time they are first read, and a watch costs the store a registration.
            if let Some(head) = &mut self.head {
                head.borrow_and_update();
            }
            let store = &self.conn.shared.store;
            let (session, stream) = (&self.conn.runtime.id, &self.conn.stream);
            // If the range says the stream ended, the page holds every event it ended with, so
            // an empty page really means "nothing more".
            let Ok(Some(StreamPage { range, events })) =
                store.read_page(session, stream, self.conn.cursor, READ_BATCH).await
            else {
                return self.finish();
            };
            let at_end = move |cursor: u64| range.state != StreamState::Live && cursor >= range.head;
            if !events.is_empty() {
                let chunk = self.write_events(&events);
                // The end of a finished stream: no need to read again to learn it.
                self.done |= at_end(self.conn.cursor);
                return chunk;
            }
            if !self.conn.follow || at_end(self.conn.cursor) {
                return self.finish();
            }
            if self.head.is_none() {
                // Read again once watched, so that nothing appended meanwhile is missed.
                let watch = self.conn.shared.store.watch(&self.conn.runtime.id, &self.conn.stream).await;
                let Ok(watch) = watch else { return self.finish() };
                self.head = Some(watch);
                continue;
            }
            if let Some(chunk) = self.wait().await {
                return chunk;
            }
        }
    }

    fn write_events(&mut self, events: &[StoredEvent]) -> Option<Bytes> {
        let mut out = Vec::with_capacity(events.iter().map(|e| e.data.len() + self.id_prefix.len() + 32).sum());
        let mut id = self.id_prefix.clone();
        let mut seq = itoa::Buffer::new();
        for event in events {
            if event.seq != self.conn.cursor + 1 {
                // The connection fell behind retention. Close it: the client's resume gets an
                // explicit resync instead of a silent gap.
                self.done = true;
                break;
            }
            id.truncate(self.id_prefix.len());
            id.push_str(seq.format(event.seq));
            encode(&mut out, &OutgoingEvent { id: Some(&id), data: Some(&event.data), ..Default::default() });
            self.conn.cursor = event.seq;
        }
        if self.conn.resumed {
            crate::telemetry::events_replayed(events.len());
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
        let Pump { head, conn, .. } = self;
        let head = head.as_mut()?;
        let woke = tokio::select! {
            changed = head.changed() => Woke::Head(changed.is_ok()),
            () = conn.attachment.superseded() => Woke::Close,
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
        let retry = self.retry_ms?;
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
