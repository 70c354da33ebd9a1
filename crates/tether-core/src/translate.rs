//! How a message of one protocol era reads in the other, for what joins a client of one era to
//! a server of the other: `tether connect` between a 2026-07-28 application and a server of the
//! handshake era, and `tether gateway` between a 2026-07-28 client and a handshake-era child.
//!
//! A 2026-07-28 request carries in its `_meta` envelope what a session holds in the handshake
//! era (the revision, the client's info and capabilities), and its results say that they are
//! complete; a handshake-era server learns the first at `initialize` and refuses the envelope,
//! and its results say nothing of the second.

use serde_json::{Value, json};

use crate::mcp::{ProtocolVersion, meta, method};
use crate::methods;

/// A 2026-07-28 request's `params` as a handshake-era server takes them: without the envelope
/// ([`meta::ENVELOPE`]), and without a `_meta` the envelope alone filled.
pub fn strip_envelope(params: &mut Value) {
    let Some(fields) = params.get_mut("_meta").and_then(Value::as_object_mut) else {
        return;
    };
    for field in meta::ENVELOPE {
        fields.remove(field);
    }
    if fields.is_empty()
        && let Some(params) = params.as_object_mut()
    {
        params.remove("_meta");
    }
}

/// The `initialize` params that a 2026-07-28 request's envelope declares: the newest
/// handshake-era revision, with the client's capabilities and info (`fallback` where the
/// envelope names no client).
pub fn initialize_params(params: &Value, fallback: &Value) -> Value {
    let envelope = params.get("_meta");
    let field = |name: &str| envelope.and_then(|fields| fields.get(name));
    json!({
        "protocolVersion": ProtocolVersion::LATEST_SESSIONFUL.as_str(),
        "capabilities": field(meta::CLIENT_CAPABILITIES).filter(|c| c.is_object()).cloned().unwrap_or_else(|| json!({})),
        "clientInfo": field(meta::CLIENT_INFO).filter(|info| info.is_object()).unwrap_or(fallback),
    })
}

/// A result of `method` as a 2026-07-28 client reads it: its `resultType` (complete unless it
/// says otherwise: a handshake-era server asks for input by requests of its own, never by
/// `input_required` results), for a cacheable method the cache hints a result must carry (`ttlMs`
/// 0 and scope private unless it says otherwise: nothing may be reused), and the server's info,
/// `server_info`, in its `_meta`.
pub fn stateless_result(method: &str, result: &mut Value, server_info: &Value) {
    let Value::Object(map) = result else { return };
    map.entry("resultType").or_insert_with(|| json!("complete"));
    if methods::is_cacheable(method) {
        map.entry("ttlMs").or_insert_with(|| json!(0));
        map.entry("cacheScope").or_insert_with(|| json!("private"));
    }
    if let Value::Object(fields) = map.entry("_meta").or_insert_with(|| json!({})) {
        fields
            .entry(meta::SERVER_INFO)
            .or_insert_with(|| server_info.clone());
    }
}

/// The `server/discover` result a 2026-07-28 client gets from a server that answered
/// `initialize` with `initialized`: the revision the client is spoken to in, and the server's
/// capabilities, instructions and info.
pub fn discover_result(initialized: &Value) -> Value {
    let mut result = json!({
        "supportedVersions": [ProtocolVersion::V2026_07_28.as_str()],
        "capabilities": initialized.get("capabilities").filter(|c| c.is_object()).cloned().unwrap_or_else(|| json!({})),
    });
    if let Some(instructions) = initialized.get("instructions").filter(|i| i.is_string()) {
        result["instructions"] = instructions.clone();
    }
    stateless_result(
        method::SERVER_DISCOVER,
        &mut result,
        &server_info(initialized),
    );
    result
}

/// The server's info in an `initialize` result (`serverInfo`) or a `server/discover` result (in
/// its `_meta`, or where early drafts put it, as in `initialize`); a server that names none is
/// "unnamed".
pub fn server_info(answer: &Value) -> Value {
    answer
        .pointer(&format!("/_meta/{}", meta::SERVER_INFO.replace('/', "~1")))
        .or_else(|| answer.get("serverInfo"))
        .filter(|info| info.is_object())
        .cloned()
        .unwrap_or_else(|| json!({"name": "unnamed", "version": "0"}))
}

/// The `initialize` result a handshake-era client gets from a server that speaks only
/// 2026-07-28, given what its `server/discover` said: the revision the client asked for
/// (`asked`), and the server's capabilities, instructions and info.
pub fn initialize_result(discovered: &Value, asked: ProtocolVersion) -> Value {
    let mut result = json!({
        "protocolVersion": asked.as_str(),
        "capabilities": discovered.get("capabilities").filter(|c| c.is_object()).cloned().unwrap_or_else(|| json!({})),
        "serverInfo": server_info(discovered),
    });
    if let Some(instructions) = discovered.get("instructions").filter(|i| i.is_string()) {
        result["instructions"] = instructions.clone();
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_goes_and_what_else_the_meta_holds_stays() {
        let mut params = json!({"name": "count", "_meta": {
            "progressToken": 7, meta::PROTOCOL_VERSION: "2026-07-28", meta::CLIENT_INFO: {"name": "app"},
            meta::CLIENT_CAPABILITIES: {}, meta::LOG_LEVEL: "info"}});
        strip_envelope(&mut params);
        assert_eq!(
            params,
            json!({"name": "count", "_meta": {"progressToken": 7}})
        );
        let mut bare = json!({"_meta": {meta::PROTOCOL_VERSION: "2026-07-28"}});
        strip_envelope(&mut bare);
        assert_eq!(bare, json!({}));
    }

    #[test]
    fn initialize_params_are_the_clients_own() {
        let fallback = json!({"name": "tether", "version": "1"});
        let declared = json!({"_meta": {meta::CLIENT_INFO: {"name": "app", "version": "2"},
            meta::CLIENT_CAPABILITIES: {"roots": {}}}});
        assert_eq!(
            initialize_params(&declared, &fallback),
            json!({"protocolVersion": "2025-11-25", "capabilities": {"roots": {}}, "clientInfo": {"name": "app", "version": "2"}})
        );
        assert_eq!(
            initialize_params(&json!({}), &fallback),
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": fallback})
        );
    }

    #[test]
    fn discovery_and_initialization_say_the_same_of_the_server() {
        let initialized = json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
            "serverInfo": {"name": "s", "version": "1"}, "instructions": "be kind"});
        let discovered = discover_result(&initialized);
        assert_eq!(
            discovered,
            json!({"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}, "instructions": "be kind",
                   "resultType": "complete", "ttlMs": 0, "cacheScope": "private",
                   "_meta": {meta::SERVER_INFO: {"name": "s", "version": "1"}}})
        );
        let mut back = initialize_result(&discovered, ProtocolVersion::V2025_06_18);
        back["protocolVersion"] = json!("2025-11-25");
        assert_eq!(back, initialized);
    }

    #[test]
    fn a_result_says_it_is_complete_and_how_long_it_may_be_cached_unless_it_says_otherwise() {
        let info = json!({"name": "s", "version": "1"});
        let mut listed = json!({"tools": []});
        stateless_result(method::TOOLS_LIST, &mut listed, &info);
        assert_eq!(
            listed,
            json!({"tools": [], "resultType": "complete", "ttlMs": 0, "cacheScope": "private",
                   "_meta": {meta::SERVER_INFO: info}})
        );
        let mut asking =
            json!({"resultType": "input_required", "_meta": {meta::SERVER_INFO: "other"}});
        stateless_result(method::TOOLS_CALL, &mut asking, &info);
        assert_eq!(
            asking,
            json!({"resultType": "input_required", "_meta": {meta::SERVER_INFO: "other"}})
        );
    }
}
