//! Multi round-trip requests (SEP-2322, 2026-07-28): a request the server cannot finish without
//! the client's input is answered with an `InputRequiredResult` (`resultType: "input_required"`,
//! the `inputRequests` it needs, and an opaque `requestState`); the client answers each and sends
//! the request again with `inputResponses` and the state.
//!
//! The state comes back from the client, so the server must not trust it as it is: here it is
//! sealed with a server key (HMAC-SHA256) and bound to the request's method and name, so a state
//! changed, forged, or moved to another tool is refused. Replicas that share the key accept each
//! other's states.

use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};

use crate::base64::{self, Encoding};
use crate::lineage::base64url;

/// The `resultType` of a result that asks for input.
pub const RESULT_TYPE: &str = "input_required";

/// The params field carrying the client's answers.
pub const RESPONSES: &str = "inputResponses";

/// The params and result field carrying the sealed state.
pub const STATE: &str = "requestState";

/// Most rounds tether carries one request through (its client, and its server for sessionful
/// sessions) before giving up: a handler that keeps asking is a bug, not a dialogue.
pub const MAX_ROUNDS: usize = 16;

/// Whether a result asks for input.
pub fn asks(result: &Value) -> bool {
    result.get("resultType").and_then(Value::as_str) == Some(RESULT_TYPE)
}

/// The input requests of an `InputRequiredResult`: each key with the method and params to
/// answer (`{}` when a request has none).
pub fn requests(result: &Value) -> impl Iterator<Item = (&str, &str, Value)> {
    result
        .get("inputRequests")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(key, request)| {
            let method = request
                .get("method")
                .and_then(Value::as_str)
                .unwrap_or_default();
            (
                key.as_str(),
                method,
                request
                    .get("params")
                    .cloned()
                    .unwrap_or_else(|| serde_json::json!({})),
            )
        })
}

/// How long a sealed state may be brought back: a client that answers later starts the
/// request again.
pub const STATE_TTL_MS: u64 = 60 * 60 * 1000;

/// What a state is bound to: the method, and a digest of the params without their metadata,
/// answers and state (the tool or prompt, its arguments, the uri). A state is brought back only
/// with the very request it was issued for: replayed with other arguments it is refused.
pub fn binding(method: &str, params: &Value) -> String {
    let bare: std::collections::BTreeMap<&String, &Value> = params
        .as_object()
        .map(|params| {
            params
                .iter()
                .filter(|(key, _)| !matches!(key.as_str(), "_meta" | RESPONSES | STATE))
                .collect()
        })
        .unwrap_or_default();
    let bytes = serde_json::to_vec(&bare).unwrap_or_default();
    format!("{method}\n{}", base64url(&Sha256::digest(&bytes)))
}

/// Why a request's input is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// `inputResponses` is not an object of objects.
    #[error("inputResponses must be an object whose values are objects ({0})")]
    Responses(String),
    /// `requestState` is not a state this server issued for this request.
    #[error("requestState was not issued by this server for this request")]
    State,
    /// `requestState` was issued for this request longer ago than [`STATE_TTL_MS`].
    #[error("requestState has expired: send the request again without it")]
    Expired,
}

/// The client's answers a request carries: `None` without `inputResponses`.
pub fn responses(params: &Value) -> Result<Option<&Map<String, Value>>, InputError> {
    let Some(responses) = params.get(RESPONSES) else {
        return Ok(None);
    };
    let responses = responses
        .as_object()
        .ok_or_else(|| InputError::Responses("not an object".into()))?;
    if let Some((key, _)) = responses.iter().find(|(_, answer)| !answer.is_object()) {
        return Err(InputError::Responses(format!("{key:?} is not an object")));
    }
    Ok(Some(responses))
}

/// The key states are sealed with.
#[derive(Clone)]
pub struct StateKey([u8; 32]);

impl std::fmt::Debug for StateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateKey(..)")
    }
}

impl StateKey {
    /// A key of 256 bits (the caller supplies them from a CSPRNG, or from configuration shared by
    /// replicas).
    pub fn new(bytes: [u8; 32]) -> StateKey {
        StateKey(bytes)
    }

    /// `state` sealed at `now_ms` for the request `binding` names, to be opened until
    /// [`STATE_TTL_MS`] later: `<payload>.<expiry>.<mac>`, the payload base64url, the expiry in
    /// milliseconds, the MAC over both.
    pub fn seal(&self, binding: &str, state: &Value, now_ms: u64) -> String {
        let payload = base64url(state.to_string().as_bytes());
        let sealed = format!("{payload}.{}", now_ms.saturating_add(STATE_TTL_MS));
        let mac = base64url(&self.mac(binding, &sealed));
        format!("{sealed}.{mac}")
    }

    /// The state `sealed` holds, if this key sealed it for `binding` and it has not expired at
    /// `now_ms`.
    pub fn open(&self, binding: &str, sealed: &str, now_ms: u64) -> Result<Value, InputError> {
        let (signed, mac) = sealed.rsplit_once('.').ok_or(InputError::State)?;
        let (payload, expiry) = signed.split_once('.').ok_or(InputError::State)?;
        let expected = base64url(&self.mac(binding, signed));
        // Compared in constant time: the MAC is the secret's only witness.
        let same = expected.len() == mac.len()
            && expected
                .bytes()
                .zip(mac.bytes())
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0;
        if !same {
            return Err(InputError::State);
        }
        if expiry.parse::<u64>().map_err(|_| InputError::State)? <= now_ms {
            return Err(InputError::Expired);
        }
        let json = base64::decode(payload, Encoding::UrlUnpadded).ok_or(InputError::State)?;
        serde_json::from_slice(&json).map_err(|_| InputError::State)
    }

    /// The MAC of a state: over the binding and the payload, a 0 byte between them.
    fn mac(&self, binding: &str, payload: &str) -> [u8; 32] {
        self.hmac(&[binding.as_bytes(), &[0], payload.as_bytes()])
    }

    /// HMAC-SHA256 (RFC 2104) of the concatenated `parts` under this key.
    fn hmac(&self, parts: &[&[u8]]) -> [u8; 32] {
        const BLOCK: usize = 64;
        let mut key = [0u8; BLOCK];
        key[..32].copy_from_slice(&self.0);
        let pad = |byte: u8| key.map(|k| k ^ byte);
        let inner = parts
            .iter()
            .fold(Sha256::new().chain_update(pad(0x36)), |h, part| {
                h.chain_update(part)
            })
            .finalize();
        Sha256::new()
            .chain_update(pad(0x5c))
            .chain_update(inner)
            .finalize()
            .into()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2: key "Jefe". HMAC pads a short key with zeros, as a 32-byte key ending in
        // zeros is padded, so the vector applies.
        let mut bytes = [0u8; 32];
        bytes[..4].copy_from_slice(b"Jefe");
        let mac = StateKey::new(bytes).hmac(&[b"what do ya want ", b"for nothing?"]);
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_sealed_state_opens_only_with_its_key_and_binding_unchanged_and_in_time() {
        let key = StateKey::new([7; 32]);
        let state = json!({"step": 2, "name": "Alice"});
        let sealed = key.seal("tools/call\nt", &state, 1_000);
        assert_eq!(key.open("tools/call\nt", &sealed, 1_000), Ok(state.clone()));
        assert_eq!(
            key.open("tools/call\nother", &sealed, 1_000),
            Err(InputError::State),
            "another request"
        );
        assert_eq!(
            StateKey::new([8; 32]).open("tools/call\nt", &sealed, 1_000),
            Err(InputError::State),
            "another key"
        );
        assert_eq!(
            key.open("tools/call\nt", &format!("{sealed}-TAMPERED"), 1_000),
            Err(InputError::State)
        );
        let (signed, mac) = sealed.rsplit_once('.').expect("three parts");
        let (payload, expiry) = signed.split_once('.').expect("three parts");
        let forged = base64url(json!({"step": 3}).to_string().as_bytes());
        assert_eq!(
            key.open("tools/call\nt", &format!("{forged}.{expiry}.{mac}"), 1_000),
            Err(InputError::State)
        );
        let later = 1_000 + 2 * STATE_TTL_MS;
        assert_eq!(
            key.open("tools/call\nt", &format!("{payload}.{later}.{mac}"), 1_000),
            Err(InputError::State),
            "an expiry moved"
        );
        assert_eq!(
            key.open("tools/call\nt", payload, 1_000),
            Err(InputError::State)
        );
        let due = 1_000 + STATE_TTL_MS;
        assert_eq!(key.open("tools/call\nt", &sealed, due - 1), Ok(state));
        assert_eq!(
            key.open("tools/call\nt", &sealed, due),
            Err(InputError::Expired)
        );
    }

    #[test]
    fn responses_must_be_an_object_of_objects() {
        assert_eq!(responses(&json!({})), Ok(None));
        let answers = json!({"inputResponses": {"a": {"action": "accept"}}});
        assert_eq!(responses(&answers).map(|r| r.map(|r| r.len())), Ok(Some(1)));
        assert!(responses(&json!({"inputResponses": null})).is_err());
        assert!(responses(&json!({"inputResponses": {"user_name": 12345}})).is_err());
    }

    #[test]
    fn input_requests_are_read_with_their_keys() {
        let result = json!({"resultType": "input_required", "inputRequests": {
            "a": {"method": "roots/list"}, "b": {"method": "elicitation/create", "params": {"message": "m"}}}});
        assert!(asks(&result) && !asks(&json!({"resultType": "complete"})) && !asks(&json!({})));
        let read: Vec<_> = requests(&result).collect();
        assert_eq!(
            read,
            [
                ("a", "roots/list", json!({})),
                ("b", "elicitation/create", json!({"message": "m"}))
            ]
        );
    }

    #[test]
    fn a_binding_holds_the_method_and_the_params_but_not_the_input_or_metadata() {
        let call = json!({"name": "t", "arguments": {"city": "Oslo"}});
        let again = json!({"name": "t", "arguments": {"city": "Oslo"}, "_meta": {"k": 1},
            "inputResponses": {"a": {}}, "requestState": "s"});
        assert_eq!(binding("tools/call", &call), binding("tools/call", &again));
        assert_ne!(
            binding("tools/call", &call),
            binding("prompts/get", &call),
            "another method"
        );
        let other = json!({"name": "t", "arguments": {"city": "Rome"}});
        assert_ne!(
            binding("tools/call", &call),
            binding("tools/call", &other),
            "other arguments"
        );
        let tool = json!({"name": "u", "arguments": {"city": "Oslo"}});
        assert_ne!(
            binding("tools/call", &call),
            binding("tools/call", &tool),
            "another tool"
        );
    }
}
