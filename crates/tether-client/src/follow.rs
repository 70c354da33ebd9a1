//! Following one stream to its end: read, prove continuity, deliver, checkpoint; and when the
//! connection drops, reconnect with `Last-Event-ID` and judge the resume before trusting it.

use std::sync::Arc;

use tether_core::jsonrpc::{self, Message, RequestId};
use tether_core::lineage::{
    Accepted, Checkpoint, Digest, FirstEvent, ObservedId, Reconnect, ResyncNotice, StreamValidator, Verdict,
    client_verdict,
};
use tether_core::sse::Event;
use tracing::Instrument as _;

use crate::backoff::Attempts;
use crate::checkpoint::StreamCursor;
use crate::cursors::{STANDALONE, stream_key};
use crate::http::{Head, Reply, SseReader};
use crate::session::Session;
use crate::{Ack, ClientError, ClientEvent, DivergenceReason, Policy, RequestError, ResumeVerdict};

/// A connection that lasted this long was no storm, even if it delivered nothing.
const LONG_LIVED: std::time::Duration = std::time::Duration::from_secs(30);

/// Which stream is followed.
#[derive(Debug, Clone)]
pub(crate) enum Origin {
    /// The standalone GET stream.
    Standalone,
    /// The stream of the request with this id; it is done when the response arrives.
    Request(RequestId),
}

impl Ended {
    /// The name of how the connection ended, for logs.
    fn kind(&self) -> &'static str {
        match self {
            Ended::Done => "done",
            Ended::Dropped => "dropped",
            Ended::Unanswered => "unanswered",
            Ended::Diverged(_) => "diverged",
        }
    }
}

/// Where the proof of continuity stands.
enum Continuity {
    /// Every event is checked against the previous one.
    Checked(StreamValidator),
    /// A reconnect's response head passed; its first event decides.
    Resuming { checkpoint: Checkpoint, head: Head },
    /// Policy `Trust` after an unverifiable resume: events are delivered without proof.
    Trusted,
}

/// What an event is to the stream being followed.
enum Admit {
    /// The next event: deliver it.
    Deliver,
    /// Already delivered (the cursor's own event again), or not judged yet: skip it.
    Skip,
    /// A resync that continues the stream: report it and go on.
    Resynced(ResyncNotice),
    /// The error that ends a request whose outcome the stream no longer holds.
    Trailer,
}

/// How reading a connection ended.
enum Ended {
    /// The stream is complete (the request's response was delivered).
    Done,
    /// The connection dropped, or the server closed it saying when to come back; reconnect.
    Dropped,
    /// The server ended a request's stream without its response and without saying when to
    /// come back: a resume would find nothing more.
    Unanswered,
    /// The stream is not the one being followed.
    Diverged(DivergenceReason),
}

/// What a reconnect came to.
enum Reconnected {
    /// A stream to read: its first event decides a resume, or there is nothing to prove.
    Stream(Box<SseReader>),
    /// The attempt failed: wait and try again.
    Retry,
    /// Following ends here (given up, the session replaced, or no stream to follow).
    Stop,
    /// The answer proves the stream is not the one being followed.
    Diverged(DivergenceReason),
}

pub(crate) struct Follower {
    inner: Arc<Session>,
    generation: u64,
    origin: Origin,
    key: String,
    continuity: Continuity,
    attempts: Attempts,
    retry: Option<u64>,
    /// Told once the first attempt to connect is over: open, refused or failed (a refusal is
    /// then tried again with backoff, without holding up whoever waits).
    ready: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Follower {
    /// Follows a stream on its own task. `first` is the connection already open (a POST's SSE
    /// answer); without it the follower connects itself.
    pub fn spawn(
        inner: Arc<Session>,
        generation: u64,
        origin: Origin,
        first: Option<(Head, Box<SseReader>)>,
        ready: Option<tokio::sync::oneshot::Sender<()>>,
    ) {
        let key = match &origin {
            Origin::Standalone => STANDALONE.to_owned(),
            Origin::Request(id) => stream_key(id),
        };
        let attempts = Attempts::new(inner.config.backoff);
        let follower = Follower {
            inner,
            generation,
            origin,
            key,
            continuity: Continuity::Checked(StreamValidator::fresh()),
            attempts,
            retry: None,
            ready,
        };
        let span = tracing::debug_span!("follow", stream = %follower.key);
        tokio::spawn(follower.run(first.map(|(_, reader)| reader)).instrument(span));
    }

    async fn run(mut self, mut reader: Option<Box<SseReader>>) {
        // Without an open connection the first connect is immediate (and, with a cursor from a
        // checkpoint, already a resume that must be judged).
        let mut immediate = reader.is_none();
        loop {
            if let Some(connection) = reader.take() {
                let opened = tokio::time::Instant::now();
                let ended = self.read(connection).await;
                tracing::debug!(stream = %self.key, ended = ended.kind(), "connection ended");
                if opened.elapsed() >= LONG_LIVED {
                    self.attempts.refill();
                }
                match ended {
                    Ended::Done => return,
                    Ended::Unanswered => {
                        self.give_up("the server ended the request's stream without its response");
                        return;
                    }
                    Ended::Diverged(reason) => {
                        self.inner.diverge(self.generation, reason).await;
                        return;
                    }
                    Ended::Dropped => {}
                }
            }
            if !self.inner.is_current(self.generation) {
                return;
            }
            let attempt = self.reconnect(std::mem::take(&mut immediate)).await;
            if let Some(ready) = self.ready.take() {
                let _ = ready.send(());
            }
            reader = match attempt {
                Reconnected::Stream(reader) => Some(reader),
                Reconnected::Retry => None,
                Reconnected::Stop => return,
                Reconnected::Diverged(reason) => {
                    self.inner.diverge(self.generation, reason).await;
                    return;
                }
            };
        }
    }

    fn cursor(&self) -> Option<String> {
        self.inner.last_id(&self.key)
    }

    /// Waits out the backoff and reconnects.
    async fn reconnect(&mut self, immediate: bool) -> Reconnected {
        let cursor = self.cursor();
        let delay = if immediate {
            Some(std::time::Duration::ZERO)
        } else {
            self.attempts.next_delay(cursor.as_deref(), self.retry)
        };
        let Some(delay) = delay else {
            self.give_up("the stream kept closing without progress");
            return Reconnected::Stop;
        };
        if cursor.is_none() && matches!(self.origin, Origin::Request(_)) {
            // Nothing to resume from: a GET without Last-Event-ID would open an unrelated stream.
            self.give_up("the stream dropped before any event id arrived");
            return Reconnected::Stop;
        }
        tokio::time::sleep(delay).await;
        if !self.inner.is_current(self.generation) {
            return Reconnected::Stop;
        }
        let session = self.inner.session();
        let (head, reply) = match self.inner.endpoint.get(&session, cursor.as_deref()).await {
            Ok(answer) => answer,
            Err(err) => {
                tracing::debug!(%err, stream = %self.key, "reconnect failed");
                return Reconnected::Retry;
            }
        };
        let Some(cursor) = cursor else {
            // A new standalone stream: nothing to prove yet.
            return match reply {
                Reply::Sse(reader) => {
                    self.continuity = Continuity::Checked(StreamValidator::fresh());
                    Reconnected::Stream(reader)
                }
                Reply::Refused(_) if head.status == 405 => {
                    self.inner.emit(ClientEvent::Closed {
                        reason: "the server offers no standalone stream (405)".into(),
                        fatal: false,
                    });
                    Reconnected::Stop
                }
                _ => Reconnected::Retry,
            };
        };
        let checkpoint = self.inner.lineage(&self.key);
        let Some(checkpoint) = checkpoint else {
            return Reconnected::Diverged(DivergenceReason::NoCheckpoint { cursor });
        };
        let verdict = client_verdict(&checkpoint, &reconnect_of(&head, None));
        match (verdict, reply) {
            (Verdict::Diverged(d), _) => Reconnected::Diverged(DivergenceReason::Lineage(d)),
            (Verdict::Unavailable { status }, _) => {
                tracing::debug!(status, stream = %self.key, "the server cannot resume now; trying again");
                Reconnected::Retry
            }
            (Verdict::AwaitingFirstEvent, Reply::Sse(reader)) => {
                self.continuity = Continuity::Resuming { checkpoint, head };
                Reconnected::Stream(reader)
            }
            // A 2xx that is not a stream: the server cannot resume this cursor.
            (_, _) => Reconnected::Diverged(DivergenceReason::NotAStream { cursor, status: head.status }),
        }
    }

    fn give_up(&self, why: &str) {
        match &self.origin {
            Origin::Request(_) => self.inner.resolve(&self.key, Err(RequestError::OutcomeUnknown(why.to_owned()))),
            Origin::Standalone => {
                self.inner.emit(ClientEvent::Closed { reason: format!("standalone stream: {why}"), fatal: false })
            }
        }
    }

    /// Reads one connection to its end.
    async fn read(&mut self, mut reader: Box<SseReader>) -> Ended {
        loop {
            let event = match reader.next().await {
                Ok(Some(event)) => event,
                // The body ended whole: the server closed it. Unless it said when to come back (a
                // `retry` field on this stream), a request's stream is over.
                Ok(None) if matches!(self.origin, Origin::Request(_)) && reader.retry().or(self.retry).is_none() => {
                    return Ended::Unanswered;
                }
                Ok(None) | Err(ClientError::Transport(_)) => {
                    self.retry = reader.retry().or(self.retry);
                    return Ended::Dropped;
                }
                Err(err) => return Ended::Diverged(DivergenceReason::Undecodable(err.to_string())),
            };
            self.retry = reader.retry().or(self.retry);
            if !self.inner.is_current(self.generation) {
                return Ended::Done;
            }
            let done = match self.admit(&event) {
                Ok(Admit::Deliver) => self.record_and_deliver(event),
                Ok(Admit::Skip) => false,
                Ok(Admit::Resynced(notice)) => {
                    self.resynced(&event, notice);
                    false
                }
                Ok(Admit::Trailer) => self.trailer(&event),
                Err(ended) => return ended,
            };
            if done {
                return Ended::Done;
            }
        }
    }

    /// Decides what an event is to the stream being followed.
    fn admit(&mut self, event: &Event) -> Result<Admit, Ended> {
        let id = event.id.as_deref();
        let kind = event.event.as_deref();
        let accepted = match &mut self.continuity {
            Continuity::Checked(validator) => validator.accept(id, kind, event.data.as_bytes()).map_err(lineage)?,
            Continuity::Trusted => match kind {
                Some(tether_core::lineage::RESYNC_EVENT) => {
                    return Err(Ended::Diverged(DivergenceReason::UnplacedResync(event.data.clone())));
                }
                _ => Accepted::Event,
            },
            Continuity::Resuming { checkpoint, head } => {
                let first = FirstEvent { id, event: kind, data: event.data.as_bytes() };
                let verdict = client_verdict(checkpoint, &reconnect_of(head, Some(first)));
                let resumed = |verdict| ClientEvent::Resumed { id: id.unwrap_or_default().to_owned(), verdict };
                match verdict {
                    Verdict::ProvisionallyContinuous | Verdict::Resynced(_) => {
                        let mut validator = StreamValidator::resume(checkpoint);
                        let accepted = validator.accept(id, kind, event.data.as_bytes()).map_err(lineage)?;
                        self.continuity = Continuity::Checked(validator);
                        if accepted == Accepted::Event {
                            self.inner.emit(resumed(ResumeVerdict::Continuous));
                        }
                        accepted
                    }
                    Verdict::BoundaryDuplicate => {
                        self.continuity = Continuity::Checked(StreamValidator::resume(checkpoint));
                        self.inner.emit(resumed(ResumeVerdict::DuplicateSkipped));
                        return Ok(Admit::Skip);
                    }
                    Verdict::Unverifiable(why) => match self.inner.config.policy {
                        Policy::Strict => return Err(Ended::Diverged(DivergenceReason::Unverifiable(why))),
                        Policy::Trust => {
                            self.continuity = Continuity::Trusted;
                            self.inner.emit(resumed(ResumeVerdict::Unverified));
                            Accepted::Event
                        }
                    },
                    Verdict::Diverged(d) => return Err(lineage(d)),
                    // A head that was a stream (2xx) is never unavailable.
                    Verdict::AwaitingFirstEvent | Verdict::Unavailable { .. } => return Ok(Admit::Skip),
                }
            }
        };
        Ok(match accepted {
            Accepted::Event => Admit::Deliver,
            Accepted::Resync(notice) => Admit::Resynced(notice),
            Accepted::Trailer => Admit::Trailer,
        })
    }

    /// The cursor of the event just admitted, if it has an id: the validator's last (accepting
    /// an event with an id makes it that), or, on a stream followed without proof, made here.
    fn admitted(&self, event: &Event) -> Option<StreamCursor> {
        let id = event.id.as_deref()?;
        let made = || StreamCursor { last_id: ObservedId::parse(id), digest: Digest::of(id, event.data.as_bytes()) };
        Some(match &self.continuity {
            Continuity::Checked(validator) => validator
                .last()
                .map_or_else(made, |(last_id, digest)| StreamCursor { last_id: last_id.clone(), digest: *digest }),
            Continuity::Resuming { .. } | Continuity::Trusted => made(),
        })
    }

    /// A resync that continues the stream: the loss (or the end) it names is reported, and its
    /// id is the cursor from now on, committed when the application acknowledges the report
    /// (after what came before it).
    fn resynced(&mut self, event: &Event, notice: ResyncNotice) {
        metrics::counter!("tether_client_resyncs_total", "reason" => notice.reason.as_str()).increment(1);
        let id = event.id.clone().unwrap_or_default();
        let cursor = self.admitted(event).unwrap_or_else(|| StreamCursor {
            last_id: ObservedId::parse(&id),
            digest: Digest::of(&id, event.data.as_bytes()),
        });
        self.inner.arrived(&self.key, cursor.clone());
        let ack = Ack::new(&self.inner, self.generation, self.key.clone(), cursor);
        self.inner.emit(ClientEvent::Resynced { id, notice, ack });
    }

    /// The error that ends a request whose outcome the stream no longer holds (after a resync
    /// at the stream's head). `true` when it ended the followed request.
    fn trailer(&mut self, event: &Event) -> bool {
        let Origin::Request(request) = &self.origin else { return false };
        let request = request.clone();
        let Ok(Message::Response(response)) = jsonrpc::parse_message(event.data.as_bytes()) else { return false };
        if response.id.as_ref() != Some(&request) {
            return false;
        }
        let outcome = match response.outcome {
            Ok(_) => return false,
            Err(error) if error.reason() == Some("request_aborted") => Err(RequestError::Aborted(error)),
            Err(error) if error.reason() == Some("request_history_expired") => {
                Err(RequestError::OutcomeUnknown(format!("the stream no longer holds the outcome: {}", error.message)))
            }
            Err(error) => Err(RequestError::Rpc(error)),
        };
        self.inner.finish(&request, outcome);
        true
    }

    /// Records the event's cursor and delivers its message; `true` when it completes the stream.
    /// The cursor is committed to the file when the application acknowledges the message (at
    /// once for events that carry none, like the priming event).
    fn record_and_deliver(&mut self, event: Event) -> bool {
        let cursor = self.admitted(&event);
        if let Some(cursor) = &cursor {
            self.inner.arrived(&self.key, cursor.clone());
        }
        let ack = match cursor {
            Some(cursor) => Ack::new(&self.inner, self.generation, self.key.clone(), cursor),
            None => Ack::none(),
        };
        if event.data.is_empty() {
            // A priming event: nothing to process, but its id is a cursor to resume from.
            ack.done();
            return false;
        }
        let message = match jsonrpc::parse_message(event.data.as_bytes()) {
            Ok(message) => message,
            Err(err) => {
                tracing::warn!(%err, "event data is not a JSON-RPC message");
                ack.done();
                return false;
            }
        };
        let request = match &self.origin {
            Origin::Request(id) => Some(id),
            Origin::Standalone => None,
        };
        let done = matches!((request, &message), (Some(id), Message::Response(r)) if r.id.as_ref() == Some(id));
        self.inner.deliver(event.id, request, message, ack);
        done
    }
}

fn reconnect_of<'a>(head: &'a Head, first_event: Option<FirstEvent<'a>>) -> Reconnect<'a> {
    Reconnect { status: head.status, session_id: head.session_id.as_deref(), epoch: head.epoch.as_deref(), first_event }
}

fn lineage(divergence: tether_core::lineage::Divergence) -> Ended {
    Ended::Diverged(DivergenceReason::Lineage(divergence))
}

/// Reads a 2026-07-28 response stream. There is no resumption: a broken stream cancelled the
/// request.
pub(crate) async fn read_stateless(inner: Arc<Session>, id: RequestId, mut reader: Box<SseReader>) {
    let key = stream_key(&id);
    loop {
        match reader.next().await {
            Ok(Some(event)) if !event.data.is_empty() => {
                let Ok(message) = jsonrpc::parse_message(event.data.as_bytes()) else { continue };
                let response = matches!(message, Message::Response(_));
                inner.deliver(None, Some(&id), message, Ack::none());
                if response {
                    return;
                }
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                inner.resolve(&key, Err(RequestError::Cancelled));
                return;
            }
        }
    }
}
