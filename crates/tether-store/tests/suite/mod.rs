//! The behaviour every [`Store`] backend must have, run against each backend by its own test
//! file. Time is passed in explicitly, so nothing here sleeps.

use bytes::Bytes;
use tether_core::idempotency::Acknowledged;
use tether_core::lineage::{Epoch, SessionId, StreamName, StreamRange, StreamState};
use tether_core::mcp::ProtocolVersion;
use tether_store::{
    BeginRequest, Claim, CounterStore, KeyClaim, KeyState, RequestKey, RequestRecord, Retention, SessionEnd,
    SessionRecord, SessionStatus, Store, StoreError, TaskLimits,
};

pub const TTL: u64 = 1_000;

/// The retention the suite's backends are built with.
pub fn retention() -> Retention {
    Retention {
        ended_stream_ms: 500,
        tombstone_ms: 2_000,
        max_events_per_stream: 8,
        max_bytes_per_session: 1_000,
        max_bytes_total: 1 << 20,
        lease_ms: 5_000,
        idempotency_ms: 10_000,
        max_idempotency_records: 3,
        max_requests_per_session: 4,
        max_finished_tasks: 2,
    }
}

/// A claim of `key` at `now`, running on stream `r1` of session `s`.
pub fn claim(key: &str, digest: &str, now: u64) -> KeyClaim {
    KeyClaim {
        key: key.into(),
        params_digest: digest.into(),
        stream: Some((sid("s"), stream("r1"))),
        now_ms: now,
        acknowledged: None,
    }
}

/// The acknowledgement of the claim at `position` in `store`'s records.
pub async fn ack(store: &dyn Store, position: u64) -> Acknowledged {
    Acknowledged { records: store.records().await.expect("records"), position }
}

/// A task id.
pub fn tid(id: &str) -> tether_core::tasks::TaskId {
    tether_core::tasks::TaskId::parse(id).expect("a task id")
}

pub fn sid(id: &str) -> SessionId {
    SessionId::parse(id).expect("valid session id")
}

/// The key of a request as the server records it (`n:1`, `s:x`).
pub fn key(stored: &str) -> RequestKey {
    RequestKey::parse(stored).expect("a request key")
}

pub fn epoch(tag: char) -> Epoch {
    Epoch::parse(&tag.to_string().repeat(22)).expect("valid epoch")
}

pub fn stream(name: &str) -> StreamName {
    StreamName::parse(name).expect("valid stream")
}

/// Request `key` of `session` in incarnation `epoch`, with the digest of its params and its
/// stream, as the store records it when it begins.
pub fn request<'a>(
    session: &'a SessionId,
    epoch: &'a Epoch,
    key: &'a RequestKey,
    params_digest: &'a str,
    stream: &'a StreamName,
) -> RequestRecord<'a> {
    RequestRecord { session, epoch, key, params_digest, stream }
}

pub fn record(id: &str, epoch: Epoch, now: u64) -> SessionRecord {
    SessionRecord {
        id: sid(id),
        epoch,
        principal: None,
        protocol_version: ProtocolVersion::V2025_11_25,
        client: std::sync::Arc::new(serde_json::json!({"capabilities": {}})),
        idle_ttl_ms: TTL,
        expires_at_ms: now + TTL,
    }
}

/// What a stream whose events retention dropped says of itself: how far it got and how it
/// ended, with nothing retained.
pub fn tombstone(head: u64, state: StreamState) -> Option<StreamRange> {
    Some(StreamRange { retained_from: head + 1, head, state })
}

async fn seqs(store: &dyn Store, session: &SessionId, s: &StreamName, after: u64) -> Vec<u64> {
    store.read(session, s, after, usize::MAX).await.expect("read").iter().map(|e| e.seq).collect()
}

pub async fn sessions_are_created_once_and_read_without_renewal(store: &dyn Store) {
    let a = epoch('A');
    store.create_session(record("s1", a.clone(), 0), usize::MAX).await.expect("create");
    assert_eq!(store.create_session(record("s1", epoch('B'), 0), usize::MAX).await, Err(StoreError::DuplicateSession));
    let SessionStatus::Live(r) = store.session(&sid("s1"), 900).await.expect("lookup") else { panic!("live") };
    assert_eq!((r.epoch, r.expires_at_ms), (a, TTL));
    // Reading at a later time did not renew it.
    let SessionStatus::Live(r) = store.session(&sid("s1"), 950).await.expect("lookup") else { panic!("live") };
    assert_eq!(r.expires_at_ms, TTL);
    assert_eq!(store.session(&sid("nope"), 0).await, Ok(SessionStatus::Unknown));
}

pub async fn live_sessions_are_counted_when_one_is_admitted(store: &dyn Store) {
    let a = epoch('A');
    for id in ["c1", "c2", "c3"] {
        store.create_session(record(id, a.clone(), 0), 3).await.expect("admitted under the limit");
    }
    assert_eq!(store.create_session(record("c4", a.clone(), 0), 3).await, Err(StoreError::TooManySessions));
    assert_eq!(store.create_session(record("c1", a.clone(), 0), 4).await, Err(StoreError::DuplicateSession));
    store.end_session(&sid("c1"), &a, SessionEnd::Terminated).await.expect("end");
    store.create_session(record("c4", a.clone(), 0), 3).await.expect("an ended session is not counted");
    assert_eq!(store.create_session(record("c5", a.clone(), 0), 3).await, Err(StoreError::TooManySessions));
    // Renewed, c2 outlives the sweep; c3 and c4 expire and are no longer counted.
    store.touch_session(&sid("c2"), &a, 500).await.expect("touch");
    assert_eq!(
        store.sweep(TTL).await.map(|mut ids| {
            ids.sort();
            ids
        }),
        Ok(vec![sid("c3"), sid("c4")])
    );
    store.create_session(record("c5", a.clone(), TTL), 3).await.expect("admitted");
    store.create_session(record("c6", a.clone(), TTL), 3).await.expect("admitted");
    assert_eq!(store.create_session(record("c7", a.clone(), TTL), 3).await, Err(StoreError::TooManySessions));
}

/// Many initializes at once against a limit: exactly the limit's worth is admitted.
pub async fn concurrent_admissions_never_pass_the_limit(store: &dyn Store) {
    let a = epoch('A');
    let attempts = (0..24).map(|n| store.create_session(record(&format!("x{n}"), a.clone(), 0), 5));
    let results = futures_util::future::join_all(attempts).await;
    let admitted = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(admitted, 5, "{results:?}");
    assert!(results.iter().all(|r| matches!(r, Ok(()) | Err(StoreError::TooManySessions))));
}

pub async fn touch_renews_only_a_live_session_of_the_same_incarnation(store: &dyn Store) {
    let a = epoch('A');
    store.create_session(record("s2", a.clone(), 0), usize::MAX).await.expect("create");
    store.touch_session(&sid("s2"), &a, 500).await.expect("touch");
    let SessionStatus::Live(r) = store.session(&sid("s2"), 500).await.expect("lookup") else { panic!("live") };
    assert_eq!(r.expires_at_ms, 500 + TTL);
    assert_eq!(store.touch_session(&sid("s2"), &epoch('B'), 600).await, Err(StoreError::SessionGone));
    // Past its deadline a session cannot be renewed, even before any sweep ran.
    assert_eq!(store.touch_session(&sid("s2"), &a, 500 + TTL).await, Err(StoreError::SessionGone));
    assert_eq!(store.touch_session(&sid("unknown"), &a, 0).await, Err(StoreError::SessionGone));
}

pub async fn ended_sessions_refuse_writes_and_are_remembered(store: &dyn Store) {
    let a = epoch('A');
    let s = stream("r1");
    store.create_session(record("s3", a.clone(), 0), usize::MAX).await.expect("create");
    store.open_stream(&sid("s3"), &a, &s).await.expect("open");
    assert_eq!(store.end_session(&sid("s3"), &epoch('B'), SessionEnd::Terminated).await, Err(StoreError::SessionGone));
    store.end_session(&sid("s3"), &a, SessionEnd::Terminated).await.expect("end");
    assert_eq!(store.session(&sid("s3"), 0).await, Ok(SessionStatus::Ended(SessionEnd::Terminated)));
    assert_eq!(store.append(&sid("s3"), &a, &s, Bytes::from_static(b"x"), false).await, Err(StoreError::SessionGone));
    assert_eq!(store.stream_range(&sid("s3"), &s).await, Ok(None));
    assert_eq!(store.create_session(record("s3", epoch('C'), 0), usize::MAX).await, Err(StoreError::DuplicateSession));
    // Each way a session ends is remembered as itself: the 404 names it.
    store.create_session(record("s3u", a.clone(), 0), usize::MAX).await.expect("create");
    store.end_session(&sid("s3u"), &a, SessionEnd::UpstreamLost).await.expect("end");
    assert_eq!(store.session(&sid("s3u"), 0).await, Ok(SessionStatus::Ended(SessionEnd::UpstreamLost)));
}

pub async fn appends_are_contiguous_and_checked_against_the_incarnation(store: &dyn Store) {
    let a = epoch('A');
    let s = stream("r1");
    store.create_session(record("s4", a.clone(), 0), usize::MAX).await.expect("create");
    store.open_stream(&sid("s4"), &a, &s).await.expect("open");
    for expected in 1..=3 {
        assert_eq!(store.append(&sid("s4"), &a, &s, Bytes::from(format!("e{expected}")), false).await, Ok(expected));
    }
    // A writer from another incarnation neither writes nor consumes a sequence number.
    assert_eq!(
        store.append(&sid("s4"), &epoch('B'), &s, Bytes::from_static(b"stale"), false).await,
        Err(StoreError::SessionGone)
    );
    assert_eq!(
        store.append(&sid("s4"), &a, &stream("nope"), Bytes::new(), false).await,
        Err(StoreError::UnknownStream)
    );
    assert_eq!(store.append(&sid("s4"), &a, &s, Bytes::from_static(b"final"), true).await, Ok(4));
    assert_eq!(
        store.append(&sid("s4"), &a, &s, Bytes::from_static(b"late"), false).await,
        Err(StoreError::StreamEnded)
    );
    let range = store.stream_range(&sid("s4"), &s).await.expect("range").expect("known stream");
    assert_eq!((range.retained_from, range.head, range.state), (0, 4, StreamState::Complete));
    let events = store.read(&sid("s4"), &s, 0, usize::MAX).await.expect("read");
    let data: Vec<&[u8]> = events.iter().map(|e| &e.data[..]).collect();
    assert_eq!(data, [&b"e1"[..], b"e2", b"e3", b"final"]);
}

pub async fn batches_append_in_order_and_wake_watchers_once_committed(store: &dyn Store) {
    let a = epoch('A');
    let s = stream("r1");
    store.create_session(record("s4b", a.clone(), 0), usize::MAX).await.expect("create");
    store.open_stream(&sid("s4b"), &a, &s).await.expect("open");
    let mut watch = store.watch(&sid("s4b"), &s).await.expect("watch");
    let batch = |items: &[&'static str]| items.iter().map(|i| Bytes::from_static(i.as_bytes())).collect::<Vec<_>>();
    assert_eq!(store.append_batch(&sid("s4b"), &a, &s, batch(&["e1", "e2"]), false).await, Ok(2));
    assert!(tokio::time::timeout(std::time::Duration::from_secs(5), watch.changed()).await.is_ok(), "watch woken");
    assert!(*watch.borrow() >= 2, "the watch sees the batch's head");
    assert_eq!(
        store.append_batch(&sid("s4b"), &epoch('B'), &s, batch(&["stale"]), false).await,
        Err(StoreError::SessionGone)
    );
    assert_eq!(store.append_batch(&sid("s4b"), &a, &s, batch(&["e3", "final"]), true).await, Ok(4));
    assert_eq!(store.append_batch(&sid("s4b"), &a, &s, batch(&["late"]), false).await, Err(StoreError::StreamEnded));
    let events = store.read(&sid("s4b"), &s, 0, usize::MAX).await.expect("read");
    let data: Vec<&[u8]> = events.iter().map(|e| &e.data[..]).collect();
    assert_eq!(data, [&b"e1"[..], b"e2", b"e3", b"final"]);
    let range = store.stream_range(&sid("s4b"), &s).await.expect("range").expect("known stream");
    assert_eq!(range.state, StreamState::Complete);
}

pub async fn reads_start_strictly_after_the_cursor(store: &dyn Store) {
    let a = epoch('A');
    let s = stream("r1");
    store.create_session(record("s5", a.clone(), 0), usize::MAX).await.expect("create");
    store.open_stream(&sid("s5"), &a, &s).await.expect("open");
    for _ in 0..5 {
        store.append(&sid("s5"), &a, &s, Bytes::from_static(b"x"), false).await.expect("append");
    }
    assert_eq!(seqs(store, &sid("s5"), &s, 2).await, [3, 4, 5]);
    assert_eq!(seqs(store, &sid("s5"), &s, 5).await, Vec::<u64>::new());
    assert_eq!(seqs(store, &sid("s5"), &s, 9).await, Vec::<u64>::new());
    // A cursor is the client's: the last position there can be reads nothing, and fails nothing.
    assert_eq!(seqs(store, &sid("s5"), &s, u64::MAX).await, Vec::<u64>::new());
    let page = store.read_page(&sid("s5"), &s, u64::MAX, 0).await.expect("page").expect("known stream");
    assert!(page.events.is_empty() && page.at_cursor.is_none(), "{page:?}");
    assert_eq!(store.read(&sid("s5"), &s, 0, 2).await.expect("read").len(), 2);
    // The priming event is event 0 and is returned only to a reader from before it: never.
    assert_eq!(seqs(store, &sid("s5"), &s, 0).await, [1, 2, 3, 4, 5]);
    assert_eq!(seqs(store, &sid("other"), &s, 0).await, Vec::<u64>::new());
}

pub async fn a_page_holds_the_range_and_the_events_after_the_cursor(store: &dyn Store) {
    let a = epoch('A');
    let s = stream("r1");
    store.create_session(record("s5p", a.clone(), 0), usize::MAX).await.expect("create");
    assert_eq!(store.read_page(&sid("s5p"), &s, 0, 10).await, Ok(None), "no such stream");
    store.open_stream(&sid("s5p"), &a, &s).await.expect("open");
    let events = ["e1", "e2", "final"].map(|e| Bytes::from_static(e.as_bytes())).to_vec();
    assert_eq!(store.append_batch(&sid("s5p"), &a, &s, events, true).await, Ok(3));
    let ended = StreamRange { retained_from: 0, head: 3, state: StreamState::Complete };
    let page = store.read_page(&sid("s5p"), &s, 1, 10).await.expect("page").expect("known stream");
    assert_eq!(page.range, ended);
    assert_eq!(page.events.iter().map(|e| e.seq).collect::<Vec<_>>(), [2, 3]);
    assert_eq!(&page.events[1].data[..], b"final");
    let page = store.read_page(&sid("s5p"), &s, 1, 1).await.expect("page").expect("known stream");
    assert_eq!(page.events.iter().map(|e| e.seq).collect::<Vec<_>>(), [2], "at most max");
    let page = store.read_page(&sid("s5p"), &s, 3, 10).await.expect("page").expect("known stream");
    assert_eq!((page.range, page.events.len()), (ended, 0), "nothing more after the end");
}

/// Every event has a tag, the same at every read; a page tells the tag at its cursor while the
/// store can: the event is retained, or is the last one dropped (whose tag the stream keeps,
/// also once it is a tombstone).
pub async fn every_event_keeps_its_tag_and_a_page_tells_the_one_at_its_cursor(store: &dyn Store) {
    let a = epoch('A');
    let s = stream("r1");
    let session = sid("tags");
    store.create_session(record("tags", a.clone(), 0), usize::MAX).await.expect("create");
    store.open_stream(&session, &a, &s).await.expect("open");
    let (session_, s_) = (&session, &s);
    let page = move |after| async move {
        store.read_page(session_, s_, after, usize::MAX).await.expect("page").expect("known")
    };
    let mut tags = vec![page(0).await.at_cursor.expect("the priming event's tag")];
    for n in 1..=20u64 {
        let appended = store.append(&session, &a, &s, Bytes::from(format!("e{n}")), n == 20).await;
        assert_eq!(appended, Ok(n));
        let newest = page(n - 1).await;
        assert_eq!(newest.at_cursor, Some(tags[usize::try_from(n - 1).expect("small")]), "the same tag at every read");
        tags.extend(newest.events.iter().map(|e| e.tag));
    }
    assert_eq!(tags.len(), 21);
    let distinct: std::collections::HashSet<_> = tags.iter().collect();
    assert_eq!(distinct.len(), 21, "each event its own tag");
    // 8 retained: 13..=20. The last one dropped, 12, still tells its tag; 5 no longer can.
    let trimmed = page(12).await;
    assert_eq!(trimmed.range.retained_from, 13);
    assert_eq!((trimmed.at_cursor, trimmed.before_retained), (Some(tags[12]), Some(tags[12])));
    assert_eq!(trimmed.events.iter().map(|e| e.tag).collect::<Vec<_>>(), tags[13..].to_vec());
    assert_eq!(page(5).await.at_cursor, None, "an evicted position further back is unknown");
    assert_eq!(page(17).await.at_cursor, Some(tags[17]));
    // Retention drops the ended stream whole: its tombstone keeps the tag of its last event.
    store.sweep(0).await.expect("sweep");
    store.touch_session(&session, &a, 600).await.expect("touch");
    store.sweep(600).await.expect("sweep");
    let buried = page(20).await;
    assert_eq!(buried.range, tombstone(20, StreamState::Complete).expect("a tombstone"));
    assert_eq!((buried.at_cursor, buried.before_retained), (Some(tags[20]), Some(tags[20])));
}

pub async fn request_ids_are_recorded_once_per_incarnation(store: &dyn Store) {
    let a = epoch('A');
    store.create_session(record("s6", a.clone(), 0), usize::MAX).await.expect("create");
    let started = store.begin_request(request(&sid("s6"), &a, &key("n:1"), "d1", &stream("r1"))).await;
    assert_eq!(started, Ok(BeginRequest::Started));
    assert!(store.stream_range(&sid("s6"), &stream("r1")).await.expect("range").is_some());
    let again = store.begin_request(request(&sid("s6"), &a, &key("n:1"), "d1", &stream("r2"))).await;
    assert_eq!(again, Ok(BeginRequest::Existing { stream: stream("r1"), same_params: true }));
    assert_eq!(store.stream_range(&sid("s6"), &stream("r2")).await, Ok(None), "no second stream opened");
    let other = store.begin_request(request(&sid("s6"), &a, &key("n:1"), "d2", &stream("r3"))).await;
    assert_eq!(other, Ok(BeginRequest::Existing { stream: stream("r1"), same_params: false }));
    assert_eq!(
        store.begin_request(request(&sid("s6"), &epoch('B'), &key("n:2"), "d", &stream("r4"))).await,
        Err(StoreError::SessionGone)
    );
}

/// A pipelined begin orders its record before what is written after the call, even before its
/// answer: the request's output follows a new record, and a write to the stream of a known id
/// (never opened) is refused. A store that cannot pipeline records nothing when asked.
pub async fn a_pipelined_begin_is_ordered_before_what_is_written_after_the_call(store: &dyn Store) {
    let a = epoch('A');
    store.create_session(record("s6o", a.clone(), 0), usize::MAX).await.expect("create");
    let r1 = stream("o1");
    let Some(begun) = store.begin_request_pipelined(request(&sid("s6o"), &a, &key("n:1"), "d1", &r1)) else {
        let begun = store.begin_request(request(&sid("s6o"), &a, &key("n:1"), "d1", &r1)).await;
        assert_eq!(begun, Ok(BeginRequest::Started), "declining to pipeline recorded the request");
        return;
    };
    let appended = store.append_batch(&sid("s6o"), &a, &r1, vec![Bytes::from_static(b"result")], true);
    assert_eq!(begun.await, Ok(BeginRequest::Started));
    assert_eq!(appended.await, Ok(1), "the output written before the answer follows the record");
    let range = store.stream_range(&sid("s6o"), &r1).await.expect("range");
    assert_eq!(range, Some(StreamRange { retained_from: 0, head: 1, state: StreamState::Complete }));
    let again =
        store.begin_request_pipelined(request(&sid("s6o"), &a, &key("n:1"), "d1", &stream("o2"))).expect("pipelined");
    let refused = store.append_batch(&sid("s6o"), &a, &stream("o2"), vec![Bytes::from_static(b"again")], true);
    assert_eq!(again.await, Ok(BeginRequest::Existing { stream: r1.clone(), same_params: true }));
    assert_eq!(refused.await, Err(StoreError::UnknownStream), "a known id's second run wrote its output");
    let again = store.begin_request(request(&sid("s6o"), &a, &key("n:1"), "d1", &stream("o3"))).await;
    assert_eq!(again, Ok(BeginRequest::Existing { stream: r1.clone(), same_params: true }), "one record for both");
    let other =
        store.begin_request_pipelined(request(&sid("s6o"), &a, &key("n:1"), "d2", &stream("o4"))).expect("pipelined");
    assert_eq!(other.await, Ok(BeginRequest::Existing { stream: r1.clone(), same_params: false }));
    for unopened in ["o2", "o3", "o4"] {
        assert_eq!(store.stream_range(&sid("s6o"), &stream(unopened)).await, Ok(None), "{unopened} was opened");
    }
    let range = store.stream_range(&sid("s6o"), &r1).await.expect("range");
    assert_eq!(range, Some(StreamRange { retained_from: 0, head: 1, state: StreamState::Complete }));
    let gone = store.begin_request_pipelined(request(&sid("s6o"), &epoch('B'), &key("n:2"), "d", &stream("o5")));
    assert_eq!(gone.expect("pipelined").await, Err(StoreError::SessionGone));
}

/// Run by the memory and Redis stores only: the embedded store keeps a live session's request
/// ids on disk, where a bound would cost every request an index update (measured: a third of
/// its tool-call rate), not memory.
#[allow(dead_code, reason = "not run against the embedded store")]
pub async fn request_ids_past_the_bound_are_forgotten_oldest_first(store: &dyn Store) {
    let a = epoch('A');
    store.create_session(record("s6b", a.clone(), 0), usize::MAX).await.expect("create");
    for n in 1..=5 {
        let begun = store
            .begin_request(request(&sid("s6b"), &a, &key(&format!("n:{n}")), "d", &stream(&format!("q{n}"))))
            .await;
        assert_eq!(begun, Ok(BeginRequest::Started));
    }
    // Four are remembered: the first went when the fifth came.
    for n in 2..=5 {
        let again = store.begin_request(request(&sid("s6b"), &a, &key(&format!("n:{n}")), "d", &stream("other"))).await;
        assert_eq!(again, Ok(BeginRequest::Existing { stream: stream(&format!("q{n}")), same_params: true }));
    }
    let forgotten = store.begin_request(request(&sid("s6b"), &a, &key("n:1"), "d", &stream("q1-again"))).await;
    assert_eq!(forgotten, Ok(BeginRequest::Started), "the oldest id is forgotten past the bound");
    let again = store.begin_request(request(&sid("s6b"), &a, &key("n:2"), "d", &stream("other"))).await;
    assert_eq!(again, Ok(BeginRequest::Started), "and then the next oldest");
    let again = store.begin_request(request(&sid("s6b"), &a, &key("n:5"), "d", &stream("other"))).await;
    assert_eq!(again, Ok(BeginRequest::Existing { stream: stream("q5"), same_params: true }));
}

pub async fn retention_evicts_oldest_events_and_reports_it_in_the_range(store: &dyn Store) {
    let a = epoch('A');
    let s = stream("r1");
    store.create_session(record("s7", a.clone(), 0), usize::MAX).await.expect("create");
    store.open_stream(&sid("s7"), &a, &s).await.expect("open");
    for _ in 0..20 {
        store.append(&sid("s7"), &a, &s, Bytes::from_static(b"x"), false).await.expect("append");
    }
    let range = store.stream_range(&sid("s7"), &s).await.expect("range").expect("known");
    assert_eq!((range.retained_from, range.head), (13, 20), "8 events retained");
    assert_eq!(seqs(store, &sid("s7"), &s, 3).await, (13..=20).collect::<Vec<_>>());
}

/// A batch is held to retention as if its events came one by one: past the per-stream cap the
/// stream keeps its newest events, batch included; past the session's byte cap ended streams
/// go first.
pub async fn a_batch_past_the_caps_keeps_the_newest_events(store: &dyn Store) {
    let a = epoch('A');
    let (old, s) = (stream("old"), stream("r1"));
    store.create_session(record("s7b", a.clone(), 0), usize::MAX).await.expect("create");
    store.open_stream(&sid("s7b"), &a, &old).await.expect("open");
    store.open_stream(&sid("s7b"), &a, &s).await.expect("open");
    store.append(&sid("s7b"), &a, &old, Bytes::from(vec![b'o'; 400]), true).await.expect("append");
    let batch: Vec<Bytes> = (1..=12u8).map(|i| Bytes::from(vec![i; 50])).collect();
    assert_eq!(store.append_batch(&sid("s7b"), &a, &s, batch, false).await, Ok(12));
    let range = store.stream_range(&sid("s7b"), &s).await.expect("range").expect("known");
    assert_eq!((range.retained_from, range.head), (5, 12), "8 events retained");
    let events = store.read(&sid("s7b"), &s, 0, usize::MAX).await.expect("read");
    let firsts: Vec<u8> = events.iter().map(|e| e.data[0]).collect();
    assert_eq!(firsts, (5..=12).collect::<Vec<u8>>(), "the newest, in order");
    assert!(store.stream_range(&sid("s7b"), &old).await.expect("range").is_some(), "under the byte cap");
    let big: Vec<Bytes> = (0..3).map(|_| Bytes::from(vec![b'b'; 200])).collect();
    assert_eq!(store.append_batch(&sid("s7b"), &a, &s, big, false).await, Ok(15));
    assert_eq!(
        store.stream_range(&sid("s7b"), &old).await,
        Ok(tombstone(1, StreamState::Complete)),
        "the ended stream's events went first"
    );
    let range = store.stream_range(&sid("s7b"), &s).await.expect("range").expect("known");
    assert_eq!((range.retained_from, range.head), (8, 15));
}

pub async fn session_byte_cap_evicts_ended_streams_first(store: &dyn Store) {
    let a = epoch('A');
    store.create_session(record("s8", a.clone(), 0), usize::MAX).await.expect("create");
    let (old, live) = (stream("old"), stream("live"));
    store.open_stream(&sid("s8"), &a, &old).await.expect("open");
    store.open_stream(&sid("s8"), &a, &live).await.expect("open");
    store.append(&sid("s8"), &a, &old, Bytes::from(vec![b'o'; 600]), true).await.expect("append");
    store.append(&sid("s8"), &a, &live, Bytes::from(vec![b'l'; 300]), false).await.expect("append");
    assert!(store.stream_range(&sid("s8"), &old).await.expect("range").is_some());
    store.append(&sid("s8"), &a, &live, Bytes::from(vec![b'l'; 300]), false).await.expect("append");
    assert_eq!(
        store.stream_range(&sid("s8"), &old).await,
        Ok(tombstone(1, StreamState::Complete)),
        "ended stream evicted first, its tombstone kept"
    );
    let range = store.stream_range(&sid("s8"), &live).await.expect("range").expect("live stream kept");
    assert_eq!(range.retained_from, 0);
    // Over the cap with no ended stream left: the live stream loses its oldest events, as
    // many as bring the session under the cap and no more.
    store.append(&sid("s8"), &a, &live, Bytes::from(vec![b'l'; 600]), false).await.expect("append");
    let retained = || async { store.stream_range(&sid("s8"), &live).await.expect("range").expect("live stream kept") };
    let range = retained().await;
    assert_eq!((range.retained_from, range.head), (2, 3), "the 300 bytes of event 1 went: {range:?}");
    // The cap is the most a session keeps: exactly at it, nothing goes.
    store.append(&sid("s8"), &a, &live, Bytes::from(vec![b'l'; 100]), false).await.expect("append");
    let range = retained().await;
    assert_eq!((range.retained_from, range.head), (2, 4), "1,000 bytes are within the cap: {range:?}");
    // An event larger than the cap by itself is kept, alone: a stream never loses its newest.
    store.append(&sid("s8"), &a, &live, Bytes::from(vec![b'l'; 1_200]), false).await.expect("append");
    let range = retained().await;
    assert_eq!((range.retained_from, range.head), (5, 5), "{range:?}");
    assert_eq!(seqs(store, &sid("s8"), &live, 0).await, vec![5]);
}

/// Over a session's byte cap the earliest ended stream goes first, however it ended (a final
/// append, an end, an abort): not the first by name, nor the first opened.
pub async fn the_byte_cap_evicts_the_earliest_ended_stream_first(store: &dyn Store) {
    let a = epoch('A');
    store.create_session(record("s9", a.clone(), 0), usize::MAX).await.expect("create");
    let s = sid("s9");
    store.begin_request(request(&s, &a, &key("n:1"), "d", &stream("b"))).await.expect("begin");
    for name in ["a", "c", "d"] {
        store.open_stream(&s, &a, &stream(name)).await.expect("open");
    }
    for name in ["b", "a", "c", "d"] {
        store.append(&s, &a, &stream(name), Bytes::from(vec![b'x'; 200]), false).await.expect("append");
    }
    store.end_stream(&s, &a, &stream("c")).await.expect("end");
    store.abort_stream(&s, &a, &stream("b")).await.expect("abort");
    store.append(&s, &a, &stream("a"), Bytes::from(vec![b'x'; 100]), true).await.expect("append");
    let kept = |name: &'static str| {
        let s = &s;
        async move {
            let range = store.stream_range(s, &stream(name)).await.expect("range").expect("known");
            range.retained_from <= range.head
        }
    };
    store.append(&s, &a, &stream("d"), Bytes::from(vec![b'x'; 200]), false).await.expect("append");
    assert!(!kept("c").await, "over the 1,000-byte cap, the stream that ended first goes");
    assert!(kept("b").await && kept("a").await && kept("d").await);
    store.append(&s, &a, &stream("d"), Bytes::from(vec![b'x'; 200]), false).await.expect("append");
    assert!(!kept("b").await, "then the one that ended next");
    assert!(kept("a").await && kept("d").await);
}

pub async fn sweep_expires_idle_sessions_and_drops_old_history(store: &dyn Store) {
    let a = epoch('A');
    store.create_session(record("s9", a.clone(), 0), usize::MAX).await.expect("create");
    store.create_session(record("s10", epoch('B'), 0), usize::MAX).await.expect("create");
    let done = stream("done");
    store.open_stream(&sid("s9"), &a, &done).await.expect("open");
    store.append(&sid("s9"), &a, &done, Bytes::from_static(b"result"), true).await.expect("append");
    store.touch_session(&sid("s9"), &a, 900).await.expect("touch");
    // s10 was never renewed: it expires at its deadline.
    let expired = store.sweep(TTL).await.expect("sweep");
    assert_eq!(expired, [sid("s10")]);
    assert_eq!(store.session(&sid("s10"), TTL).await, Ok(SessionStatus::Ended(SessionEnd::Expired)));
    assert!(store.stream_range(&sid("s9"), &done).await.expect("range").is_some(), "ended stream retained");
    store.touch_session(&sid("s9"), &a, TTL + 400).await.expect("touch");
    store.sweep(TTL + 600).await.expect("sweep");
    assert_eq!(
        store.stream_range(&sid("s9"), &done).await,
        Ok(tombstone(1, StreamState::Complete)),
        "its events dropped after their retention"
    );
    assert!(seqs(store, &sid("s9"), &done, 0).await.is_empty());
    assert_eq!(
        store.session(&sid("s10"), TTL + 600).await,
        Ok(SessionStatus::Ended(SessionEnd::Expired)),
        "an ended session is remembered until its tombstone's time"
    );
    // Tombstones are forgotten after their time, even one read (and cached) just before.
    store.sweep(TTL + 2_000).await.expect("sweep");
    assert_eq!(store.session(&sid("s10"), TTL + 2_000).await, Ok(SessionStatus::Unknown));
}

pub async fn watch_follows_the_head_and_closes_with_the_session(store: &dyn Store) {
    let a = epoch('A');
    let s = stream("g");
    store.create_session(record("s11", a.clone(), 0), usize::MAX).await.expect("create");
    store.open_stream(&sid("s11"), &a, &s).await.expect("open");
    let mut head = store.watch(&sid("s11"), &s).await.expect("watch");
    assert_eq!(*head.borrow_and_update(), 0);
    store.append(&sid("s11"), &a, &s, Bytes::from_static(b"x"), false).await.expect("append");
    head.changed().await.expect("changed");
    assert_eq!(*head.borrow_and_update(), 1);
    store.end_session(&sid("s11"), &a, SessionEnd::Terminated).await.expect("end");
    // A wake-up may still be in flight (Redis echoes every append through pub/sub), and a spurious
    // wake only makes a follower re-read; but the watch must close soon after.
    let closed = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        for _ in 0..8 {
            if head.changed().await.is_err() {
                return true;
            }
        }
        false
    });
    assert_eq!(closed.await, Ok(true), "the watch closes when the session ends");
    assert!(store.watch(&sid("s11"), &s).await.is_err());
}

pub async fn a_watch_made_after_appends_starts_at_the_head(store: &dyn Store) {
    let a = epoch('A');
    let s = stream("late");
    store.create_session(record("s11b", a.clone(), 0), usize::MAX).await.expect("create");
    store.open_stream(&sid("s11b"), &a, &s).await.expect("open");
    for data in ["x", "y"] {
        store.append(&sid("s11b"), &a, &s, Bytes::from_static(data.as_bytes()), false).await.expect("append");
    }
    let mut head = store.watch(&sid("s11b"), &s).await.expect("watch");
    assert_eq!(*head.borrow_and_update(), 2, "a new watch knows the appends before it");
    store.append(&sid("s11b"), &a, &s, Bytes::from_static(b"z"), true).await.expect("append");
    // Redis may echo the earlier appends late: a spurious wake-up only makes a follower re-read.
    let woken = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        for _ in 0..8 {
            head.changed().await.ok()?;
            if *head.borrow_and_update() == 3 {
                return Some(());
            }
        }
        None
    });
    assert_eq!(woken.await, Ok(Some(())), "woken by the append after it, at its head");
}

pub async fn standalone_stream_is_recorded_for_every_replica(store: &dyn Store) {
    let a = epoch('A');
    store.create_session(record("s12", a.clone(), 0), usize::MAX).await.expect("create");
    assert_eq!(store.standalone_stream(&sid("s12")).await, Ok(None));
    store.open_stream(&sid("s12"), &a, &stream("g1")).await.expect("open");
    store.set_standalone_stream(&sid("s12"), &a, &stream("g1")).await.expect("set");
    assert_eq!(store.standalone_stream(&sid("s12")).await, Ok(Some(stream("g1"))));
    assert_eq!(
        store.set_standalone_stream(&sid("s12"), &epoch('B'), &stream("g2")).await,
        Err(StoreError::SessionGone)
    );
    store.end_session(&sid("s12"), &a, SessionEnd::Terminated).await.expect("end");
    assert_eq!(store.standalone_stream(&sid("s12")).await, Ok(None));
}

pub async fn counters_add_and_read(store: &dyn CounterStore) {
    assert_eq!(store.counter_get("k").await, Ok(0));
    assert_eq!(store.counter_add("k", 2, None).await, Ok(2));
    assert_eq!(store.counter_add("k", -5, None).await, Ok(-3));
    assert_eq!(store.counter_get("k").await, Ok(-3));
}

pub async fn idempotency_keys_run_once_and_keep_their_outcome(store: &dyn Store) {
    assert_eq!(store.key_state("k1", 100).await, Ok(None));
    assert_eq!(store.claim_key(claim("k1", "d1", 100)).await, Ok(Claim::Claimed(ack(store, 1).await)));
    let running = KeyState::Running { stream: Some((sid("s"), stream("r1"))), abandoned: false };
    assert_eq!(
        store.claim_key(claim("k1", "d1", 101)).await,
        Ok(Claim::Existing { same_params: true, state: running.clone(), acknowledged: ack(store, 1).await }),
        "a second claim finds the running request, never runs it again"
    );
    assert_eq!(
        store.claim_key(claim("k1", "other", 101)).await,
        Ok(Claim::Existing { same_params: false, state: running.clone(), acknowledged: ack(store, 1).await })
    );
    assert_eq!(store.take_over_key(claim("k1", "d1", 102)).await, Ok(false), "a live owner keeps its request");
    assert_eq!(store.key_state("k1", 102).await, Ok(Some(running)));
    let outcome = Bytes::from_static(br#"{"result":{"value":1}}"#);
    store.finish_key("k1", outcome.clone()).await.expect("finish");
    store.finish_key("k1", Bytes::from_static(b"{}")).await.expect("finish again");
    assert_eq!(store.key_state("k1", 103).await, Ok(Some(KeyState::Finished(outcome.clone()))), "first outcome kept");
    assert_eq!(
        store.claim_key(claim("k1", "d1", 104)).await,
        Ok(Claim::Existing {
            same_params: true,
            state: KeyState::Finished(outcome),
            acknowledged: ack(store, 1).await
        })
    );
    let stateless = KeyClaim { stream: None, ..claim("k2", "d2", 105) };
    assert_eq!(store.claim_key(stateless.clone()).await, Ok(Claim::Claimed(ack(store, 2).await)));
    assert_eq!(store.key_state("k2", 105).await, Ok(Some(KeyState::Running { stream: None, abandoned: false })));
}

/// A key sent again with the claim the client was acknowledged: held as acknowledged, it is
/// answered as any known key; records that no longer hold it (other records, behind it, the
/// key unknown though retention did not forget it, or claimed again since) refuse it, and
/// claim nothing.
pub async fn a_claim_the_records_no_longer_hold_is_refused_as_regressed(store: &dyn Store) {
    let records = store.records().await.expect("records");
    assert_eq!(store.records().await.as_ref(), Ok(&records), "the same name every time");
    let shown = |key: &str, records: &str, position| KeyClaim {
        acknowledged: Some(Acknowledged { records: records.into(), position }),
        ..claim(key, "d", 200)
    };
    assert_eq!(store.claim_key(claim("k1", "d", 100)).await, Ok(Claim::Claimed(ack(store, 1).await)));
    store.finish_key("k1", Bytes::from_static(b"{}")).await.expect("finish");
    let held = store.claim_key(shown("k1", &records, 1)).await;
    assert!(matches!(held, Ok(Claim::Existing { acknowledged: Acknowledged { position: 1, .. }, .. })), "{held:?}");
    assert_eq!(store.claim_key(shown("k1", "other-records", 1)).await, Ok(Claim::Regressed), "other records");
    assert_eq!(store.claim_key(shown("k1", &records, 7)).await, Ok(Claim::Regressed), "records behind the claim");
    assert_eq!(store.claim_key(shown("k9", &records, 1)).await, Ok(Claim::Regressed), "a claim they lost");
    assert_eq!(store.key_state("k9", 201).await, Ok(None), "a regressed claim claims nothing");
    assert_eq!(store.claim_key(claim("k2", "d", 100)).await, Ok(Claim::Claimed(ack(store, 2).await)));
    assert_eq!(store.claim_key(shown("k1", &records, 2)).await, Ok(Claim::Regressed), "a later claim of the key");
    let begun = store
        .begin_keyed_request(request(&sid("s"), &epoch('A'), &key("n:1"), "d", &stream("r1")), shown("k9", &records, 1))
        .await;
    assert_eq!(begun, Err(StoreError::SessionGone), "no session: nothing is begun");
}

/// A claim that retention forgot is not one the records lost: the key runs again, as a key
/// sent after its record was forgotten always has.
pub async fn a_claim_forgotten_by_retention_is_claimed_again(store: &dyn Store) {
    let records = store.records().await.expect("records");
    for (i, key) in ["a", "b", "c", "d"].into_iter().enumerate() {
        let claimed = store.claim_key(claim(key, "d", 1_000 + i as u64)).await;
        assert_eq!(claimed, Ok(Claim::Claimed(ack(store, i as u64 + 1).await)));
        store.finish_key(key, Bytes::from_static(b"{}")).await.expect("finish");
    }
    // Four records, three kept: "a", the oldest, is forgotten.
    store.sweep(1_010).await.expect("sweep");
    assert_eq!(store.key_state("a", 1_010).await, Ok(None));
    let again = KeyClaim { acknowledged: Some(Acknowledged { records, position: 1 }), ..claim("a", "d", 1_020) };
    assert_eq!(store.claim_key(again).await, Ok(Claim::Claimed(ack(store, 5).await)));
}

pub async fn keyed_requests_begin_and_claim_together(store: &dyn Store) {
    let a = epoch('A');
    store.create_session(record("s", a.clone(), 0), usize::MAX).await.expect("create");
    let begun =
        store.begin_keyed_request(request(&sid("s"), &a, &key("n:1"), "d", &stream("r1")), claim("k", "d", 100)).await;
    assert_eq!(begun, Ok((BeginRequest::Started, Some(Claim::Claimed(ack(store, 1).await)))));
    // The same request id again: it attaches in its session, and claims nothing.
    let again =
        store.begin_keyed_request(request(&sid("s"), &a, &key("n:1"), "d", &stream("r2")), claim("k", "d", 101)).await;
    assert_eq!(again, Ok((BeginRequest::Existing { stream: stream("r1"), same_params: true }, None)));
    // Another id with the same key: a new request, whose key is the first one's.
    let (begun, claimed) = store
        .begin_keyed_request(request(&sid("s"), &a, &key("n:2"), "d", &stream("r3")), claim("k", "d", 102))
        .await
        .expect("begin");
    assert_eq!(begun, BeginRequest::Started);
    assert!(matches!(
        claimed,
        Some(Claim::Existing {
            same_params: true,
            state: KeyState::Running { .. },
            acknowledged: Acknowledged { position: 1, .. }
        })
    ));
    // A session that is gone claims nothing.
    let gone = store
        .begin_keyed_request(request(&sid("s"), &epoch('B'), &key("n:3"), "d", &stream("r4")), claim("k2", "d", 103))
        .await;
    assert_eq!(gone, Err(StoreError::SessionGone));
    assert_eq!(store.key_state("k2", 103).await, Ok(None));
}

pub async fn a_final_append_records_the_keys_outcome_even_if_the_session_is_gone(store: &dyn Store) {
    let a = epoch('A');
    store.create_session(record("s", a.clone(), 0), usize::MAX).await.expect("create");
    let begun =
        store.begin_keyed_request(request(&sid("s"), &a, &key("n:1"), "d", &stream("r1")), claim("k", "d", 100)).await;
    assert_eq!(begun, Ok((BeginRequest::Started, Some(Claim::Claimed(ack(store, 1).await)))));
    let response = Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
    let events = vec![Bytes::from_static(b"progress"), response.clone()];
    assert_eq!(store.append_final(&sid("s"), &a, &stream("r1"), events, true, "k").await, Ok(2));
    let range = store.stream_range(&sid("s"), &stream("r1")).await.expect("range").expect("stream");
    assert_eq!((range.head, range.state), (2, StreamState::Complete));
    assert_eq!(store.key_state("k", 101).await, Ok(Some(KeyState::Finished(response))));
    // The session ended while the request ran: the append fails, the outcome is still recorded.
    store
        .begin_keyed_request(request(&sid("s"), &a, &key("n:2"), "e", &stream("r2")), claim("k2", "e", 102))
        .await
        .expect("begin");
    store.end_session(&sid("s"), &a, SessionEnd::Terminated).await.expect("end");
    let late = Bytes::from_static(br#"{"jsonrpc":"2.0","id":2,"result":{}}"#);
    assert_eq!(
        store.append_final(&sid("s"), &a, &stream("r2"), vec![late.clone()], true, "k2").await,
        Err(StoreError::SessionGone)
    );
    assert_eq!(store.key_state("k2", 103).await, Ok(Some(KeyState::Finished(late))));
}

pub async fn counter_additions_under_a_key_apply_once<S: Store + CounterStore>(store: &S) {
    assert_eq!(store.claim_key(claim("op", "d", 100)).await, Ok(Claim::Claimed(ack(store, 1).await)));
    assert_eq!(store.counter_add("c", 5, Some("op")).await, Ok(5));
    assert_eq!(store.counter_add("c", 5, Some("op")).await, Ok(5), "the same addition again is not made");
    assert_eq!(store.counter_add("c", 1, None).await, Ok(6));
    assert_eq!(store.counter_get("c").await, Ok(6));
}

pub async fn idempotency_records_expire_and_are_bounded(store: &dyn Store) {
    let r = retention();
    for (i, key) in ["a", "b", "c", "d"].into_iter().enumerate() {
        assert_eq!(
            store.claim_key(claim(key, "d", 1_000 + i as u64)).await,
            Ok(Claim::Claimed(ack(store, i as u64 + 1).await))
        );
    }
    for key in ["b", "c", "d"] {
        store.finish_key(key, Bytes::from_static(b"{}")).await.expect("finish");
    }
    store.sweep(1_010).await.expect("sweep");
    let known = |key: &'static str| async move { store.key_state(key, 1_010).await.expect("state").is_some() };
    assert!(known("a").await, "a running request is never forgotten for the count bound");
    assert!(!known("b").await, "past the bound, the oldest finished record goes first");
    assert!(known("c").await && known("d").await);
    store.sweep(1_002 + r.idempotency_ms).await.expect("sweep");
    assert!(!known("a").await && !known("c").await, "records past their time are forgotten");
    assert!(known("d").await);
}

/// A stream whose events retention dropped keeps its tombstone (head, end, request) while its
/// session lives, so a resume can be told exactly what is gone; the session's end forgets it.
pub async fn a_dropped_stream_keeps_its_tombstone_while_its_session_lives(store: &dyn Store) {
    let a = epoch('A');
    let (requested, standalone) = (stream("r1"), stream("g1"));
    store.create_session(record("st", a.clone(), 0), usize::MAX).await.expect("create");
    store.begin_request(request(&sid("st"), &a, &key("n:7"), "d", &requested)).await.expect("begin");
    store.open_stream(&sid("st"), &a, &standalone).await.expect("open");
    let events = vec![Bytes::from_static(b"progress"), Bytes::from_static(b"result")];
    store.append_batch(&sid("st"), &a, &requested, events, true).await.expect("append");
    store.touch_session(&sid("st"), &a, 100).await.expect("touch");
    store.sweep(100).await.expect("sweep");
    store.touch_session(&sid("st"), &a, 700).await.expect("touch");
    store.sweep(700).await.expect("sweep");
    assert_eq!(store.stream_range(&sid("st"), &requested).await, Ok(tombstone(2, StreamState::Complete)));
    assert_eq!(store.stream_request(&sid("st"), &requested).await, Ok(Some(key("n:7"))), "the request it carried");
    let page = store.read_page(&sid("st"), &requested, 0, 10).await.expect("page").expect("known");
    assert!(page.events.is_empty());
    // A live stream is never buried.
    assert_eq!(
        store.stream_range(&sid("st"), &standalone).await.expect("range").map(|r| r.state),
        Some(StreamState::Live)
    );
    store.end_session(&sid("st"), &a, SessionEnd::Terminated).await.expect("end");
    assert_eq!(store.stream_range(&sid("st"), &requested).await, Ok(None), "forgotten with its session");
}

/// A request that joins a stream already open (a batch's) leaves it as it is: its head, and
/// which of its events are retained.
pub async fn a_request_joining_an_open_stream_leaves_it_as_it_is(store: &dyn Store) {
    let a = epoch('A');
    let shared = stream("b1");
    store.create_session(record("sj", a.clone(), 0), usize::MAX).await.expect("create");
    assert_eq!(
        store.begin_request(request(&sid("sj"), &a, &key("n:1"), "d", &shared)).await,
        Ok(BeginRequest::Started)
    );
    let events: Vec<Bytes> = (0..20).map(|_| Bytes::from_static(b"e")).collect();
    store.append_batch(&sid("sj"), &a, &shared, events, false).await.expect("append");
    let before = store.stream_range(&sid("sj"), &shared).await.expect("range").expect("known");
    assert_eq!((before.retained_from, before.head), (13, 20), "8 events retained");
    assert_eq!(
        store.begin_request(request(&sid("sj"), &a, &key("n:2"), "d", &shared)).await,
        Ok(BeginRequest::Started)
    );
    // Its head, and its oldest retained event (not an event 0 written again).
    assert_eq!(store.stream_range(&sid("sj"), &shared).await, Ok(Some(before)), "the same stream, as it was");
}

/// A request that shares its stream (a batch's) records its outcome without ending it.
pub async fn a_final_append_may_leave_the_stream_open(store: &dyn Store) {
    let a = epoch('A');
    store.create_session(record("s", a.clone(), 0), usize::MAX).await.expect("create");
    let begun =
        store.begin_keyed_request(request(&sid("s"), &a, &key("n:1"), "d", &stream("b1")), claim("k", "d", 100)).await;
    assert_eq!(begun, Ok((BeginRequest::Started, Some(Claim::Claimed(ack(store, 1).await)))));
    let response = Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
    assert_eq!(store.append_final(&sid("s"), &a, &stream("b1"), vec![response.clone()], false, "k").await, Ok(1));
    let range = store.stream_range(&sid("s"), &stream("b1")).await.expect("range").expect("stream");
    assert_eq!((range.head, range.state), (1, StreamState::Live));
    assert_eq!(store.key_state("k", 101).await, Ok(Some(KeyState::Finished(response))));
    assert_eq!(store.append(&sid("s"), &a, &stream("b1"), Bytes::from_static(b"next"), false).await, Ok(2));
}

/// A request stream that will not get its response is aborted: readers are told so, nothing is
/// appended after, and a stream that already ended keeps how it ended.
pub async fn an_aborted_stream_says_so_and_takes_nothing_more(store: &dyn Store) {
    let a = epoch('A');
    store.create_session(record("s", a.clone(), 0), usize::MAX).await.expect("create");
    let (s, r1, r2) = (sid("s"), stream("r1"), stream("r2"));
    store.begin_request(request(&s, &a, &key("n:1"), "d", &r1)).await.expect("begin");
    assert_eq!(store.append(&s, &a, &r1, Bytes::from_static(b"progress"), false).await, Ok(1));
    store.abort_stream(&s, &a, &r1).await.expect("abort");
    let range = store.stream_range(&s, &r1).await.expect("range").expect("stream");
    assert_eq!((range.head, range.state), (1, StreamState::Aborted));
    assert!(store.append(&s, &a, &r1, Bytes::from_static(b"late"), true).await.is_err(), "nothing after");
    store.abort_stream(&s, &a, &r1).await.expect("aborting again does nothing");
    store.begin_request(request(&s, &a, &key("n:2"), "d", &r2)).await.expect("begin");
    assert_eq!(store.append(&s, &a, &r2, Bytes::from_static(b"response"), true).await, Ok(1));
    store.abort_stream(&s, &a, &r2).await.expect("abort an ended stream");
    let range = store.stream_range(&s, &r2).await.expect("range").expect("stream");
    assert_eq!(range.state, StreamState::Complete, "an ended stream keeps its end");
}

/// A claim whose request never ran is released: a re-send claims the key anew, also when it
/// shows the released claim, which the client was acknowledged (the records did not go back in
/// time); the released claim shown once more finds the new one. A key with an outcome is never
/// released.
pub async fn a_released_claim_is_claimed_anew_and_an_outcome_stays(store: &dyn Store) {
    assert_eq!(store.claim_key(claim("k1", "d", 100)).await, Ok(Claim::Claimed(ack(store, 1).await)));
    store.release_key("k1").await.expect("release");
    assert_eq!(store.key_state("k1", 101).await, Ok(None));
    let shown = KeyClaim { acknowledged: Some(ack(store, 1).await), ..claim("k1", "d", 102) };
    assert_eq!(store.claim_key(shown.clone()).await, Ok(Claim::Claimed(ack(store, 2).await)), "released, not lost");
    let found = store.claim_key(shown).await;
    assert!(matches!(found, Ok(Claim::Existing { acknowledged: Acknowledged { position: 2, .. }, .. })), "{found:?}");
    store.finish_key("k1", Bytes::from_static(b"{}")).await.expect("finish");
    store.release_key("k1").await.expect("release");
    assert_eq!(store.key_state("k1", 103).await, Ok(Some(KeyState::Finished(Bytes::from_static(b"{}")))));
    // Released, then claimed again: the sweep forgets the record for its count, once.
    for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
        assert!(matches!(store.claim_key(claim(key, "d", 200 + i as u64)).await, Ok(Claim::Claimed(_))));
        store.finish_key(key, Bytes::from_static(b"{}")).await.expect("finish");
    }
    store.sweep(300).await.expect("sweep");
    assert_eq!(store.key_state("k1", 300).await, Ok(None), "the oldest of four, three kept");
    assert!(store.key_state("c", 300).await.expect("state").is_some());
}

/// A task, created with its idempotency key's outcome, is read back as created; a change applies
/// once (the first final change wins) and a change that changes nothing is reported as such.
pub async fn a_task_is_created_with_its_keys_outcome_and_changed_in_one_step(store: &dyn Store) {
    use tether_core::tasks::{TaskChange, TaskRecord, TaskStatus};
    let key = KeyClaim { stream: None, ..claim("k", "d", 1_000) };
    assert_eq!(store.claim_key(key).await, Ok(Claim::Claimed(ack(store, 1).await)));
    let created = TaskRecord::new(tid("t1"), Some("alice".into()), 1_000, Some(60_000), Some(250));
    let outcome = Bytes::from_static(b"{\"result\":{\"taskId\":\"t1\"}}");
    store.create_task(created.clone(), Some(("k".into(), outcome.clone())), TaskLimits::NONE).await.expect("create");
    assert_eq!(store.key_state("k", 1_000).await, Ok(Some(KeyState::Finished(outcome))));
    let read = store.task(&tid("t1"), 1_000).await.expect("read").expect("the task exists");
    assert_eq!((read.record, read.abandoned), (created, false));
    assert_eq!(store.task(&tid("t2"), 1_000).await, Ok(None));
    assert_eq!(store.update_task(&tid("t2"), TaskChange::Cancel, 1_000).await, Ok(None));
    let asked = serde_json::json!({"a": {"method": "elicitation/create"}});
    let ask = TaskChange::Ask { requests: asked.as_object().cloned().unwrap_or_default(), state: None };
    let (after, changed) = store.update_task(&tid("t1"), ask, 1_100).await.expect("ask").expect("exists");
    assert!(changed);
    assert_eq!(after.record.task.status, TaskStatus::InputRequired);
    let (after, changed) =
        store.update_task(&tid("t1"), TaskChange::Cancel, 1_200).await.expect("cancel").expect("exists");
    assert!(changed);
    assert_eq!(after.record.task.status, TaskStatus::Cancelled);
    let late = TaskChange::Finish(Ok(serde_json::json!({"content": []})));
    let (after, changed) = store.update_task(&tid("t1"), late, 1_300).await.expect("finish").expect("exists");
    assert!(!changed, "a cancelled task does not complete");
    let read = store.task(&tid("t1"), 1_300).await.expect("read").expect("the task exists");
    assert_eq!(read.record, after.record);
    assert_eq!((read.record.task.status, read.record.task.last_updated_at_ms), (TaskStatus::Cancelled, 1_200));
}

/// Running tasks are capped in all and per principal, counted as they are created; a task that
/// ends makes room, and one refused is not created.
pub async fn running_tasks_are_capped_in_all_and_per_principal(store: &dyn Store) {
    use tether_core::tasks::{TaskChange, TaskRecord};
    let limits = TaskLimits { total: 3, per_principal: 2 };
    let task = |id: &str, principal: Option<&str>| {
        TaskRecord::new(tid(id), principal.map(str::to_owned), 1_000, Some(60_000), None)
    };
    for (id, principal) in [("a1", Some("alice")), ("a2", Some("alice")), ("b1", Some("bob"))] {
        store.create_task(task(id, principal), None, limits).await.expect("within the caps");
    }
    let refused = store.create_task(task("a3", Some("alice")), None, limits).await;
    assert_eq!(refused, Err(StoreError::TooManyTasks { principal: true }), "alice's two");
    assert_eq!(store.task(&tid("a3"), 1_000).await, Ok(None), "nothing created");
    let refused = store.create_task(task("n1", None), None, limits).await;
    assert_eq!(refused, Err(StoreError::TooManyTasks { principal: false }), "three in all");
    let finish = TaskChange::Finish(Ok(serde_json::json!({"content": []})));
    store.update_task(&tid("a1"), finish, 1_100).await.expect("finish").expect("exists");
    store.update_task(&tid("a1"), TaskChange::Cancel, 1_200).await.expect("no change").expect("exists");
    store.create_task(task("a3", Some("alice")), None, limits).await.expect("a1 made room");
    let refused = store.create_task(task("n1", None), None, limits).await;
    assert_eq!(
        refused,
        Err(StoreError::TooManyTasks { principal: false }),
        "a change that is not an end frees nothing"
    );
}

/// Past the bound of finished tasks, the sweep forgets those due first; running ones stay.
pub async fn finished_tasks_past_the_bound_are_forgotten_due_first(store: &dyn Store) {
    use tether_core::tasks::{TaskChange, TaskRecord};
    for (id, created) in [("a", 1_000), ("b", 1_001), ("c", 1_002), ("running", 1_003)] {
        let task = TaskRecord::new(tid(id), None, created, Some(60_000), None);
        store.create_task(task, None, TaskLimits::NONE).await.expect("create");
    }
    for id in ["c", "a", "b"] {
        let finish = TaskChange::Finish(Ok(serde_json::json!({"content": []})));
        store.update_task(&tid(id), finish, 1_100).await.expect("finish").expect("exists");
    }
    store.sweep(1_200).await.expect("sweep");
    assert_eq!(store.task(&tid("a"), 1_200).await, Ok(None), "due first (created first), past the two kept");
    for id in ["b", "c", "running"] {
        assert!(store.task(&tid(id), 1_200).await.expect("read").is_some(), "{id} is kept");
    }
}

/// A finished task is kept for its ttl from its creation, then forgotten by the sweep; a running
/// one is kept whatever its ttl.
pub async fn a_finished_task_is_forgotten_after_its_ttl(store: &dyn Store) {
    use tether_core::tasks::{TaskChange, TaskRecord};
    for id in ["done", "running"] {
        store
            .create_task(TaskRecord::new(tid(id), None, 1_000, Some(1_000), None), None, TaskLimits::NONE)
            .await
            .expect("create");
    }
    let finish = TaskChange::Finish(Ok(serde_json::json!({"content": []})));
    store.update_task(&tid("done"), finish, 1_500).await.expect("finish").expect("exists");
    store.sweep(1_999).await.expect("sweep");
    assert!(store.task(&tid("done"), 1_999).await.expect("read").is_some(), "within its ttl");
    store.sweep(2_000).await.expect("sweep");
    assert_eq!(store.task(&tid("done"), 2_000).await, Ok(None));
    assert!(store.task(&tid("running"), 2_000).await.expect("read").is_some(), "a running task is kept");
}

/// Declares one `#[tokio::test]` per suite case, each with a fresh store from `$make`; with
/// `guarded:` the expression gives `(guard, store)` and the guard (a server process) lives as
/// long as the test.
#[macro_export]
macro_rules! store_suite {
    (guarded: $make:expr) => {
        $crate::store_suite!(@cases $make;
            sessions_are_created_once_and_read_without_renewal,
            live_sessions_are_counted_when_one_is_admitted,
            concurrent_admissions_never_pass_the_limit,
            touch_renews_only_a_live_session_of_the_same_incarnation,
            ended_sessions_refuse_writes_and_are_remembered,
            appends_are_contiguous_and_checked_against_the_incarnation,
            batches_append_in_order_and_wake_watchers_once_committed,
            reads_start_strictly_after_the_cursor,
            a_page_holds_the_range_and_the_events_after_the_cursor,
            every_event_keeps_its_tag_and_a_page_tells_the_one_at_its_cursor,
            request_ids_are_recorded_once_per_incarnation,
            a_pipelined_begin_is_ordered_before_what_is_written_after_the_call,
            retention_evicts_oldest_events_and_reports_it_in_the_range,
            a_batch_past_the_caps_keeps_the_newest_events,
            session_byte_cap_evicts_ended_streams_first,
            the_byte_cap_evicts_the_earliest_ended_stream_first,
            sweep_expires_idle_sessions_and_drops_old_history,
            watch_follows_the_head_and_closes_with_the_session,
            a_watch_made_after_appends_starts_at_the_head,
            standalone_stream_is_recorded_for_every_replica,
            counters_add_and_read,
            idempotency_keys_run_once_and_keep_their_outcome,
            keyed_requests_begin_and_claim_together,
            a_claim_the_records_no_longer_hold_is_refused_as_regressed,
            a_claim_forgotten_by_retention_is_claimed_again,
            a_final_append_records_the_keys_outcome_even_if_the_session_is_gone,
            counter_additions_under_a_key_apply_once,
            idempotency_records_expire_and_are_bounded,
            a_dropped_stream_keeps_its_tombstone_while_its_session_lives,
            a_final_append_may_leave_the_stream_open,
            a_request_joining_an_open_stream_leaves_it_as_it_is,
            a_task_is_created_with_its_keys_outcome_and_changed_in_one_step,
            a_finished_task_is_forgotten_after_its_ttl,
            an_aborted_stream_says_so_and_takes_nothing_more,
            a_released_claim_is_claimed_anew_and_an_outcome_stays,
            running_tasks_are_capped_in_all_and_per_principal,
            finished_tasks_past_the_bound_are_forgotten_due_first,
        );
    };
    ($make:expr) => {
        $crate::store_suite!(guarded: ((), $make));
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let (_guard, store) = $make;
                suite::$case(&store).await;
            }
        )*
    };
}
