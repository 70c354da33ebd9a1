//! The probe's HTTP exchanges: a bounded number of requests, only to the URL it was given.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use tether_core::mcp::header;
use tether_core::sse::{Decoder, Event};

use crate::ProbeError;

/// Most requests one probe run sends.
const MAX_REQUESTS: u32 = 200;

/// What came back.
#[derive(Debug, Clone, Default)]
pub(crate) struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    /// A JSON body, if it was one.
    pub json: Option<Value>,
    /// SSE events read (up to the limit the caller set).
    pub events: Vec<Event>,
    /// Whether the SSE stream ended by itself (rather than the probe stopping to read).
    pub ended: bool,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Whether the status is 2xx.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The response to request `id`: the JSON body, or that message on the stream.
    pub fn response(&self, id: u64) -> Option<Value> {
        self.json.clone().or_else(|| self.messages().into_iter().find(|m| m.get("id") == Some(&json!(id))))
    }

    /// Whether a resume was refused in a way a client can see: an error status, a `resync`
    /// event, or a JSON-RPC error on the stream (the opposite of a silent empty 200).
    pub fn refused_explicitly(&self) -> bool {
        !self.ok() || self.events.iter().any(|e| e.event.as_deref() == Some("resync") || e.data.contains("\"error\""))
    }

    /// The JSON-RPC messages among the events (priming events have no data).
    pub fn messages(&self) -> Vec<Value> {
        self.events.iter().filter(|e| !e.data.is_empty()).filter_map(|e| serde_json::from_str(&e.data).ok()).collect()
    }

    /// Short evidence: status, then what the body held.
    pub fn summary(&self) -> String {
        let body = match (&self.json, self.events.len()) {
            (Some(json), _) => {
                let text = json.to_string();
                format!("JSON {}", text.chars().take(160).collect::<String>())
            }
            (None, 0) => "no events".to_owned(),
            (None, n) => {
                let ids: Vec<&str> = self.events.iter().map(|e| e.id.as_deref().unwrap_or("-")).take(6).collect();
                format!("{n} events, ids {ids:?}")
            }
        };
        format!("HTTP {}, {body}", self.status)
    }
}

/// A session the probe opened.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub id: Option<String>,
    pub version: String,
}

pub(crate) struct Wire {
    http: reqwest::Client,
    pub url: String,
    sent: Arc<AtomicU32>,
}

impl Wire {
    pub fn new(url: &str, trust: &tether_client::tls::Trust, headers: &[(String, String)]) -> Result<Wire, ProbeError> {
        let mut defaults = reqwest::header::HeaderMap::new();
        for (name, value) in headers {
            let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| ProbeError::Transport(format!("header {name:?}: {e}")))?;
            let value = reqwest::header::HeaderValue::from_str(value)
                .map_err(|e| ProbeError::Transport(format!("the value of header {name}: {e}")))?;
            defaults.append(name, value);
        }
        let http = trust
            .http_client()
            .default_headers(defaults)
            .tcp_nodelay(true)
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|e| ProbeError::Transport(e.to_string()))?;
        Ok(Wire { http, url: url.to_owned(), sent: Arc::default() })
    }

    /// The same client and request budget, aimed at another URL (a replica).
    pub fn at(&self, url: &str) -> Wire {
        Wire { http: self.http.clone(), url: url.to_owned(), sent: Arc::clone(&self.sent) }
    }

    fn count(&self) -> Result<(), ProbeError> {
        if self.sent.fetch_add(1, Ordering::Relaxed) >= MAX_REQUESTS {
            return Err(ProbeError::Budget(MAX_REQUESTS));
        }
        Ok(())
    }

    /// Whether the URL names a loopback host, where a foreign `Host` header means DNS rebinding.
    pub fn on_loopback(&self) -> bool {
        reqwest::Url::parse(&self.url).ok().and_then(|u| u.host_str().map(str::to_owned)).is_some_and(|host| {
            host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()) || host == "[::1]"
        })
    }

    /// Waits until the server's port accepts TCP connections again (no HTTP requests spent).
    pub async fn wait_until_accepting(&self, limit: Duration) -> Result<(), ProbeError> {
        let url = reqwest::Url::parse(&self.url).map_err(|e| ProbeError::Transport(e.to_string()))?;
        let address = url
            .socket_addrs(|| None)
            .map_err(|e| ProbeError::Transport(e.to_string()))?
            .into_iter()
            .next()
            .ok_or_else(|| ProbeError::Transport(format!("{} names no address", self.url)))?;
        let deadline = tokio::time::Instant::now() + limit;
        while tokio::time::Instant::now() < deadline {
            if tokio::net::TcpStream::connect(address).await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(ProbeError::Restart(format!("{} did not accept connections within {limit:?}", self.url)))
    }

    /// Requests sent so far.
    pub fn sent(&self) -> u32 {
        self.sent.load(Ordering::Relaxed)
    }

    /// POSTs `body`; reads an SSE answer until it ends, `max_events` arrived, or `read_for` passed.
    pub async fn post(
        &self,
        session: Option<&Session>,
        body: &Value,
        extra: &[(&str, &str)],
        max_events: usize,
        read_for: Duration,
    ) -> Result<Answer, ProbeError> {
        self.count()?;
        let mut request = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(session) = session {
            if let Some(id) = &session.id {
                request = request.header(header::SESSION_ID, id);
            }
            if !extra.iter().any(|(name, _)| name.eq_ignore_ascii_case(header::PROTOCOL_VERSION)) {
                request = request.header(header::PROTOCOL_VERSION, &session.version);
            }
        }
        for (name, value) in extra {
            request = request.header(*name, *value);
        }
        let response = request
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| ProbeError::Transport(tether_client::tls::describe(&e)))?;
        read(response, max_events, read_for).await
    }

    /// GETs a stream of `session`, resuming after `cursor` if given.
    pub async fn get(
        &self,
        session: &Session,
        cursor: Option<&str>,
        max_events: usize,
        read_for: Duration,
    ) -> Result<Answer, ProbeError> {
        self.count()?;
        let mut request = self.http.get(&self.url).header("accept", "text/event-stream");
        if let Some(id) = &session.id {
            request = request.header(header::SESSION_ID, id);
        }
        request = request.header(header::PROTOCOL_VERSION, &session.version);
        if let Some(cursor) = cursor {
            request = request.header(header::LAST_EVENT_ID, cursor);
        }
        let response = request.send().await.map_err(|e| ProbeError::Transport(tether_client::tls::describe(&e)))?;
        read(response, max_events, read_for).await
    }

    pub async fn delete(&self, session: &Session) -> Result<u16, ProbeError> {
        self.count()?;
        let mut request = self.http.delete(&self.url);
        if let Some(id) = &session.id {
            request = request.header(header::SESSION_ID, id);
        }
        let response = request.send().await.map_err(|e| ProbeError::Transport(tether_client::tls::describe(&e)))?;
        Ok(response.status().as_u16())
    }

    /// The sessionful handshake at 2025-11-25.
    pub async fn initialize(&self) -> Result<(Session, Answer), ProbeError> {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "tether-probe", "version": env!("CARGO_PKG_VERSION")}}});
        let answer = self.post(None, &body, &[], 8, Duration::from_secs(5)).await?;
        let result = answer
            .response(1)
            .and_then(|m| m.get("result").cloned())
            .ok_or_else(|| ProbeError::Handshake(answer.summary()))?;
        let session = Session {
            id: answer.header(header::SESSION_ID).map(str::to_owned),
            version: result.get("protocolVersion").and_then(Value::as_str).unwrap_or("2025-11-25").to_owned(),
        };
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        self.post(Some(&session), &initialized, &[], 0, Duration::from_secs(5)).await?;
        Ok((session, answer))
    }
}

async fn read(mut response: reqwest::Response, max_events: usize, read_for: Duration) -> Result<Answer, ProbeError> {
    let mut answer =
        Answer { status: response.status().as_u16(), headers: response.headers().clone(), ..Answer::default() };
    let content_type = answer.header("content-type").unwrap_or("").to_ascii_lowercase();
    if !content_type.starts_with("text/event-stream") {
        let bytes = response.bytes().await.unwrap_or_default();
        answer.json = serde_json::from_slice(&bytes).ok();
        return Ok(answer);
    }
    let deadline = tokio::time::Instant::now() + read_for;
    let mut decoder = Decoder::default();
    while answer.events.len() < max_events {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Ok(Ok(Some(chunk))) => {
                let mut input = &chunk[..];
                while let Ok(Some(event)) = decoder.decode(&mut input) {
                    answer.events.push(event);
                }
            }
            Ok(Ok(None)) | Ok(Err(_)) => {
                answer.ended = true;
                break;
            }
            Err(_) => break,
        }
    }
    Ok(answer)
}
