//! The embedded store's schema: its tables, the codes its columns hold, and the columns and
//! indexes added since the first release, added to an older database when it is opened.

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
    standalone TEXT,
    bytes INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS streams (
    session TEXT NOT NULL,
    stream TEXT NOT NULL,
    head INTEGER NOT NULL,
    state INTEGER NOT NULL,
    ended_at_ms INTEGER,
    owner TEXT NOT NULL,
    request_key TEXT,
    bytes INTEGER NOT NULL DEFAULT 0,
    -- The tag of the last event retention dropped (the one before those retained), if any.
    before_retained INTEGER,
    PRIMARY KEY (session, stream)
) WITHOUT ROWID;
-- Live sessions by deadline and ended ones by age, for the sweep: without them every sweep read
-- the whole sessions table three times (10 ms at 50,000 sessions).
CREATE INDEX IF NOT EXISTS sessions_expiry ON sessions (expires_at_ms) WHERE ended IS NULL;
CREATE INDEX IF NOT EXISTS sessions_ended ON sessions (ended_at_ms) WHERE ended IS NOT NULL;
-- Ended streams by age, for the sweep: without it every sweep read the whole table, on the
-- writer thread, once a second (30 ms at 200,000 retained streams). A stream's retention counts
-- from the last sweep before it ended (meta `swept_at`), or the first after if there was none:
-- stamping it later, in the sweep, moved every entry of this index once more.
CREATE INDEX IF NOT EXISTS streams_ended ON streams (ended_at_ms) WHERE state != 0;
CREATE TABLE IF NOT EXISTS events (
    session TEXT NOT NULL,
    stream TEXT NOT NULL,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL,
    -- The 64 random bits drawn for the event (tether_core::lineage::Tag), as a signed integer.
    tag INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session, stream, seq)
) WITHOUT ROWID;
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
CREATE TABLE IF NOT EXISTS requests (
    session TEXT NOT NULL,
    key TEXT NOT NULL,
    digest TEXT NOT NULL,
    stream TEXT NOT NULL,
    PRIMARY KEY (session, key)
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
CREATE INDEX IF NOT EXISTS streams_end_order ON streams (session, ended_order) WHERE state != 0;
";

/// Adds the [`ADDED_COLUMNS`] a database made before them lacks.
pub(super) fn add_missing_columns(connection: &Connection) -> Result<(), StoreError> {
    for (table, column, declaration) in ADDED_COLUMNS {
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
