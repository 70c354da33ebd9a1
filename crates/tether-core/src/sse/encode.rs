//! `text/event-stream` encoder whose output the [`Decoder`](super::Decoder) gives back exactly.

/// An event to write. Fields left `None` are not written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutgoingEvent<'a> {
    /// The `id` field: must not contain CR, LF or NUL.
    pub id: Option<&'a str>,
    /// The `event` field (event type): must not contain CR, LF or NUL.
    pub event: Option<&'a str>,
    /// The `retry` field, in milliseconds.
    pub retry: Option<u64>,
    /// The data: UTF-8 text, taken as bytes because framing only looks for line breaks, and
    /// stored messages are bytes already. `Some(b"")` writes one empty data line, which
    /// dispatches an event with empty data (the MCP priming event); `None` writes no data, so
    /// the block only sets id or retry.
    pub data: Option<&'a [u8]>,
}

/// Why an event could not be encoded. Nothing is written when encoding fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The `id` contained CR, LF or NUL, which the decoder would cut or ignore.
    #[error("SSE id contains CR, LF or NUL")]
    InvalidId,
    /// The event type contained CR, LF or NUL.
    #[error("SSE event type contains CR, LF or NUL")]
    InvalidEventType,
    /// A comment contained CR or LF, which would end it early.
    #[error("SSE comment contains CR or LF")]
    InvalidComment,
}

/// Writes SSE frames into a byte buffer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Encoder;

fn has_line_break_or_nul(value: &str) -> bool {
    value.bytes().any(|b| matches!(b, b'\r' | b'\n' | b'\0'))
}

impl Encoder {
    /// Appends `event` to `out`, terminated by the blank line that dispatches it.
    ///
    /// Data is split at every line break (LF, CR or CRLF), so the decoder returns it with
    /// each line break as LF: an input without CR comes back byte for byte.
    pub fn event(out: &mut Vec<u8>, event: &OutgoingEvent<'_>) -> Result<(), EncodeError> {
        if event.id.is_some_and(has_line_break_or_nul) {
            return Err(EncodeError::InvalidId);
        }
        if event.event.is_some_and(has_line_break_or_nul) {
            return Err(EncodeError::InvalidEventType);
        }
        if let Some(id) = event.id {
            write_field(out, b"id", id);
        }
        if let Some(name) = event.event {
            write_field(out, b"event", name);
        }
        if let Some(retry) = event.retry {
            out.extend_from_slice(b"retry: ");
            out.extend_from_slice(retry.to_string().as_bytes());
            out.push(b'\n');
        }
        if let Some(data) = event.data {
            write_data(out, data);
        }
        out.push(b'\n');
        Ok(())
    }

    /// Appends a comment line, which decoders ignore: the keep-alive of long-lived streams.
    pub fn comment(out: &mut Vec<u8>, text: &str) -> Result<(), EncodeError> {
        if text.bytes().any(|b| matches!(b, b'\r' | b'\n')) {
            return Err(EncodeError::InvalidComment);
        }
        out.push(b':');
        out.extend_from_slice(text.as_bytes());
        out.push(b'\n');
        Ok(())
    }
}

fn write_field(out: &mut Vec<u8>, name: &[u8], value: &str) {
    write_line(out, name, value.as_bytes());
}

/// Writes `name: value`, or `name:` for an empty value. The colon is always there (some
/// decoders reject a bare field name) and so is the space before a value: the decoder strips
/// exactly one, so a value that itself starts with a space survives.
fn write_line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.push(b':');
    if !value.is_empty() {
        out.push(b' ');
        out.extend_from_slice(value);
    }
    out.push(b'\n');
}

fn write_data(out: &mut Vec<u8>, data: &[u8]) {
    let mut rest = data;
    loop {
        let (line, next) = match memchr::memchr2(b'\r', b'\n', rest) {
            Some(i) if rest[i] == b'\r' && rest.get(i + 1) == Some(&b'\n') => {
                (&rest[..i], Some(i + 2))
            }
            Some(i) => (&rest[..i], Some(i + 1)),
            None => (rest, None),
        };
        write_line(out, b"data", line);
        match next {
            Some(next) => rest = &rest[next..],
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(event: OutgoingEvent<'_>) -> String {
        let mut out = Vec::new();
        Encoder::event(&mut out, &event).expect("valid event");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn writes_fields_in_order() {
        let wire = encode(OutgoingEvent {
            id: Some("e:s:1"),
            event: Some("resync"),
            retry: Some(1500),
            data: Some(b"{}"),
        });
        assert_eq!(wire, "id: e:s:1\nevent: resync\nretry: 1500\ndata: {}\n\n");
    }

    #[test]
    fn priming_event_is_id_and_empty_data() {
        let wire = encode(OutgoingEvent {
            id: Some("e:s:0"),
            data: Some(b""),
            ..Default::default()
        });
        assert_eq!(wire, "id: e:s:0\ndata:\n\n");
    }

    #[test]
    fn retry_only_block_has_no_data() {
        let wire = encode(OutgoingEvent {
            retry: Some(2000),
            ..Default::default()
        });
        assert_eq!(wire, "retry: 2000\n\n");
    }

    #[test]
    fn data_is_split_on_every_line_break() {
        let wire = encode(OutgoingEvent {
            data: Some(b"a\nb\r\nc\rd\n"),
            ..Default::default()
        });
        assert_eq!(wire, "data: a\ndata: b\ndata: c\ndata: d\ndata:\n\n");
    }

    #[test]
    fn leading_space_in_value_survives() {
        let wire = encode(OutgoingEvent {
            id: Some(" x"),
            data: Some(b" y"),
            ..Default::default()
        });
        assert_eq!(wire, "id:  x\ndata:  y\n\n");
    }

    #[test]
    fn rejects_line_breaks_and_nul_in_id_and_event_type() {
        for bad in ["a\nb", "a\rb", "a\0b"] {
            let mut out = Vec::new();
            let id = OutgoingEvent {
                id: Some(bad),
                data: Some(b"x"),
                ..Default::default()
            };
            assert_eq!(Encoder::event(&mut out, &id), Err(EncodeError::InvalidId));
            let event = OutgoingEvent {
                event: Some(bad),
                data: Some(b"x"),
                ..Default::default()
            };
            assert_eq!(
                Encoder::event(&mut out, &event),
                Err(EncodeError::InvalidEventType)
            );
            assert!(out.is_empty(), "nothing written for a rejected event");
        }
    }

    #[test]
    fn comment_is_a_colon_line() {
        let mut out = Vec::new();
        Encoder::comment(&mut out, "keep-alive").expect("valid comment");
        assert_eq!(out, b":keep-alive\n");
        assert_eq!(
            Encoder::comment(&mut out, "a\nb"),
            Err(EncodeError::InvalidComment)
        );
    }
}
