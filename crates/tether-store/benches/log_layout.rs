//! What the embedded store's writer thread pays for one tool call's writes, by layout, on one
//! thread (no channels, no flush: the writer's own CPU), in SQLite as the store configures it
//! (WAL, 1 KiB pages, `synchronous = NORMAL`), eight calls to a commit as under load:
//! - `tables`: the statements the store runs today: the request's record and its stream with
//!   the priming event, then two appends (the progress event, then the result, which ends the
//!   stream), each checking the session and the stream and keeping the byte counts, every job
//!   in a savepoint;
//! - `tables_checked_in_memory`: the same statements without their reads (the session's
//!   incarnation, the stream's head, the session's byte count), as a writer holding them would;
//! - `tables_numbered`: today's statements with events keyed by a number the stream's row holds
//!   instead of the session id and the stream name;
//! - `tables_writes`: the same tables written with no read and no savepoint: each row inserted
//!   and the stream's row updated once, at its end, as a writer holding the checks and counts in
//!   memory would;
//! - `log`: an append-only log, one row per record or event under an integer key, every
//!   check and count made in memory by the one writer.
//!
//! The difference bounds what holding the store's state in the writer's memory can save
//! (issue 48). `cargo bench -p tether-store --bench log_layout`

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use rusqlite::{Connection, OptionalExtension, params};

/// Calls committed together, as the bench's 16 connections fill a batch.
const PER_COMMIT: usize = 8;

const PROGRESS: &[u8] = br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t-000123","progress":1,"total":1}}"#;
const RESULT: &[u8] = br#"{"jsonrpc":"2.0","id":123456,"result":{"content":[{"type":"text","text":"counted to 1"}]}}"#;
const SESSION: &str = "8f6b2c1e-4d3a-4b5c-9e8f-7a6b5c4d3e2f";
const EPOCH: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f0";

fn open(name: &str, schema: &str) -> (Connection, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("tether-log-layout-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench directory");
    let connection = Connection::open(dir.join("db")).expect("open");
    connection
        .execute_batch(
            "PRAGMA page_size = 1024; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
             PRAGMA wal_autocheckpoint = 0;",
        )
        .expect("pragmas");
    connection.execute_batch(schema).expect("schema");
    connection.set_prepared_statement_cache_capacity(64);
    (connection, dir)
}

const TABLES: &str = "
CREATE TABLE sessions (id TEXT PRIMARY KEY, epoch TEXT NOT NULL, ended INTEGER, bytes INTEGER NOT NULL DEFAULT 0);
CREATE TABLE streams (session TEXT NOT NULL, stream TEXT NOT NULL, head INTEGER NOT NULL, state INTEGER NOT NULL,
    ended_at_ms INTEGER, owner TEXT NOT NULL, request_key TEXT, bytes INTEGER NOT NULL DEFAULT 0,
    ended_order INTEGER, PRIMARY KEY (session, stream)) WITHOUT ROWID;
CREATE INDEX streams_ended ON streams (ended_at_ms) WHERE state != 0;
CREATE INDEX streams_end_order ON streams (session, ended_order) WHERE state != 0;
CREATE TABLE events (session TEXT NOT NULL, stream TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL,
    tag INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (session, stream, seq)) WITHOUT ROWID;
CREATE TABLE requests (session TEXT NOT NULL, key TEXT NOT NULL, digest TEXT NOT NULL, stream TEXT NOT NULL,
    PRIMARY KEY (session, key)) WITHOUT ROWID;
";

/// [`TABLES`] with events keyed by a number each stream's row holds.
const TABLES_NUMBERED: &str = "
CREATE TABLE sessions (id TEXT PRIMARY KEY, epoch TEXT NOT NULL, ended INTEGER, bytes INTEGER NOT NULL DEFAULT 0);
CREATE TABLE streams (session TEXT NOT NULL, stream TEXT NOT NULL, head INTEGER NOT NULL, state INTEGER NOT NULL,
    ended_at_ms INTEGER, owner TEXT NOT NULL, request_key TEXT, bytes INTEGER NOT NULL DEFAULT 0,
    ended_order INTEGER, number INTEGER, PRIMARY KEY (session, stream)) WITHOUT ROWID;
CREATE INDEX streams_ended ON streams (ended_at_ms) WHERE state != 0;
CREATE INDEX streams_end_order ON streams (session, ended_order) WHERE state != 0;
CREATE TABLE events (sid INTEGER NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL,
    tag INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (sid, seq)) WITHOUT ROWID;
CREATE TABLE requests (session TEXT NOT NULL, key TEXT NOT NULL, digest TEXT NOT NULL, stream TEXT NOT NULL,
    PRIMARY KEY (session, key)) WITHOUT ROWID;
";

const LOG: &str = "
CREATE TABLE log (id INTEGER PRIMARY KEY, kind INTEGER NOT NULL, session INTEGER NOT NULL, stream INTEGER NOT NULL,
    seq INTEGER NOT NULL, tag INTEGER NOT NULL, data BLOB NOT NULL);
";

fn execute(c: &Connection, sql: &str, p: impl rusqlite::Params) {
    c.prepare_cached(sql).expect("prepare").execute(p).expect("execute");
}

fn live(c: &Connection) {
    let epoch: Option<String> = c
        .prepare_cached("SELECT epoch FROM sessions WHERE id = ?1 AND ended IS NULL")
        .expect("prepare")
        .query_row([SESSION], |r| r.get(0))
        .optional()
        .expect("session");
    assert_eq!(epoch.as_deref(), Some(EPOCH));
}

/// Where an append finds the session's incarnation and the stream's head: read from SQLite
/// (today), or held by the writer.
#[derive(Clone, Copy)]
enum Checks {
    InSql,
    InMemory,
}

/// How events are keyed: by session id and stream name (today), or by an integer the stream's
/// row holds, so each event lands on the rightmost page of an integer-keyed B-tree.
#[derive(Clone, Copy)]
enum EventKey {
    Names,
    StreamNumber,
}

fn insert_event(c: &Connection, key: EventKey, stream: &str, number: i64, seq: i64, data: &[u8], tag: i64) {
    match key {
        EventKey::Names => execute(
            c,
            "INSERT INTO events (session, stream, seq, data, tag) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![SESSION, stream, seq, data, tag],
        ),
        EventKey::StreamNumber => execute(
            c,
            "INSERT INTO events (sid, seq, data, tag) VALUES (?1, ?2, ?3, ?4)",
            params![number, seq, data, tag],
        ),
    }
}

/// Appends one event as the store does: the checks, the insert, the stream's and the session's
/// counts, in a savepoint. `seq` is the event's, which the writer knows when it holds the head.
#[allow(clippy::too_many_arguments)]
fn append(
    c: &Connection,
    checks: Checks,
    key: EventKey,
    stream: &str,
    number: i64,
    seq: i64,
    data: &[u8],
    ended: bool,
) {
    execute(c, "SAVEPOINT job", []);
    if let Checks::InSql = checks {
        live(c);
        let (head, _state): (i64, i64) = c
            .prepare_cached("SELECT head, state FROM streams WHERE session = ?1 AND stream = ?2")
            .expect("prepare")
            .query_row(params![SESSION, stream], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("stream");
        assert_eq!(head + 1, seq);
    }
    let len = data.len() as i64;
    insert_event(c, key, stream, number, seq, data, seq * 7919);
    execute(
        c,
        "UPDATE streams SET head = ?3, state = ?4, bytes = bytes + ?5, ended_order = ?6, ended_at_ms = CASE WHEN ?4 != 0 THEN 1 END WHERE session = ?1 AND stream = ?2",
        params![SESSION, stream, seq, i64::from(ended), len, ended.then_some(number)],
    );
    execute(c, "UPDATE sessions SET bytes = bytes + ?2 WHERE id = ?1", params![SESSION, len]);
    if let Checks::InSql = checks {
        let _bytes: i64 = c
            .prepare_cached("SELECT bytes FROM sessions WHERE id = ?1")
            .expect("prepare")
            .query_row([SESSION], |r| r.get(0))
            .expect("bytes");
    }
    execute(c, "RELEASE job", []);
}

/// The request's record, its stream and the stream's priming event.
fn record_request(c: &Connection, key: EventKey, n: i64, stream: &str, request: &str) {
    execute(
        c,
        "INSERT INTO requests (session, key, digest, stream) VALUES (?1, ?2, ?3, ?4)",
        params![SESSION, request, "d41d8cd98f00b204e9800998ecf8427e", stream],
    );
    match key {
        EventKey::Names => execute(
            c,
            "INSERT OR IGNORE INTO streams (session, stream, head, state, owner, request_key) VALUES (?1, ?2, 0, 0, ?3, ?4)",
            params![SESSION, stream, "bench", request],
        ),
        EventKey::StreamNumber => execute(
            c,
            "INSERT OR IGNORE INTO streams (session, stream, head, state, owner, request_key, number) VALUES (?1, ?2, 0, 0, ?3, ?4, ?5)",
            params![SESSION, stream, "bench", request, n],
        ),
    }
    insert_event(c, key, stream, n, 0, b"", n);
}

/// One call's writes into today's tables: the request's record and its stream, then two
/// appends, each job in a savepoint; the checks made where `checks` says, events keyed as `key`.
fn call_in_tables_as(c: &Connection, n: i64, checks: Checks, key: EventKey) {
    let (stream, request) = (format!("r{n:016x}"), format!("{n}"));
    execute(c, "SAVEPOINT job", []);
    if let Checks::InSql = checks {
        live(c);
    }
    let existing: Option<String> = c
        .prepare_cached("SELECT digest FROM requests WHERE session = ?1 AND key = ?2")
        .expect("prepare")
        .query_row(params![SESSION, request], |r| r.get(0))
        .optional()
        .expect("request");
    assert!(existing.is_none());
    record_request(c, key, n, &stream, &request);
    execute(c, "RELEASE job", []);
    append(c, checks, key, &stream, n, 1, PROGRESS, false);
    append(c, checks, key, &stream, n, 2, RESULT, true);
}

fn call_in_tables(c: &Connection, n: i64) {
    call_in_tables_as(c, n, Checks::InSql, EventKey::Names);
}

fn call_in_tables_checked_in_memory(c: &Connection, n: i64) {
    call_in_tables_as(c, n, Checks::InMemory, EventKey::Names);
}

fn call_in_tables_numbered(c: &Connection, n: i64) {
    call_in_tables_as(c, n, Checks::InSql, EventKey::StreamNumber);
}

/// One call's writes into today's tables, with the checks and counts left to memory.
fn call_in_tables_writes(c: &Connection, n: i64) {
    let (stream, key) = (format!("r{n:016x}"), format!("{n}"));
    record_request(c, EventKey::Names, n, &stream, &key);
    for (i, data) in [PROGRESS, RESULT].into_iter().enumerate() {
        execute(
            c,
            "INSERT INTO events (session, stream, seq, data, tag) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![SESSION, stream, i as i64 + 1, data, n * 7919],
        );
    }
    execute(
        c,
        "UPDATE streams SET head = ?3, state = ?4, bytes = bytes + ?5, ended_order = ?6, ended_at_ms = CASE WHEN ?4 != 0 THEN 1 END WHERE session = ?1 AND stream = ?2",
        params![SESSION, stream, 2, 1, 200, n],
    );
}

/// One call's writes as an append-only log: the request's record, its two events.
fn call_in_log(c: &Connection, n: i64) {
    let insert = "INSERT INTO log (kind, session, stream, seq, tag, data) VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
    execute(c, insert, params![0, 1, n, 0, n, "d41d8cd98f00b204e9800998ecf8427e".as_bytes()]);
    execute(c, insert, params![1, 1, n, 1, n * 7919, PROGRESS]);
    execute(c, insert, params![2, 1, n, 2, n * 7907, RESULT]);
}

/// A layout: its name, its schema, and one call's writes into it (the call's number).
type Layout = (&'static str, &'static str, fn(&Connection, i64));

fn layouts(c: &mut Criterion) {
    let mut group = c.benchmark_group("log_layout");
    group.throughput(Throughput::Elements(PER_COMMIT as u64));
    let layouts: [Layout; 5] = [
        ("tables", TABLES, call_in_tables),
        ("tables_checked_in_memory", TABLES, call_in_tables_checked_in_memory),
        ("tables_numbered", TABLES_NUMBERED, call_in_tables_numbered),
        ("tables_writes", TABLES, call_in_tables_writes),
        ("log", LOG, call_in_log),
    ];
    for (name, schema, call) in layouts {
        let (connection, dir) = open(name, schema);
        if schema != LOG {
            execute(&connection, "INSERT INTO sessions (id, epoch) VALUES (?1, ?2)", params![SESSION, EPOCH]);
        }
        let n = std::cell::Cell::new(0i64);
        group.bench_function(name, |b| {
            b.iter_batched(
                // Checkpoints are the checkpointer thread's, not the writer's: made here, untimed.
                || {
                    if n.get() % (64 * PER_COMMIT as i64) == 0 {
                        connection.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).expect("checkpoint");
                    }
                },
                |()| {
                    execute(&connection, "BEGIN", []);
                    for _ in 0..PER_COMMIT {
                        n.set(n.get() + 1);
                        call(&connection, n.get());
                    }
                    execute(&connection, "COMMIT", []);
                },
                BatchSize::SmallInput,
            );
        });
        drop(connection);
        let _ = std::fs::remove_dir_all(dir);
    }
    group.finish();
}

criterion_group!(benches, layouts);
criterion_main!(benches);
