//! What a request's stream is recorded under in its session, and the request ids that key
//! stands for: made by the server's dispatcher, read back to end or cancel those requests.
//! One codec ([`RequestKey::encode`], [`RequestKey::parse`]) turns it into the text a store keeps.

use serde_json::Value;
use tether_core::jsonrpc::RequestId;
use tether_core::lineage::StreamName;

use crate::ReplicaId;

/// The key a request runs under in its session. Keys of different kinds never meet: `1` and
/// `"1"` are two requests, each batch has its own key, and a re-sent request relaying its
/// original is tracked apart from every request, whatever its id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RequestKey {
    /// A request, by its id.
    Request(RequestId),
    /// A 2025-03-26 batch: its shared stream, and the ids of its requests.
    Batch {
        /// The stream the batch's responses go out on.
        stream: StreamName,
        /// Its requests' ids, in order.
        ids: Vec<RequestId>,
    },
    /// A request re-sent on `stream` while its original, which may still run under the
    /// request's own key, is relayed to it.
    Resent {
        /// The re-sent request's id.
        id: RequestId,
        /// The stream the re-sent request's answer goes out on.
        stream: StreamName,
    },
    /// A call another replica relayed to the upstream this one holds.
    Relayed {
        /// The replica the call came from.
        replica: ReplicaId,
        /// The call's number at that replica.
        call: u64,
    },
}

/// A stored key the codec cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a request key: {0:?}")]
pub struct MalformedKey(String);

impl RequestKey {
    /// The key of the request with `id`.
    pub fn of(id: &RequestId) -> RequestKey {
        RequestKey::Request(id.clone())
    }

    /// The key of the request a `notifications/cancelled` names by its `requestId`; `None` for
    /// an id no request can have (the spec asks to ignore such cancellations).
    pub fn cancelled(request_id: &Value) -> Option<RequestKey> {
        RequestId::from_value(request_id).ok().map(RequestKey::Request)
    }

    /// The request ids the key stands for: those whose responses end its stream.
    pub fn request_ids(&self) -> Vec<RequestId> {
        match self {
            RequestKey::Request(id) | RequestKey::Resent { id, .. } => vec![id.clone()],
            RequestKey::Batch { ids, .. } => ids.clone(),
            RequestKey::Relayed { .. } => Vec::new(),
        }
    }

    /// The key as a store keeps it: a one-letter kind, `:`, and the kind's fields (stream names
    /// have no `:`, so a stream comes first where there is one). `n:` and `s:` keep the text
    /// earlier versions stored for a request.
    pub fn encode(&self) -> String {
        match self {
            RequestKey::Request(id) => encode_id(id),
            RequestKey::Batch { stream, ids } => {
                let ids: Vec<Value> = ids.iter().map(RequestId::to_value).collect();
                format!("b:{stream}:{}", Value::Array(ids))
            }
            RequestKey::Resent { id, stream } => format!("r:{stream}:{}", encode_id(id)),
            RequestKey::Relayed { replica, call } => format!("u:{call}:{replica}"),
        }
    }

    /// Reads a key a store kept.
    pub fn parse(stored: &str) -> Result<RequestKey, MalformedKey> {
        let malformed = || MalformedKey(stored.chars().take(64).collect());
        let (kind, rest) = stored.split_once(':').ok_or_else(malformed)?;
        let stream_and = |rest: &str| {
            let (stream, rest) = rest.split_once(':')?;
            Some((StreamName::parse(stream).ok()?, rest.to_owned()))
        };
        match kind {
            "n" | "s" => parse_id(kind, rest).map(RequestKey::Request).ok_or_else(malformed),
            "b" => {
                let (stream, ids) = stream_and(rest).ok_or_else(malformed)?;
                let ids: Vec<Value> = serde_json::from_str(&ids).map_err(|_| malformed())?;
                let ids = ids.iter().map(RequestId::from_value).collect::<Result<_, _>>().map_err(|_| malformed())?;
                Ok(RequestKey::Batch { stream, ids })
            }
            "r" => {
                let (stream, id) = stream_and(rest).ok_or_else(malformed)?;
                let (kind, id) = id.split_once(':').ok_or_else(malformed)?;
                let id = parse_id(kind, id).ok_or_else(malformed)?;
                Ok(RequestKey::Resent { id, stream })
            }
            "u" => {
                let (call, replica) = rest.split_once(':').ok_or_else(malformed)?;
                let call = call.parse().map_err(|_| malformed())?;
                let replica = ReplicaId::parse(replica).map_err(|_| malformed())?;
                Ok(RequestKey::Relayed { replica, call })
            }
            _ => Err(malformed()),
        }
    }
}

fn encode_id(id: &RequestId) -> String {
    let mut number = itoa::Buffer::new();
    let (kind, id) = match id {
        RequestId::Number(n) => ("n:", number.format(*n)),
        RequestId::String(s) => ("s:", s.as_str()),
    };
    let mut encoded = String::with_capacity(kind.len() + id.len());
    encoded.push_str(kind);
    encoded.push_str(id);
    encoded
}

fn parse_id(kind: &str, id: &str) -> Option<RequestId> {
    match kind {
        "n" => id.parse().ok().map(RequestId::Number),
        "s" => Some(RequestId::String(id.to_owned())),
        _ => None,
    }
}

impl std::fmt::Display for RequestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.encode())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn stream(name: &str) -> StreamName {
        StreamName::parse(name).expect("a stream name")
    }

    #[test]
    fn every_kind_of_key_round_trips_through_the_codec() {
        let keys = [
            RequestKey::of(&RequestId::Number(-3)),
            RequestKey::of(&RequestId::String("7".into())),
            RequestKey::of(&RequestId::String("a:b in c".into())),
            RequestKey::Batch {
                stream: stream("b1"),
                ids: vec![RequestId::Number(1), RequestId::String("b:2".into())],
            },
            RequestKey::Resent { id: RequestId::String("x:y".into()), stream: stream("b1") },
            RequestKey::Relayed { replica: ReplicaId::parse("r:1").expect("replica"), call: 9 },
        ];
        for key in keys {
            assert_eq!(RequestKey::parse(&key.encode()), Ok(key.clone()), "{key}");
            assert_eq!(key.to_string(), key.encode(), "logs show the text the store holds");
        }
        assert_eq!(RequestKey::of(&RequestId::Number(7)).encode(), "n:7", "the text earlier versions stored");
        assert_eq!(RequestKey::of(&RequestId::String("7".into())).encode(), "s:7");
    }

    #[test]
    fn keys_keep_the_ids_they_stand_for() {
        assert_ne!(RequestKey::of(&RequestId::Number(7)), RequestKey::of(&RequestId::String("7".into())));
        let batch = vec![RequestId::Number(1), RequestId::String("b:2".into())];
        assert_eq!(RequestKey::Batch { stream: stream("b1"), ids: batch.clone() }.request_ids(), batch);
        let resent = RequestKey::Resent { id: RequestId::Number(4), stream: stream("r2") };
        assert_eq!(resent.request_ids(), [RequestId::Number(4)]);
        assert!(
            RequestKey::Relayed { replica: ReplicaId::parse("a").expect("replica"), call: 1 }.request_ids().is_empty()
        );
    }

    /// A client may name a request `"x in b1"`: the key of a re-sent `"x"` relayed on `b1` is
    /// still another key, in memory and as stored.
    #[test]
    fn a_request_id_never_makes_the_key_of_a_resent_request() {
        let named = RequestKey::of(&RequestId::String("x in b1".into()));
        let resent = RequestKey::Resent { id: RequestId::String("x".into()), stream: stream("b1") };
        assert_ne!(named, resent);
        assert_ne!(named.encode(), resent.encode());
    }

    #[test]
    fn a_stored_key_the_codec_cannot_read_is_an_error_not_an_empty_key() {
        for stored in ["", "x:1", "n:1.5", "n:", "b:b1", "b:b1:[1.5]", "b:no stream:[1]", "r:b1:q:1", "u:one:a"] {
            assert!(RequestKey::parse(stored).is_err(), "{stored:?}");
        }
    }

    #[test]
    fn a_cancellation_names_the_key_its_request_runs_under() {
        assert_eq!(RequestKey::cancelled(&json!(7)), Some(RequestKey::of(&RequestId::Number(7))));
        assert_eq!(RequestKey::cancelled(&json!("7")), Some(RequestKey::of(&RequestId::String("7".into()))));
        assert_eq!(RequestKey::cancelled(&json!(1.5)), None);
        assert_eq!(RequestKey::cancelled(&json!(null)), None);
    }
}
