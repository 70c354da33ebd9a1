//! The `resync` event: the server's explicit word that a resume cannot be exact.

use serde::{Deserialize, Serialize};

/// The SSE event type of a resync event.
pub const RESYNC_EVENT: &str = "resync";

/// Why the server cannot replay exactly what follows the cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResyncReason {
    /// Events after the cursor are no longer retained.
    Evicted,
    /// The cursor names a position the stream never reached.
    AheadOfHead,
    /// The session has no stream by that name.
    UnknownStream,
    /// The request that fed the stream died before finishing; its result will never come.
    RequestAborted,
}

impl ResyncReason {
    /// The reason as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ResyncReason::Evicted => "evicted",
            ResyncReason::AheadOfHead => "ahead_of_head",
            ResyncReason::UnknownStream => "unknown_stream",
            ResyncReason::RequestAborted => "request_aborted",
        }
    }
}

/// The JSON data of a resync event.
///
/// The event's id is `{epoch}:{stream}:{head}`, so a client that resumes from it continues
/// after `head` and is not told the same thing twice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResyncNotice {
    /// Why the resume is not exact.
    pub reason: ResyncReason,
    /// The stream that was resumed.
    pub stream: String,
    /// The cursor's sequence number.
    pub after: u64,
    /// First sequence number the client will never receive, if any.
    pub lost_from: Option<u64>,
    /// Last sequence number the client will never receive, if any.
    pub lost_to: Option<u64>,
    /// The stream's head when the server decided.
    pub head: u64,
}

impl ResyncNotice {
    /// The JSON data of the event.
    pub fn to_json(&self) -> String {
        // A struct of strings and integers always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads the data of a resync event.
    pub fn from_json(data: &str) -> Option<ResyncNotice> {
        serde_json::from_str(data).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_shape_is_stable() {
        let notice = ResyncNotice {
            reason: ResyncReason::Evicted,
            stream: "r1".into(),
            after: 3,
            lost_from: Some(4),
            lost_to: Some(9),
            head: 9,
        };
        assert_eq!(
            notice.to_json(),
            r#"{"reason":"evicted","stream":"r1","after":3,"lost_from":4,"lost_to":9,"head":9}"#
        );
        assert_eq!(ResyncNotice::from_json(&notice.to_json()), Some(notice));
        for reason in [
            ResyncReason::Evicted,
            ResyncReason::AheadOfHead,
            ResyncReason::UnknownStream,
            ResyncReason::RequestAborted,
        ] {
            assert_eq!(
                serde_json::to_value(reason).ok(),
                Some(serde_json::Value::from(reason.as_str()))
            );
        }
    }
}
