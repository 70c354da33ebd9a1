//! The shared store suite against the in-memory backend.

mod suite;

use tether_store::MemoryStore;

store_suite!(MemoryStore::new(suite::retention()));
