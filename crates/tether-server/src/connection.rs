//! Connections: accepting them, and the limits each is held to before and between its requests.
//!
//! A connection may be open only while it does something: it has `header_timeout` to send a
//! whole request head (from its first byte, or from accept if it sends nothing), `idle_timeout`
//! with no request in flight after a response, and `send_timeout` to take each part of a
//! response the server has ready (a client that stops reading, or an HTTP/2 client that never
//! opens its window, holds nothing for long). A request waiting for its handler or its stream's
//! next event is not idle: a long SSE stream is never cut for being quiet, and the request's body
//! is the router's to bound. At `max_connections`, one more is answered 503 and closed instead of
//! waiting for a slot. HTTP/1.1 and HTTP/2 with prior knowledge (h2c) are served on the same
//! port, or, with TLS ([`serve_tls`]), HTTP/1.1 and HTTP/2 negotiated by ALPN; a TLS handshake
//! is held to the header timeout.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::future;
use http::Request;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tower::ServiceExt as _;
use tower::util::Either;

use crate::tls::ServerTls;

/// What [`serve`] answers requests with: an [`Endpoint`](crate::Endpoint), an axum `Router`, or
/// either of two.
pub trait App: Clone + Send + Sync + 'static {
    /// The response to `request`, from a clone of the app (a connection's requests run side by
    /// side).
    fn answer(self, request: Request<Body>) -> impl Future<Output = Response> + Send + 'static;
}

impl App for axum::Router {
    async fn answer(self, request: Request<Body>) -> Response {
        match self.oneshot(request).await {
            Ok(response) => response,
            Err(infallible) => match infallible {},
        }
    }
}

impl<A: App, B: App> App for Either<A, B> {
    // Inlined for the reason `Endpoint::answer` is.
    #[inline(always)]
    fn answer(self, request: Request<Body>) -> impl Future<Output = Response> + Send + 'static {
        match self {
            Either::Left(app) => future::Either::Left(app.answer(request)),
            Either::Right(app) => future::Either::Right(app.answer(request)),
        }
    }
}

/// Limits on connections, applied before any request reaches the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections open at once. One more is answered `503` with `Retry-After` and
    /// closed; keep it below the descriptor limit so that answer can still be given.
    pub max_connections: usize,
    /// How long a request head may take from its first byte, and how long a new connection may
    /// wait before sending one.
    pub header_timeout: Duration,
    /// How long a connection stays open with no request in flight after a response.
    pub idle_timeout: Duration,
    /// How long a part of a response may wait for the client to take it (to read it, or to open
    /// its HTTP/2 window) before the connection is closed.
    pub send_timeout: Duration,
    /// Most requests in flight at once on one HTTP/2 connection.
    pub max_concurrent_streams: u32,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 4_096,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(60),
            max_concurrent_streams: 128,
        }
    }
}

/// Most refusals being written at once; past it a connection over the limit is closed unanswered,
/// so a flood of connections cannot hold descriptors through its refusals.
const MAX_REFUSING: usize = 64;

/// How long a refusal may take to be written and read by the peer.
const REFUSAL_TIME: Duration = Duration::from_secs(1);

/// How long accepting pauses after an error such as running out of descriptors, which would
/// otherwise repeat at once.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `app` on `listener` under `limits`, with `TCP_NODELAY` on every socket (SSE writes many
/// small frames, and Nagle's algorithm would hold each one back for a delayed ACK). Runs for
/// ever: an error accepting a connection (such as running out of descriptors) is logged, at most
/// once a second, and accepting goes on after a pause.
pub async fn serve(listener: TcpListener, app: impl App, limits: ConnectionLimits) -> io::Result<()> {
    accept(listener, app, limits, None).await
}

/// [`serve`] over TLS: each connection's handshake, with `tls`'s certificate, must finish within
/// the header timeout. A connection over the limit is closed unanswered, since the refusal
/// [`serve`] writes would have to follow a handshake the server is too busy to spend.
pub async fn serve_tls(
    listener: TcpListener,
    app: impl App,
    limits: ConnectionLimits,
    tls: ServerTls,
) -> io::Result<()> {
    accept(listener, app, limits, Some(tls)).await
}

async fn accept(
    listener: TcpListener,
    app: impl App,
    limits: ConnectionLimits,
    tls: Option<ServerTls>,
) -> io::Result<()> {
    let open = Arc::new(AtomicUsize::new(0));
    let refusing = Arc::new(AtomicUsize::new(0));
    let mut logged: Option<Instant> = None;
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                if logged.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
                    tracing::warn!(%err, "accepting a connection failed");
                    logged = Some(Instant::now());
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::warn!(%err, "could not set TCP_NODELAY");
        }
        let Some(slot) = Slot::take(&open, limits.max_connections) else {
            crate::telemetry::connection_refused();
            if tls.is_none()
                && let Some(refusal) = Slot::take(&refusing, MAX_REFUSING)
            {
                tokio::spawn(refuse(tcp, refusal));
            }
            continue;
        };
        let (app, tls) = (app.clone(), tls.clone());
        tokio::spawn(async move {
            crate::telemetry::connections_open(1.0);
            match tls {
                None => serve_connection(tcp, app, limits).await,
                Some(tls) => match tokio::time::timeout(limits.header_timeout, tls.acceptor().accept(tcp)).await {
                    Ok(Ok(stream)) => serve_connection(stream, app, limits).await,
                    Ok(Err(err)) => tracing::debug!(%err, "TLS handshake failed"),
                    Err(_) => crate::telemetry::connection_expired(Expiry::Head),
                },
            }
            crate::telemetry::connections_open(-1.0);
            drop(slot);
        });
    }
}

/// One of a bounded number of places, given back when dropped.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).ok()?;
        Some(Slot(Arc::clone(count)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The refusal of a connection over the limit: an HTTP/1.1 503 whose body is a JSON-RPC error.
fn refusal() -> Vec<u8> {
    use tether_core::jsonrpc::{Message, Response};
    let error =
        crate::refusal::Refusal::TooManyConnections.error("as many connections as allowed are open; try again later");
    let body = Message::Response(Response::error(None, error)).to_vec();
    let mut out = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Answers a connection over the limit and closes it. What the peer already sent is read and
/// dropped until it closes too, so the close does not reset the connection before the answer
/// is read.
async fn refuse(mut tcp: TcpStream, _slot: Slot) {
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        tcp.write_all(&refusal()).await?;
        tcp.shutdown().await?;
        let mut sink = [0u8; 1024];
        while tcp.read(&mut sink).await? > 0 {}
        io::Result::Ok(())
    })
    .await;
}

/// Why a connection was closed by its watchdog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// No complete request head within the header timeout.
    Head,
    /// Nothing in flight for the idle timeout.
    Idle,
    /// A part of a response not taken by the client for the send timeout.
    Send,
}

impl Expiry {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Expiry::Head => "header_timeout",
            Expiry::Idle => "idle_timeout",
            Expiry::Send => "send_timeout",
        }
    }
}

/// Serves one connection of any transport (a TLS stream, a Unix socket) under `limits`, as
/// [`serve`] serves each TCP connection it accepts: until the peer closes it or it expires.
/// `max_connections` is the caller's to apply.
pub async fn serve_connection<I>(io: I, app: impl App, limits: ConnectionLimits)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http2().max_concurrent_streams(limits.max_concurrent_streams);
    let activity = Arc::new(Activity::new(limits));
    let io = TokioIo::new(Observed { inner: io, activity: Arc::clone(&activity) });
    let service = hyper::service::service_fn({
        let activity = Arc::clone(&activity);
        move |request: Request<Incoming>| {
            let in_flight = InFlight::start(&activity);
            let app = app.clone();
            async move {
                let response = app.answer(request.map(Body::new)).await;
                Ok::<_, std::convert::Infallible>(response.map(|body| Body::new(Finishing::new(body, in_flight))))
            }
        }
    });
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let expiry = tokio::select! {
        served = connection.as_mut() => {
            if let Err(err) = served {
                tracing::debug!(%err, "connection ended with an error");
            }
            return;
        }
        expiry = activity.expired() => expiry,
    };
    tracing::debug!(reason = expiry.as_str(), "connection closed");
    crate::telemetry::connection_expired(expiry);
    // Nothing is in flight but a response the client does not take: an HTTP/2 client is told
    // (GOAWAY) that nothing more will be served, and the connection closes when that is written
    // or the grace runs out.
    if expiry != Expiry::Send {
        connection.as_mut().graceful_shutdown();
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, connection).await;
    }
}

/// How long an expired connection may take to close after it was told to.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// What a connection is doing, reported by its reads and its requests to its watchdog.
struct Activity {
    /// The connection's start: times below are milliseconds after it.
    start: Instant,
    /// The limits the connection is held to.
    limits: ConnectionLimits,
    /// Requests whose response, body included, is not finished.
    in_flight: AtomicUsize,
    /// Whether a response was ever finished: until then, waiting is waiting for a first head.
    answered: AtomicBool,
    /// When the connection last had nothing in flight.
    idle_since: AtomicU64,
    /// When the first byte arrived with nothing in flight, or [`NO_HEAD`].
    head_since: AtomicU64,
    /// Whether the connection speaks HTTP/2, whose control frames are not request heads.
    h2: AtomicBool,
    /// Response parts handed to the connection that the client has not taken yet: a body that
    /// gave one and has not been asked for the next.
    unsent: AtomicUsize,
    /// When a response body last gave a part or was asked for one.
    sent_at: AtomicU64,
}

const NO_HEAD: u64 = u64::MAX;

impl Activity {
    fn new(limits: ConnectionLimits) -> Activity {
        Activity {
            start: Instant::now(),
            limits,
            in_flight: AtomicUsize::new(0),
            answered: AtomicBool::new(false),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(NO_HEAD),
            h2: AtomicBool::new(false),
            unsent: AtomicUsize::new(0),
            sent_at: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// Bytes arrived: with nothing in flight, on HTTP/1 they are a request head starting.
    /// HTTP/2 has no heads to time out (a request is one frame), only the first request, which is
    /// timed from accept.
    fn read(&self, bytes: &[u8]) {
        if self.in_flight.load(Ordering::Acquire) > 0 || self.h2.load(Ordering::Relaxed) {
            return;
        }
        if bytes.starts_with(H2_PREFACE) {
            self.h2.store(true, Ordering::Relaxed);
            return;
        }
        let _ = self.head_since.compare_exchange(NO_HEAD, self.now(), Ordering::AcqRel, Ordering::Acquire);
    }

    /// When the connection is to be looked at again, and whether it expires then if nothing
    /// changed (`None`: a request in flight, checked for stalled responses every send timeout).
    fn deadline(&self) -> (Instant, Option<Expiry>) {
        let limits = &self.limits;
        let at = |ms: u64, after: Duration| self.start + Duration::from_millis(ms) + after;
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return if self.unsent.load(Ordering::Acquire) > 0 {
                (at(self.sent_at.load(Ordering::Acquire), limits.send_timeout), Some(Expiry::Send))
            } else {
                (Instant::now() + limits.send_timeout, None)
            };
        }
        let head = self.head_since.load(Ordering::Acquire);
        if head != NO_HEAD {
            return (at(head, limits.header_timeout), Some(Expiry::Head));
        }
        let idle = self.idle_since.load(Ordering::Acquire);
        if self.answered.load(Ordering::Acquire) {
            (at(idle, limits.idle_timeout), Some(Expiry::Idle))
        } else {
            (at(idle, limits.header_timeout), Some(Expiry::Head))
        }
    }

    /// Resolves when the connection has outlived its deadline. It looks again at its deadline or
    /// after the shortest limit, whichever comes first: every deadline the connection can set
    /// from then on is at least that limit away, so nothing the connection does has to wake it,
    /// and a request costs the watchdog nothing. It sleeps at least the timer's millisecond, so
    /// that a limit of zero does not spin it.
    async fn expired(&self) -> Expiry {
        let limits = &self.limits;
        let shortest = limits.header_timeout.min(limits.idle_timeout).min(limits.send_timeout);
        loop {
            let now = Instant::now();
            match self.deadline() {
                (at, Some(why)) if at <= now => return why,
                (at, _) => {
                    let next = at.min(now + shortest).max(now + Duration::from_millis(1));
                    tokio::time::sleep_until(next).await;
                }
            }
        }
    }
}

/// The bytes an HTTP/2 connection starts with.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A request in flight on its connection, from its head until its response body is finished or
/// dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: &Arc<Activity>) -> InFlight {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.0;
        activity.answered.store(true, Ordering::Release);
        activity.idle_since.store(activity.now(), Ordering::Release);
        activity.head_since.store(NO_HEAD, Ordering::Release);
        activity.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request in flight until it is finished or dropped, and tells
/// the watchdog whether the part it gave last was taken.
struct Finishing {
    body: Body,
    in_flight: InFlight,
    /// Whether the last part given has not been asked past yet.
    unsent: bool,
}

impl Finishing {
    fn new(body: Body, in_flight: InFlight) -> Finishing {
        Finishing { body, in_flight, unsent: false }
    }

    fn taken(&mut self) {
        if std::mem::take(&mut self.unsent) {
            self.in_flight.0.unsent.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl hyper::body::Body for Finishing {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        // Asked for the next part: the last one was taken.
        self.taken();
        let activity = Arc::clone(&self.in_flight.0);
        activity.sent_at.store(activity.now(), Ordering::Release);
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(Some(Ok(_)))) {
            self.unsent = true;
            activity.unsent.fetch_add(1, Ordering::AcqRel);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Finishing {
    fn drop(&mut self) {
        self.taken();
    }
}

/// A connection's transport, reporting its reads to the connection's [`Activity`].
struct Observed<I> {
    inner: I,
    activity: Arc<Activity>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Observed<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read(&buf.filled()[before..]);
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Observed<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ConnectionLimits {
        ConnectionLimits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            ..ConnectionLimits::default()
        }
    }

    /// The deadline after the connection's start, if it expires then.
    fn expiry(activity: &Activity) -> Option<(Duration, Expiry)> {
        let (at, why) = activity.deadline();
        why.map(|why| (at - activity.start, why))
    }

    #[test]
    fn a_new_connection_has_the_header_timeout_and_an_answered_one_the_idle_timeout() {
        let activity = Arc::new(Activity::new(limits()));
        assert_eq!(expiry(&activity), Some((Duration::from_secs(10), Expiry::Head)));
        let request = InFlight::start(&activity);
        assert_eq!(expiry(&activity), None, "nothing expires with a request in flight");
        activity.read(b"body");
        assert_eq!(expiry(&activity), None, "a body read is not a head");
        drop(request);
        let (idle, why) = expiry(&activity).expect("a deadline");
        assert_eq!(why, Expiry::Idle);
        assert!(idle >= Duration::from_secs(60), "{idle:?}");
    }

    #[test]
    fn the_first_byte_of_a_head_starts_the_header_timeout() {
        let activity = Arc::new(Activity::new(limits()));
        drop(InFlight::start(&activity));
        activity.read(b"P");
        let head = activity.head_since.load(Ordering::Acquire);
        assert_ne!(head, NO_HEAD);
        let (timeout, why) = expiry(&activity).expect("a deadline");
        assert_eq!((timeout, why), (Duration::from_millis(head) + Duration::from_secs(10), Expiry::Head));
        activity.read(b"O");
        assert_eq!(activity.head_since.load(Ordering::Acquire), head, "later bytes do not extend it");
    }

    #[test]
    fn http2_frames_between_requests_are_not_a_head() {
        let activity = Arc::new(Activity::new(limits()));
        activity.read(H2_PREFACE);
        drop(InFlight::start(&activity));
        activity.read(b"\0\0\x04\x08\0\0\0\0\0");
        assert_eq!(activity.head_since.load(Ordering::Acquire), NO_HEAD);
        assert_eq!(expiry(&activity).map(|(_, why)| why), Some(Expiry::Idle));
    }

    /// Polls `body` once with a no-op waker.
    fn poll(body: &mut Finishing) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        hyper::body::Body::poll_frame(Pin::new(body), &mut cx)
    }

    #[test]
    fn a_response_part_not_taken_expires_the_connection_after_the_send_timeout() {
        let activity = Arc::new(Activity::new(limits()));
        let mut body = Finishing::new(Body::from("part"), InFlight::start(&activity));
        assert_eq!(expiry(&activity), None, "a request waiting for its response is not stalled");
        assert!(matches!(poll(&mut body), Poll::Ready(Some(Ok(_)))));
        let (at, why) = expiry(&activity).expect("a part given and not taken");
        assert_eq!(why, Expiry::Send);
        assert!(at >= Duration::from_secs(60) && at < Duration::from_secs(61), "{at:?}");
        // Asked for the next part: the first was taken.
        assert!(matches!(poll(&mut body), Poll::Ready(None)));
        assert_eq!(expiry(&activity), None);
        assert!(matches!(poll(&mut body), Poll::Ready(None)));
        drop(body);
        assert_eq!(activity.unsent.load(Ordering::Acquire), 0);
        assert_eq!(expiry(&activity).map(|(_, why)| why), Some(Expiry::Idle));
    }

    /// A send timeout shorter than the header timeout holds from a connection's first request:
    /// the watchdog, asleep before the request starts, looks again within the send timeout.
    #[tokio::test(start_paused = true)]
    async fn a_send_timeout_shorter_than_the_header_timeout_holds_for_the_first_response() {
        let send_timeout = Duration::from_millis(500);
        let activity = Arc::new(Activity::new(ConnectionLimits { send_timeout, ..limits() }));
        let watchdog = tokio::spawn({
            let activity = Arc::clone(&activity);
            async move { activity.expired().await }
        });
        tokio::task::yield_now().await;
        let mut body = Finishing::new(Body::from("part"), InFlight::start(&activity));
        assert!(matches!(poll(&mut body), Poll::Ready(Some(Ok(_)))));
        assert_eq!(watchdog.await.expect("the watchdog ends"), Expiry::Send);
        let after = activity.start.elapsed();
        assert!(after >= send_timeout && after <= 2 * send_timeout, "expired after {after:?}");
    }

    /// A head that starts on a kept-alive connection is timed from its first byte although
    /// nothing wakes the watchdog, asleep until the far later idle deadline: it looks again
    /// within the shortest limit.
    #[tokio::test(start_paused = true)]
    async fn a_head_started_on_an_idle_connection_expires_after_the_header_timeout_unwoken() {
        let header_timeout = Duration::from_secs(1);
        let activity = Arc::new(Activity::new(ConnectionLimits { header_timeout, ..limits() }));
        drop(InFlight::start(&activity));
        let watchdog = tokio::spawn({
            let activity = Arc::clone(&activity);
            async move { activity.expired().await }
        });
        tokio::time::sleep(Duration::from_millis(5_500)).await;
        assert!(!watchdog.is_finished(), "an idle connection expired before its idle timeout");
        activity.read(b"POST /mcp HTTP/1.1\r\n");
        assert_eq!(watchdog.await.expect("the watchdog ends"), Expiry::Head);
        let after = activity.start.elapsed();
        assert!(
            after >= Duration::from_millis(6_500) && after <= Duration::from_millis(7_600),
            "expired after {after:?}"
        );
    }

    #[test]
    fn a_body_dropped_with_a_part_not_taken_leaves_nothing_unsent() {
        let activity = Arc::new(Activity::new(limits()));
        let mut body = Finishing::new(Body::from("part"), InFlight::start(&activity));
        assert!(matches!(poll(&mut body), Poll::Ready(Some(Ok(_)))));
        drop(body);
        assert_eq!(activity.unsent.load(Ordering::Acquire), 0);
    }

    #[test]
    fn the_refusal_is_a_complete_http_response_with_a_reason() {
        let text = String::from_utf8(refusal()).expect("ASCII");
        let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        let body: serde_json::Value = serde_json::from_str(body).expect("JSON");
        assert_eq!(body["error"]["data"]["reason"], "too_many_connections");
    }
}
