//! Property tests of the SSE codec: encode→decode round trips under any chunking, and the
//! decoder agrees with an independent WHATWG implementation (sse-stream 0.3.0).

use std::convert::Infallible;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use futures_util::Stream;
use proptest::prelude::*;
use tether_core::sse::{Decoder, Encoder, Event, OutgoingEvent};

/// Splits `bytes` at the given cut points (taken modulo the length) and decodes.
fn decode_chunked(bytes: &[u8], cuts: &[usize]) -> Vec<Event> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    cuts.sort_unstable();
    let mut decoder = Decoder::default();
    let mut events = Vec::new();
    let mut start = 0;
    for end in cuts.into_iter().chain([bytes.len()]) {
        let mut input = &bytes[start..end];
        while let Some(event) = decoder.decode(&mut input).expect("within default limits") {
            events.push(event);
        }
        start = end;
    }
    events
}

fn field_value() -> impl Strategy<Value = String> {
    // Any text without CR, LF or NUL, including leading spaces, colons and non-ASCII.
    proptest::string::string_regex("[ :a-z0-9_\u{e9}\u{20ac}\u{feff}-]{0,12}").expect("valid regex")
}

fn data_value() -> impl Strategy<Value = String> {
    proptest::string::string_regex("([ :a-z{}\"\u{e9}]|\r\n|\r|\n){0,24}").expect("valid regex")
}

#[derive(Debug, Clone)]
enum Item {
    Event { id: Option<String>, event: Option<String>, retry: Option<u64>, data: Option<String> },
    Comment(String),
}

fn item() -> impl Strategy<Value = Item> {
    prop_oneof![
        4 => (
            proptest::option::of(field_value()),
            proptest::option::of(field_value()),
            proptest::option::of(any::<u64>()),
            proptest::option::weighted(0.9, data_value()),
        )
            .prop_map(|(id, event, retry, data)| Item::Event { id, event, retry, data }),
        1 => field_value().prop_map(Item::Comment),
    ]
}

/// The events a WHATWG decoder must produce for `items`.
fn expected(items: &[Item]) -> Vec<Event> {
    let mut last_event_id = String::new();
    let mut retry = None;
    let mut out = Vec::new();
    for item in items {
        let Item::Event { id, event, retry: r, data } = item else { continue };
        if let Some(id) = id {
            last_event_id = id.clone();
        }
        retry = r.or(retry);
        if let Some(data) = data {
            out.push(Event {
                event: event.clone().filter(|e| !e.is_empty()),
                data: data.replace("\r\n", "\n").replace('\r', "\n"),
                id: id.clone(),
                last_event_id: last_event_id.clone(),
                retry,
            });
        }
    }
    out
}

fn encode(items: &[Item]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for item in items {
        match item {
            Item::Event { id, event, retry, data } => Encoder::event(
                &mut bytes,
                &OutgoingEvent {
                    id: id.as_deref(),
                    event: event.as_deref(),
                    retry: *retry,
                    data: data.as_deref().map(str::as_bytes),
                },
            )
            .expect("generated fields are valid"),
            Item::Comment(text) => Encoder::comment(&mut bytes, text).expect("no line breaks"),
        }
    }
    bytes
}

/// Decodes with sse-stream 0.3.0 and applies the WHATWG dispatch rules to its raw blocks.
fn oracle(chunks: Vec<Vec<u8>>) -> Option<Vec<Event>> {
    let stream = futures_util::stream::iter(chunks.into_iter().map(|c| Ok::<_, Infallible>(Bytes::from(c))));
    let mut stream = pin!(sse_stream::SseByteStream::new(stream));
    let mut cx = Context::from_waker(Waker::noop());
    let (mut last_event_id, mut retry, mut out) = (String::new(), None, Vec::new());
    loop {
        match stream.as_mut().poll_next(&mut cx) {
            Poll::Ready(Some(Ok(block))) => {
                if let Some(id) = &block.id {
                    last_event_id = id.clone();
                }
                retry = block.retry.or(retry);
                if let Some(data) = block.data {
                    out.push(Event {
                        event: block.event.filter(|e| !e.is_empty()),
                        data,
                        id: block.id,
                        last_event_id: last_event_id.clone(),
                        retry,
                    });
                }
            }
            Poll::Ready(Some(Err(_))) => return None,
            Poll::Ready(None) => return Some(out),
            Poll::Pending => unreachable!("an in-memory stream is always ready"),
        }
    }
}

/// Raw input from SSE-significant fragments, so odd combinations come up often.
fn raw_input() -> impl Strategy<Value = Vec<u8>> {
    let fragment = prop_oneof![
        Just("data".to_owned()),
        Just("id".to_owned()),
        Just("event".to_owned()),
        Just("retry".to_owned()),
        Just(":".to_owned()),
        Just(" ".to_owned()),
        Just("\n".to_owned()),
        Just("\r".to_owned()),
        Just("\r\n".to_owned()),
        Just("\0".to_owned()),
        Just("\u{feff}".to_owned()),
        Just("+".to_owned()),
        "[0-9]{1,3}",
        "[a-z\u{e9}]{1,3}",
    ];
    proptest::collection::vec(fragment, 0..48).prop_map(|parts| parts.concat().into_bytes())
}

fn split(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    cuts.sort_unstable();
    let mut chunks = Vec::new();
    let mut start = 0;
    for end in cuts.into_iter().chain([bytes.len()]) {
        chunks.push(bytes[start..end].to_vec());
        start = end;
    }
    chunks
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn encode_then_decode_round_trips_under_any_chunking(
        items in proptest::collection::vec(item(), 0..12),
        cuts in proptest::collection::vec(any::<usize>(), 0..10),
    ) {
        let bytes = encode(&items);
        prop_assert_eq!(decode_chunked(&bytes, &cuts), expected(&items));
    }

    #[test]
    fn decoder_agrees_with_sse_stream_oracle(
        body in raw_input(),
        cuts in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        // Terminate the stream so the last block is complete for both decoders.
        let mut bytes = body;
        bytes.extend_from_slice(b"\n\n");
        let ours = decode_chunked(&bytes, &cuts);
        let theirs = oracle(split(&bytes, &cuts));
        prop_assert_eq!(Some(ours), theirs, "input {:?}", String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn chunking_never_changes_the_result(
        body in raw_input(),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        prop_assert_eq!(decode_chunked(&body, &cuts), decode_chunked(&body, &[]));
    }
}
