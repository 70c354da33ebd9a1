//! What an operator can set, with the defaults a production server should start from.

use std::time::Duration;
use tether_core::input_required::StateKey;

use tether_store::Retention;

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// How long a session lives without activity. Open streams and running requests count as
    /// activity.
    pub session_idle_ttl: Duration,
    /// What the store retains, and for how long a finished request's stream stays replayable.
    pub retention: Retention,
    /// Largest accepted request body; a larger one gets 413.
    pub max_body_bytes: usize,
    /// How long a request body may take to arrive, from its head; a slower one gets 408.
    pub body_timeout: Duration,
    /// Most live sessions; more get 503 with `Retry-After`.
    pub max_sessions: usize,
    /// Most open streams and running requests per session; more get 429.
    pub max_streams_per_session: usize,
    /// Most tasks running at once (working or waiting for input), over every principal and
    /// every replica sharing the store; a call that would become one more gets 429.
    pub max_tasks: usize,
    /// Most tasks of one principal running at once (all unauthenticated clients are one).
    pub max_tasks_per_principal: usize,
    /// Origins allowed besides the loopback origins (`http://localhost[:port]`,
    /// `http://127.0.0.1[:port]`, `http://[::1][:port]`). A request without `Origin` is allowed.
    pub allowed_origins: Vec<String>,
    /// Whether `Host` must be a loopback name (DNS-rebinding protection); set it when bound to
    /// a loopback address.
    pub require_loopback_host: bool,
    /// The reconnection delay announced on 2025-11-25 streams (`retry:`).
    pub sse_retry: Duration,
    /// How long one connection to a stream may stay open before the server closes it and the
    /// client resumes (SEP-1699 polling; 2025-11-25 sessions only).
    pub max_connection_duration: Duration,
    /// Interval of SSE keep-alive comments on idle connections.
    pub keep_alive: Duration,
    /// How often idle sessions are expired and old history dropped.
    pub sweep_interval: Duration,
    /// How long a handler waits for the client's answer to a server-to-client request.
    pub client_request_timeout: Duration,
    /// Whether requests carrying an idempotency key run exactly once (the `io.tether/idempotency`
    /// extension, advertised in the capabilities). Off, keys are ignored.
    pub idempotency: bool,
    /// The key a 2026-07-28 request's `requestState` is sealed with (SEP-2322): replicas that
    /// serve the same clients must share it. `None`: one drawn at random when the server is built.
    pub request_state_key: Option<StateKey>,
    /// How long a task is kept after it was created, once it has finished (its `ttlMs`).
    pub task_ttl: Duration,
    /// How often clients are asked to poll a task (its `pollIntervalMs`), and how often the
    /// process running a task looks for a cancel or an answer another replica recorded.
    pub task_poll_interval: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            session_idle_ttl: Duration::from_secs(30 * 60),
            retention: Retention::default(),
            max_body_bytes: 4 << 20,
            body_timeout: Duration::from_secs(30),
            max_sessions: 10_000,
            max_streams_per_session: 64,
            max_tasks: 4_096,
            max_tasks_per_principal: 1_024,
            allowed_origins: Vec::new(),
            require_loopback_host: true,
            sse_retry: Duration::from_secs(1),
            max_connection_duration: Duration::from_secs(5 * 60),
            keep_alive: Duration::from_secs(15),
            sweep_interval: Duration::from_secs(1),
            client_request_timeout: Duration::from_secs(5 * 60),
            idempotency: true,
            request_state_key: None,
            task_ttl: Duration::from_secs(60 * 60),
            task_poll_interval: Duration::from_millis(500),
        }
    }
}

/// Parses a duration written as a number with a unit: `500ms`, `2s`, `5m`, `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| format!("{text:?}: expected a number followed by ms, s, m or h"))?;
    let ms = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1_000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => return Err(format!("{text:?}: unit must be ms, s, m or h")),
    };
    ms.map(Duration::from_millis).ok_or_else(|| format!("{text:?}: too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "5", "s", "-1s", "1.5s", "5 m", "99999999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
