//! Hot-path costs of the core: SSE decode throughput and per-event lineage validation.
//!
//! `cargo bench -p tether-core --bench core`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use tether_core::lineage::{Epoch, EventId, StreamName, StreamValidator, Tag};
use tether_core::sse::{Decoder, Encoder, OutgoingEvent};

/// A realistic MCP stream: progress notifications with lineage ids.
fn stream_bytes(events: u64) -> (Vec<u8>, Vec<(String, String)>) {
    let epoch = Epoch::from_entropy([7; 16]);
    let stream = StreamName::parse("req-42").expect("valid stream");
    let mut bytes = Vec::new();
    let mut parsed = Vec::new();
    for seq in 1..=events {
        let id =
            EventId { epoch: epoch.clone(), stream: stream.clone(), seq, tag: Some(Tag::from_bits(seq)) }.to_string();
        let data = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"t-1","progress":{seq},"total":{events}}}}}"#
        );
        Encoder::event(&mut bytes, &OutgoingEvent { id: Some(&id), data: Some(data.as_bytes()), ..Default::default() })
            .expect("valid event");
        parsed.push((id, data));
    }
    (bytes, parsed)
}

fn sse_decode(c: &mut Criterion) {
    let (bytes, _) = stream_bytes(10_000);
    let mut group = c.benchmark_group("sse_decode");
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    for chunk in [16 * 1024, 1460] {
        group.bench_function(format!("chunks_of_{chunk}"), |b| {
            b.iter(|| {
                let mut decoder = Decoder::default();
                let mut n = 0;
                for piece in bytes.chunks(chunk) {
                    let mut input = piece;
                    while let Some(event) = decoder.decode(&mut input).expect("valid stream") {
                        n += event.data.len();
                    }
                }
                black_box(n)
            })
        });
    }
    group.finish();
}

fn sse_encode(c: &mut Criterion) {
    let (bytes, events) = stream_bytes(10_000);
    let mut group = c.benchmark_group("sse_encode");
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.bench_function("events", |b| {
        let mut out = Vec::with_capacity(bytes.len());
        b.iter(|| {
            out.clear();
            for (id, data) in &events {
                Encoder::event(
                    &mut out,
                    &OutgoingEvent { id: Some(id), data: Some(data.as_bytes()), ..Default::default() },
                )
                .expect("valid event");
            }
            black_box(out.len())
        })
    });
    group.finish();
}

fn lineage_validate(c: &mut Criterion) {
    let (_, events) = stream_bytes(10_000);
    let mut group = c.benchmark_group("lineage_validate");
    group.throughput(Throughput::Elements(events.len() as u64));
    group.bench_function("per_event", |b| {
        b.iter(|| {
            let mut validator = StreamValidator::fresh();
            for (id, data) in &events {
                validator.accept(Some(id), None, data.as_bytes()).expect("contiguous");
            }
            black_box(validator.last().is_some())
        })
    });
    group.finish();
}

criterion_group!(benches, sse_decode, sse_encode, lineage_validate);
criterion_main!(benches);
