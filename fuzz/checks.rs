// Invariants checked on arbitrary input, shared by the fuzz target (`cargo +nightly fuzz run
// sse_decode`) and the stable test that replays the corpus (`tests/fuzz_corpus.rs`).

/// Decoding arbitrary bytes never panics, gives the same events however the bytes are
/// chunked, stays within its limits, and every id it yields either parses as a lineage id
/// that formats back to itself or is rejected with a reason.
pub fn check_sse_decode(bytes: &[u8]) {
    use tether_core::lineage::EventId;
    use tether_core::sse::{Decoder, Limits};

    let limits = Limits { max_line: 256, max_event: 1024 };
    let decode = |chunks: &[&[u8]]| {
        let mut decoder = Decoder::new(limits);
        let mut events = Vec::new();
        for chunk in chunks {
            let mut input = *chunk;
            loop {
                match decoder.decode(&mut input) {
                    Ok(Some(event)) => {
                        assert!(event.data.len() <= limits.max_event);
                        events.push(Ok(event));
                    }
                    Ok(None) => break,
                    Err(err) => {
                        events.push(Err(err));
                        return events;
                    }
                }
            }
        }
        events
    };
    let whole = decode(&[bytes]);
    let cut = bytes.first().map_or(0, |b| usize::from(*b) % (bytes.len() + 1));
    let (a, b) = bytes.split_at(cut);
    assert_eq!(whole, decode(&[a, b]), "chunking changed the result");
    let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
    assert_eq!(whole, decode(&bytewise), "byte-at-a-time changed the result");
    for event in whole.iter().flatten() {
        if let Some(id) = &event.id
            && let Ok(parsed) = EventId::parse(id)
        {
            assert_eq!(&parsed.to_string(), id, "lineage ids are canonical");
        }
    }
}
