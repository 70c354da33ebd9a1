//! W3C Trace Context (`traceparent`, `tracestate`) as MCP carries it: in a request's
//! `params._meta` (SEP-414, unprefixed keys), and in the HTTP `traceparent` header. Parsed into a
//! typed value, so that a malformed header is ignored rather than passed on.

use serde_json::Value;

/// The `_meta` key of the W3C `traceparent` (SEP-414).
pub const TRACEPARENT: &str = "traceparent";

/// The `_meta` key of the W3C `tracestate` (SEP-414).
pub const TRACESTATE: &str = "tracestate";

/// The longest `tracestate` passed on; W3C allows a vendor to drop a longer one whole.
pub const MAX_TRACESTATE: usize = 512;

/// A trace context: the trace, the span that is the parent of whatever is done next, and the
/// vendors' state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// The trace's id; never all zeros.
    pub trace_id: [u8; 16],
    /// The parent span's id; never all zeros.
    pub span_id: [u8; 8],
    /// Whether the trace is sampled (the `sampled` flag).
    pub sampled: bool,
    /// The `tracestate` value, if one came with it and was at most [`MAX_TRACESTATE`] bytes.
    pub state: Option<String>,
}

impl TraceContext {
    /// Parses a `traceparent` value (`00-<32 hex>-<16 hex>-<2 hex>`, lowercase), with
    /// `tracestate` if any. A later version is read by its version-00 fields, as W3C asks;
    /// version `ff`, uppercase hex and all-zero ids are refused.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        let bytes = traceparent.trim().as_bytes();
        if bytes.len() < 55 || bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let [version] = hex::<1>(&bytes[..2])?;
        if version == 0xff
            || (version == 0 && bytes.len() != 55)
            || (version != 0 && bytes.len() > 55 && bytes[55] != b'-')
        {
            return None;
        }
        let trace_id = hex::<16>(&bytes[3..35])?;
        let span_id = hex::<8>(&bytes[36..52])?;
        let [flags] = hex::<1>(&bytes[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        let state = tracestate
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE)
            .map(str::to_owned);
        Some(TraceContext {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
            state,
        })
    }

    /// The trace context a request's `params._meta` carries, if a valid one.
    pub fn from_meta(params: &Value) -> Option<TraceContext> {
        let meta = params.get("_meta")?;
        let parent = meta.get(TRACEPARENT)?.as_str()?;
        TraceContext::parse(parent, meta.get(TRACESTATE).and_then(Value::as_str))
    }

    /// Puts this context in `params._meta` as the parent of what the receiver does, replacing
    /// any there; `params` that are not an object are left alone.
    pub fn inject(&self, params: &mut Value) {
        let Some(params) = params.as_object_mut() else {
            return;
        };
        let meta = params
            .entry("_meta")
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        let Some(meta) = meta.as_object_mut() else {
            return;
        };
        meta.insert(TRACEPARENT.to_owned(), Value::String(self.traceparent()));
        match &self.state {
            Some(state) => meta.insert(TRACESTATE.to_owned(), Value::String(state.clone())),
            None => meta.remove(TRACESTATE),
        };
    }

    /// The `traceparent` value, version 00.
    pub fn traceparent(&self) -> String {
        let mut out = String::with_capacity(55);
        out.push_str("00-");
        push_hex(&mut out, &self.trace_id);
        out.push('-');
        push_hex(&mut out, &self.span_id);
        out.push_str(if self.sampled { "-01" } else { "-00" });
        out
    }
}

fn hex<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    if digits.len() != 2 * N {
        return None;
    }
    let nibble = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_round_trips() {
        let parsed = TraceContext::parse(EXAMPLE, Some("rojo=00f067aa0ba902b7")).expect("valid");
        assert_eq!(parsed.trace_id[..4], [0x4b, 0xf9, 0x2f, 0x35]);
        assert_eq!(parsed.span_id[7], 0xb7);
        assert!(parsed.sampled);
        assert_eq!(parsed.state.as_deref(), Some("rojo=00f067aa0ba902b7"));
        assert_eq!(parsed.traceparent(), EXAMPLE);
        let unsampled = TraceContext::parse(&EXAMPLE.replace("-01", "-00"), None).expect("valid");
        assert!(!unsampled.sampled);
    }

    #[test]
    fn malformed_values_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::parse(bad, None), None, "{bad:?}");
        }
        // A later version is read by the fields it shares with 00.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more";
        assert_eq!(
            TraceContext::parse(later, None).map(|c| c.traceparent()),
            Some(EXAMPLE.to_owned())
        );
        let long_state = "a=".to_owned() + &"b".repeat(MAX_TRACESTATE);
        assert_eq!(
            TraceContext::parse(EXAMPLE, Some(&long_state)).and_then(|c| c.state),
            None
        );
    }

    #[test]
    fn meta_carries_it_in_and_out() {
        let mut params = json!({"name": "echo", "_meta": {"traceparent": EXAMPLE, "tracestate": "a=1", "other": 1}});
        let parsed = TraceContext::from_meta(&params).expect("in _meta");
        let next = TraceContext {
            span_id: [1; 8],
            state: None,
            ..parsed
        };
        next.inject(&mut params);
        assert_eq!(
            params["_meta"]["traceparent"],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0101010101010101-01"
        );
        assert!(params["_meta"].get("tracestate").is_none());
        assert_eq!(params["_meta"]["other"], 1);
        let mut bare = json!({"name": "echo"});
        next.inject(&mut bare);
        assert_eq!(TraceContext::from_meta(&bare), Some(next));
        assert_eq!(
            TraceContext::from_meta(&json!({"_meta": {"traceparent": 7}})),
            None
        );
    }
}
