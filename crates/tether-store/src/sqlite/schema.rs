//! The embedded store's schema: its tables, the codes its columns hold, and the columns and
//! indexes added since the first release, added to an older database when it is opened.

use super::log::{ENDED, EVENT, OPENED, REQUEST, TRIMMED};
use super::*;

pub(super) const SCHEMA: &str = "
-- Every commit writes each page it changed whole to the WAL, and a commit of a few small
-- events changes dozens of B-tree pages (about 54 per commit under the tool-call bench): 1 KiB
-- pages write a quarter of the bytes of the default 4 KiB (tool-call +12-17%, back to back).
-- It only takes effect when the database is created.
PRAGMA page_size = 1024;
PRAGMA journal_mode = WAL;
-- Commits do not wait for the disk: the flush thread flushes the WAL before anyone is answered
-- (flush.rs). Checkpoints still flush the WAL before they copy it and the database after.
PRAGMA synchronous = NORMAL;
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    epoch TEXT NOT NULL,
    principal TEXT,
    protocol_version TEXT NOT NULL,
    client TEXT NOT NULL,
    idle_ttl_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    ended INTEGER,
    ended_at_ms INTEGER,
    standalone TEXT
);
-- The streams, events and request records of live sessions, as rows appended in order
-- (sqlite/log.rs): the writer holds what they say in memory and checks against it, so a write
-- only inserts rows, under an integer key, with no index to keep. What each column holds
-- depends on the row's kind (log.rs names them).
CREATE TABLE IF NOT EXISTS log (
    id INTEGER PRIMARY KEY,
    kind INTEGER NOT NULL,
    session TEXT NOT NULL,
    stream TEXT NOT NULL,
    -- An event's sequence number; an end's state; the first event retained after a trim.
    seq INTEGER,
    -- An event's tag (tether_core::lineage::Tag, its 64 bits as a signed integer); an end's
    -- order; the tag of the last event a trim dropped.
    tag INTEGER,
    -- An event's data.
    data BLOB,
    -- A request's key, in its record and in the stream it opened.
    key TEXT,
    -- A request's params digest; a stream's owner.
    detail TEXT,
    -- When an ended stream's retention counts from.
    at INTEGER
);
-- Request records by their key: a session keeps every request id for its life, so they are not
-- held in memory. The one index the log has; the kind is REQUEST (sqlite/log.rs). Unique, so a
-- record is inserted unless its key is known in one statement. A database made before has it,
-- not unique, as `log_requests`.
DROP INDEX IF EXISTS log_requests;
CREATE UNIQUE INDEX IF NOT EXISTS log_request_keys ON log (session, key) WHERE kind = 0;
-- Live sessions by deadline and ended ones by age, for the sweep: without them every sweep read
-- the whole sessions table three times (10 ms at 50,000 sessions).
CREATE INDEX IF NOT EXISTS sessions_expiry ON sessions (expires_at_ms) WHERE ended IS NULL;
CREATE INDEX IF NOT EXISTS sessions_ended ON sessions (ended_at_ms) WHERE ended IS NOT NULL;
-- Streams whose events retention dropped: how far they got and how they ended, kept while their
-- session lives, so a resume is told exactly what is gone.
CREATE TABLE IF NOT EXISTS tombstones (
    session TEXT NOT NULL,
    stream TEXT NOT NULL,
    head INTEGER NOT NULL,
    state INTEGER NOT NULL,
    request_key TEXT,
    -- The tag of the stream's last event.
    before_retained INTEGER,
    PRIMARY KEY (session, stream)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS keys (
    key TEXT PRIMARY KEY,
    digest TEXT NOT NULL,
    owner TEXT NOT NULL,
    session TEXT,
    stream TEXT,
    outcome BLOB,
    created_ms INTEGER NOT NULL,
    -- The claim's position: meta 'claims' when it was made.
    at INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS keys_by_age ON keys (created_ms);
CREATE TABLE IF NOT EXISTS counter_ops (op TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
-- Tasks: the record as JSON (tether_core::tasks::TaskRecord), the process running it, and when a
-- finished one may be forgotten.
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    record TEXT NOT NULL,
    forget_at_ms INTEGER,
    -- While the task runs: its principal (`running_principal`), so running tasks are counted
    -- against their caps; NULL once it is final.
    running_principal TEXT
);
CREATE INDEX IF NOT EXISTS tasks_forgotten ON tasks (forget_at_ms) WHERE forget_at_ms IS NOT NULL;
-- How many idempotency records there are, kept by the database itself (so a rolled-back write
-- takes its count with it): counting them for the sweep's bound read all of them once a second.
CREATE TRIGGER IF NOT EXISTS keys_counted AFTER INSERT ON keys
    BEGIN UPDATE meta SET value = value + 1 WHERE name = 'keys_count'; END;
CREATE TRIGGER IF NOT EXISTS keys_uncounted AFTER DELETE ON keys
    BEGIN UPDATE meta SET value = value - 1 WHERE name = 'keys_count'; END;
-- How many sessions are live, kept the same way: a new session is admitted against it.
CREATE TRIGGER IF NOT EXISTS sessions_counted AFTER INSERT ON sessions WHEN NEW.ended IS NULL
    BEGIN UPDATE meta SET value = value + 1 WHERE name = 'live_sessions'; END;
CREATE TRIGGER IF NOT EXISTS sessions_ended AFTER UPDATE OF ended ON sessions
    WHEN OLD.ended IS NULL AND NEW.ended IS NOT NULL
    BEGIN UPDATE meta SET value = value - 1 WHERE name = 'live_sessions'; END;
CREATE TRIGGER IF NOT EXISTS sessions_uncounted AFTER DELETE ON sessions WHEN OLD.ended IS NULL
    BEGIN UPDATE meta SET value = value - 1 WHERE name = 'live_sessions'; END;
";

pub(super) const LIVE: i64 = 0;
pub(super) const COMPLETE: i64 = 1;
pub(super) const ABORTED: i64 = 2;
pub(super) const TERMINATED: i64 = 1;
pub(super) const EXPIRED: i64 = 2;
pub(super) const UPSTREAM_LOST: i64 = 3;
pub(super) const HISTORY_REWRITTEN: i64 = 4;

/// The columns added to tables after their first release, each added to a database made before
/// it (with the default their rows take): `CREATE TABLE IF NOT EXISTS` leaves an existing table
/// as it is.
pub(super) const ADDED_COLUMNS: [(&str, &str, &str); 6] = [
    ("events", "tag", "INTEGER NOT NULL DEFAULT 0"),
    ("streams", "before_retained", "INTEGER"),
    ("tombstones", "before_retained", "INTEGER"),
    ("keys", "at", "INTEGER NOT NULL DEFAULT 0"),
    ("tasks", "running_principal", "TEXT"),
    ("streams", "ended_order", "INTEGER"),
];

/// Indexes of [`ADDED_COLUMNS`], made once the columns are there.
pub(super) const ADDED_INDEXES: &str = "
CREATE INDEX IF NOT EXISTS tasks_running ON tasks (owner, running_principal) WHERE running_principal IS NOT NULL;
";

/// Adds the [`ADDED_COLUMNS`] a database made before them lacks (to the tables it has).
pub(super) fn add_missing_columns(connection: &Connection) -> Result<(), StoreError> {
    for (table, column, declaration) in ADDED_COLUMNS {
        if !has_table(connection, table)? {
            continue;
        }
        let present: bool = connection
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2)",
                params![table, column],
                |r| r.get(0),
            )
            .map_err(backend)?;
        if !present {
            connection
                .execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {declaration}"))
                .map_err(backend)?;
        }
    }
    Ok(())
}

fn has_table(connection: &Connection, table: &str) -> Result<bool, StoreError> {
    connection
        .query_row("SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)", [table], |r| {
            r.get(0)
        })
        .map_err(backend)
}

/// Moves the rows of the tables a database made before the log kept streams, events and
/// requests in (`streams`, `events`, `requests`) into the log, in one transaction, and drops
/// those tables: each stream's opening, then its retained events in order, its trim (when its
/// priming event is gone) and its end.
pub(super) fn move_tables_into_log(connection: &mut Connection) -> Result<(), StoreError> {
    if !has_table(connection, "streams")? {
        return Ok(());
    }
    let txn = connection.transaction().map_err(backend)?;
    txn.execute_batch(&format!(
        "INSERT INTO log (kind, session, stream, key, detail) \
             SELECT {REQUEST}, session, stream, key, digest FROM requests; \
         INSERT INTO log (kind, session, stream, key, detail) \
             SELECT {OPENED}, session, stream, request_key, owner FROM streams; \
         INSERT INTO log (kind, session, stream, seq, tag, data) \
             SELECT {EVENT}, session, stream, seq, tag, data FROM events WHERE seq > 0 ORDER BY session, stream, seq; \
         INSERT INTO log (kind, session, stream, seq, tag) \
             SELECT {TRIMMED}, s.session, s.stream, \
                 COALESCE((SELECT MIN(seq) FROM events e WHERE e.session = s.session AND e.stream = s.stream), s.head + 1), \
                 s.before_retained \
             FROM streams s WHERE NOT EXISTS \
                 (SELECT 1 FROM events e WHERE e.session = s.session AND e.stream = s.stream AND e.seq = 0); \
         INSERT INTO log (kind, session, stream, seq, tag, at) \
             SELECT {ENDED}, session, stream, state, ended_order, ended_at_ms FROM streams WHERE state != {LIVE}; \
         DROP TABLE events; DROP TABLE streams; DROP TABLE requests;"
    ))
    .map_err(backend)?;
    txn.commit().map_err(backend)
}
