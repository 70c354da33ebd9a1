//! The shared store suite against the in-memory backend.

mod suite;

use tether_store::MemoryStore;

store_suite!(MemoryStore::new(suite::retention()));

#[test]
fn every_memory_store_names_its_own_idempotency_records() {
    use tether_store::Store;
    let (a, b) = (MemoryStore::new(suite::retention()), MemoryStore::new(suite::retention()));
    assert!(!a.records_id().is_empty());
    assert_ne!(a.records_id(), b.records_id(), "a restarted or other process never claims the same records");
}
