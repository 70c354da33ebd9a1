//! Replays the fuzz corpus on stable Rust, so CI checks every input the fuzzer found
//! interesting without a nightly toolchain.

include!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/checks.rs"));

#[test]
fn sse_decode_corpus_holds_its_invariants() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/corpus/sse_decode");
    let mut replayed = 0;
    for entry in std::fs::read_dir(dir).expect("corpus directory exists") {
        let path = entry.expect("readable entry").path();
        check_sse_decode(&std::fs::read(&path).expect("readable corpus file"));
        replayed += 1;
    }
    assert!(replayed >= 10, "corpus has only {replayed} inputs");
    println!("replayed {replayed} corpus inputs");
}
