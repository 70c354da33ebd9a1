//! Incremental `text/event-stream` decoder (WHATWG HTML, "Server-sent events", §9.2.6).

/// Upper bounds on what one stream may make the decoder hold in memory.
///
/// A peer that exceeds them gets a [`DecodeError`] instead of unbounded buffering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest line, in bytes, without its terminator.
    pub max_line: usize,
    /// Largest data buffer of one event, in bytes.
    pub max_event: usize,
}

impl Limits {
    /// 1 MiB lines, 4 MiB events: the server's default request body limit.
    pub const DEFAULT: Limits = Limits {
        max_line: 1 << 20,
        max_event: 4 << 20,
    };
}

impl Default for Limits {
    /// [`Limits::DEFAULT`].
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// Why a stream could not be decoded. The decoder stays failed after it reports one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A line grew past [`Limits::max_line`].
    #[error("SSE line longer than {limit} bytes")]
    LineTooLong {
        /// The limit that was exceeded.
        limit: usize,
    },
    /// An event's data grew past [`Limits::max_event`].
    #[error("SSE event data larger than {limit} bytes")]
    EventTooLarge {
        /// The limit that was exceeded.
        limit: usize,
    },
}

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The event type; `None` for the default type `message` (no `event` field, or an empty one).
    pub event: Option<String>,
    /// The data lines joined with LF. Empty for an event whose only data line was empty, such as
    /// the MCP priming event.
    pub data: String,
    /// The value of this event's own `id` field, if it had a valid one.
    pub id: Option<String>,
    /// The stream's last event id after this event: what a reconnect sends as `Last-Event-ID`.
    pub last_event_id: String,
    /// The stream's latest reconnection time in milliseconds, if the server set one.
    pub retry: Option<u64>,
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Incremental decoder: feed it bytes in any chunking and it yields the same events.
///
/// It keeps the WHATWG connection state (last event id, reconnection time) across
/// [`Decoder::end_of_stream`], so one decoder can follow a stream over reconnects.
#[derive(Debug, Clone)]
pub struct Decoder {
    limits: Limits,
    /// Bytes of the BOM matched at the start of the stream; `None` once past it.
    bom_matched: Option<usize>,
    /// The previous chunk ended in CR, so a leading LF finishes that line break.
    skip_lf: bool,
    line: Vec<u8>,
    /// The data lines so far, joined with LF.
    data: String,
    /// Whether the block had a data line, so an empty `data` still dispatches an event.
    has_data: bool,
    event_type: String,
    block_id: Option<String>,
    last_event_id: String,
    retry: Option<u64>,
    failed: Option<DecodeError>,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new(Limits::default())
    }
}

impl Decoder {
    /// A decoder at the start of a stream.
    pub fn new(limits: Limits) -> Self {
        Decoder {
            limits,
            bom_matched: Some(0),
            skip_lf: false,
            line: Vec::new(),
            data: String::new(),
            has_data: false,
            event_type: String::new(),
            block_id: None,
            last_event_id: String::new(),
            retry: None,
            failed: None,
        }
    }

    /// The stream's last event id (empty when none was set, or after an empty `id` field).
    pub fn last_event_id(&self) -> &str {
        &self.last_event_id
    }

    /// The latest reconnection time the stream set, in milliseconds.
    ///
    /// Blocks without data update it too, which is how a server announces `retry:` right
    /// before it closes the connection.
    pub fn retry(&self) -> Option<u64> {
        self.retry
    }

    /// The connection ended: drop the incomplete event, keep the last event id and retry,
    /// and expect a new stream (with an optional BOM) next.
    pub fn end_of_stream(&mut self) {
        self.bom_matched = Some(0);
        self.skip_lf = false;
        self.line.clear();
        self.data.clear();
        self.has_data = false;
        self.event_type.clear();
        self.block_id = None;
        self.failed = None;
    }

    /// Consumes bytes from the front of `input` until one event is complete or the input is
    /// exhausted. Call it again while it returns events; `Ok(None)` means it wants more input.
    pub fn decode(&mut self, input: &mut &[u8]) -> Result<Option<Event>, DecodeError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        let result = self.decode_inner(input);
        if let Err(err) = &result {
            self.failed = Some(err.clone());
        }
        result
    }

    fn decode_inner(&mut self, input: &mut &[u8]) -> Result<Option<Event>, DecodeError> {
        self.skip_bom(input);
        while !input.is_empty() {
            if self.skip_lf {
                self.skip_lf = false;
                if input[0] == b'\n' {
                    *input = &input[1..];
                    continue;
                }
            }
            let Some(end) = memchr::memchr2(b'\r', b'\n', input) else {
                self.extend_line(input)?;
                *input = &[];
                return Ok(None);
            };
            let terminator = input[end];
            let event = if self.line.is_empty() {
                self.check_line(end)?;
                self.process_line(&input[..end])?
            } else {
                self.extend_line(&input[..end])?;
                let line = std::mem::take(&mut self.line);
                let event = self.process_line(&line);
                self.line = line;
                self.line.clear();
                event?
            };
            *input = &input[end + 1..];
            self.skip_lf = terminator == b'\r';
            if event.is_some() {
                return Ok(event);
            }
        }
        Ok(None)
    }

    /// Strips a UTF-8 BOM at the very start of the stream, even when split across chunks.
    fn skip_bom(&mut self, input: &mut &[u8]) {
        while let Some(matched) = self.bom_matched {
            let Some(&byte) = input.first() else { return };
            if byte == BOM[matched] {
                *input = &input[1..];
                self.bom_matched = (matched + 1 < BOM.len()).then_some(matched + 1);
            } else {
                // Not a BOM after all: the bytes taken so far are ordinary line content.
                self.line.extend_from_slice(&BOM[..matched]);
                self.bom_matched = None;
            }
        }
    }

    fn check_line(&self, len: usize) -> Result<(), DecodeError> {
        if len > self.limits.max_line {
            return Err(DecodeError::LineTooLong {
                limit: self.limits.max_line,
            });
        }
        Ok(())
    }

    fn extend_line(&mut self, bytes: &[u8]) -> Result<(), DecodeError> {
        self.check_line(self.line.len() + bytes.len())?;
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn process_line(&mut self, line: &[u8]) -> Result<Option<Event>, DecodeError> {
        if line.is_empty() {
            return Ok(self.dispatch());
        }
        if line[0] == b':' {
            return Ok(None);
        }
        // Split before decoding: a colon is ASCII, so it never belongs to an invalid UTF-8
        // sequence, and decoding field and value apart equals decoding the line whole.
        let (field, value) = match memchr::memchr(b':', line) {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"event" => {
                self.event_type.clear();
                self.event_type.push_str(&text(value));
            }
            b"data" => {
                let value = text(value);
                let separator = usize::from(self.has_data);
                if self.data.len() + separator + value.len() > self.limits.max_event {
                    return Err(DecodeError::EventTooLarge {
                        limit: self.limits.max_event,
                    });
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&value);
                self.has_data = true;
            }
            b"id" if !value.contains(&0) => {
                let value = text(value);
                self.last_event_id.clear();
                self.last_event_id.push_str(&value);
                self.block_id = Some(value.into_owned());
            }
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                // Digits only; a value beyond u64 is as unusable as a malformed one.
                if let Some(ms) = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()) {
                    self.retry = Some(ms);
                }
            }
            _ => {}
        }
        Ok(None)
    }

    fn dispatch(&mut self) -> Option<Event> {
        let id = self.block_id.take();
        if !std::mem::take(&mut self.has_data) {
            self.event_type.clear();
            return None;
        }
        let event = (!self.event_type.is_empty()).then(|| std::mem::take(&mut self.event_type));
        Some(Event {
            event,
            data: std::mem::take(&mut self.data),
            id,
            last_event_id: self.last_event_id.clone(),
            retry: self.retry,
        })
    }
}

/// Bytes as text; invalid UTF-8 decodes to U+FFFD, as the stream's UTF-8 decode step requires.
fn text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    // `from_utf8` checks ASCII a word at a time; the lossy walk is only for the rare bad line.
    match std::str::from_utf8(bytes) {
        Ok(text) => text.into(),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `chunks` fed one after another, then the end of the stream.
    fn decode_chunks(decoder: &mut Decoder, chunks: &[&[u8]]) -> Vec<Event> {
        let mut events = Vec::new();
        for chunk in chunks {
            let mut input = *chunk;
            while let Some(event) = decoder.decode(&mut input).expect("within limits") {
                events.push(event);
            }
            assert!(input.is_empty());
        }
        decoder.end_of_stream();
        events
    }

    fn decode(chunks: &[&[u8]]) -> Vec<Event> {
        decode_chunks(&mut Decoder::default(), chunks)
    }

    fn data(events: &[Event]) -> Vec<&str> {
        events.iter().map(|e| e.data.as_str()).collect()
    }

    #[test]
    fn lf_cr_and_crlf_line_ends_are_equivalent() {
        for input in [
            &b"data: a\n\ndata: b\n\n"[..],
            b"data: a\r\rdata: b\r\r",
            b"data: a\r\n\r\ndata: b\r\n\r\n",
        ] {
            assert_eq!(data(&decode(&[input])), ["a", "b"], "{input:?}");
        }
    }

    #[test]
    fn cr_at_chunk_end_and_lf_at_next_chunk_start_are_one_line_break() {
        let events = decode(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]);
        assert_eq!(data(&events), ["a\nb"]);
    }

    #[test]
    fn bom_is_stripped_at_stream_start_even_when_split() {
        assert_eq!(data(&decode(&[b"\xEF\xBB\xBFdata: x\n\n"])), ["x"]);
        assert_eq!(
            data(&decode(&[b"\xEF", b"\xBB", b"\xBFdata: x\n\n"])),
            ["x"]
        );
    }

    #[test]
    fn bom_is_only_stripped_once_and_only_at_the_start() {
        // A second BOM makes the field name "\u{feff}data", which is unknown and ignored.
        assert!(decode(&[b"\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\n"]).is_empty());
        let events = decode(&[b"data: \xEF\xBB\xBFx\n\n"]);
        assert_eq!(data(&events), ["\u{feff}x"]);
    }

    #[test]
    fn partial_bom_is_line_content() {
        // EF BB followed by 'd' is not a BOM: the two bytes become U+FFFD in the field name.
        assert!(decode(&[b"\xEF\xBB", b"data: x\n\n"]).is_empty());
    }

    #[test]
    fn comments_are_ignored() {
        let events = decode(&[b": keep-alive\n:\ndata: x\n: in the middle\n\n"]);
        assert_eq!(data(&events), ["x"]);
    }

    #[test]
    fn field_without_colon_has_empty_value() {
        // "data" alone appends an empty line; "id" alone resets the last event id.
        let events = decode(&[b"id: 7\ndata\ndata\n\nid\ndata: y\n\n"]);
        assert_eq!(data(&events), ["\n", "y"]);
        assert_eq!(events[0].last_event_id, "7");
        assert_eq!(events[1].last_event_id, "");
        assert_eq!(events[1].id.as_deref(), Some(""));
    }

    #[test]
    fn exactly_one_leading_space_is_stripped() {
        let events = decode(&[b"data:x\n\ndata: x\n\ndata:  x\n\n"]);
        assert_eq!(data(&events), ["x", "x", " x"]);
    }

    #[test]
    fn multi_line_data_is_joined_with_lf() {
        assert_eq!(data(&decode(&[b"data: a\ndata:\ndata: b\n\n"])), ["a\n\nb"]);
        assert_eq!(
            data(&decode(&[b"data:\ndata: x\n\ndata:\ndata:\n\n"])),
            ["\nx", "\n"]
        );
    }

    #[test]
    fn invalid_utf8_becomes_replacement_characters() {
        let events =
            decode(&[b"event: a\xFFb\nid: 1\xC3\ndata: x\xE2\x82:y\n\nda\xFFta: z\ndata: w\n\n"]);
        assert_eq!(events[0].event.as_deref(), Some("a\u{FFFD}b"));
        assert_eq!(events[0].id.as_deref(), Some("1\u{FFFD}"));
        assert_eq!(events[0].data, "x\u{FFFD}:y");
        // A field name that is not valid UTF-8 names no known field: the line is ignored.
        assert_eq!(events[1].data, "w");
        assert_eq!(events[1].last_event_id, "1\u{FFFD}");
    }

    #[test]
    fn event_type_applies_to_one_event() {
        let events = decode(&[b"event: resync\ndata: {}\n\ndata: x\n\nevent:\ndata: y\n\n"]);
        assert_eq!(events[0].event.as_deref(), Some("resync"));
        assert_eq!(events[1].event, None);
        assert_eq!(
            events[2].event, None,
            "an empty event type is the default type"
        );
    }

    #[test]
    fn event_type_without_data_does_not_leak_into_next_event() {
        let events = decode(&[b"event: resync\n\ndata: x\n\n"]);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].event, None);
    }

    #[test]
    fn id_is_inherited_as_last_event_id_but_not_as_own_id() {
        let events = decode(&[b"id: 1\ndata: a\n\ndata: b\n\n"]);
        assert_eq!(events[0].id.as_deref(), Some("1"));
        assert_eq!(events[1].id, None);
        assert_eq!(events[1].last_event_id, "1");
    }

    #[test]
    fn id_containing_nul_is_ignored() {
        let events = decode(&[b"id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n"]);
        assert_eq!(events[1].id, None);
        assert_eq!(events[1].last_event_id, "1");
    }

    #[test]
    fn empty_id_resets_last_event_id() {
        let mut decoder = Decoder::default();
        let events = decode_chunks(&mut decoder, &[b"id: 1\ndata: a\n\nid:\ndata: b\n\n"]);
        assert_eq!(events[1].last_event_id, "");
        assert_eq!(decoder.last_event_id(), "");
    }

    #[test]
    fn id_only_block_updates_last_event_id_without_dispatch() {
        let mut decoder = Decoder::default();
        let events = decode_chunks(&mut decoder, &[b"id: 5\n\n"]);
        assert!(events.is_empty());
        assert_eq!(decoder.last_event_id(), "5");
    }

    #[test]
    fn retry_accepts_ascii_digits_only() {
        for (line, expected) in [
            (&b"retry: 2000\n"[..], Some(2000)),
            (b"retry: +5\n", None),
            (b"retry:  5\n", None),
            (b"retry: 5x\n", None),
            (b"retry:\n", None),
            (b"retry: 99999999999999999999999\n", None),
        ] {
            let mut decoder = Decoder::default();
            decode_chunks(&mut decoder, &[line, b"\n"]);
            assert_eq!(decoder.retry(), expected, "{line:?}");
        }
    }

    #[test]
    fn retry_is_reported_with_later_events() {
        let events = decode(&[b"retry: 10\n\ndata: a\n\n"]);
        assert_eq!(events[0].retry, Some(10));
    }

    #[test]
    fn priming_event_with_empty_data_is_dispatched() {
        let events = decode(&[b"id: e:s:0\ndata:\n\n"]);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].data, "");
        assert_eq!(events[0].id.as_deref(), Some("e:s:0"));
        let events = decode(&[b"id: e:s:0\ndata\n\n"]);
        assert_eq!(data(&events), [""]);
    }

    #[test]
    fn block_without_data_is_not_dispatched() {
        assert!(decode(&[b"event: x\nid: 1\nretry: 5\n\n"]).is_empty());
    }

    #[test]
    fn unknown_fields_are_ignored() {
        assert_eq!(data(&decode(&[b"foo: bar\ndata: x\nDATA: y\n\n"])), ["x"]);
    }

    #[test]
    fn incomplete_event_at_end_of_stream_is_discarded() {
        let mut decoder = Decoder::default();
        assert!(decode_chunks(&mut decoder, &[b"id: 3\ndata: partial\n"]).is_empty());
        // The id field already took effect; the next connection starts a clean block.
        assert_eq!(decoder.last_event_id(), "3");
        let events = decode_chunks(&mut decoder, &[b"data: next\n\n"]);
        assert_eq!(data(&events), ["next"]);
    }

    #[test]
    fn invalid_utf8_becomes_replacement_character() {
        assert_eq!(data(&decode(&[b"data: a\xFFb\n\n"])), ["a\u{FFFD}b"]);
    }

    #[test]
    fn multibyte_character_split_across_chunks_survives() {
        let bytes = "data: é€\n\n".as_bytes();
        let events = decode(&[&bytes[..7], &bytes[7..9], &bytes[9..]]);
        assert_eq!(data(&events), ["é€"]);
    }

    #[test]
    fn colon_in_value_is_kept() {
        assert_eq!(data(&decode(&[b"data: a: b\n\n"])), ["a: b"]);
    }

    #[test]
    fn line_over_limit_is_an_error_and_the_decoder_stays_failed() {
        let mut decoder = Decoder::new(Limits {
            max_line: 8,
            max_event: 64,
        });
        let mut input = &b"data: 123"[..];
        assert_eq!(
            decoder.decode(&mut input),
            Err(DecodeError::LineTooLong { limit: 8 })
        );
        let mut input = &b"\n\n"[..];
        assert!(decoder.decode(&mut input).is_err());
    }

    #[test]
    fn line_over_limit_is_caught_across_chunks() {
        let mut decoder = Decoder::new(Limits {
            max_line: 8,
            max_event: 64,
        });
        let mut ok = 0;
        let mut failed = false;
        for _ in 0..100 {
            let mut input = &b"xx"[..];
            match decoder.decode(&mut input) {
                Ok(_) => ok += 1,
                Err(_) => failed = true,
            }
        }
        assert!(failed);
        assert_eq!(ok, 4);
    }

    #[test]
    fn event_over_limit_is_an_error() {
        let mut decoder = Decoder::new(Limits {
            max_line: 64,
            max_event: 10,
        });
        let mut input = &b"data: 12345\ndata: 12345\n\n"[..];
        let err = loop {
            match decoder.decode(&mut input) {
                Ok(Some(_)) => panic!("event over the limit was dispatched"),
                Ok(None) => continue,
                Err(err) => break err,
            }
        };
        assert_eq!(err, DecodeError::EventTooLarge { limit: 10 });
    }

    #[test]
    fn an_event_of_exactly_the_limit_is_dispatched() {
        let mut decoder = Decoder::new(Limits {
            max_line: 64,
            max_event: 11,
        });
        // Two lines of five and the newline that joins them: eleven bytes.
        let mut input = &b"data: 12345\ndata: 12345\n\n"[..];
        let event = decoder
            .decode(&mut input)
            .expect("within the limit")
            .expect("an event");
        assert_eq!(event.data, "12345\n12345");
    }

    #[test]
    fn many_events_in_one_chunk_come_out_one_per_call() {
        let mut decoder = Decoder::default();
        let mut input = &b"data: 1\n\ndata: 2\n\ndata: 3\n\n"[..];
        let mut seen = Vec::new();
        while let Some(event) = decoder.decode(&mut input).expect("within limits") {
            seen.push(event.data);
        }
        assert_eq!(seen, ["1", "2", "3"]);
        assert!(input.is_empty());
    }
}
