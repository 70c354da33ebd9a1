//! The shared store suite against the embedded SQLite backend, plus what only a durable store
//! can do: keep everything across a reopen, and abort the requests of a process that died (at
//! once: one process has the directory, so the one before is gone).

mod suite;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use tether_store::{CounterStore, EventLog, KeyRecords, SessionStore};

use bytes::Bytes;
use tether_core::lineage::{Epoch, SessionId, StreamName, StreamRange, StreamState, Tag};
use tether_core::mcp::ProtocolVersion;
use tether_store::{BeginRequest, Claim, KeyState, SessionRecord, SessionStatus, SqliteStore, TaskLimits};

/// A directory of its own for every store a test opens.
fn fresh_dir() -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tether-sqlite-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The store's database file under `dir`, opened beside the store (to write what an earlier
/// version left, or to read what this one made).
fn database(dir: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(dir.join("tether.sqlite3")).expect("the store's database")
}

fn open(dir: &Path, owner: &str) -> SqliteStore {
    SqliteStore::open(dir, suite::retention(), owner).expect("open store")
}

store_suite!(open(&fresh_dir(), "owner-a"));

fn record(id: &str, epoch: &Epoch) -> SessionRecord {
    SessionRecord {
        id: suite::sid(id),
        epoch: epoch.clone(),
        principal: Some("alice".into()),
        protocol_version: ProtocolVersion::V2025_06_18,
        client: std::sync::Arc::new(serde_json::json!({"capabilities": {"elicitation": {}}})),
        idle_ttl_ms: 60_000,
        expires_at_ms: 60_000,
    }
}

#[tokio::test]
async fn everything_acknowledged_survives_a_reopen() {
    let dir = fresh_dir();
    let epoch = suite::epoch('E');
    let stream = StreamName::parse("r1").expect("stream");
    let records_id;
    {
        let store = open(&dir, "before");
        records_id = store.records().await.expect("records");
        store.create_session(record("durable", &epoch), usize::MAX).await.expect("create");
        store
            .begin_request(suite::request(&suite::sid("durable"), &epoch, &suite::key("n:1"), "digest", &stream))
            .await
            .expect("begin");
        for i in 0..5 {
            store
                .append(&suite::sid("durable"), &epoch, &stream, Bytes::from(format!("event {i}")), i == 4)
                .await
                .expect("append");
        }
        store.counter_add("c", 7, None).await.expect("counter");
    }
    let store = open(&dir, "after");
    assert_eq!(
        store.records().await.expect("records"),
        records_id,
        "idempotency records keep their name across restarts"
    );
    let SessionStatus::Live(loaded) = store.session(&suite::sid("durable"), 0).await.expect("lookup") else {
        panic!("session lost")
    };
    assert_eq!(loaded, record("durable", &epoch), "the whole record, incarnation included");
    let range = store.stream_range(&suite::sid("durable"), &stream).await.expect("range").expect("stream kept");
    assert_eq!((range.retained_from, range.head, range.state), (0, 5, StreamState::Complete));
    let data: Vec<Bytes> =
        store.read(&suite::sid("durable"), &stream, 0, 10).await.expect("read").into_iter().map(|e| e.data).collect();
    assert_eq!(data.last(), Some(&Bytes::from("event 4")));
    assert_eq!(data.len(), 5);
    assert_eq!(store.counter_get("c").await, Ok(7));
    assert_eq!(store.stream_request(&suite::sid("durable"), &stream).await, Ok(Some(suite::key("n:1"))));
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[tokio::test]
async fn live_sessions_are_still_counted_after_a_reopen() {
    let dir = fresh_dir();
    let epoch = suite::epoch('E');
    let live = |id: &str| SessionRecord { expires_at_ms: u64::MAX / 4, ..suite::record(id, epoch.clone(), 0) };
    {
        let store = open(&dir, "before");
        for id in ["a", "b", "c"] {
            store.create_session(live(id), 3).await.expect("admitted");
        }
    }
    {
        let store = open(&dir, "after");
        assert_eq!(store.create_session(live("d"), 3).await, Err(tether_store::StoreError::TooManySessions));
        store.end_session(&suite::sid("a"), &epoch, tether_store::SessionEnd::Terminated).await.expect("end");
    }
    let store = open(&dir, "again");
    store.create_session(live("d"), 3).await.expect("the ended one's place");
    assert_eq!(store.create_session(live("e"), 3).await, Err(tether_store::StoreError::TooManySessions));
    drop(store);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[tokio::test]
async fn a_reopened_store_aborts_what_the_previous_process_left_running() {
    let dir = fresh_dir();
    let epoch = suite::epoch('E');
    let (running, other) = (StreamName::parse("r1").expect("stream"), StreamName::parse("g1").expect("stream"));
    {
        let dead = open(&dir, "dead");
        dead.create_session(SessionRecord { expires_at_ms: u64::MAX / 2, ..record("s", &epoch) }, usize::MAX)
            .await
            .expect("create");
        dead.begin_request(suite::request(&suite::sid("s"), &epoch, &suite::key("n:1"), "d", &running))
            .await
            .expect("begin");
        dead.open_stream(&suite::sid("s"), &epoch, &other).await.expect("open");
        dead.append(&suite::sid("s"), &epoch, &running, Bytes::from_static(b"progress"), false).await.expect("append");
        assert_eq!(dead.claim_key(suite::claim("k", "d", 1_000)).await, Ok(Claim::Claimed(suite::ack(&dead, 1).await)));
        assert!(
            SqliteStore::open(&dir, suite::retention(), "intruder").is_err(),
            "a second process cannot open a directory in use"
        );
    }
    // Only one process opens the directory, so whoever had it before is gone: no lease to wait out.
    let survivor = open(&dir, "survivor");
    let range = survivor.stream_range(&suite::sid("s"), &running).await.expect("range").expect("kept");
    assert_eq!((range.state, range.head), (StreamState::Aborted, 1), "the dead owner's request is aborted");
    let standalone = survivor.stream_range(&suite::sid("s"), &other).await.expect("range").expect("kept");
    assert_eq!(standalone.state, StreamState::Live, "only request streams have an owner that must finish them");
    let abandoned = KeyState::Running { stream: Some((suite::sid("s"), running.clone())), abandoned: true };
    assert_eq!(survivor.key_state("k", 1_001).await, Ok(Some(abandoned)));
    assert_eq!(survivor.take_over_key(suite::claim("k", "other", 1_001)).await, Ok(false), "only with the same params");
    assert_eq!(survivor.take_over_key(suite::claim("k", "d", 1_001)).await, Ok(true));
    assert_eq!(survivor.take_over_key(suite::claim("k", "d", 1_002)).await, Ok(false), "taken over once");
    survivor.finish_key("k", Bytes::from_static(b"{}")).await.expect("finish");
    assert_eq!(survivor.key_state("k", 1_003).await, Ok(Some(KeyState::Finished(Bytes::from_static(b"{}")))));
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[tokio::test]
async fn a_task_the_previous_process_left_running_is_abandoned_and_a_finished_one_is_not() {
    use tether_core::tasks::{TaskChange, TaskRecord, TaskStatus};
    use tether_store::TaskStore;
    let dir = fresh_dir();
    {
        let dead = open(&dir, "dead");
        for id in ["running", "done"] {
            dead.create_task(TaskRecord::new(suite::tid(id), None, 1_000, None, None), None, TaskLimits::NONE)
                .await
                .expect("create");
        }
        let finish = TaskChange::Finish(Ok(serde_json::json!({"content": []})));
        dead.update_task(&suite::tid("done"), finish, 1_100).await.expect("finish").expect("exists");
        let running = dead.task(&suite::tid("running"), 1_200).await.expect("read").expect("exists");
        assert!(!running.abandoned, "its own process runs it");
    }
    let survivor = open(&dir, "survivor");
    let running = survivor.task(&suite::tid("running"), 2_000).await.expect("read").expect("kept across the restart");
    assert!(running.abandoned, "its process is gone");
    let done = survivor.task(&suite::tid("done"), 2_000).await.expect("read").expect("kept across the restart");
    assert_eq!((done.record.task.status, done.abandoned), (TaskStatus::Completed, true));
    let (after, changed) =
        survivor.update_task(&suite::tid("running"), TaskChange::Cancel, 2_100).await.expect("cancel").expect("exists");
    assert!(changed && after.abandoned, "a change keeps the owner: it is still not this process's to run");
    drop(survivor);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// What the store answers about `streams`: each range, and every event (with its tag) read from
/// the start in pages of 7.
async fn snapshot(store: &SqliteStore, session: &SessionId, streams: &[StreamName]) -> Vec<String> {
    let mut seen = Vec::new();
    for stream in streams {
        let range = store.stream_range(session, stream).await.expect("range");
        let (mut events, mut tags) = (Vec::new(), Vec::new());
        let mut after = 0;
        for _ in 0..1_000 {
            let page = store.read(session, stream, after, 7).await.expect("read");
            let Some(last) = page.last() else { break };
            after = last.seq;
            tags.extend(page.iter().map(|e| e.tag.bits()));
            events.extend(page.into_iter().map(|e| (e.seq, e.data)));
        }
        seen.push(format!("{stream}: {range:?} {events:?} tags {tags:?}"));
    }
    seen
}

#[tokio::test]
async fn reads_from_memory_agree_with_the_file() {
    let dir = fresh_dir();
    let epoch = Epoch::parse("MMMMMMMMMMMMMMMMMMMMMM").expect("epoch");
    let retention =
        tether_store::Retention { max_events_per_stream: 1_500, max_bytes_per_session: 20_000, ..suite::retention() };
    let streams: Vec<StreamName> = ["short", "long", "ended", "trimmed", "complete", "closed"]
        .iter()
        .map(|s| StreamName::parse(s).expect("name"))
        .collect();
    let before = {
        let store = SqliteStore::open(&dir, retention, "owner").expect("open");
        store.create_session(record("mirrored", &epoch), usize::MAX).await.expect("create");
        for (i, stream) in streams.iter().enumerate() {
            store
                .begin_request(suite::request(
                    &suite::sid("mirrored"),
                    &epoch,
                    &suite::key(&format!("n:{i}")),
                    "digest",
                    stream,
                ))
                .await
                .expect("begin");
        }
        let batch = |n: usize, size: usize| (0..n).map(|i| Bytes::from(format!("{i:0size$}"))).collect::<Vec<_>>();
        store.append_batch(&suite::sid("mirrored"), &epoch, &streams[0], batch(3, 4), false).await.expect("short");
        // Longer than memory keeps a stream: read back from the file.
        for _ in 0..12 {
            store.append_batch(&suite::sid("mirrored"), &epoch, &streams[1], batch(100, 4), false).await.expect("long");
        }
        store.append_batch(&suite::sid("mirrored"), &epoch, &streams[2], batch(2, 4), false).await.expect("ended");
        store.end_stream(&suite::sid("mirrored"), &epoch, &streams[2]).await.expect("end");
        // Past the session's byte cap: the ended stream goes first, then this one's oldest events.
        for _ in 0..40 {
            store
                .append_batch(&suite::sid("mirrored"), &epoch, &streams[3], batch(2, 500), false)
                .await
                .expect("trimmed");
        }
        // Kept in memory to the end: read in pages, ended by their last append or by end_stream.
        store.append_batch(&suite::sid("mirrored"), &epoch, &streams[4], batch(20, 4), true).await.expect("complete");
        store.append_batch(&suite::sid("mirrored"), &epoch, &streams[5], batch(20, 4), false).await.expect("closed");
        store.end_stream(&suite::sid("mirrored"), &epoch, &streams[5]).await.expect("end");
        snapshot(&store, &suite::sid("mirrored"), &streams).await
    };
    for ended in &before[4..] {
        assert!(ended.contains("head: 20, state: Complete") && ended.contains("(20, b\"0019\")"), "{ended}");
    }
    assert!(
        before[2].starts_with("ended: Some(StreamRange { retained_from: 3, head: 2, state: Complete }) []"),
        "the byte cap dropped the ended stream's events, its tombstone kept: {}",
        before[2]
    );
    assert!(!before[3].contains("retained_from: 0,"), "the byte cap trimmed the stream: {}", before[3]);
    let store = SqliteStore::open(&dir, retention, "owner").expect("reopen");
    assert_eq!(
        snapshot(&store, &suite::sid("mirrored"), &streams).await,
        before,
        "memory answered what the file holds"
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn an_ended_stream_is_kept_for_its_retention_from_the_sweep_before_it_ended() {
    let dir = fresh_dir();
    let store = open(&dir, "owner-a");
    let a = suite::epoch('A');
    let record = SessionRecord { expires_at_ms: u64::MAX / 4, ..suite::record("r1", a.clone(), 10_000) };
    store.create_session(record, usize::MAX).await.expect("create");
    let s = suite::stream("done");
    store.open_stream(&suite::sid("r1"), &a, &s).await.expect("open");
    store.sweep(10_000).await.expect("sweep");
    store.append(&suite::sid("r1"), &a, &s, Bytes::from_static(b"result"), true).await.expect("append");
    // The retention (500 ms) runs from the sweep at 10,000, before the stream ended: no later
    // sweep has to see the stream first.
    store.sweep(10_499).await.expect("sweep");
    assert_eq!(
        store.stream_range(&suite::sid("r1"), &s).await.expect("range").map(|r| r.retained_from),
        Some(0),
        "kept within its retention"
    );
    store.sweep(10_500).await.expect("sweep");
    assert_eq!(
        store.stream_range(&suite::sid("r1"), &s).await,
        Ok(suite::tombstone(1, StreamState::Complete)),
        "its events dropped once it ran out"
    );
    assert_eq!(store.retained_bytes().await.expect("bytes"), Some(0));
    // After a restart the last sweep is another process's: a stream that ends before this
    // process's first sweep counts from that sweep, not from the old one.
    drop(store);
    let store = open(&dir, "owner-b");
    let late = suite::stream("late");
    store.open_stream(&suite::sid("r1"), &a, &late).await.expect("open");
    store.append(&suite::sid("r1"), &a, &late, Bytes::from_static(b"result"), true).await.expect("append");
    store.sweep(11_100).await.expect("sweep");
    assert_eq!(
        store.stream_range(&suite::sid("r1"), &late).await.expect("range").map(|r| r.retained_from),
        Some(0),
        "kept after a restart"
    );
    store.sweep(11_600).await.expect("sweep");
    assert_eq!(store.stream_range(&suite::sid("r1"), &late).await, Ok(suite::tombstone(1, StreamState::Complete)));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_order_and_the_time_streams_ended_in_hold_across_reopens() {
    let dir = fresh_dir();
    let a = suite::epoch('A');
    let session = suite::sid("r1");
    let record = SessionRecord { expires_at_ms: u64::MAX / 4, ..suite::record("r1", a.clone(), 10_000) };
    // Opened in one order, ended in the other, named in neither.
    let (first, second) = (suite::stream("a"), suite::stream("z"));
    let store = open(&dir, "owner-a");
    store.create_session(record, usize::MAX).await.expect("create");
    store.sweep(10_000).await.expect("sweep");
    for stream in [&first, &second] {
        store.open_stream(&session, &a, stream).await.expect("open");
    }
    for stream in [&second, &first] {
        store.append(&session, &a, stream, Bytes::from(vec![b'x'; 300]), true).await.expect("append");
    }
    drop(store);

    let store = open(&dir, "owner-b");
    let live = suite::stream("live");
    store.open_stream(&session, &a, &live).await.expect("open");
    // Past the session's 1,000 bytes by less than one stream's: the stream that ended first goes.
    store.append(&session, &a, &live, Bytes::from(vec![b'x'; 500]), false).await.expect("append");
    assert_eq!(store.stream_range(&session, &second).await, Ok(suite::tombstone(1, StreamState::Complete)));
    assert_eq!(
        store.stream_range(&session, &first).await.expect("range").map(|r| r.retained_from),
        Some(0),
        "the stream that ended last is kept"
    );
    // Its retention runs from the sweep before it ended, in the previous process.
    store.sweep(10_499).await.expect("sweep");
    assert_eq!(store.stream_range(&session, &first).await.expect("range").map(|r| r.retained_from), Some(0));
    store.sweep(10_500).await.expect("sweep");
    assert_eq!(store.stream_range(&session, &first).await, Ok(suite::tombstone(1, StreamState::Complete)));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_database_from_before_the_key_count_is_counted_at_open() {
    let dir = fresh_dir();
    let store = open(&dir, "owner-a");
    for (i, key) in ["a", "b", "c", "d"].into_iter().enumerate() {
        assert_eq!(
            store.claim_key(suite::claim(key, "d", 1_000 + i as u64)).await,
            Ok(Claim::Claimed(suite::ack(&store, i as u64 + 1).await))
        );
        store.finish_key(key, Bytes::from_static(b"{}")).await.expect("finish");
    }
    drop(store);
    let old = database(&dir);
    old.execute_batch(
        "DROP TRIGGER keys_counted; DROP TRIGGER keys_uncounted; DELETE FROM meta WHERE name = 'keys_count';",
    )
    .expect("as an earlier version left it");
    drop(old);
    let store = open(&dir, "owner-a");
    store.sweep(1_010).await.expect("sweep");
    let known = |key: &'static str| {
        let store = &store;
        async move { store.key_state(key, 1_010).await.expect("state").is_some() }
    };
    assert!(!known("a").await, "four records counted at open: the oldest goes past the bound of three");
    assert!(known("b").await && known("c").await && known("d").await);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The tables a database made before the log kept streams, events and requests in, with the
/// last columns they had.
const TABLES_BEFORE_THE_LOG: &str = "
CREATE TABLE streams (session TEXT NOT NULL, stream TEXT NOT NULL, head INTEGER NOT NULL, state INTEGER NOT NULL,
    ended_at_ms INTEGER, owner TEXT NOT NULL, request_key TEXT, bytes INTEGER NOT NULL DEFAULT 0,
    before_retained INTEGER, ended_order INTEGER, PRIMARY KEY (session, stream)) WITHOUT ROWID;
CREATE TABLE events (session TEXT NOT NULL, stream TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL,
    tag INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (session, stream, seq)) WITHOUT ROWID;
CREATE TABLE requests (session TEXT NOT NULL, key TEXT NOT NULL, digest TEXT NOT NULL, stream TEXT NOT NULL,
    PRIMARY KEY (session, key)) WITHOUT ROWID;
";

#[tokio::test]
async fn a_database_from_before_the_log_keeps_its_streams_events_and_requests() {
    let dir = fresh_dir();
    let epoch = suite::epoch('E');
    let session = suite::sid("old");
    let (running, trimmed) = (suite::stream("r1"), suite::stream("r2"));
    let store = open(&dir, "before");
    store.create_session(record("old", &epoch), usize::MAX).await.expect("create");
    drop(store);
    let old = database(&dir);
    old.execute_batch(TABLES_BEFORE_THE_LOG).expect("the old tables");
    old.execute_batch(&format!(
        "INSERT INTO requests VALUES ('old', 'n:1', 'digest-1', 'r1'), ('old', 'n:2', 'digest-2', 'r2');
         INSERT INTO streams (session, stream, head, state, owner, request_key) VALUES ('old', 'r1', 2, 0, 'before', 'n:1');
         INSERT INTO streams (session, stream, head, state, owner, request_key, before_retained, ended_order, ended_at_ms)
             VALUES ('old', 'r2', 3, 1, 'before', 'n:2', 11, 7, 500);
         INSERT INTO events VALUES ('old', 'r1', 0, x'', {}), ('old', 'r1', 1, x'61', 21), ('old', 'r1', 2, x'62', 22),
             ('old', 'r2', 2, x'63', 32), ('old', 'r2', 3, x'64', 33);",
        i64::from_ne_bytes(tether_core::lineage::Tag::priming(&running).bits().to_ne_bytes())
    ))
    .expect("the rows an earlier version left");
    drop(old);

    let store = open(&dir, "after");
    assert_eq!(
        store.stream_range(&session, &running).await,
        Ok(Some(StreamRange { retained_from: 0, head: 2, state: StreamState::Aborted })),
        "a request the previous process left running is aborted at open"
    );
    let page = store.read_page(&session, &running, 0, 10).await.expect("read").expect("a page");
    assert_eq!(page.at_cursor, Some(tether_core::lineage::Tag::priming(&running)));
    let events: Vec<(u64, u64, &[u8])> = page.events.iter().map(|e| (e.seq, e.tag.bits(), &e.data[..])).collect();
    assert_eq!(events, [(1, 21, &b"a"[..]), (2, 22, b"b")]);
    let page = store.read_page(&session, &trimmed, 1, 10).await.expect("read").expect("a page");
    assert_eq!(page.range, StreamRange { retained_from: 2, head: 3, state: StreamState::Complete });
    assert_eq!((page.at_cursor, page.before_retained), (Some(Tag::from_bits(11)), Some(Tag::from_bits(11))));
    assert_eq!(page.events.iter().map(|e| (e.seq, e.tag.bits())).collect::<Vec<_>>(), [(2, 32), (3, 33)]);
    assert_eq!(
        store.begin_request(suite::request(&session, &epoch, &suite::key("n:2"), "digest-2", &running)).await,
        Ok(BeginRequest::Existing { stream: trimmed.clone(), same_params: true }),
        "a request's record is kept"
    );
    assert_eq!(store.retained_bytes().await, Ok(Some(4)));
    drop(store);
    let tables: i64 = database(&dir)
        .query_row("SELECT COUNT(*) FROM sqlite_master WHERE name IN ('streams', 'events', 'requests')", [], |r| {
            r.get(0)
        })
        .expect("tables");
    assert_eq!(tables, 0, "the old tables are dropped once their rows are in the log");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_database_with_the_request_index_not_unique_gets_it_unique_and_keeps_its_records() {
    let dir = fresh_dir();
    let epoch = suite::epoch('E');
    let session = suite::sid("kept");
    let (first, second) = (suite::stream("r1"), suite::stream("r2"));
    let store = open(&dir, "before");
    store.create_session(record("kept", &epoch), usize::MAX).await.expect("create");
    let begun = store.begin_request(suite::request(&session, &epoch, &suite::key("n:1"), "digest-1", &first)).await;
    assert_eq!(begun, Ok(BeginRequest::Started));
    drop(store);
    let old = database(&dir);
    old.execute_batch("DROP INDEX log_request_keys; CREATE INDEX log_requests ON log (session, key) WHERE kind = 0;")
        .expect("the index an earlier version made");
    drop(old);

    let store = open(&dir, "after");
    assert_eq!(
        store.begin_request(suite::request(&session, &epoch, &suite::key("n:1"), "digest-other", &second)).await,
        Ok(BeginRequest::Existing { stream: first.clone(), same_params: false }),
        "a request's record is kept"
    );
    assert_eq!(
        store.begin_request(suite::request(&session, &epoch, &suite::key("n:2"), "digest-2", &second)).await,
        Ok(BeginRequest::Started)
    );
    drop(store);
    let indexes: Vec<(String, bool)> = database(&dir)
        .prepare("SELECT name, \"unique\" FROM pragma_index_list('log')")
        .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .expect("indexes");
    assert_eq!(indexes, [("log_request_keys".to_owned(), true)]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_sweep_drops_every_stream_past_its_retention_however_many_are_due() {
    let dir = fresh_dir();
    let store = open(&dir, "owner-a");
    let epoch = suite::epoch('E');
    store.create_session(suite::record("many", epoch.clone(), 10_000), usize::MAX).await.expect("create");
    let session = suite::sid("many");
    // More than one of the sweep's jobs drops.
    let streams: Vec<StreamName> = (0..700).map(|n| suite::stream(&format!("s{n}"))).collect();
    for stream in &streams {
        store.open_stream(&session, &epoch, stream).await.expect("open");
        store.end_stream(&session, &epoch, stream).await.expect("end");
    }
    store.sweep(1_000).await.expect("the first sweep stamps them");
    store.sweep(1_000 + suite::retention().ended_stream_ms).await.expect("the sweep that drops them");
    for stream in &streams {
        assert_eq!(store.stream_range(&session, stream).await, Ok(suite::tombstone(0, StreamState::Complete)));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn what_the_log_says_of_an_aborted_and_a_trimmed_stream_holds_across_reopens() {
    let dir = fresh_dir();
    let epoch = suite::epoch('E');
    let session = suite::sid("s");
    let (running, long) = (suite::stream("r1"), suite::stream("r2"));
    let page_of = |store: SqliteStore| {
        let (session, long) = (session.clone(), long.clone());
        async move {
            // The cursor just before what is retained (8 of 12): its tag is the trim's to keep.
            let page = store.read_page(&session, &long, 4, 100).await.expect("read").expect("kept");
            (store, page)
        }
    };
    let before = {
        let dead = open(&dir, "dead");
        dead.create_session(SessionRecord { expires_at_ms: u64::MAX / 2, ..record("s", &epoch) }, usize::MAX)
            .await
            .expect("create");
        dead.begin_request(suite::request(&session, &epoch, &suite::key("n:1"), "d", &running)).await.expect("begin");
        dead.open_stream(&session, &epoch, &long).await.expect("open");
        // Past max_events_per_stream (8): the oldest are dropped, and the log says so.
        for _ in 0..12 {
            dead.append(&session, &epoch, &long, Bytes::from_static(b"event"), false).await.expect("append");
        }
        page_of(dead).await.1
    };
    assert_eq!(before.range.retained_from, 5, "trimmed: {before:?}");
    assert!(before.at_cursor.is_some() && before.at_cursor == before.before_retained, "{before:?}");
    for reopening in 0..2 {
        let store = open(&dir, "survivor");
        let range = store.stream_range(&session, &running).await.expect("range").expect("kept");
        assert_eq!(range.state, StreamState::Aborted, "aborted at the first open, still at reopen {reopening}");
        let (_, page) = page_of(store).await;
        assert_eq!(
            (page.range, page.at_cursor, page.before_retained),
            (before.range, before.at_cursor, before.before_retained),
            "the trim as before, at reopen {reopening}"
        );
    }
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
