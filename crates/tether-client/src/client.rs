//! The client's facade: connect, follow the standalone stream, send requests (keyed and
//! re-issued where their outcome is unknown), notify, close. The session it drives is
//! [`crate::session::Session`].

use std::sync::{Arc, Mutex};

use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use tether_core::idempotency::Acknowledged;
use tether_core::input_required;
use tether_core::jsonrpc::{Message, Notification, Request, RequestId, Response};
use tether_core::lifecycle::{self, Attempt, Said};
use tether_core::mcp::{Era, meta, method};
use tether_core::tasks;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument as _;

use crate::backoff::Attempts;
use crate::checkpoint::CheckpointFile;
use crate::cursors::stream_key;
use crate::follow::{Follower, Origin};
use crate::http::{Head, Reply};
use crate::session::{Keying, Session, parse_response, refused};
use crate::{Ack, ClientConfig, ClientError, ClientEvent, DivergenceReason, RequestError};

/// Told the id of each attempt of a request as it goes out.
pub(crate) type OnAttempt = Box<dyn Fn(&RequestId) + Send + Sync>;

/// What a cancellable request has in flight: the id of its current attempt, and the task it
/// became, if the server answered it with one.
#[derive(Default)]
pub(crate) struct InFlight {
    request: Mutex<Option<RequestId>>,
    task: Mutex<Option<String>>,
    on_attempt: Option<OnAttempt>,
    input: Input,
}

/// Who answers what a 2026-07-28 server asks before it completes a request (SEP-2322).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Input {
    /// The configured hooks, round after round, until the result is complete.
    #[default]
    Hooks,
    /// Whoever sent the request: its `input_required` result is its outcome. A 2026-07-28
    /// application behind a link runs its own rounds.
    Caller,
}

impl InFlight {
    fn set_request(&self, id: &RequestId) {
        if let Some(on_attempt) = &self.on_attempt {
            on_attempt(id);
        }
        *self.request.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(id.clone());
    }

    pub(crate) fn set_task(&self, id: &str) {
        *self.task.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(id.to_owned());
    }

    fn take(&self) -> (Option<RequestId>, Option<String>) {
        let request = self.request.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        (request, self.task.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take())
    }
}

/// An MCP client connection. Cheap to clone; all clones share one session.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Session>,
}

impl Client {
    /// Connects: resumes the session of the checkpoint file if it holds one, else initializes.
    /// Returns the client and the stream of events for the application.
    pub async fn connect(config: ClientConfig) -> Result<(Client, mpsc::UnboundedReceiver<ClientEvent>), ClientError> {
        let file = match &config.checkpoint_file {
            Some(path) => CheckpointFile::load(path).map_err(|e| ClientError::Checkpoint(e.to_string()))?,
            None => CheckpointFile::default(),
        };
        let (events, rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Session::new(config, file, events)?);
        if !inner.has_session() {
            inner.initialize().await?;
        }
        Ok((Client { inner }, rx))
    }

    /// The current session id, if the server uses sessions.
    pub fn session_id(&self) -> Option<String> {
        self.inner.session().session_id
    }

    /// Follows the standalone (GET) stream: resumes it from the checkpoint if there is a cursor,
    /// else opens a new one. Returns once the first attempt is over: open, so server messages
    /// sent after this are not missed, or refused or failed, which the follower then tries again
    /// with backoff in the background. Its messages arrive as [`ClientEvent`]s.
    pub async fn follow_standalone(&self) {
        let Some(generation) = self.inner.start_standalone() else { return };
        let (ready, opened) = oneshot::channel();
        Follower::spawn(Arc::clone(&self.inner), generation, Origin::Standalone, None, Some(ready));
        // An error only means the follower stopped before connecting; it reported why.
        let _ = opened.await;
    }

    /// Sends a request and waits for its outcome. Notifications on its stream arrive as events.
    /// A `tools/call` of a tool not annotated idempotent carries an idempotency key (if the
    /// configuration and the server allow) and is re-issued until its real outcome arrives.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, RequestError> {
        self.send(method, params, Keying::Auto, None).await
    }

    /// Sends a request under an idempotency key whatever its method, so it runs at most once
    /// however often it is sent, and re-issues it until its real outcome arrives. Without the
    /// server's support it goes out unkeyed (and a [`ClientEvent::Unkeyed`] says so).
    pub async fn request_keyed(&self, method: &str, params: Value) -> Result<Value, RequestError> {
        self.send(method, params, Keying::Always, None).await
    }

    /// Sends a request like [`Client::request`], until `cancelled` resolves: then the server is
    /// told (`tasks/cancel` if the request became a task, else `notifications/cancelled` for the
    /// attempt in flight) and the request ends with [`RequestError::CancelledByCaller`].
    pub async fn request_cancellable(
        &self,
        method: &str,
        params: Value,
        cancelled: impl Future<Output = ()>,
    ) -> Result<Value, RequestError> {
        self.request_traced(method, params, cancelled, None, Input::Hooks).await
    }

    /// [`Client::request_cancellable`], telling `on_attempt` the id of each attempt as it goes
    /// out: what the server sends on that attempt's stream arrives with it as its origin.
    /// `input` says who answers what the server asks before it completes the request.
    pub(crate) async fn request_traced(
        &self,
        method: &str,
        params: Value,
        cancelled: impl Future<Output = ()>,
        on_attempt: Option<OnAttempt>,
        input: Input,
    ) -> Result<Value, RequestError> {
        let in_flight = InFlight { on_attempt, input, ..InFlight::default() };
        {
            let sent = self.send(method, params, Keying::Auto, Some(&in_flight));
            tokio::pin!(sent);
            tokio::select! {
                outcome = &mut sent => return outcome,
                () = cancelled => {}
            }
        }
        // The attempt's wait was dropped with it; what is left is to tell the server.
        match in_flight.take() {
            (_, Some(task)) => {
                if let Err(err) = self.send_once(tasks::method::CANCEL, json!({"taskId": task}), None).await {
                    tracing::debug!(%err, "could not cancel a task");
                }
            }
            (Some(id), None) => {
                if let Err(err) = self.cancel(&id, "cancelled by the client").await {
                    tracing::debug!(%err, "could not tell the server of a cancellation");
                }
            }
            (None, None) => {}
        }
        Err(RequestError::CancelledByCaller)
    }

    /// Sends a request until its result is complete: a 2026-07-28 server may answer that it
    /// needs input first (SEP-2322); each input request is answered by the configured hooks (as
    /// the server's own requests are in sessions) and the request sent again with the
    /// answers and the server's state, at most [`input_required::MAX_ROUNDS`] times. Each round is a request
    /// of its own, with its own idempotency key. A result that is a task (SEP-2663) is followed
    /// until the task finishes: the task's result is the request's.
    async fn send(
        &self,
        method: &str,
        mut params: Value,
        keying: Keying,
        in_flight: Option<&InFlight>,
    ) -> Result<Value, RequestError> {
        if method == method::TOOLS_CALL
            && let Some(why) =
                params.get("name").and_then(Value::as_str).and_then(|tool| self.inner.excluded_tool(tool))
        {
            return Err(RequestError::Client(ClientError::Protocol(format!("the tool is excluded: {why}"))));
        }
        for _ in 0..input_required::MAX_ROUNDS {
            let result = self.send_round(method, params.clone(), keying, in_flight).await?;
            if !self.inner.is_stateless() {
                return Ok(result);
            }
            if result.get("resultType").and_then(Value::as_str) == Some(tasks::RESULT_TYPE) {
                return crate::task::follow(self, &result, in_flight).await;
            }
            if !input_required::asks(&result) || in_flight.is_some_and(|f| f.input == Input::Caller) {
                return Ok(result);
            }
            let mut answers = serde_json::Map::new();
            for (key, asked, asked_params) in input_required::requests(&result) {
                let answer = self.inner.config.hooks.answer(asked, asked_params).await.map_err(RequestError::Rpc)?;
                answers.insert(key.to_owned(), answer);
            }
            let Value::Object(fields) = &mut params else {
                return Err(RequestError::Client(ClientError::Protocol(
                    "the server asked for input on a request without named params".into(),
                )));
            };
            fields.insert(input_required::RESPONSES.into(), Value::Object(answers));
            match result.get(input_required::STATE) {
                Some(state) => fields.insert(input_required::STATE.into(), state.clone()),
                None => fields.remove(input_required::STATE),
            };
        }
        Err(RequestError::Client(ClientError::Protocol(format!(
            "the server still asked for input after {} rounds",
            input_required::MAX_ROUNDS
        ))))
    }

    /// Sends one round of a request with its key, if it gets one, and re-issues it while its
    /// outcome is unknown; records in `in_flight` the id of each attempt as it goes out.
    async fn send_round(
        &self,
        method: &str,
        mut params: Value,
        keying: Keying,
        in_flight: Option<&InFlight>,
    ) -> Result<Value, RequestError> {
        let mut key = self.inner.key_for(method, &params, keying);
        match (&key, &mut params) {
            (None, _) => {}
            (Some((key, _)), Value::Object(_)) => params["_meta"][meta::IDEMPOTENCY_KEY] = json!(key.as_str()),
            (Some((key, _)), Value::Null) => params = json!({"_meta": {meta::IDEMPOTENCY_KEY: key.as_str()}}),
            // Positional params have no `_meta`: MCP requests never take them.
            (Some(_), _) => key = None,
        }
        let Some((key, records)) = &key else { return self.send_once(method, params, in_flight).await };
        let mut reissues = Attempts::new(self.inner.config.backoff);
        let mut attempt = 0;
        // The key's claim as the server acknowledged it, shown on every re-send: records that
        // went back in time refuse the key instead of running it again.
        let claimed: Mutex<Option<Acknowledged>> = Mutex::new(None);
        let mut attempts = lifecycle::Attempts::default();
        // Why the first attempt that may have run may have: what the last attempt says cannot
        // take that back.
        let mut may_have_run: Option<String> = None;
        loop {
            let mut params = params.clone();
            if let Some(acknowledged) = claimed.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).as_ref() {
                params["_meta"][meta::IDEMPOTENCY_CLAIM] = acknowledged.to_meta();
            }
            let outcome = match self.send_attempt(method, params, in_flight, Some(&claimed)).await {
                // The key's record went back in time, or went while the request ran: whether it
                // ran is unknown, and a re-send could run it again.
                Err(RequestError::Rpc(error))
                    if matches!(error.reason(), Some("records_regressed" | "idempotency_record_lost")) =>
                {
                    return Err(RequestError::OutcomeUnknown(format!("the server's {}", error.message)));
                }
                // The server's store failed under this attempt, before or after it ran (a Redis
                // failing over): the key makes a re-send safe, and the re-send finds out.
                Err(RequestError::Rpc(error)) if error.reason() == Some("store_unavailable") => {
                    Err(RequestError::OutcomeUnknown(format!("the server's store was unavailable ({})", error.message)))
                }
                // Refused "not now" without a reason to read (a balancer's 503, a gateway's 504
                // after the request went on, a body cut on the way): it may have run, and the key
                // makes a re-send safe.
                Err(RequestError::Client(ClientError::Refused { status, message }))
                    if tether_core::lineage::is_unavailable(status) =>
                {
                    Err(RequestError::OutcomeUnknown(format!("the server answered {status}: {message}")))
                }
                outcome => outcome,
            };
            let (ended, reason) = match &outcome {
                Err(RequestError::NotExecuted(reason)) => (Attempt::NotExecuted, reason.clone()),
                Err(RequestError::OutcomeUnknown(reason)) => (Attempt::MayHaveRun, reason.clone()),
                Err(RequestError::Cancelled) => (Attempt::MayHaveRun, "the response stream broke".to_owned()),
                Err(RequestError::Aborted(error)) => {
                    (Attempt::MayHaveRun, format!("its server stopped before it finished: {}", error.message))
                }
                _ => return outcome,
            };
            attempts.record(ended);
            let outcome = match (attempts.verdict(ended), outcome) {
                (Said::OutcomeUnknown, Err(RequestError::NotExecuted(_) | RequestError::OutcomeUnknown(_))) => {
                    Err(RequestError::OutcomeUnknown(unknown_after(may_have_run.as_deref(), ended, &reason)))
                }
                (_, outcome) => outcome,
            };
            if ended == Attempt::MayHaveRun && may_have_run.is_none() {
                may_have_run = Some(reason.clone());
            }
            let Some(delay) = reissues.next_delay(None, None) else { return outcome };
            tokio::time::sleep(delay).await;
            // A re-initialization under way decides where the next attempt goes. The session that
            // replaced a diverged one may be served by other records (a restarted memory store, a
            // replica with its own): a re-issue there could run the request again.
            drop(self.inner.settled().await);
            if self.inner.idempotency_records().as_ref() != Some(records) {
                return outcome;
            }
            attempt += 1;
            metrics::counter!("tether_client_reissues_total").increment(1);
            self.inner.emit(ClientEvent::Reissued { key: key.to_string(), attempt, reason });
        }
    }

    /// Sends a request once and waits for its outcome. A request without params is sent
    /// without the member (`Value::Null` stands for none).
    pub(crate) async fn send_once(
        &self,
        method: &str,
        params: Value,
        in_flight: Option<&InFlight>,
    ) -> Result<Value, RequestError> {
        self.send_attempt(method, params, in_flight, None).await
    }

    /// [`Client::send_once`], keeping in `claimed` the idempotency key's claim the response head
    /// acknowledges, if it does.
    async fn send_attempt(
        &self,
        method: &str,
        params: Value,
        in_flight: Option<&InFlight>,
        claimed: Option<&Mutex<Option<Acknowledged>>>,
    ) -> Result<Value, RequestError> {
        let inner = &self.inner;
        // A re-initialization in progress has no session yet: wait for it, and hold it off until
        // this request is registered with the session it goes out on.
        let serial = inner.settled().await;
        let id = inner.next_id();
        if let Some(in_flight) = in_flight {
            in_flight.set_request(&id);
        }
        let params = (!params.is_null()).then_some(params);
        let request = Request { id: id.clone(), method: method.to_owned(), params };
        let key = stream_key(&id);
        let (tx, rx) = oneshot::channel();
        let (era, session, generation) = inner.register(&id, &key, method, tx).map_err(RequestError::Client)?;
        drop(serial);
        // An abandoned wait (the caller dropped this future) leaves nothing waiting behind.
        let _waiting = inner.waiting(&key);
        inner.persist();
        // The trace context in `_meta` goes in the HTTP header too, for what traces HTTP.
        let trace = request.params.as_ref().and_then(tether_core::trace_context::TraceContext::from_meta);
        let (body, mut headers) = match era {
            Era::Sessionful => (Message::Request(request).to_vec(), HeaderMap::new()),
            Era::Stateless => inner.stateless_request(request),
        };
        if let Some(value) = trace.and_then(|trace| reqwest::header::HeaderValue::from_str(&trace.traceparent()).ok()) {
            headers.insert(tether_core::trace_context::TRACEPARENT, value);
        }
        // What the HTTP client logs while the attempt goes out carries its id.
        let post = inner.endpoint.post(&session, body, headers).instrument(tracing::debug_span!("attempt", id = %id));
        match post.await {
            // Nothing of it was written, or it was refused before the server acted on it: it
            // did not run.
            Err(ClientError::NotSent(why) | ClientError::Untrusted(why) | ClientError::Unauthorized(why)) => {
                inner.resolve(&key, Err(RequestError::NotExecuted(why)))
            }
            Err(err) => inner
                .resolve(&key, Err(RequestError::OutcomeUnknown(format!("the request may not have arrived: {err}")))),
            Ok((head, reply)) => {
                if let (Some(claimed), Some(acknowledged)) = (claimed, &head.claimed) {
                    *claimed.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(acknowledged.clone());
                }
                self.handle_reply(era, generation, &key, &id, head, reply).await
            }
        }
        let outcome = rx.await.unwrap_or(Err(RequestError::Client(ClientError::Closed)));
        tracing::debug!(attempt = %id, outcome = ?outcome.as_ref().map(|_| "result"), "attempt ended");
        if method == method::TOOLS_LIST
            && let Ok(result) = &outcome
        {
            inner.learn_tools(result);
        }
        outcome
    }

    async fn handle_reply(&self, era: Era, generation: u64, key: &str, id: &RequestId, head: Head, reply: Reply) {
        let inner = &self.inner;
        match reply {
            Reply::Json(bytes) => match parse_response(&bytes) {
                Ok(response) => inner.deliver(None, None, Message::Response(response), Ack::none()),
                Err(err) => inner.resolve(key, Err(RequestError::Client(err))),
            },
            Reply::Sse(reader) if era == Era::Stateless => {
                let inner = Arc::clone(inner);
                let id = id.clone();
                tokio::spawn(async move { crate::follow::read_stateless(inner, id, reader).await });
            }
            Reply::Sse(reader) => {
                Follower::spawn(Arc::clone(inner), generation, Origin::Request(id.clone()), Some((head, reader)), None);
            }
            Reply::Accepted => inner.resolve(
                key,
                Err(RequestError::Client(ClientError::Protocol("a request was answered with 202".into()))),
            ),
            Reply::Refused(body) if head.status == 404 && era == Era::Sessionful => {
                inner.resolve(key, Err(RequestError::NotExecuted("the session is gone (404)".into())));
                let reason =
                    DivergenceReason::Refused { status: head.status, detail: refused(&head, &body).to_string() };
                inner.diverge(generation, reason).await;
            }
            Reply::Refused(body) => {
                let error = match parse_response(&body) {
                    Ok(Response { outcome: Err(error), .. }) => RequestError::Rpc(error),
                    _ => RequestError::Client(refused(&head, &body)),
                };
                inner.resolve(key, Err(error));
            }
        }
    }

    /// Calls a tool.
    pub async fn call_tool(&self, name: &str, arguments: Value) -> Result<Value, RequestError> {
        self.request(method::TOOLS_CALL, json!({"name": name, "arguments": arguments})).await
    }

    /// Follows task `task_id` (SEP-2663) to its outcome: the task a call of an earlier process
    /// became, say. Its event stream resumes after the cursor the checkpoint file kept for it, so
    /// what this process is handed continues exactly what the earlier one was.
    pub async fn follow_task(&self, task_id: &str) -> Result<Value, RequestError> {
        crate::task::follow(self, &json!({"taskId": task_id}), None).await
    }

    /// Where task `id`'s event stream resumes, if it is being followed.
    pub(crate) fn task_cursor(&self, id: &str) -> Option<crate::TaskCursor> {
        self.inner.task_cursor(id)
    }

    /// Records where task `id`'s stream resumes (`None`: it finished), in the checkpoint file too.
    pub(crate) fn task_moved(&self, id: &str, cursor: Option<crate::TaskCursor>) {
        self.inner.task_moved(id, cursor);
    }

    /// Cancels a request the client sent (`notifications/cancelled`).
    pub async fn cancel(&self, id: &RequestId, reason: &str) -> Result<(), ClientError> {
        self.notify(method::CANCELLED, json!({"requestId": id.to_value(), "reason": reason})).await
    }

    /// Sends a notification to the server (`notifications/roots/list_changed`, ...); `Null`
    /// params are left out.
    pub async fn notify(&self, method: &str, params: Value) -> Result<(), ClientError> {
        let params = (!params.is_null()).then_some(params);
        let body = Message::Notification(Notification { method: method.to_owned(), params }).to_vec();
        self.inner.endpoint.post(&self.inner.session(), body, HeaderMap::new()).await.map(|_| ())
    }

    /// Whether the client speaks 2026-07-28 to its server (which has no sessions), rather than a
    /// revision of the handshake era.
    pub fn is_stateless(&self) -> bool {
        self.inner.is_stateless()
    }

    /// The server's answer to the current session's `initialize` (`protocolVersion`,
    /// `capabilities`, `serverInfo`, `instructions`); for 2026-07-28, its `server/discover`
    /// result.
    pub fn server(&self) -> Value {
        self.inner.server()
    }

    /// Sends a 2026-07-28 request once and hands back the raw reply, for a stream read by its
    /// own rules (a task's).
    pub(crate) async fn post_stateless(&self, method: &str, params: Value) -> Result<Reply, ClientError> {
        let request = Request { id: self.inner.next_id(), method: method.to_owned(), params: Some(params) };
        let (body, headers) = self.inner.stateless_request(request);
        let (_, reply) = self.inner.endpoint.post(&self.inner.session(), body, headers).await?;
        Ok(reply)
    }

    /// The client's configuration.
    pub(crate) fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// Tells the application `event`.
    pub(crate) fn emit(&self, event: ClientEvent) {
        self.inner.emit(event);
    }

    /// Ends the session (DELETE) and stops every stream.
    pub async fn close(&self) {
        let session = self.inner.close();
        if session.session_id.is_some() {
            self.inner.endpoint.delete(&session).await;
        }
    }
}

/// What is said of a request whose outcome is unknown once an attempt ended as `last` for
/// `reason`, when an earlier attempt may have run for `earlier`: the earlier attempt first,
/// since nothing the last one says can take it back.
fn unknown_after(earlier: Option<&str>, last: Attempt, reason: &str) -> String {
    match (earlier, last) {
        (None, _) => reason.to_owned(),
        (Some(earlier), Attempt::NotExecuted) => {
            format!("an earlier attempt may have run ({earlier}), and the last was not executed: {reason}")
        }
        (Some(earlier), _) => format!("an earlier attempt may have run ({earlier}), and the last may too: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_outcome_says_first_why_an_earlier_attempt_may_have_run() {
        assert_eq!(unknown_after(None, Attempt::MayHaveRun, "the stream broke"), "the stream broke");
        let after_progress = unknown_after(
            Some("the stream kept closing without progress"),
            Attempt::MayHaveRun,
            "the request may not have arrived: connection reset",
        );
        assert_eq!(
            after_progress,
            "an earlier attempt may have run (the stream kept closing without progress), and the last may too: \
             the request may not have arrived: connection reset"
        );
        assert!(
            unknown_after(Some("its server stopped"), Attempt::NotExecuted, "connection refused")
                .starts_with("an earlier attempt may have run (its server stopped), and the last was not executed")
        );
    }
}
