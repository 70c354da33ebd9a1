//! What a request's stream is recorded under in its session, and the request ids that key
//! stands for: made by the server's dispatcher, read back to end or cancel those requests.

use serde_json::Value;
use tether_core::jsonrpc::RequestId;
use tether_core::lineage::StreamName;

/// The key a request (or a 2025-03-26 batch's shared stream) is recorded under: `n:` or `s:`
/// and the id, so that `1` and `"1"` are two requests; `b:`, the batch's stream and its
/// requests' ids as a JSON array, so each batch has its own. No request id makes a batch's key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestKey(String);

impl RequestKey {
    /// The key of the request with `id`.
    pub fn of(id: &RequestId) -> RequestKey {
        RequestKey(match id {
            RequestId::Number(n) => format!("n:{n}"),
            RequestId::String(s) => format!("s:{s}"),
        })
    }

    /// The key of a batch's shared `stream`, which carries the requests with `ids`.
    pub fn of_batch(stream: &StreamName, ids: &[RequestId]) -> RequestKey {
        let ids: Vec<Value> = ids.iter().map(RequestId::to_value).collect();
        RequestKey(format!("b:{stream}:{}", Value::Array(ids)))
    }

    /// The key of the request a `notifications/cancelled` names by its `requestId`; `None` for
    /// an id no request can have (the spec asks to ignore such cancellations).
    pub fn cancelled(request_id: &Value) -> Option<RequestKey> {
        RequestId::from_value(request_id).ok().map(|id| RequestKey::of(&id))
    }

    /// The key a re-sent request of a batch is tracked under while it relays its original, which
    /// may still run under this key: no request's key has a space, so the two never meet.
    pub fn relayed_in(&self, stream: &StreamName) -> RequestKey {
        RequestKey(format!("{} in {stream}", self.0))
    }

    /// A key as the store kept it.
    pub fn stored(key: &str) -> RequestKey {
        RequestKey(key.to_owned())
    }

    /// The key as the store keeps it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The request ids the key was made from.
    pub fn request_ids(&self) -> Vec<RequestId> {
        match self.0.split_once(':') {
            Some(("n", n)) => n.parse().ok().map(RequestId::Number).into_iter().collect(),
            Some(("s", s)) => vec![RequestId::String(s.to_owned())],
            // Stream names have no ':'.
            Some(("b", batch)) => serde_json::from_str::<Vec<Value>>(batch.split_once(':').map_or("", |(_, ids)| ids))
                .map(|ids| ids.iter().filter_map(|id| RequestId::from_value(id).ok()).collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }
}

impl std::fmt::Display for RequestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn request_keys_round_trip_and_keep_the_id_type() {
        for id in [RequestId::Number(-3), RequestId::String("7".into()), RequestId::String("a:b".into())] {
            assert_eq!(RequestKey::of(&id).request_ids(), [id]);
        }
        assert_ne!(RequestKey::of(&RequestId::Number(7)), RequestKey::of(&RequestId::String("7".into())));
        let batch = [RequestId::Number(1), RequestId::String("b:2".into())];
        let stream = StreamName::parse("b1").expect("a stream name");
        assert_eq!(RequestKey::of_batch(&stream, &batch).request_ids(), batch);
        assert!(RequestKey::stored("x:1").request_ids().is_empty());
    }

    #[test]
    fn a_cancellation_names_the_key_its_request_runs_under() {
        assert_eq!(RequestKey::cancelled(&json!(7)), Some(RequestKey::of(&RequestId::Number(7))));
        assert_eq!(RequestKey::cancelled(&json!("7")), Some(RequestKey::of(&RequestId::String("7".into()))));
        assert_eq!(RequestKey::cancelled(&json!(1.5)), None);
        assert_eq!(RequestKey::cancelled(&json!(null)), None);
    }
}
