//! Replays the HTTP fuzz target's corpus on stable Rust, so CI checks every input the fuzzer
//! found interesting without a nightly toolchain.

include!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/http_checks.rs"));

#[test]
fn http_exchange_corpus_holds_its_invariants() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/corpus/http_exchange");
    let mut replayed = 0;
    for entry in std::fs::read_dir(dir).expect("corpus directory exists") {
        let path = entry.expect("readable entry").path();
        let input = std::fs::read(&path).expect("readable corpus file");
        if std::panic::catch_unwind(|| check_http_exchange(&input)).is_err() {
            panic!("{} breaks an invariant", path.display());
        }
        replayed += 1;
    }
    assert!(replayed >= 20, "corpus has only {replayed} inputs");
    println!("replayed {replayed} corpus inputs");
}
