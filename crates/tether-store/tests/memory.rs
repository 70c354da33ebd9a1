//! The shared store suite against the in-memory backend.

mod suite;

use tether_store::MemoryStore;
use tether_store::{EventLog, KeyRecords, SessionStore};

store_suite!(MemoryStore::new(suite::retention()));

#[tokio::test]
async fn every_memory_store_names_its_own_idempotency_records() {
    let (a, b) = (MemoryStore::new(suite::retention()), MemoryStore::new(suite::retention()));
    assert!(!a.records().await.expect("records").is_empty());
    assert_ne!(a.records().await, b.records().await, "a restarted or other process never claims the same records");
}

#[tokio::test]
async fn the_byte_cap_evicts_the_earliest_ended_stream_and_sweeps_keep_the_count_exact() {
    use bytes::Bytes;
    use suite::{epoch, record, sid, stream};

    let store = MemoryStore::new(suite::retention());
    let a = epoch('A');
    store.create_session(record("m1", a.clone(), 0), usize::MAX).await.expect("create");
    // Ended in an order that is neither the names' nor the order they were opened in.
    for name in ["b", "a", "c", "d"] {
        store.open_stream(&sid("m1"), &a, &stream(name)).await.expect("open");
    }
    for name in ["c", "a", "b"] {
        store.append(&sid("m1"), &a, &stream(name), Bytes::from(vec![b'x'; 300]), true).await.expect("append");
    }
    store.append(&sid("m1"), &a, &stream("d"), Bytes::from(vec![b'x'; 300]), false).await.expect("append");
    // Kept: its events are retained (a dropped stream keeps only its tombstone).
    let kept = |name: &'static str| {
        let store = &store;
        async move {
            let range = store.stream_range(&sid("m1"), &stream(name)).await.expect("range").expect("known");
            range.retained_from <= range.head
        }
    };
    assert!(!kept("c").await, "over the 1,000-byte cap, the stream that ended first goes");
    assert!(kept("a").await && kept("b").await && kept("d").await);
    assert_eq!(store.retained_bytes().await, Ok(Some(900)));
    store.append(&sid("m1"), &a, &stream("d"), Bytes::from(vec![b'x'; 200]), false).await.expect("append");
    assert!(!kept("a").await && kept("b").await, "then the one that ended next");
    assert_eq!(store.retained_bytes().await, Ok(Some(800)));
    store.sweep(0).await.expect("sweep");
    store.sweep(499).await.expect("sweep");
    assert!(kept("b").await, "ended streams are kept for their retention after a sweep saw them");
    store.sweep(500).await.expect("sweep");
    assert!(!kept("b").await && kept("d").await);
    assert_eq!(store.retained_bytes().await, Ok(Some(500)));
}

/// A session's events leave the store's total when it ends, terminated or expired: the cap on
/// all sessions' bytes must not evict a live session's history for bytes no session holds.
#[tokio::test]
async fn an_ended_sessions_bytes_leave_the_total_the_cap_is_held_to() {
    use bytes::Bytes;
    use suite::{TTL, epoch, record, sid, stream};
    use tether_store::SessionEnd;

    let retention =
        tether_store::Retention { max_bytes_total: 1_000, max_idempotency_records: 100, ..suite::retention() };
    let store = MemoryStore::new(retention);
    let a = epoch('A');
    // "gone" is terminated, "idle" expires, "kept" is renewed and stays.
    for id in ["gone", "idle", "kept"] {
        store.create_session(record(id, a.clone(), 0), usize::MAX).await.expect("create");
        store.open_stream(&sid(id), &a, &stream("r")).await.expect("open");
        store.append(&sid(id), &a, &stream("r"), Bytes::from(vec![b'x'; 300]), false).await.expect("append");
    }
    assert_eq!(store.retained_bytes().await, Ok(Some(900)));
    store.end_session(&sid("gone"), &a, SessionEnd::Terminated).await.expect("end");
    store.touch_session(&sid("kept"), &a, TTL - 1).await.expect("touch");
    assert_eq!(store.sweep(TTL).await, Ok(vec![sid("idle")]));
    assert_eq!(store.retained_bytes().await, Ok(Some(300)), "only the live session's bytes count");
    // 600 more bytes fit under the cap beside the live session's 300: none of its events go.
    store.append(&sid("kept"), &a, &stream("r"), Bytes::from(vec![b'x'; 600]), false).await.expect("append");
    let range = store.stream_range(&sid("kept"), &stream("r")).await.expect("range").expect("known");
    assert_eq!((range.retained_from, range.head), (0, 2), "the live session's history is whole");
}

/// The cap on all sessions' bytes is kept by the session that appends: past it, its own history
/// goes (its ended streams, then its stream's oldest events), as much as brings the total back
/// under the cap; exactly at the cap, nothing goes. Other sessions keep theirs, and a stream
/// dropped later frees exactly what it still held.
#[tokio::test]
async fn the_total_cap_takes_from_the_appending_session_only_what_is_over_it() {
    use bytes::Bytes;
    use suite::{epoch, record, sid, stream};

    let retention =
        tether_store::Retention { max_bytes_total: 1_000, max_idempotency_records: 100, ..suite::retention() };
    let store = MemoryStore::new(retention);
    let a = epoch('A');
    for id in ["x", "y"] {
        store.create_session(record(id, a.clone(), 0), usize::MAX).await.expect("create");
        store.open_stream(&sid(id), &a, &stream("r")).await.expect("open");
        store.append(&sid(id), &a, &stream("r"), Bytes::from(vec![b'x'; 400]), id == "x").await.expect("append");
    }
    let range = |id: &'static str| {
        let store = &store;
        async move {
            let range = store.stream_range(&sid(id), &stream("r")).await.expect("range").expect("known");
            (range.retained_from, range.head)
        }
    };
    store.append(&sid("y"), &a, &stream("r"), Bytes::from(vec![b'y'; 200]), false).await.expect("append");
    assert_eq!(range("y").await, (0, 2), "1,000 bytes in all are within the cap");
    store.append(&sid("y"), &a, &stream("r"), Bytes::from(vec![b'y'; 100]), false).await.expect("append");
    assert_eq!(range("y").await, (2, 3), "the appending session's oldest event went, and only it");
    assert_eq!(range("x").await, (0, 1), "another session's ended stream is not the appender's to drop");
    assert_eq!(store.retained_bytes().await, Ok(Some(700)));
    // Dropped whole once ended and past retention, each stream frees what it still held.
    store.end_stream(&sid("y"), &a, &stream("r")).await.expect("end");
    store.sweep(0).await.expect("sweep");
    store.sweep(suite::retention().ended_stream_ms).await.expect("sweep");
    assert_eq!(store.retained_bytes().await, Ok(Some(0)));
}

#[tokio::test]
async fn request_ids_past_the_bound_are_forgotten_oldest_first() {
    suite::request_ids_past_the_bound_are_forgotten_oldest_first(&MemoryStore::new(suite::retention())).await;
}

#[tokio::test]
async fn tombstones_past_the_bound_are_forgotten_oldest_first() {
    use bytes::Bytes;
    use suite::{epoch, record, sid, stream};

    let store = MemoryStore::new(suite::retention());
    let a = epoch('A');
    store.create_session(record("m2", a.clone(), 0), usize::MAX).await.expect("create");
    // Five streams dropped one sweep apart; the bound (4) keeps the last four tombstones.
    for (n, now) in (1..=5).zip((0..).step_by(600)) {
        let name = stream(&format!("t{n}"));
        store.open_stream(&sid("m2"), &a, &name).await.expect("open");
        store.append(&sid("m2"), &a, &name, Bytes::from_static(b"x"), true).await.expect("append");
        store.touch_session(&sid("m2"), &a, now).await.expect("touch");
        store.sweep(now).await.expect("sweep");
    }
    store.touch_session(&sid("m2"), &a, 3_000).await.expect("touch");
    store.sweep(3_000).await.expect("sweep");
    let range = |n: u32| {
        let store = &store;
        async move { store.stream_range(&sid("m2"), &stream(&format!("t{n}"))).await.expect("range") }
    };
    assert_eq!(range(1).await, None, "the oldest tombstone went past the bound");
    for n in 2..=5 {
        assert_eq!(range(n).await, suite::tombstone(1, tether_core::lineage::StreamState::Complete), "tombstone t{n}");
    }
}

/// A sweep forgets history in batches with the lock released in between: it must still forget
/// everything due, however many batches that takes.
#[tokio::test]
async fn a_sweep_forgets_everything_due_however_many_batches_it_takes() {
    use bytes::Bytes;
    use suite::{claim, epoch, record, sid, stream};

    let retention = tether_store::Retention {
        max_bytes_per_session: 1 << 20,
        max_requests_per_session: 10_000,
        max_finished_tasks: 10_000,
        max_idempotency_records: 10_000,
        ..suite::retention()
    };
    let store = MemoryStore::new(retention);
    let a = epoch('A');
    store.create_session(record("m3", a.clone(), 0), usize::MAX).await.expect("create");
    let n = 2_500;
    for i in 0..n {
        let name = stream(&format!("s{i}"));
        store.open_stream(&sid("m3"), &a, &name).await.expect("open");
        store.append(&sid("m3"), &a, &name, Bytes::from_static(b"x"), true).await.expect("append");
        let key = format!("k{i}");
        assert!(matches!(store.claim_key(claim(&key, "d", 0)).await, Ok(tether_store::Claim::Claimed(_))));
        store.finish_key(&key, Bytes::from_static(b"{}")).await.expect("finish");
    }
    assert_eq!(store.retained_bytes().await, Ok(Some(n)));
    store.sweep(0).await.expect("sweep");
    store.sweep(retention.ended_stream_ms).await.expect("sweep");
    assert_eq!(store.retained_bytes().await, Ok(Some(0)), "every ended stream's events dropped");
    let last = store.stream_range(&sid("m3"), &stream(&format!("s{}", n - 1))).await.expect("range");
    assert_eq!(last, suite::tombstone(1, tether_core::lineage::StreamState::Complete));
    store.sweep(retention.idempotency_ms).await.expect("sweep");
    for i in [0, n / 2, n - 1] {
        assert_eq!(store.key_state(&format!("k{i}"), retention.idempotency_ms).await, Ok(None), "k{i} forgotten");
    }
}

/// Sessions are swept a batch at a time too: every one past its deadline is expired and
/// uncounted, and every tombstone past its time forgotten, however many batches that takes.
#[tokio::test]
async fn a_sweep_visits_every_session_however_many_batches_it_takes() {
    use suite::{TTL, epoch, record, sid};
    use tether_store::SessionStatus;
    let store = MemoryStore::new(suite::retention());
    let n = 2_500;
    for i in 0..n {
        store.create_session(record(&format!("s{i:04}"), epoch('A'), 0), usize::MAX).await.expect("create");
    }
    let expired = store.sweep(TTL).await.expect("sweep");
    assert_eq!(expired.len(), n, "every session past its deadline expired");
    store.create_session(record("one-more", epoch('B'), TTL), 1).await.expect("none counted as live any more");
    store.sweep(TTL + suite::retention().tombstone_ms).await.expect("sweep");
    for i in [0, n / 2, n - 1] {
        let status = store.session(&sid(&format!("s{i:04}")), TTL).await.expect("status");
        assert!(matches!(status, SessionStatus::Unknown), "s{i:04}: {status:?}");
    }
}

/// Idempotency records' outcomes are held to the store's byte bound, apart from the events': a
/// client chooses how many keys it sends and how large their outcomes are. Past it, the sweep
/// forgets the oldest finished records first, and never a running one.
#[tokio::test]
async fn outcomes_past_the_byte_bound_are_forgotten_oldest_first() {
    use bytes::Bytes;
    use suite::claim;
    use tether_store::{Claim, KeyState};

    let retention =
        tether_store::Retention { max_bytes_total: 1_000, max_idempotency_records: 100, ..suite::retention() };
    let store = MemoryStore::new(retention);
    assert!(matches!(store.claim_key(claim("running", "d", 0)).await, Ok(Claim::Claimed(_))));
    for i in 0..5 {
        let key = format!("k{i}");
        assert!(matches!(store.claim_key(claim(&key, "d", 0)).await, Ok(Claim::Claimed(_))));
        store.finish_key(&key, Bytes::from(vec![b'x'; 400])).await.expect("finish");
    }
    store.sweep(0).await.expect("sweep");
    for i in 0..3 {
        assert_eq!(store.key_state(&format!("k{i}"), 0).await, Ok(None), "k{i}: 2,000 bytes where 1,000 are kept");
    }
    for i in 3..5 {
        let state = store.key_state(&format!("k{i}"), 0).await.expect("state");
        assert!(matches!(state, Some(KeyState::Finished(ref outcome)) if outcome.len() == 400), "k{i}: {state:?}");
    }
    let running = store.key_state("running", 0).await.expect("state");
    assert!(matches!(running, Some(KeyState::Running { .. })), "{running:?}");
}
