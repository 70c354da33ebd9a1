//! MCP protocol versions, their eras, and the names MCP puts on the wire.

use std::fmt;
use std::str::FromStr;

/// A dated MCP protocol revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProtocolVersion {
    /// 2024-11-05: the HTTP+SSE transport (two endpoints).
    V2024_11_05,
    /// 2025-03-26: Streamable HTTP, sessions, JSON-RPC batches.
    V2025_03_26,
    /// 2025-06-18: batches removed, `MCP-Protocol-Version` header.
    V2025_06_18,
    /// 2025-11-25: priming event, `retry`, server-initiated close (SEP-1699).
    V2025_11_25,
    /// 2026-07-28: stateless; per-request metadata, no sessions, no resumption.
    V2026_07_28,
}

/// How a client and a server agree on a version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Era {
    /// The `initialize` handshake negotiates the version once per session.
    Sessionful,
    /// Every request carries its version and capabilities in `_meta`.
    Stateless,
}

/// The version string was not one of the known revisions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown MCP protocol version {0:?}")]
pub struct UnknownVersion(pub String);

impl ProtocolVersion {
    /// Every known revision, oldest first.
    pub const ALL: [ProtocolVersion; 5] = [
        ProtocolVersion::V2024_11_05,
        ProtocolVersion::V2025_03_26,
        ProtocolVersion::V2025_06_18,
        ProtocolVersion::V2025_11_25,
        ProtocolVersion::V2026_07_28,
    ];

    /// The newest revision with sessions and resumption.
    pub const LATEST_SESSIONFUL: ProtocolVersion = ProtocolVersion::V2025_11_25;

    /// The newest revision.
    pub const LATEST: ProtocolVersion = ProtocolVersion::V2026_07_28;

    /// What a server assumes when a sessionful request has no `MCP-Protocol-Version` header.
    pub const ASSUMED_WITHOUT_HEADER: ProtocolVersion = ProtocolVersion::V2025_03_26;

    /// The version string, as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ProtocolVersion::V2024_11_05 => "2024-11-05",
            ProtocolVersion::V2025_03_26 => "2025-03-26",
            ProtocolVersion::V2025_06_18 => "2025-06-18",
            ProtocolVersion::V2025_11_25 => "2025-11-25",
            ProtocolVersion::V2026_07_28 => "2026-07-28",
        }
    }

    /// Whether the version negotiates once (sessionful) or per request (stateless).
    pub fn era(self) -> Era {
        match self {
            ProtocolVersion::V2024_11_05
            | ProtocolVersion::V2025_03_26
            | ProtocolVersion::V2025_06_18
            | ProtocolVersion::V2025_11_25 => Era::Sessionful,
            ProtocolVersion::V2026_07_28 => Era::Stateless,
        }
    }

    /// Whether a POST body may be a JSON-RPC batch (2025-03-26 only).
    pub fn allows_batches(self) -> bool {
        self == ProtocolVersion::V2025_03_26
    }

    /// Whether SSE streams start with a priming event and may be closed by the server with a
    /// `retry` hint (SEP-1699, 2025-11-25). Older clients may choke on an empty `data` field.
    pub fn primes_streams(self) -> bool {
        self == ProtocolVersion::V2025_11_25
    }
}

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ProtocolVersion {
    type Err = UnknownVersion;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ProtocolVersion::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| UnknownVersion(s.to_owned()))
    }
}

/// HTTP header names, lowercase (HTTP header names are case-insensitive).
pub mod header {
    /// The session id (sessionful revisions).
    pub const SESSION_ID: &str = "mcp-session-id";
    /// The negotiated protocol version.
    pub const PROTOCOL_VERSION: &str = "mcp-protocol-version";
    /// The SSE resumption cursor.
    pub const LAST_EVENT_ID: &str = "last-event-id";
    /// The session incarnation's replay epoch (tether lineage).
    pub const REPLAY_EPOCH: &str = "x-mcp-replay-epoch";
    /// The JSON-RPC method, mirrored in a header (2026-07-28).
    pub const METHOD: &str = "mcp-method";
    /// The tool, resource or prompt name, mirrored in a header (2026-07-28).
    pub const NAME: &str = "mcp-name";
    /// The claim of a request's idempotency key, as the server's records acknowledge it
    /// (tether idempotency: [`crate::idempotency::Acknowledged`]).
    pub const IDEMPOTENCY_CLAIM: &str = "x-mcp-idempotency-claim";
}

/// Method names tether handles at the protocol level.
pub mod method {
    /// Sessionful handshake request.
    pub const INITIALIZE: &str = "initialize";
    /// Sessionful handshake notification.
    pub const INITIALIZED: &str = "notifications/initialized";
    /// Liveness check (sessionful).
    pub const PING: &str = "ping";
    /// Cancels a request.
    pub const CANCELLED: &str = "notifications/cancelled";
    /// Progress of a request.
    pub const PROGRESS: &str = "notifications/progress";
    /// A log message.
    pub const MESSAGE: &str = "notifications/message";
    /// Server discovery (2026-07-28).
    pub const SERVER_DISCOVER: &str = "server/discover";
    /// Lists tools.
    pub const TOOLS_LIST: &str = "tools/list";
    /// Calls a tool.
    pub const TOOLS_CALL: &str = "tools/call";
}

/// MCP-specific JSON-RPC error codes.
pub mod code {
    /// A request-metadata header disagrees with the body (2026-07-28).
    pub const HEADER_MISMATCH: i64 = -32020;
    /// A resource that does not exist, before 2026-07-28 (SEP-2164 made it invalid params
    /// with `data.uri`).
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
    /// The request needs a client capability it did not declare (2026-07-28).
    pub const MISSING_REQUIRED_CLIENT_CAPABILITY: i64 = -32021;
    /// The protocol version is not supported (2026-07-28).
    pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
}

/// `_meta` and capability keys.
pub mod meta {
    /// The experimental capability under which a tether server advertises its lineage.
    pub const LINEAGE_CAPABILITY: &str = "io.tether/lineage";
    /// Per-request protocol version (2026-07-28).
    pub const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
    /// Per-request client capabilities (2026-07-28).
    pub const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
    /// Per-request log level (2026-07-28): without it the server sends no log messages.
    pub const LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
    /// Per-request client info (2026-07-28).
    pub const CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
    /// The server's info on a 2026-07-28 result (the handshake era's `serverInfo`).
    pub const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
    /// The fields by which a 2026-07-28 request carries what a session holds in the sessionful
    /// revisions: a request handed to a server of a sessionful revision goes without them.
    pub const ENVELOPE: [&str; 4] = [
        PROTOCOL_VERSION,
        CLIENT_CAPABILITIES,
        CLIENT_INFO,
        LOG_LEVEL,
    ];
    /// The experimental capability under which a tether server offers exactly-once execution
    /// of requests carrying an [`IDEMPOTENCY_KEY`].
    pub const IDEMPOTENCY_CAPABILITY: &str = "io.tether/idempotency";
    /// The request `_meta` field holding an idempotency key.
    pub const IDEMPOTENCY_KEY: &str = "io.tether/idempotencyKey";
    /// The request `_meta` field holding the claim of its idempotency key the client was
    /// acknowledged when it sent the key before ([`crate::idempotency::Acknowledged`]).
    pub const IDEMPOTENCY_CLAIM: &str = "io.tether/idempotencyClaim";
}

/// Sets `name` to `value` among a server's `experimental` capabilities. The capabilities are a
/// handler's or an upstream server's, taken as they come: where they, or their `experimental`,
/// are not an object, they name nothing a client could use, and an empty object takes their
/// place.
pub fn set_experimental(
    capabilities: &mut serde_json::Value,
    name: &str,
    value: serde_json::Value,
) {
    let experimental = object(
        object(capabilities)
            .entry("experimental")
            .or_insert(serde_json::Value::Null),
    );
    experimental.insert(name.to_owned(), value);
}

/// `value` as an object, made an empty one first if it is anything else.
fn object(value: &mut serde_json::Value) -> &mut serde_json::Map<String, serde_json::Value> {
    if !value.is_object() {
        *value = serde_json::Value::Object(serde_json::Map::new());
    }
    value.as_object_mut().expect("an object was just put there")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_experimental_capability_is_set_whatever_the_capabilities_held() {
        use serde_json::json;
        for (before, after) in [
            (
                json!({"tools": {}}),
                json!({"tools": {}, "experimental": {"x": 1}}),
            ),
            (
                json!({"experimental": {"y": 2}}),
                json!({"experimental": {"y": 2, "x": 1}}),
            ),
            (
                json!({"experimental": true}),
                json!({"experimental": {"x": 1}}),
            ),
            (
                json!({"experimental": [1]}),
                json!({"experimental": {"x": 1}}),
            ),
            (json!("tools"), json!({"experimental": {"x": 1}})),
        ] {
            let mut capabilities = before.clone();
            set_experimental(&mut capabilities, "x", json!(1));
            assert_eq!(capabilities, after, "from {before}");
        }
    }

    #[test]
    fn versions_round_trip_and_order() {
        for v in ProtocolVersion::ALL {
            assert_eq!(v.as_str().parse::<ProtocolVersion>(), Ok(v));
        }
        assert!(ProtocolVersion::ALL.windows(2).all(|w| w[0] < w[1]));
        assert!("2025-11-26".parse::<ProtocolVersion>().is_err());
    }

    #[test]
    fn eras_and_features() {
        assert_eq!(ProtocolVersion::V2026_07_28.era(), Era::Stateless);
        assert_eq!(ProtocolVersion::V2025_11_25.era(), Era::Sessionful);
        assert_eq!(ProtocolVersion::V2024_11_05.era(), Era::Sessionful);
        let batches: Vec<_> = ProtocolVersion::ALL
            .into_iter()
            .filter(|v| v.allows_batches())
            .collect();
        assert_eq!(batches, [ProtocolVersion::V2025_03_26]);
        let priming: Vec<_> = ProtocolVersion::ALL
            .into_iter()
            .filter(|v| v.primes_streams())
            .collect();
        assert_eq!(priming, [ProtocolVersion::V2025_11_25]);
    }

    #[test]
    fn header_names_are_lowercase() {
        for name in [
            header::SESSION_ID,
            header::PROTOCOL_VERSION,
            header::LAST_EVENT_ID,
            header::REPLAY_EPOCH,
            header::METHOD,
            header::NAME,
            header::IDEMPOTENCY_CLAIM,
        ] {
            assert_eq!(name, name.to_ascii_lowercase());
        }
    }
}
