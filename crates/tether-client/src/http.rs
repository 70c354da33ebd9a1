//! The HTTP exchanges of Streamable HTTP: POST a message, GET a stream, DELETE a session, and
//! read an SSE body event by event.

use std::sync::Arc;

use bytes::Bytes;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue};
use tether_core::idempotency::Acknowledged;
use tether_core::mcp::header;
use tether_core::sse::{Decoder, Event};

use crate::ClientError;
use crate::oauth::{Authorizer, Challenge, Credential};

/// What the server's response head said about the session, and about a keyed request's claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Head {
    pub status: u16,
    pub session_id: Option<String>,
    pub epoch: Option<String>,
    /// The idempotency key's claim, as the server's records acknowledge it.
    pub claimed: Option<Acknowledged>,
}

impl Head {
    fn of(response: &reqwest::Response) -> Head {
        let text = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        Head {
            status: response.status().as_u16(),
            session_id: text(header::SESSION_ID),
            epoch: text(header::REPLAY_EPOCH),
            claimed: text(header::IDEMPOTENCY_CLAIM).as_deref().and_then(Acknowledged::from_header),
        }
    }
}

/// The body of a response, by kind.
pub(crate) enum Reply {
    /// 202 or another success without a body.
    Accepted,
    /// A JSON body.
    Json(Bytes),
    /// An SSE stream.
    Sse(Box<SseReader>),
    /// An error status, with the body for its reason.
    Refused(Bytes),
}

/// The session headers a request carries.
#[derive(Debug, Clone, Default)]
pub(crate) struct SessionHeaders {
    pub session_id: Option<String>,
    pub protocol_version: Option<String>,
}

impl SessionHeaders {
    fn apply(&self, mut headers: HeaderMap) -> HeaderMap {
        let mut put = |name: &'static str, value: &Option<String>| {
            if let Some(value) = value.as_deref().and_then(|v| v.parse().ok()) {
                headers.insert(name, value);
            }
        };
        put(header::SESSION_ID, &self.session_id);
        put(header::PROTOCOL_VERSION, &self.protocol_version);
        headers
    }
}

/// How many refusals of its credentials one request answers (refreshing, stepping up,
/// authorizing) before the refusal is its outcome.
const MAX_CHALLENGES_PER_REQUEST: u32 = 3;

/// One server endpoint.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    pub http: reqwest::Client,
    pub url: String,
    /// How long a POST may go unwritten before it is given up ([`ClientError::NotSent`]), and a
    /// GET or DELETE may go unanswered.
    pub unsent_timeout: std::time::Duration,
    /// Where requests get their access tokens, if the server wants them.
    pub authorizer: Option<Arc<Authorizer>>,
}

impl Endpoint {
    /// POSTs one JSON-RPC message (or batch), with extra headers (2026-07-28 metadata). A
    /// refusal of its credentials is answered and the message sent again: the server refused it
    /// before acting on it.
    pub async fn post(
        &self,
        session: &SessionHeaders,
        body: Vec<u8>,
        extra: HeaderMap,
    ) -> Result<(Head, Reply), ClientError> {
        let body = Bytes::from(body);
        if self.authorizer.is_none() {
            return classify(self.post_once(session, body, extra, None).await?).await;
        }
        let mut challenges = 0;
        loop {
            let token = self.token().await;
            let response = self.post_once(session, body.clone(), extra.clone(), token.as_ref()).await?;
            if !self.challenged(&response, token.as_ref(), &mut challenges).await? {
                return classify(response).await;
            }
        }
    }

    /// The access token requests carry now, if any.
    async fn token(&self) -> Option<Credential> {
        match &self.authorizer {
            Some(authorizer) => authorizer.token().await,
            None => None,
        }
    }

    /// Whether `response` refused the credentials and a new token was had for the next try
    /// (at most [`MAX_CHALLENGES_PER_REQUEST`] times); an error if none can be had.
    async fn challenged(
        &self,
        response: &reqwest::Response,
        sent: Option<&Credential>,
        challenges: &mut u32,
    ) -> Result<bool, ClientError> {
        let Some(authorizer) = &self.authorizer else { return Ok(false) };
        let Some(challenge) = Challenge::of(response.status().as_u16(), response.headers()) else {
            if sent.is_some() && response.status().is_success() {
                authorizer.accepted();
            }
            return Ok(false);
        };
        if *challenges >= MAX_CHALLENGES_PER_REQUEST {
            return Ok(false);
        }
        *challenges += 1;
        authorizer.answer(sent, &challenge).await.map_err(|err| ClientError::Unauthorized(err.to_string()))?;
        Ok(true)
    }

    /// One POST of `body`.
    async fn post_once(
        &self,
        session: &SessionHeaders,
        body: Bytes,
        extra: HeaderMap,
        token: Option<&Credential>,
    ) -> Result<reqwest::Response, ClientError> {
        let mut headers = session.apply(extra);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, HeaderValue::from_static("application/json, text/event-stream"));
        self.present(&mut headers, "POST", token)?;
        // An HTTP client can lose a request handed to a connection that closes at that very
        // moment: it is never written and never answered. Nothing of it is written before its
        // body is first read, so a request whose body is not read in time did not reach the
        // server, and is given up as not sent.
        let (body, read) = Announced::new(body);
        let sent = self.http.post(&self.url).headers(headers).body(reqwest::Body::wrap(body)).send();
        tokio::pin!(sent);
        let unsent = async {
            if tokio::time::timeout(self.unsent_timeout, read).await.is_err() {
                return;
            }
            std::future::pending::<()>().await;
        };
        tokio::select! {
            response = &mut sent => response.map_err(transport),
            () = unsent => Err(ClientError::NotSent(format!(
                "the HTTP client had not begun to write the request after {:?}",
                self.unsent_timeout
            ))),
        }
    }

    /// GETs an SSE stream, resuming after `cursor` if given; a refusal of its credentials is
    /// answered and the GET made again.
    pub async fn get(&self, session: &SessionHeaders, cursor: Option<&str>) -> Result<(Head, Reply), ClientError> {
        let mut challenges = 0;
        loop {
            let token = self.token().await;
            let mut headers = session.apply(HeaderMap::new());
            headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
            if let Some(cursor) = cursor.and_then(|c| c.parse().ok()) {
                headers.insert(header::LAST_EVENT_ID, cursor);
            }
            self.present(&mut headers, "GET", token.as_ref())?;
            // A GET changes nothing, and a stream's head comes at once: one that does not come
            // in time (the request was lost, as a POST can be) is tried again.
            let response = tokio::time::timeout(self.unsent_timeout, self.http.get(&self.url).headers(headers).send())
                .await
                .map_err(|_| ClientError::Transport(format!("no answer to the GET within {:?}", self.unsent_timeout)))?
                .map_err(transport)?;
            if !self.challenged(&response, token.as_ref(), &mut challenges).await? {
                return classify(response).await;
            }
        }
    }

    /// Puts the access token, if any, in the headers of a `method` request.
    fn present(&self, headers: &mut HeaderMap, method: &str, token: Option<&Credential>) -> Result<(), ClientError> {
        match (&self.authorizer, token) {
            (Some(authorizer), Some(token)) => authorizer
                .present(token, method, &self.url, headers)
                .map_err(|err| ClientError::Unauthorized(err.to_string())),
            _ => Ok(()),
        }
    }

    /// DELETEs the session; the answer does not matter.
    pub async fn delete(&self, session: &SessionHeaders) {
        let mut headers = session.apply(HeaderMap::new());
        let token = self.token().await;
        if let Err(err) = self.present(&mut headers, "DELETE", token.as_ref()) {
            tracing::debug!(%err, "DELETE of the session without credentials");
        }
        match tokio::time::timeout(self.unsent_timeout, self.http.delete(&self.url).headers(headers).send()).await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => tracing::debug!(%err, "DELETE of the session failed"),
            Err(_) => tracing::debug!("DELETE of the session was not answered in time"),
        }
    }
}

/// A request body that says when the HTTP client first reads it: before that, nothing of the
/// request is written (the head goes out with the body's first bytes).
struct Announced {
    bytes: Option<Bytes>,
    read: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Announced {
    fn new(bytes: Bytes) -> (Announced, tokio::sync::oneshot::Receiver<()>) {
        let (read, is_read) = tokio::sync::oneshot::channel();
        (Announced { bytes: Some(bytes), read: Some(read) }, is_read)
    }
}

impl http_body::Body for Announced {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if let Some(read) = self.read.take() {
            let _ = read.send(());
        }
        std::task::Poll::Ready(self.bytes.take().map(|bytes| Ok(http_body::Frame::data(bytes))))
    }

    fn is_end_stream(&self) -> bool {
        self.bytes.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.bytes.as_ref().map_or(0, |bytes| bytes.len() as u64))
    }
}

/// Why a body was not read whole.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// It is longer than the bound.
    #[error("the answer is larger than allowed")]
    TooLarge,
    /// The connection failed.
    #[error("{}", crate::tls::describe(.0))]
    Failed(reqwest::Error),
}

/// The body of `response`, of at most `limit` bytes: what a server sends is never held beyond it.
pub(crate) async fn read_bounded(response: &mut reqwest::Response, limit: usize) -> Result<Vec<u8>, BodyError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Failed)? {
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn transport(err: reqwest::Error) -> ClientError {
    if crate::tls::is_untrusted(&err) {
        return ClientError::Untrusted(crate::tls::describe(&err));
    }
    ClientError::Transport(crate::tls::describe(&err))
}

/// The largest JSON body read: one message, as an SSE event may carry.
const MAX_JSON_BODY: usize = tether_core::sse::Limits::DEFAULT.max_event;

async fn classify(mut response: reqwest::Response) -> Result<(Head, Reply), ClientError> {
    let head = Head::of(&response);
    if !response.status().is_success() {
        // A refusal's body only explains its status: one that cannot be read whole explains nothing.
        let body = read_bounded(&mut response, MAX_JSON_BODY).await.unwrap_or_default();
        return Ok((head, Reply::Refused(Bytes::from(body))));
    }
    let content_type =
        response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase();
    if content_type.starts_with(tether_core::sse::CONTENT_TYPE) {
        return Ok((head, Reply::Sse(Box::new(SseReader::new(response)))));
    }
    let body = read_bounded(&mut response, MAX_JSON_BODY).await.map_err(|err| match err {
        BodyError::TooLarge => ClientError::Protocol(format!("a JSON answer over {MAX_JSON_BODY} bytes")),
        BodyError::Failed(err) => transport(err),
    })?;
    Ok((head, if body.is_empty() { Reply::Accepted } else { Reply::Json(Bytes::from(body)) }))
}

/// Reads an SSE body as events.
pub(crate) struct SseReader {
    response: reqwest::Response,
    decoder: Decoder,
    chunk: Bytes,
}

impl SseReader {
    fn new(response: reqwest::Response) -> SseReader {
        SseReader { response, decoder: Decoder::default(), chunk: Bytes::new() }
    }

    /// The next event; `Ok(None)` when the connection ended.
    pub async fn next(&mut self) -> Result<Option<Event>, ClientError> {
        loop {
            if !self.chunk.is_empty() {
                let mut input = &self.chunk[..];
                let event = self.decoder.decode(&mut input).map_err(|e| ClientError::Protocol(e.to_string()))?;
                let consumed = self.chunk.len() - input.len();
                let _ = self.chunk.split_to(consumed);
                if let Some(event) = event {
                    return Ok(Some(event));
                }
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.chunk = chunk,
                Ok(None) => return Ok(None),
                Err(err) => return Err(transport(err)),
            }
        }
    }

    /// The reconnection delay the server announced on this connection, in milliseconds.
    pub fn retry(&self) -> Option<u64> {
        self.decoder.retry()
    }
}
