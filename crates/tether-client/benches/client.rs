//! The client's per-event cost with continuity validation on and off: the same decode and
//! JSON-RPC parse, with and without `StreamValidator::accept` (order check and SHA-256 digest).
//!
//! `cargo bench -p tether-client --bench client`

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tether_core::jsonrpc;
use tether_core::lineage::{Epoch, EventId, StreamName, StreamValidator, Tag};
use tether_core::sse::{Decoder, Encoder, OutgoingEvent};

const EVENTS: u64 = 10_000;

fn stream() -> Vec<u8> {
    let epoch = Epoch::from_entropy([9; 16]);
    let stream = StreamName::parse("rbench").expect("stream");
    let mut bytes = Vec::new();
    for seq in 1..=EVENTS {
        let id =
            EventId { epoch: epoch.clone(), stream: stream.clone(), seq, tag: Some(Tag::from_bits(seq)) }.to_string();
        let data = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"t","progress":{seq}}}}}"#
        );
        Encoder::event(&mut bytes, &OutgoingEvent { id: Some(&id), data: Some(data.as_bytes()), ..Default::default() })
            .expect("event");
    }
    bytes
}

fn run(bytes: &[u8], validate: bool) -> usize {
    let mut decoder = Decoder::default();
    let mut validator = StreamValidator::fresh();
    let mut delivered = 0;
    for chunk in bytes.chunks(16 * 1024) {
        let mut input = chunk;
        while let Some(event) = decoder.decode(&mut input).expect("valid stream") {
            if validate {
                validator
                    .accept(event.id.as_deref(), event.event.as_deref(), event.data.as_bytes())
                    .expect("continuous");
            }
            let message = jsonrpc::parse_message(event.data.as_bytes()).expect("message");
            delivered += usize::from(message.method().is_some());
        }
    }
    delivered
}

fn per_event(c: &mut Criterion) {
    let bytes = stream();
    let mut group = c.benchmark_group("client_event");
    group.throughput(Throughput::Elements(EVENTS));
    group.bench_function("validation_off", |b| b.iter(|| black_box(run(&bytes, false))));
    group.bench_function("validation_on", |b| b.iter(|| black_box(run(&bytes, true))));
    group.finish();
}

criterion_group!(benches, per_event);
criterion_main!(benches);
