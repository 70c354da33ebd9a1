//! `tether connect`: a stdio MCP client (a desktop application) talks to a Streamable HTTP
//! server through tether's client, a drop-in for bridges such as `mcp-remote`.
//!
//! What the stdio client writes (one JSON-RPC message per line) goes through a
//! [`MessageLink`]; what the server sends comes back the same way. Every reconnect is proven
//! continuous or the server's session is replaced by a new one, initialized with the stdio
//! client's own `initialize` params, so the client keeps working; a `notifications/message`
//! (level `warning`, logger `tether`) tells it that what the old session held was reset. A
//! request never hangs: it ends with its real result (re-issued under its idempotency key when
//! the server offers keys) or with an error whose `data.reason` says why: `not_executed` (it
//! was refused with its session, so it never ran), `outcome_unknown` (it may have run),
//! `request_aborted` (the server died under it).

use std::collections::VecDeque;
use std::time::Duration;

use serde_json::json;
use tether_client::link::{FromServer, MessageLink};
use tether_client::{ClientConfig, ClientEvent};
use tether_core::jsonrpc::{self, ErrorObject, Message, Notification, RequestId, Response, code};
use tether_core::mcp::method;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::sync::mpsc;

use crate::lines::{LinesEnded, next_line, write_messages};

/// How long past the timeout a connecting request waits for the handshake to fail with its
/// cause before the bridge answers `connect_failed` without one.
const CONNECT_GRACE: Duration = Duration::from_millis(500);

/// How long requests still running get to finish once the stdio client closed its input.
const DRAIN: Duration = Duration::from_secs(60);

/// What a bridge carried, counted when it ends.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    /// Requests from the stdio client.
    pub requests: u64,
    /// Of their answers: results.
    pub results: u64,
    /// Of their answers: errors whose reason is `outcome_unknown` (the request may have run).
    pub outcome_unknown: u64,
    /// Of their answers: errors whose reason is `not_executed` (refused with its session).
    pub not_executed: u64,
    /// Of their answers: errors whose reason is `request_aborted` (the server died under it).
    pub aborted: u64,
    /// Of their answers: any other error.
    pub errors: u64,
    /// Notifications and requests from the server.
    pub from_server: u64,
    /// Resumes proven continuous, or reported unverified under the trust policy.
    pub resumed: u64,
    /// Divergences found.
    pub divergences: u64,
    /// Sessions replaced by a new one.
    pub reinitialized: u64,
    /// Keyed requests re-sent.
    pub reissued: u64,
}

impl Counts {
    fn answered(&mut self, response: &Response) {
        match &response.outcome {
            Ok(_) => self.results += 1,
            Err(error) => match error.reason() {
                Some("outcome_unknown") => self.outcome_unknown += 1,
                Some("not_executed") => self.not_executed += 1,
                Some("request_aborted") => self.aborted += 1,
                _ => self.errors += 1,
            },
        }
    }

    /// Requests not answered yet.
    pub fn pending(&self) -> u64 {
        let answered = self.results + self.outcome_unknown + self.not_executed + self.aborted + self.errors;
        self.requests.saturating_sub(answered)
    }
}

/// Carries messages between the stdio client on `input`/`output` and the server `config`
/// names, until the client closes its input (and what it asked is answered, for at most a
/// minute) or the client can no longer reach the server. With `timeout`, each of the stdio
/// client's requests is answered within it: one the server has not answered by then is
/// answered `outcome_unknown` (it may have run) and cancelled, and an `initialize` that could
/// not connect is answered `connect_failed`, with the cause (connection refused, DNS, TLS).
pub async fn bridge(
    mut config: ClientConfig,
    timeout: Option<Duration>,
    input: impl AsyncRead + Unpin + Send + 'static,
    output: impl AsyncWrite + Unpin + Send + 'static,
) -> Counts {
    // A handshake that cannot succeed in time fails with its cause, not only with the time.
    if config.connect_timeout.is_none() {
        config.connect_timeout = timeout;
    }
    let (mut link, mut from_server, mut events) = MessageLink::new(config);
    // Bounded: an application that stops reading stdout holds the server's messages back, not
    // the bridge's memory.
    let (to_client, to_client_rx) = mpsc::channel::<Message>(crate::upstream::LINK_QUEUE);
    let writer = tokio::spawn(write_messages(to_client_rx, output));
    let (lines_tx, mut lines) = mpsc::channel::<Vec<u8>>(64);
    tokio::spawn(read_lines(input, lines_tx));
    let mut counts = Counts::default();
    let mut input_open = true;
    let drained = tokio::time::sleep(Duration::MAX);
    tokio::pin!(drained);
    let mut deadlines = Deadlines::default();
    loop {
        if !input_open && counts.pending() == 0 {
            break;
        }
        let overdue = deadlines.next();
        tokio::select! {
            line = lines.recv(), if input_open => match line {
                Some(line) => match jsonrpc::parse_message(&line) {
                    Ok(message) => {
                        let request = match &message {
                            Message::Request(request) => Some(request.id.clone()),
                            _ => None,
                        };
                        counts.requests += u64::from(request.is_some());
                        // A handshake, or a 2026-07-28 request that comes first, connects the
                        // link and waits for it here: within the timeout too.
                        let sent = link.send(message);
                        let (Some(id), Some(timeout)) = (request, timeout) else {
                            if sent.await.is_err() {
                                tracing::warn!("the server can no longer be reached");
                            }
                            continue;
                        };
                        let deadline = tokio::time::Instant::now() + timeout;
                        // The handshake gives up by the deadline itself, with its cause; this
                        // wait, a moment longer, only backs it up.
                        match tokio::time::timeout_at(deadline + CONNECT_GRACE, sent).await {
                            Ok(sent) => {
                                deadlines.add(id, deadline);
                                if sent.is_err() {
                                    tracing::warn!("the server can no longer be reached");
                                }
                            }
                            Err(_) => {
                                deadlines.expire(&id);
                                let why = format!("could not connect to the server within {timeout:?}");
                                let _ = to_client.send(own_answer(&mut counts, id, why, "connect_failed")).await;
                            }
                        }
                    }
                    Err(err) => {
                        let error = ErrorObject::with_reason(code::PARSE_ERROR, err.to_string(), "parse_error");
                        let _ = to_client.send(Message::Response(Response { id: None, outcome: Err(error) })).await;
                    }
                },
                None => {
                    input_open = false;
                    drained.as_mut().reset(tokio::time::Instant::now() + DRAIN);
                }
            },
            message = from_server.recv() => match message {
                Some(FromServer { message, .. }) => {
                    match &message {
                        Message::Response(response) => {
                            if response.id.as_ref().is_some_and(|id| !deadlines.answered(id)) {
                                // Answered already, as overdue.
                                continue;
                            }
                            counts.answered(response);
                        }
                        _ => counts.from_server += 1,
                    }
                    let _ = to_client.send(message).await;
                }
                None => break,
            },
            id = overdue => {
                deadlines.expire(&id);
                let within = timeout.map(|timeout| format!(" within {timeout:?}")).unwrap_or_default();
                let why = format!("no answer from the server{within}: the request may have run");
                let _ = to_client.send(own_answer(&mut counts, id.clone(), why, "outcome_unknown")).await;
                let cancel = Notification {
                    method: method::CANCELLED.into(),
                    params: Some(json!({"requestId": id, "reason": "no answer within the bridge's timeout"})),
                };
                let _ = link.send(Message::Notification(cancel)).await;
            },
            event = events.recv() => match event {
                Some(event) => {
                    if note(&mut counts, &event, &to_client) {
                        break;
                    }
                }
                None => break,
            },
            () = &mut drained => {
                tracing::warn!(pending = counts.pending(), "requests still running when the bridge stopped waiting");
                break;
            }
        }
    }
    link.close().await;
    drop(to_client);
    let _ = writer.await;
    counts
}

/// The bridge's own answer to the stdio client's request `id`, counted: an error saying `why`,
/// with `reason`.
fn own_answer(counts: &mut Counts, id: RequestId, why: String, reason: &str) -> Message {
    let response = Response { id: Some(id), outcome: Err(ErrorObject::with_reason(code::INTERNAL_ERROR, why, reason)) };
    counts.answered(&response);
    Message::Response(response)
}

/// When each of the stdio client's requests must be answered, under a timeout.
#[derive(Default)]
struct Deadlines {
    /// Requests waiting for their answer, with when it must come.
    waiting: Vec<(tokio::time::Instant, RequestId)>,
    /// The newest requests answered as overdue (at most [`MAX_OVERDUE`]): an answer the server
    /// had already sent when the request was cancelled is dropped.
    overdue: VecDeque<RequestId>,
}

/// Most overdue requests remembered: a cancelled request gets no answer, so only those in
/// flight at their cancellation are ever looked up.
const MAX_OVERDUE: usize = 1_024;

impl Deadlines {
    fn add(&mut self, id: RequestId, at: tokio::time::Instant) {
        self.waiting.push((at, id));
    }

    /// Whether the server's answer to `id` is to be delivered: `false` if the request was
    /// answered as overdue already.
    fn answered(&mut self, id: &RequestId) -> bool {
        self.waiting.retain(|(_, waiting)| waiting != id);
        match self.overdue.iter().position(|overdue| overdue == id) {
            Some(index) => {
                self.overdue.remove(index);
                false
            }
            None => true,
        }
    }

    /// Resolves with the request whose deadline passes first (never, if none waits).
    fn next(&self) -> impl Future<Output = RequestId> + use<> {
        let first = self.waiting.iter().min_by_key(|(at, _)| *at).cloned();
        async move {
            match first {
                Some((at, id)) => {
                    tokio::time::sleep_until(at).await;
                    id
                }
                None => std::future::pending().await,
            }
        }
    }

    /// Takes `id` as answered overdue.
    fn expire(&mut self, id: &RequestId) {
        self.waiting.retain(|(_, waiting)| waiting != id);
        if self.overdue.len() == MAX_OVERDUE {
            self.overdue.pop_front();
        }
        self.overdue.push_back(id.clone());
    }
}

/// Counts what tether observed, and tells the stdio client when its session was replaced.
/// Returns whether the bridge must stop.
fn note(counts: &mut Counts, event: &ClientEvent, to_client: &mpsc::Sender<Message>) -> bool {
    tracing::debug!(?event, "client");
    match event {
        ClientEvent::Resumed { .. } => counts.resumed += 1,
        ClientEvent::Divergence { reason } => {
            counts.divergences += 1;
            tracing::warn!(kind = reason.kind(), %reason, "divergence");
        }
        ClientEvent::Reissued { .. } => counts.reissued += 1,
        ClientEvent::Reinitialized { session } => {
            counts.reinitialized += 1;
            let warning = Notification {
                method: method::MESSAGE.into(),
                params: Some(json!({
                    "level": "warning",
                    "logger": "tether",
                    "data": format!(
                        "the server's session could not be continued and was replaced by a new one ({session}): \
                         whatever the old session held (subscriptions, state of earlier calls) was reset"
                    ),
                })),
            };
            // Dropped if the application has a full queue unread: it hears of the new session
            // from what follows anyway.
            let _ = to_client.try_send(Message::Notification(warning));
        }
        ClientEvent::Closed { reason, fatal: true } => {
            tracing::error!(%reason, "the server can no longer be reached");
            return true;
        }
        _ => {}
    }
    false
}

/// Hands on the stdio client's lines until it closes its input; a line too long to hold ends it.
async fn read_lines(input: impl AsyncRead + Unpin, lines: mpsc::Sender<Vec<u8>>) {
    let mut reader = BufReader::new(input);
    loop {
        match next_line(&mut reader).await {
            Ok(line) => {
                if lines.send(line).await.is_err() {
                    return;
                }
            }
            Err(ended) => {
                if !matches!(ended, LinesEnded::Closed) {
                    tracing::error!(%ended, "the client's input ended");
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_overdue_request_is_answered_once_and_the_earliest_deadline_goes_first() {
        let now = tokio::time::Instant::now();
        let mut deadlines = Deadlines::default();
        deadlines.add(RequestId::Number(1), now + Duration::from_secs(2));
        deadlines.add(RequestId::Number(2), now + Duration::from_secs(1));
        deadlines.add(RequestId::Number(3), now + Duration::from_secs(3));
        assert_eq!(deadlines.next().await, RequestId::Number(2));
        deadlines.expire(&RequestId::Number(2));
        assert_eq!(deadlines.next().await, RequestId::Number(1), "the expired one waits no more, the others do");
        assert!(deadlines.answered(&RequestId::Number(1)), "answered in time");
        assert_eq!(deadlines.next().await, RequestId::Number(3), "the answered one waits no more, the others do");
        assert!(!deadlines.answered(&RequestId::Number(2)), "its late answer is dropped");
        assert!(deadlines.answered(&RequestId::Number(3)));
        assert!(
            tokio::time::timeout(Duration::from_secs(60), deadlines.next()).await.is_err(),
            "nothing waits any more"
        );
        for id in 0..=MAX_OVERDUE as i64 {
            deadlines.expire(&RequestId::Number(id));
        }
        assert_eq!(deadlines.overdue.len(), MAX_OVERDUE, "bounded");
        assert!(deadlines.answered(&RequestId::Number(0)), "the oldest is forgotten");
    }
}
