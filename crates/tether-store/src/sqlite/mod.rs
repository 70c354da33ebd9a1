//! The embedded durable store: SQLite in WAL mode on one writer thread with group commit.
//!
//! Every write runs on the database thread inside a transaction shared with whatever else
//! queued up meanwhile; callers are answered only after that transaction is on disk (the flush
//! thread, `flush.rs`, flushes the WAL while the writer goes on with the next batch).
//! Reads run on their own connections and return only once what they could have seen is on
//! disk. So an event is durable before any connection can read it, and a crash loses nothing
//! that was acknowledged. Checkpoints run beside the writer (`checkpoint.rs`).

mod checkpoint;
mod flush;
mod mirror;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, mpsc};

use bytes::Bytes;
use rusqlite::{Connection, OptionalExtension, Transaction, params};
use tether_core::lineage::{Epoch, SessionId, StreamName, StreamRange, StreamState, Tag};
use tether_core::mcp::ProtocolVersion;
use tokio::sync::oneshot;

use self::checkpoint::Checkpoints;
use self::flush::{Committed, Durability, Flusher};
use self::mirror::Mirror;
use crate::heads::Heads;
use crate::record::{
    BeginRequest, Claim, KeyClaim, KeyState, RequestRecord, Retention, SessionEnd, SessionRecord, SessionStatus,
    StoredEvent, StreamPage,
};
use crate::{
    CounterStore, EventLog, HeadWatch, KeyRecords, Relay, RelayedAnswer, RequestKey, SessionStore, StoreError,
    StoreFuture, StoredTask, TaskLimits, TaskStore,
};
use tether_core::idempotency::Acknowledged;
use tether_core::tasks::{TaskChange, TaskRecord};

/// Most operations committed in one transaction.
const MAX_BATCH: usize = 512;

/// Connections that only read, each on its own thread.
const READERS: usize = 2;

type Completion = Box<dyn FnOnce(Result<(), StoreError>) + Send>;
type Job = Box<dyn FnOnce(&mut Transaction<'_>) -> Completions + Send>;

/// What a job leaves to do once its batch's transaction ends.
struct Completions {
    /// Run by the writer as soon as the commit is made, before it is durable: only for callers
    /// that need their write ordered before every later one, not durable (see
    /// [`EventLog::begin_request_pipelined`]).
    committed: Option<Completion>,
    /// Run by the flush thread once the commit is durable, in commit order.
    durable: Completion,
}
type Query = Box<dyn FnOnce(&Connection) + Send>;

/// A [`Store`](crate::Store) in a SQLite file.
pub struct SqliteStore {
    /// The writer's queue; taken when the store is dropped, which ends the writer.
    jobs: Option<mpsc::Sender<Job>>,
    /// The writer thread, which holds the directory's locks until it has closed the database.
    writer: Option<std::thread::JoinHandle<()>>,
    /// Reads go to their own connections (WAL lets them run beside the writer), so they never
    /// wait for a batch's disk flush; they see only committed data.
    queries: Vec<mpsc::Sender<Query>>,
    next_reader: std::sync::atomic::AtomicUsize,
    retention: Retention,
    owner: String,
    heads: Heads,
    /// Sessions and recent streams in memory: the hot reads never reach SQLite.
    mirror: Arc<Mirror>,
    /// How far commits are durable: reads wait for it.
    durability: Arc<Durability>,
    records_id: String,
    /// The order streams end in, for eviction over a session's byte cap: the earliest ended
    /// goes first, as in every store.
    ends: EndOrder,
}

/// Numbers the ends of streams, in the order the writer commits them: a stream's
/// `ended_order`. Streams another process left running, aborted at open, have none, and so
/// count as ended before any this process ends.
#[derive(Debug, Clone)]
struct EndOrder(Arc<std::sync::atomic::AtomicI64>);

impl EndOrder {
    fn starting_after(last: i64) -> EndOrder {
        EndOrder(Arc::new(std::sync::atomic::AtomicI64::new(last)))
    }

    fn next(&self) -> i64 {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
    }
}

impl Drop for SqliteStore {
    /// Waits for the writer to finish what it was given and close the database: only then is
    /// the directory free for another store.
    fn drop(&mut self) {
        drop(self.jobs.take());
        join(self.writer.take(), "writer");
    }
}

/// Waits for one of the store's threads, which ends once its queue's sender is dropped.
fn join(thread: Option<std::thread::JoinHandle<()>>, name: &str) {
    if let Some(thread) = thread
        && thread.join().is_err()
    {
        tracing::error!(thread = name, "a thread of the store panicked");
    }
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").field("owner", &self.owner).finish_non_exhaustive()
    }
}

const SCHEMA: &str = "
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

const LIVE: i64 = 0;
const COMPLETE: i64 = 1;
const ABORTED: i64 = 2;
const TERMINATED: i64 = 1;
const EXPIRED: i64 = 2;
const UPSTREAM_LOST: i64 = 3;
const HISTORY_REWRITTEN: i64 = 4;

/// The columns added to tables after their first release, each added to a database made before
/// it (with the default their rows take): `CREATE TABLE IF NOT EXISTS` leaves an existing table
/// as it is.
const ADDED_COLUMNS: [(&str, &str, &str); 6] = [
    ("events", "tag", "INTEGER NOT NULL DEFAULT 0"),
    ("streams", "before_retained", "INTEGER"),
    ("tombstones", "before_retained", "INTEGER"),
    ("keys", "at", "INTEGER NOT NULL DEFAULT 0"),
    ("tasks", "running_principal", "TEXT"),
    ("streams", "ended_order", "INTEGER"),
];

/// Indexes of [`ADDED_COLUMNS`], made once the columns are there.
const ADDED_INDEXES: &str = "
CREATE INDEX IF NOT EXISTS tasks_running ON tasks (owner, running_principal) WHERE running_principal IS NOT NULL;
CREATE INDEX IF NOT EXISTS streams_end_order ON streams (session, ended_order) WHERE state != 0;
";

/// Adds the [`ADDED_COLUMNS`] a database made before them lacks.
fn add_missing_columns(connection: &Connection) -> Result<(), StoreError> {
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

/// A tag as SQLite keeps it: its 64 bits as a signed integer.
fn tag_column(tag: Tag) -> i64 {
    i64::from_ne_bytes(tag.bits().to_ne_bytes())
}

/// A tag read back from SQLite.
fn tag_of(column: i64) -> Tag {
    Tag::from_bits(u64::from_ne_bytes(column.to_ne_bytes()))
}

/// The time a stream that ends now is stamped with, for its retention: the last sweep's
/// (`NULL` before this process's first sweep, which then stamps it). A macro so that the
/// statements using it stay literals, cached as such.
macro_rules! last_sweep {
    () => {
        "(SELECT CAST(value AS INTEGER) FROM meta WHERE name = 'swept_at')"
    };
}

/// `query_row` on a cached statement: every statement is parsed once per connection.
fn query_row<T, P: rusqlite::Params>(
    connection: &Connection,
    sql: &str,
    params: P,
    f: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    connection.prepare_cached(sql)?.query_row(params, f)
}

/// `execute` on a cached statement.
fn execute<P: rusqlite::Params>(connection: &Connection, sql: &str, params: P) -> rusqlite::Result<usize> {
    connection.prepare_cached(sql)?.execute(params)
}

/// Runs `f` inside a savepoint, so a failing operation undoes only its own writes and the rest
/// of its batch commits. The savepoint statements are cached like the others: a batch runs
/// hundreds of them.
fn in_savepoint<T>(txn: &Connection, f: impl FnOnce(&Connection) -> Result<T, StoreError>) -> Result<T, StoreError> {
    execute(txn, "SAVEPOINT job", []).map_err(backend)?;
    let result = f(txn);
    let ended = match &result {
        Ok(_) => execute(txn, "RELEASE job", []),
        Err(_) => execute(txn, "ROLLBACK TO job", []).and_then(|_| execute(txn, "RELEASE job", [])),
    };
    match (result, ended) {
        (Ok(value), Ok(_)) => Ok(value),
        (Ok(_), Err(err)) => Err(backend(err)),
        (Err(err), _) => Err(err),
    }
}

/// Statements kept parsed per connection: more than the store has.
const STATEMENT_CACHE: usize = 64;

fn backend(err: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(err.to_string())
}

fn as_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn as_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn state_of(code: i64) -> StreamState {
    match code {
        LIVE => StreamState::Live,
        COMPLETE => StreamState::Complete,
        _ => StreamState::Aborted,
    }
}

impl SqliteStore {
    /// Opens (or creates) the store in `dir`. `owner` names this process: requests and
    /// idempotency keys it starts are owned by it.
    ///
    /// Only one process may have a directory open: a second `open` fails while the first holds
    /// it. So whatever another owner left running was left by a process that is gone: its
    /// requests are aborted at open, and its keys are abandoned. No lease is needed.
    pub fn open(dir: &Path, retention: Retention, owner: &str) -> Result<SqliteStore, StoreError> {
        std::fs::create_dir_all(dir).map_err(backend)?;
        let locks = [
            // The directory itself, which no one can delete while it holds the database, and
            // which is the same directory however it is reached (a symlink, a move). Not the
            // database file: closing a descriptor of it would drop SQLite's own locks.
            std::fs::File::open(dir).map_err(backend)?,
            // The file earlier versions lock, so that one of them cannot start beside this one.
            std::fs::File::create(dir.join("tether.lock")).map_err(backend)?,
        ];
        for lock in &locks {
            lock.try_lock().map_err(|err| match err {
                std::fs::TryLockError::WouldBlock => {
                    StoreError::Backend(format!("{} is in use by another process", dir.display()))
                }
                std::fs::TryLockError::Error(err) => backend(err),
            })?;
        }
        let path = dir.join("tether.sqlite3");
        let mut connection = Connection::open(&path).map_err(backend)?;
        connection.execute_batch(SCHEMA).map_err(backend)?;
        add_missing_columns(&connection)?;
        connection.execute_batch(ADDED_INDEXES).map_err(backend)?;
        connection
            .execute(
                "UPDATE streams SET state = ?2 WHERE state = 0 AND request_key IS NOT NULL AND owner != ?1",
                params![owner, ABORTED],
            )
            .map_err(backend)?;
        // The last sweep was another process's, maybe long ago: streams that end before this
        // process's first sweep are stamped by that sweep instead.
        connection.execute("DELETE FROM meta WHERE name = 'swept_at'", []).map_err(backend)?;
        // Counted once, when the file is created or was made before the count was kept.
        connection
            .execute("INSERT OR IGNORE INTO meta (name, value) SELECT 'keys_count', COUNT(*) FROM keys", [])
            .map_err(backend)?;
        connection
            .execute(
                "INSERT OR IGNORE INTO meta (name, value) SELECT 'live_sessions', COUNT(*) FROM sessions WHERE ended IS NULL",
                [],
            )
            .map_err(backend)?;
        // How many keys were ever claimed, and the highest claim retention forgot: what a claim a
        // client was acknowledged is held to (`Acknowledged::regressed`).
        for counted in ["claims", "claims_forgotten"] {
            connection
                .execute("INSERT OR IGNORE INTO meta (name, value) VALUES (?1, 0)", [counted])
                .map_err(backend)?;
        }
        // Named once, when the file is created: the name outlives every restart.
        connection
            .execute("INSERT OR IGNORE INTO meta (name, value) VALUES ('records_id', ?1)", [crate::new_records_id()?])
            .map_err(backend)?;
        let records_id: String = connection
            .query_row("SELECT value FROM meta WHERE name = 'records_id'", [], |r| r.get(0))
            .map_err(backend)?;
        let last_end: Option<i64> =
            connection.query_row("SELECT MAX(ended_order) FROM streams", [], |r| r.get(0)).map_err(backend)?;
        connection.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        let mut queries = Vec::new();
        for _ in 0..READERS {
            let reader = Connection::open(&path).map_err(backend)?;
            reader.busy_timeout(std::time::Duration::from_secs(5)).map_err(backend)?;
            reader.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
            // Reads map the file instead of copying every page out of the OS cache.
            reader.execute_batch("PRAGMA mmap_size = 268435456;").map_err(backend)?;
            let (tx, rx) = mpsc::channel::<Query>();
            std::thread::Builder::new()
                .name("tether-sqlite-read".into())
                .spawn(move || {
                    while let Ok(query) = rx.recv() {
                        query(&reader);
                    }
                })
                .map_err(backend)?;
            queries.push(tx);
        }
        let checkpoints = Checkpoints::start(&mut connection, &path, checkpoint::START_AT)?;
        // The WAL exists once the schema is written, and stays the same file while a connection
        // is open. Its directory entry is flushed once, here.
        let wal = std::fs::File::open(dir.join("tether.sqlite3-wal")).map_err(backend)?;
        locks[0].sync_all().map_err(backend)?;
        let durability = Arc::new(Durability::default());
        let flusher = Flusher::start(wal, Arc::clone(&durability))?;
        let writer_durability = Arc::clone(&durability);
        let (jobs, queue) = mpsc::channel::<Job>();
        // The locks go with the writer: held while the store is open, so at open every request
        // another process left running is known to be abandoned, and until the database is
        // closed.
        let writer = std::thread::Builder::new()
            .name("tether-sqlite".into())
            .spawn(move || {
                writer(&mut connection, &queue, &flusher, &writer_durability, &checkpoints);
                drop(flusher);
                drop(checkpoints);
                drop(connection);
                drop(locks);
            })
            .map_err(backend)?;
        let next_reader = std::sync::atomic::AtomicUsize::new(0);
        Ok(SqliteStore {
            jobs: Some(jobs),
            writer: Some(writer),
            queries,
            next_reader,
            retention,
            owner: owner.to_owned(),
            heads: Heads::default(),
            mirror: Arc::default(),
            durability,
            records_id,
            ends: EndOrder::starting_after(last_end.unwrap_or(0)),
        })
    }

    /// How many idempotency keys were ever claimed in these records: the position the next
    /// claim follows. A directory restored from a backup is behind what its clients were told;
    /// `tether serve` logs it at start, with the records' name.
    pub async fn claims(&self) -> Result<u64, StoreError> {
        self.query(|txn| meta_count(txn, "claims")).await
    }

    /// Runs the read `f` on a reader connection, against the latest committed state; answers
    /// once every commit it could have seen is durable.
    fn query<T, F>(&self, f: F) -> StoreFuture<'static, T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let durability = Arc::clone(&self.durability);
        let seen = Arc::clone(&durability);
        let query: Query = Box::new(move |connection| {
            let result = f(connection);
            let _ = tx.send((result, seen.seen()));
        });
        let reader = self.next_reader.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % self.queries.len().max(1);
        let sent = self.queries.get(reader).map(|queue| queue.send(query));
        Box::pin(async move {
            let stopped = || StoreError::Backend("the store's reader thread stopped".into());
            sent.ok_or_else(stopped)?.map_err(|_| stopped())?;
            let (result, seen) = rx.await.map_err(|_| stopped())?;
            durability.wait(seen).await?;
            result
        })
    }

    /// Runs `f` in the next batch; answers after the batch committed.
    fn run<T, F>(&self, f: F) -> StoreFuture<'static, T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.run_with(f, |_, _| {})
    }

    /// Runs `f` in the next batch; once the batch is durable, and if `f` succeeded, hands its
    /// result to `then` on the flush thread (so mirror updates happen in commit order), then
    /// answers.
    fn run_with<T, F, A>(&self, f: F, then: A) -> StoreFuture<'static, T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
        A: FnOnce(&Mirror, &T) + Send + 'static,
    {
        let (job, rx) = answered_at_flush(f, then, Arc::clone(&self.mirror));
        self.submit(job, rx)
    }

    /// [`SqliteStore::run_with`], answered as soon as the batch is committed, before it is
    /// durable; `then` still runs once it is durable, in commit order.
    fn run_answered_at_commit<T, F, A>(&self, f: F, then: A) -> StoreFuture<'static, T>
    where
        T: Clone + Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
        A: FnOnce(&Mirror, &T) + Send + 'static,
    {
        let (job, rx) = answered_at_commit(f, then, Arc::clone(&self.mirror));
        self.submit(job, rx)
    }

    /// The job that records `request` of a live session ([`begin`]), and what the mirror learns
    /// of it once it is durable.
    fn begin_job(
        &self,
        request: RequestRecord<'_>,
    ) -> (
        impl FnOnce(&Connection) -> Result<Begun, StoreError> + Send + 'static + use<>,
        impl FnOnce(&Mirror, &Begun) + Send + 'static + use<>,
    ) {
        let new = NewRequest {
            session: request.session.as_str().to_owned(),
            epoch: request.epoch.to_string(),
            key: request.key.encode(),
            digest: request.params_digest.to_owned(),
            stream: request.stream.clone(),
        };
        let owner = self.owner.clone();
        let then = opened_by_begin(&new.session, &new.stream);
        (move |txn: &Connection| begin(txn, &owner, &new), then)
    }

    /// Queues `job` for the writer at once, at the call (a pipelined begin relies on it); `rx`
    /// gets its answer.
    fn submit<T: Send + 'static>(&self, job: Job, rx: Answered<T>) -> StoreFuture<'static, T> {
        // Only a store being dropped has no queue.
        let sent = self.jobs.as_ref().is_some_and(|jobs| jobs.send(job).is_ok());
        Box::pin(async move {
            if !sent {
                return Err(StoreError::Backend("the store thread stopped".into()));
            }
            rx.await.unwrap_or_else(|_| Err(StoreError::Backend("the store thread stopped".into())))
        })
    }

    /// Appends `events` in one step, recording the last one as the outcome of the idempotency
    /// key `record` (its owner's) even if the append fails; then the mirror and the followers
    /// learn of it.
    fn append_events(
        &self,
        session: &str,
        epoch: &Epoch,
        stream: &StreamName,
        events: Vec<Bytes>,
        last: bool,
        record: Option<String>,
    ) -> StoreFuture<'_, u64> {
        let (s, e, st) = (session.to_owned(), epoch.to_string(), stream.to_string());
        let (owner, retention, ends) = (self.owner.clone(), self.retention, self.ends.clone());
        let events: Arc<Vec<(Tag, Bytes)>> =
            Arc::new(crate::tags::fresh_n(events.len()).into_iter().zip(events).collect());
        let (session_, stream_, written) = (s.clone(), st.clone(), Arc::clone(&events));
        let then = move |mirror: &Mirror, appended: &Result<Appended, StoreError>| {
            if let Ok(appended) = appended {
                appended.mirror(mirror, &session_, &stream_, &written, last);
            }
        };
        let done = self.run_with(
            move |txn| {
                let ended = last.then(|| ends.next());
                let Some(key) = record else { return Ok(append_in(txn, &s, &e, &st, &events, ended, &retention)) };
                // A failed append undoes only its own writes: the outcome is recorded regardless.
                let appended = in_savepoint(txn, |txn| append_in(txn, &s, &e, &st, &events, ended, &retention));
                finish_in(txn, &owner, &key, events.last().map_or(&[][..], |(_, b)| &b[..]))?;
                Ok(appended)
            },
            then,
        );
        let (session, stream) = (session.to_owned(), stream.clone());
        Box::pin(async move {
            let seq = done.await??.head;
            self.heads.notify(&session, &stream, seq);
            Ok(seq)
        })
    }
}

/// The answer to a job, once it comes.
type Answered<T> = oneshot::Receiver<Result<T, StoreError>>;

/// A job running `f`, answered once its batch is durable; `then` gets its result first, on the
/// flush thread (mirror updates happen in commit order).
fn answered_at_flush<T, F, A>(f: F, then: A, mirror: Arc<Mirror>) -> (Job, Answered<T>)
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    A: FnOnce(&Mirror, &T) + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let job: Job = Box::new(move |txn: &mut Transaction<'_>| {
        let result = in_savepoint(txn, f);
        let durable: Completion = Box::new(move |committed| {
            if let (Ok(()), Ok(value)) = (&committed, &result) {
                then(&mirror, value);
            }
            let _ = tx.send(committed.and(result));
        });
        Completions { committed: None, durable }
    });
    (job, rx)
}

/// A job running `f`, answered as soon as its batch is committed, before it is durable: what
/// the caller writes next is committed, and made durable, after it. `then` still runs once the
/// batch is durable, in commit order.
fn answered_at_commit<T, F, A>(f: F, then: A, mirror: Arc<Mirror>) -> (Job, Answered<T>)
where
    T: Clone + Send + 'static,
    F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    A: FnOnce(&Mirror, &T) + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let job: Job = Box::new(move |txn: &mut Transaction<'_>| {
        let result = in_savepoint(txn, f);
        let answer = result.clone();
        let committed: Completion = Box::new(move |committed| {
            let _ = tx.send(committed.and(answer));
        });
        let durable: Completion = Box::new(move |committed| {
            if let (Ok(()), Ok(value)) = (&committed, &result) {
                then(&mirror, value);
            }
        });
        Completions { committed: Some(committed), durable }
    });
    (job, rx)
}

/// The database thread: batches jobs into transactions (group commit) and hands each commit to
/// the flusher. It never waits for company: a batch is whatever queued up while the previous
/// one was being executed, so a lone writer pays one flush per operation and many writers
/// share each flush.
fn writer(
    connection: &mut Connection,
    queue: &mpsc::Receiver<Job>,
    flusher: &Flusher,
    durability: &Durability,
    checkpoints: &Checkpoints,
) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let mut transaction = match connection.transaction() {
            Ok(transaction) => transaction,
            Err(err) => {
                tracing::error!(%err, "cannot begin a transaction");
                continue;
            }
        };
        let executed: Vec<Completions> = batch.into_iter().map(|job| job(&mut transaction)).collect();
        // After a failed flush nothing more is committed: dropping the transaction rolls it back.
        let (generation, outcome) = match durability.begin_commit() {
            Ok(generation) => (generation, transaction.commit().map_err(backend)),
            Err(poisoned) => {
                drop(transaction);
                (0, Err(poisoned))
            }
        };
        let mut completions = Vec::with_capacity(executed.len());
        for Completions { committed, durable } in executed {
            if let Some(committed) = committed {
                committed(outcome.clone());
            }
            completions.push(durable);
        }
        flusher.send(Committed { generation, outcome, completions });
        checkpoints.after_commit(connection);
    }
}

fn live_epoch(txn: &Connection, session: &str) -> Result<Option<String>, StoreError> {
    query_row(txn, "SELECT epoch FROM sessions WHERE id = ?1 AND ended IS NULL", [session], |r| r.get(0))
        .optional()
        .map_err(backend)
}

fn check_live(txn: &Connection, session: &str, epoch: &str) -> Result<(), StoreError> {
    match live_epoch(txn, session)? {
        Some(current) if current == epoch => Ok(()),
        _ => Err(StoreError::SessionGone),
    }
}

/// Inserts a stream unless it exists; whether it was new.
fn insert_stream(
    txn: &Connection,
    session: &str,
    stream: &StreamName,
    owner: &str,
    key: Option<&str>,
) -> Result<bool, StoreError> {
    let inserted = execute(txn,
        "INSERT OR IGNORE INTO streams (session, stream, head, state, owner, request_key) VALUES (?1, ?2, 0, 0, ?3, ?4)",
        params![session, stream.as_str(), owner, key],
    )
    .map_err(backend)?;
    // An existing stream (a batch's, joined by another of its requests) keeps its events as they
    // are: its priming event may have been evicted long ago.
    if inserted > 0 {
        execute(
            txn,
            "INSERT INTO events (session, stream, seq, data, tag) VALUES (?1, ?2, 0, x'', ?3)",
            params![session, stream.as_str(), tag_column(Tag::priming(stream))],
        )
        .map_err(backend)?;
    }
    Ok(inserted > 0)
}

fn session_bytes(txn: &Connection, session: &str) -> Result<u64, StoreError> {
    query_row(txn, "SELECT bytes FROM sessions WHERE id = ?1", [session], |r| r.get::<_, i64>(0))
        .map(as_u64)
        .map_err(backend)
}

fn add_session_bytes(txn: &Connection, session: &str, delta: i64) -> Result<(), StoreError> {
    execute(txn, "UPDATE sessions SET bytes = bytes + ?2 WHERE id = ?1", params![session, delta]).map_err(backend)?;
    Ok(())
}

/// Deletes the events of `stream` with `seq <= upto` and takes their bytes off the stream,
/// which remembers the last one's tag.
fn delete_events_upto(txn: &Connection, session: &str, stream: &str, upto: i64) -> Result<usize, StoreError> {
    execute(
        txn,
        "UPDATE streams SET before_retained = COALESCE((SELECT tag FROM events \
         WHERE session = ?1 AND stream = ?2 AND seq <= ?3 ORDER BY seq DESC LIMIT 1), before_retained) \
         WHERE session = ?1 AND stream = ?2",
        params![session, stream, upto],
    )
    .map_err(backend)?;
    let freed: i64 = query_row(
        txn,
        "SELECT COALESCE(SUM(LENGTH(data)), 0) FROM events WHERE session = ?1 AND stream = ?2 AND seq <= ?3",
        params![session, stream, upto],
        |r| r.get(0),
    )
    .map_err(backend)?;
    let deleted = execute(
        txn,
        "DELETE FROM events WHERE session = ?1 AND stream = ?2 AND seq <= ?3",
        params![session, stream, upto],
    )
    .map_err(backend)?;
    execute(
        txn,
        "UPDATE streams SET bytes = bytes - ?3 WHERE session = ?1 AND stream = ?2",
        params![session, stream, freed],
    )
    .map_err(backend)?;
    add_session_bytes(txn, session, -freed)?;
    Ok(deleted)
}

/// Deletes every event of the streams matching `condition`; each remembers its last one's tag.
fn drop_events_where<P: rusqlite::Params + Copy>(
    txn: &Connection,
    condition: &str,
    params: P,
) -> Result<(), StoreError> {
    execute(
        txn,
        &format!(
            "UPDATE streams SET before_retained = COALESCE((SELECT tag FROM events e \
             WHERE e.session = streams.session AND e.stream = streams.stream ORDER BY seq DESC LIMIT 1), before_retained) \
             WHERE {condition}"
        ),
        params,
    )
    .map_err(backend)?;
    execute(
        txn,
        &format!(
            "DELETE FROM events WHERE (session, stream) IN (SELECT session, stream FROM streams WHERE {condition})"
        ),
        params,
    )
    .map_err(backend)?;
    Ok(())
}

/// Turns the streams matching `condition` (whose events are already deleted, see
/// [`drop_events_where`]) into tombstones; returns each one's session, name and the bytes it held.
fn bury<P: rusqlite::Params + Copy>(
    txn: &Connection,
    condition: &str,
    params: P,
) -> Result<Vec<(String, String, i64)>, StoreError> {
    execute(
        txn,
        &format!(
            "INSERT OR REPLACE INTO tombstones (session, stream, head, state, request_key, before_retained) \
             SELECT session, stream, head, state, request_key, before_retained FROM streams WHERE {condition}"
        ),
        params,
    )
    .map_err(backend)?;
    let mut dropped = txn
        .prepare_cached(&format!("DELETE FROM streams WHERE {condition} RETURNING session, stream, bytes"))
        .map_err(backend)?;
    let dropped = dropped.query_map(params, |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).map_err(backend)?;
    dropped.collect::<Result<_, _>>().map_err(backend)
}

/// Keeps `stream` and its session within `retention`: ended streams of the session go first,
/// the earliest ended first, then the oldest events of `stream` (never its newest). Byte counts
/// are kept per stream and per session, and ended streams are indexed by their end's order, so
/// this costs a few indexed lookups, not a scan.
fn evict(
    txn: &Connection,
    session: &str,
    stream: &str,
    head: i64,
    retention: &Retention,
) -> Result<Evicted, StoreError> {
    let mut evicted = Evicted::default();
    let max_events = i64::try_from(retention.max_events_per_stream.max(1)).unwrap_or(i64::MAX);
    if head >= max_events {
        evicted.trimmed |= delete_events_upto(txn, session, stream, head - max_events)? > 0;
    }
    let cap = u64::try_from(retention.max_bytes_per_session).unwrap_or(u64::MAX);
    while session_bytes(txn, session)? > cap {
        let ended: Option<String> = query_row(
            txn,
            "SELECT stream FROM streams WHERE session = ?1 AND stream != ?2 AND state != 0 ORDER BY ended_order LIMIT 1",
            params![session, stream],
            |r| r.get(0),
        )
        .optional()
        .map_err(backend)?;
        match ended {
            Some(ended) => {
                let bytes: i64 = query_row(
                    txn,
                    "SELECT bytes FROM streams WHERE session = ?1 AND stream = ?2",
                    params![session, ended],
                    |r| r.get(0),
                )
                .map_err(backend)?;
                drop_events_where(txn, "session = ?1 AND stream = ?2", params![session, ended])?;
                bury(txn, "session = ?1 AND stream = ?2", params![session, ended])?;
                add_session_bytes(txn, session, -bytes)?;
                evicted.dropped.push(ended);
            }
            None => {
                let oldest: Option<i64> = query_row(
                    txn,
                    "SELECT MIN(seq) FROM events WHERE session = ?1 AND stream = ?2",
                    params![session, stream],
                    |r| r.get(0),
                )
                .map_err(backend)?;
                match oldest {
                    Some(oldest) if oldest < head => {
                        evicted.trimmed |= delete_events_upto(txn, session, stream, oldest)? > 0;
                    }
                    _ => break,
                }
            }
        }
    }
    Ok(evicted)
}

/// What retention took while an append kept it.
#[derive(Debug, Default)]
struct Evicted {
    /// The appended stream lost its oldest events.
    trimmed: bool,
    /// Ended streams of the session deleted whole.
    dropped: Vec<String>,
}

/// What an append changed, for the mirror.
#[derive(Debug)]
struct Appended {
    head: u64,
    evicted: Evicted,
}

impl Appended {
    /// Brings the mirror up to date with the append of `events` to `stream`.
    fn mirror(&self, mirror: &Mirror, session: &str, stream: &str, events: &[(Tag, Bytes)], last: bool) {
        if self.evicted.trimmed {
            mirror.forget_stream(session, stream);
        } else {
            mirror.appended(session, stream, self.head, events, last);
        }
        for dropped in &self.evicted.dropped {
            mirror.forget_stream(session, dropped);
        }
    }
}

/// Forgets idempotency records past their time, then the oldest finished ones past the count
/// bound, and the counter additions of forgotten keys.
fn forget_keys(txn: &Connection, now: i64, retention: &Retention) -> Result<(), StoreError> {
    let forget = |condition: &str, arg: i64| -> Result<(), StoreError> {
        execute(
            txn,
            &format!(
                "UPDATE meta SET value = MAX(CAST(value AS INTEGER), \
                 COALESCE((SELECT MAX(at) FROM keys WHERE key IN (SELECT key FROM keys WHERE {condition})), 0)) \
                 WHERE name = 'claims_forgotten'"
            ),
            [arg],
        )
        .map_err(backend)?;
        execute(txn, &format!("DELETE FROM counter_ops WHERE op IN (SELECT key FROM keys WHERE {condition})"), [arg])
            .map_err(backend)?;
        execute(txn, &format!("DELETE FROM keys WHERE key IN (SELECT key FROM keys WHERE {condition})"), [arg])
            .map_err(backend)?;
        Ok(())
    };
    forget("created_ms <= ?1", now - as_i64(retention.idempotency_ms))?;
    let count: i64 =
        query_row(txn, "SELECT CAST(value AS INTEGER) FROM meta WHERE name = 'keys_count'", [], |r| r.get(0))
            .map_err(backend)?;
    let excess = count - i64::try_from(retention.max_idempotency_records).unwrap_or(i64::MAX);
    if excess > 0 {
        forget("outcome IS NOT NULL ORDER BY created_ms LIMIT ?1", excess)?;
    }
    Ok(())
}

/// Reads an idempotency record: its digest and state. A running request is abandoned when its
/// owner is another process than `owner` (one process has the directory: the other is gone).
fn key_record(txn: &Connection, key: &str, owner: &str) -> Result<Option<KeyRecord>, StoreError> {
    type Row = (String, Option<String>, Option<String>, Option<Vec<u8>>, String, i64);
    let row: Option<Row> =
        query_row(txn, "SELECT digest, session, stream, outcome, owner, at FROM keys WHERE key = ?1", [key], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
        })
        .optional()
        .map_err(backend)?;
    let Some((digest, session, stream, outcome, key_owner, at)) = row else { return Ok(None) };
    let state = match outcome {
        Some(outcome) => KeyState::Finished(Bytes::from(outcome)),
        None => {
            let stream = match (session, stream) {
                (Some(session), Some(stream)) => {
                    Some((SessionId::parse(&session).map_err(backend)?, StreamName::parse(&stream).map_err(backend)?))
                }
                _ => None,
            };
            KeyState::Running { stream, abandoned: key_owner != owner }
        }
    };
    Ok(Some(KeyRecord { digest, state, at: as_u64(at) }))
}

/// An idempotency record as read: its params digest, where its request stands, its claim's
/// position.
struct KeyRecord {
    digest: String,
    state: KeyState,
    at: u64,
}

/// A counter kept in `meta`.
fn meta_count(txn: &Connection, name: &str) -> Result<u64, StoreError> {
    query_row(txn, "SELECT CAST(value AS INTEGER) FROM meta WHERE name = ?1", [name], |r| r.get::<_, i64>(0))
        .map(as_u64)
        .map_err(backend)
}

/// The mirror's update after `begin`: a started request has a new stream.
/// A begun request, and whether its stream was opened by it (not joined: a batch's).
type Begun = (BeginRequest, bool);

fn opened_by_begin(session: &str, stream: &StreamName) -> impl FnOnce(&Mirror, &Begun) + Send + 'static + use<> {
    let (session, stream) = (session.to_owned(), stream.clone());
    move |mirror, (_, opened)| {
        if *opened {
            mirror.stream_opened(&session, &stream);
        }
    }
}

/// A request of a live session to record, as the writer takes it.
struct NewRequest {
    session: String,
    epoch: String,
    key: String,
    digest: String,
    stream: StreamName,
}

/// Records a request of a live session with its stream (opening it unless it exists), unless
/// its key is known.
fn begin(txn: &Connection, owner: &str, request: &NewRequest) -> Result<Begun, StoreError> {
    let NewRequest { session, epoch, key, digest, stream } = request;
    let (session, key) = (session.as_str(), key.as_str());
    check_live(txn, session, epoch)?;
    let existing: Option<(String, String)> = query_row(
        txn,
        "SELECT digest, stream FROM requests WHERE session = ?1 AND key = ?2",
        params![session, key],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .optional()
    .map_err(backend)?;
    if let Some((existing_digest, existing_stream)) = existing {
        let stream = StreamName::parse(&existing_stream).map_err(backend)?;
        return Ok((BeginRequest::Existing { stream, same_params: existing_digest == *digest }, false));
    }
    execute(
        txn,
        "INSERT INTO requests (session, key, digest, stream) VALUES (?1, ?2, ?3, ?4)",
        params![session, key, digest, stream.as_str()],
    )
    .map_err(backend)?;
    let opened = insert_stream(txn, session, stream, owner, Some(key))?;
    Ok((BeginRequest::Started, opened))
}

/// Claims an idempotency key for `owner`, unless it is recorded, or the claim the client was
/// acknowledged is no longer held as it was.
fn claim_in(txn: &Connection, owner: &str, records: &str, claim: &KeyClaim) -> Result<Claim, StoreError> {
    let held = key_record(txn, &claim.key, owner)?;
    let claims = meta_count(txn, "claims")?;
    if let Some(acknowledged) = &claim.acknowledged {
        let forgotten = meta_count(txn, "claims_forgotten")?;
        if acknowledged.regressed(records, claims, forgotten, held.as_ref().map(|record| record.at)) {
            return Ok(Claim::Regressed);
        }
    }
    if let Some(KeyRecord { digest, state, at }) = held {
        let acknowledged = Acknowledged { records: records.to_owned(), position: at };
        return Ok(Claim::Existing { same_params: digest == claim.params_digest, state, acknowledged });
    }
    let position = claims + 1;
    execute(txn, "UPDATE meta SET value = ?1 WHERE name = 'claims'", [as_i64(position)]).map_err(backend)?;
    let (session, stream) = claim.columns();
    execute(
        txn,
        "INSERT INTO keys (key, digest, owner, session, stream, created_ms, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![claim.key, claim.params_digest, owner, session, stream, as_i64(claim.now_ms), as_i64(position)],
    )
    .map_err(backend)?;
    Ok(Claim::Claimed(Acknowledged { records: records.to_owned(), position }))
}

/// Appends `events` (each with its tag) to a live stream (ending it after them, `ended` its end's
/// order, if that is given) and keeps retention.
fn append_in(
    txn: &Connection,
    s: &str,
    e: &str,
    st: &str,
    events: &[(Tag, Bytes)],
    ended: Option<i64>,
    retention: &Retention,
) -> Result<Appended, StoreError> {
    check_live(txn, s, e)?;
    let row: Option<(i64, i64)> =
        query_row(txn, "SELECT head, state FROM streams WHERE session = ?1 AND stream = ?2", params![s, st], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()
        .map_err(backend)?;
    let Some((mut head, state)) = row else { return Err(StoreError::UnknownStream) };
    if state != LIVE {
        return Err(StoreError::StreamEnded);
    }
    let mut bytes = 0;
    for (tag, data) in events {
        head += 1;
        execute(
            txn,
            "INSERT INTO events (session, stream, seq, data, tag) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![s, st, head, &data[..], tag_column(*tag)],
        )
        .map_err(backend)?;
        bytes += as_i64(data.len() as u64);
    }
    execute(
        txn,
        concat!(
            "UPDATE streams SET head = ?3, state = ?4, bytes = bytes + ?5, ended_order = ?6, ended_at_ms = CASE WHEN ?4 != 0 THEN ",
            last_sweep!(),
            " END WHERE session = ?1 AND stream = ?2"
        ),
        params![s, st, head, if ended.is_some() { COMPLETE } else { LIVE }, bytes, ended],
    )
    .map_err(backend)?;
    add_session_bytes(txn, s, bytes)?;
    let evicted = evict(txn, s, st, head, retention)?;
    Ok(Appended { head: as_u64(head), evicted })
}

/// What is retained of a stream (or its tombstone), with the tag of the last event dropped.
fn range_in(txn: &Connection, s: &str, st: &str) -> Result<Option<(StreamRange, Option<Tag>)>, StoreError> {
    let row: Option<(i64, i64, Option<i64>, Option<i64>)> = query_row(
        txn,
        "SELECT head, state, (SELECT MIN(seq) FROM events WHERE session = ?1 AND stream = ?2), before_retained \
             FROM streams WHERE session = ?1 AND stream = ?2 \
         UNION ALL SELECT head, state, NULL, before_retained FROM tombstones WHERE session = ?1 AND stream = ?2",
        params![s, st],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )
    .optional()
    .map_err(backend)?;
    Ok(row.map(|(head, state, first, before)| {
        let range = StreamRange {
            retained_from: first.map_or(as_u64(head) + 1, as_u64),
            head: as_u64(head),
            state: state_of(state),
        };
        (range, before.map(tag_of))
    }))
}

/// The tag of the retained event at `seq`.
fn tag_in(txn: &Connection, s: &str, st: &str, seq: u64) -> Result<Option<Tag>, StoreError> {
    query_row(
        txn,
        "SELECT tag FROM events WHERE session = ?1 AND stream = ?2 AND seq = ?3",
        params![s, st, as_i64(seq)],
        |r| r.get(0),
    )
    .optional()
    .map(|tag| tag.map(tag_of))
    .map_err(backend)
}

/// Up to `max` retained events with `seq > after`, in order.
fn events_in(txn: &Connection, s: &str, st: &str, after: u64, max: usize) -> Result<Vec<StoredEvent>, StoreError> {
    let limit = i64::try_from(max).unwrap_or(i64::MAX);
    let mut statement = txn
        .prepare_cached(
            "SELECT seq, data, tag FROM events WHERE session = ?1 AND stream = ?2 AND seq > ?3 ORDER BY seq LIMIT ?4",
        )
        .map_err(backend)?;
    let rows = statement
        .query_map(params![s, st, as_i64(after), limit], |r| {
            Ok(StoredEvent {
                seq: as_u64(r.get(0)?),
                data: Bytes::from(r.get::<_, Vec<u8>>(1)?),
                tag: tag_of(r.get(2)?),
            })
        })
        .map_err(backend)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(backend)
}

/// Records the outcome of `owner`'s running request for `key`.
fn finish_in(txn: &Connection, owner: &str, key: &str, outcome: &[u8]) -> Result<(), StoreError> {
    execute(
        txn,
        "UPDATE keys SET outcome = ?3 WHERE key = ?1 AND owner = ?2 AND outcome IS NULL",
        params![key, owner, outcome],
    )
    .map_err(backend)?;
    Ok(())
}

/// Reads task `id`: abandoned if another process runs it (one process has the directory: the
/// other is gone).
fn task_in(txn: &Connection, id: &str, owner: &str) -> Result<Option<StoredTask>, StoreError> {
    let row: Option<(String, String)> =
        query_row(txn, "SELECT record, owner FROM tasks WHERE id = ?1", [id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
            .map_err(backend)?;
    let Some((record, task_owner)) = row else { return Ok(None) };
    let value: serde_json::Value = serde_json::from_str(&record).map_err(backend)?;
    let record = TaskRecord::from_json(&value).map_err(backend)?;
    Ok(Some(StoredTask { record, abandoned: task_owner != owner }))
}

/// Writes a task's record, owned by `owner`.
fn put_task(txn: &Connection, record: &TaskRecord, owner: &str) -> Result<(), StoreError> {
    execute(
        txn,
        "INSERT INTO tasks (id, owner, record, forget_at_ms, running_principal) VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (id) DO UPDATE SET record = excluded.record, forget_at_ms = excluded.forget_at_ms, \
         running_principal = excluded.running_principal",
        params![
            record.task.id,
            owner,
            record.to_json().to_string(),
            record.forget_at_ms().map(as_i64),
            running_principal(record)
        ],
    )
    .map_err(backend)?;
    Ok(())
}

/// The `running_principal` column of a task: its principal while it runs (`-` for none, `+` and
/// the name for one), NULL once final.
fn running_principal(record: &TaskRecord) -> Option<String> {
    (!record.task.status.is_final()).then(|| principal_column(record.principal.as_deref()))
}

fn principal_column(principal: Option<&str>) -> String {
    principal.map_or_else(|| "-".to_owned(), |name| format!("+{name}"))
}

/// Fails with [`StoreError::TooManyTasks`] if `limits` tasks of this process run already.
fn admit_task(txn: &Connection, owner: &str, principal: Option<&str>, limits: TaskLimits) -> Result<(), StoreError> {
    let over = |count: i64, limit: usize| as_u64(count) >= u64::try_from(limit).unwrap_or(u64::MAX);
    let theirs: i64 = txn
        .query_row(
            "SELECT COUNT(*) FROM tasks WHERE owner = ?1 AND running_principal = ?2",
            params![owner, principal_column(principal)],
            |r| r.get(0),
        )
        .map_err(backend)?;
    if over(theirs, limits.per_principal) {
        return Err(StoreError::TooManyTasks { principal: true });
    }
    let all: i64 = txn
        .query_row(
            "SELECT COUNT(*) FROM tasks WHERE owner = ?1 AND running_principal IS NOT NULL",
            params![owner],
            |r| r.get(0),
        )
        .map_err(backend)?;
    if over(all, limits.total) {
        return Err(StoreError::TooManyTasks { principal: false });
    }
    Ok(())
}

impl TaskStore for SqliteStore {
    fn create_task(&self, record: TaskRecord, key: Option<(String, Bytes)>, limits: TaskLimits) -> StoreFuture<'_, ()> {
        let owner = self.owner.clone();
        self.run(move |txn| {
            admit_task(txn, &owner, record.principal.as_deref(), limits)?;
            put_task(txn, &record, &owner)?;
            match key {
                Some((key, outcome)) => finish_in(txn, &owner, &key, &outcome),
                None => Ok(()),
            }
        })
    }

    fn task(&self, id: &str, _now_ms: u64) -> StoreFuture<'_, Option<StoredTask>> {
        let (id, owner) = (id.to_owned(), self.owner.clone());
        self.query(move |txn| task_in(txn, &id, &owner))
    }

    fn update_task(&self, id: &str, change: TaskChange, now_ms: u64) -> StoreFuture<'_, Option<(StoredTask, bool)>> {
        let (id, owner) = (id.to_owned(), self.owner.clone());
        self.run(move |txn| {
            let Some(mut stored) = task_in(txn, &id, &owner)? else { return Ok(None) };
            let changed = stored.record.apply(change, now_ms);
            if changed {
                // The owner stays: a task another process left is still abandoned.
                execute(
                    txn,
                    "UPDATE tasks SET record = ?2, forget_at_ms = ?3, running_principal = ?4 WHERE id = ?1",
                    params![
                        id,
                        stored.record.to_json().to_string(),
                        stored.record.forget_at_ms().map(as_i64),
                        running_principal(&stored.record)
                    ],
                )
                .map_err(backend)?;
            }
            Ok(Some((stored, changed)))
        })
    }
}

impl SessionStore for SqliteStore {
    fn create_session(&self, record: SessionRecord, max_live: usize) -> StoreFuture<'_, ()> {
        let created = record.clone();
        let then = move |mirror: &Mirror, (): &()| {
            let id = created.id.clone();
            mirror.set_session(id.as_str(), SessionStatus::Live(created));
        };
        self.run_with(move |txn| {
            let live: i64 =
                query_row(txn, "SELECT CAST(value AS INTEGER) FROM meta WHERE name = 'live_sessions'", [], |r| r.get(0))
                    .map_err(backend)?;
            if as_u64(live) >= u64::try_from(max_live).unwrap_or(u64::MAX) {
                return Err(StoreError::TooManySessions);
            }
            let client = record.client.to_string();
            let inserted = execute(txn,
                    "INSERT OR IGNORE INTO sessions (id, epoch, principal, protocol_version, client, idle_ttl_ms, expires_at_ms) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    params![
                        record.id.as_str(),
                        record.epoch.as_str(),
                        record.principal,
                        record.protocol_version.as_str(),
                        client,
                        as_i64(record.idle_ttl_ms),
                        as_i64(record.expires_at_ms)
                    ],
                )
                .map_err(backend)?;
            if inserted == 0 { Err(StoreError::DuplicateSession) } else { Ok(()) }
        }, then)
    }

    fn session(&self, id: &SessionId, _now_ms: u64) -> StoreFuture<'_, SessionStatus> {
        if let Some(status) = self.mirror.session(id.as_str()) {
            return Box::pin(std::future::ready(Ok(status)));
        }
        let generation = self.mirror.session_generation();
        let (key, id) = (id.as_str().to_owned(), id.clone());
        let read = self.query(move |txn| {
            let row = query_row(txn,
                    "SELECT epoch, principal, protocol_version, client, idle_ttl_ms, expires_at_ms, ended FROM sessions WHERE id = ?1",
                    [id.as_str()],
                    |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            r.get::<_, Option<String>>(1)?,
                            r.get::<_, String>(2)?,
                            r.get::<_, String>(3)?,
                            r.get::<_, i64>(4)?,
                            r.get::<_, i64>(5)?,
                            r.get::<_, Option<i64>>(6)?,
                        ))
                    },
                )
                .optional()
                .map_err(backend)?;
            let Some((epoch, principal, version, client, ttl, expires, ended)) = row else {
                return Ok(SessionStatus::Unknown);
            };
            Ok(match ended {
                Some(TERMINATED) => SessionStatus::Ended(SessionEnd::Terminated),
                Some(UPSTREAM_LOST) => SessionStatus::Ended(SessionEnd::UpstreamLost),
                Some(HISTORY_REWRITTEN) => SessionStatus::Ended(SessionEnd::HistoryRewritten),
                Some(_) => SessionStatus::Ended(SessionEnd::Expired),
                None => SessionStatus::Live(SessionRecord {
                    id,
                    epoch: Epoch::parse(&epoch).map_err(backend)?,
                    principal,
                    protocol_version: version.parse::<ProtocolVersion>().map_err(backend)?,
                    client: Arc::new(serde_json::from_str(&client).map_err(backend)?),
                    idle_ttl_ms: as_u64(ttl),
                    expires_at_ms: as_u64(expires),
                }),
            })
        });
        Box::pin(async move {
            let status = read.await?;
            // Unknown ids are not kept: anyone can make up as many as they like.
            if status != SessionStatus::Unknown {
                self.mirror.offer_session(&key, &status, generation);
            }
            Ok(status)
        })
    }

    fn touch_session(&self, id: &SessionId, epoch: &Epoch, now_ms: u64) -> StoreFuture<'_, ()> {
        let (id, epoch) = (id.as_str().to_owned(), epoch.to_string());
        let renewed_id = id.clone();
        let then = move |mirror: &Mirror, (): &()| mirror.touched(&renewed_id, now_ms);
        self.run_with(
            move |txn| {
                let renewed = execute(
                    txn,
                    "UPDATE sessions SET expires_at_ms = ?3 + idle_ttl_ms \
                     WHERE id = ?1 AND epoch = ?2 AND ended IS NULL AND expires_at_ms > ?3",
                    params![id, epoch, as_i64(now_ms)],
                )
                .map_err(backend)?;
                if renewed == 0 { Err(StoreError::SessionGone) } else { Ok(()) }
            },
            then,
        )
    }

    fn end_session(&self, id: &SessionId, epoch: &Epoch, end: SessionEnd) -> StoreFuture<'_, ()> {
        let (session, epoch) = (id.as_str().to_owned(), epoch.to_string());
        let code = match end {
            SessionEnd::Terminated => TERMINATED,
            SessionEnd::Expired => EXPIRED,
            SessionEnd::UpstreamLost => UPSTREAM_LOST,
            SessionEnd::HistoryRewritten => HISTORY_REWRITTEN,
        };
        let id_ = id.as_str().to_owned();
        let then = move |mirror: &Mirror, (): &()| {
            mirror.set_session(&id_, SessionStatus::Ended(end));
            mirror.forget_streams_of(&id_);
        };
        let ended = self.run_with(
            move |txn| {
                check_live(txn, &session, &epoch)?;
                execute(txn, "UPDATE sessions SET ended = ?2 WHERE id = ?1", params![session, code])
                    .map_err(backend)?;
                for table in ["events", "streams", "tombstones", "requests"] {
                    execute(txn, &format!("DELETE FROM {table} WHERE session = ?1"), [&session]).map_err(backend)?;
                }
                Ok(())
            },
            then,
        );
        let session = id.as_str().to_owned();
        Box::pin(async move {
            ended.await?;
            self.heads.forget_session(&session);
            Ok(())
        })
    }

    fn set_standalone_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let (session, epoch, stream) = (session.as_str().to_owned(), epoch.to_string(), stream.to_string());
        self.run(move |txn| {
            check_live(txn, &session, &epoch)?;
            execute(txn, "UPDATE sessions SET standalone = ?2 WHERE id = ?1", params![session, stream])
                .map_err(backend)?;
            Ok(())
        })
    }

    fn standalone_stream(&self, session: &SessionId) -> StoreFuture<'_, Option<StreamName>> {
        let session = session.as_str().to_owned();
        self.query(move |txn| {
            let name: Option<Option<String>> =
                query_row(txn, "SELECT standalone FROM sessions WHERE id = ?1 AND ended IS NULL", [session], |r| {
                    r.get(0)
                })
                .optional()
                .map_err(backend)?;
            name.flatten().map(|n| StreamName::parse(&n).map_err(backend)).transpose()
        })
    }

    fn sweep(&self, now_ms: u64) -> StoreFuture<'_, Vec<SessionId>> {
        let retention = self.retention;
        let swept = self.run_with(move |txn| {
            let now = as_i64(now_ms);
            let mut expired = txn
                .prepare("UPDATE sessions SET ended = 2, ended_at_ms = ?1 WHERE ended IS NULL AND expires_at_ms <= ?1 RETURNING id")
                .map_err(backend)?;
            let expired: Vec<String> =
                expired.query_map([now], |r| r.get(0)).map_err(backend)?.collect::<Result<_, _>>().map_err(backend)?;
            for id in &expired {
                for table in ["events", "streams", "tombstones", "requests"] {
                    execute(txn, &format!("DELETE FROM {table} WHERE session = ?1"), [id]).map_err(backend)?;
                }
            }
            execute(txn, "UPDATE sessions SET ended_at_ms = ?1 WHERE ended IS NOT NULL AND ended_at_ms IS NULL", [now])
                .map_err(backend)?;
            let tombstones = execute(txn, "DELETE FROM sessions WHERE ended IS NOT NULL AND ended_at_ms <= ?1", [now - as_i64(retention.tombstone_ms)])
                .map_err(backend)?;
            execute(txn, "UPDATE streams SET ended_at_ms = ?1 WHERE state != 0 AND ended_at_ms IS NULL", [now]).map_err(backend)?;
            execute(txn, "INSERT INTO meta (name, value) VALUES ('swept_at', ?1) ON CONFLICT (name) DO UPDATE SET value = excluded.value", [now.to_string()]).map_err(backend)?;
            let cutoff = now - as_i64(retention.ended_stream_ms);
            drop_events_where(txn, "state != 0 AND ended_at_ms <= ?1", [cutoff])?;
            let dropped = bury(txn, "state != 0 AND ended_at_ms <= ?1", [cutoff])?;
            let mut freed: HashMap<&str, i64> = HashMap::new();
            for (session, _, bytes) in &dropped {
                *freed.entry(session).or_default() += bytes;
            }
            for (session, bytes) in freed {
                add_session_bytes(txn, session, -bytes)?;
            }
            let deleted: Vec<(String, String)> = dropped.into_iter().map(|(session, stream, _)| (session, stream)).collect();
            forget_keys(txn, now, &retention)?;
            execute(txn, "DELETE FROM tasks WHERE forget_at_ms <= ?1", [now]).map_err(backend)?;
            // Past the bound, the finished tasks due first.
            execute(
                txn,
                "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks WHERE forget_at_ms IS NOT NULL \
                 ORDER BY forget_at_ms DESC LIMIT -1 OFFSET ?1)",
                [as_i64(u64::try_from(retention.max_finished_tasks).unwrap_or(u64::MAX))],
            )
            .map_err(backend)?;
            Ok((expired, deleted, tombstones > 0))
        }, |mirror: &Mirror, (expired, deleted, tombstones): &(Vec<String>, Vec<(String, String)>, bool)| {
            for id in expired {
                mirror.forget_session(id);
            }
            for (session, stream) in deleted {
                mirror.forget_stream(session, stream);
            }
            if *tombstones {
                // Tombstones past their time are gone from the table.
                mirror.forget_ended_sessions();
            }
        });
        Box::pin(async move {
            let (expired, ..) = swept.await?;
            for id in &expired {
                self.heads.forget_session(id);
            }
            // Watches of streams that retention dropped end with the stream.
            for (session, stream) in self.heads.followed() {
                let Ok(id) = SessionId::parse(&session) else { continue };
                if matches!(self.stream_range(&id, &stream).await, Ok(None)) {
                    self.heads.forget(&session, &stream);
                }
            }
            expired.iter().map(|id| SessionId::parse(id).map_err(backend)).collect()
        })
    }
}

impl EventLog for SqliteStore {
    fn open_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let (session, epoch, stream, owner) =
            (session.as_str().to_owned(), epoch.to_string(), stream.clone(), self.owner.clone());
        let (s, st) = (session.clone(), stream.clone());
        let then = move |mirror: &Mirror, inserted: &bool| {
            if *inserted {
                mirror.stream_opened(&s, &st);
            }
        };
        let opened = self.run_with(
            move |txn| {
                check_live(txn, &session, &epoch)?;
                insert_stream(txn, &session, &stream, &owner, None)
            },
            then,
        );
        Box::pin(async move { opened.await.map(drop) })
    }

    fn begin_request(&self, request: RequestRecord<'_>) -> StoreFuture<'_, BeginRequest> {
        let (job, then) = self.begin_job(request);
        // Answered only once durable: a handler must never run for a request whose record a
        // crash could lose, or the same request id sent again would run it twice.
        let begun = self.run_with(job, then);
        Box::pin(async move { begun.await.map(|(begun, _)| begun) })
    }

    fn begin_request_pipelined(&self, request: RequestRecord<'_>) -> Option<StoreFuture<'static, BeginRequest>> {
        let (job, then) = self.begin_job(request);
        // Queued now, and run by the one writer in queue order: every later write comes after
        // it, in its batch or a later one, and the flush thread makes commits durable in
        // commit order, so what the caller writes next is durable only after the record.
        let begun = self.run_answered_at_commit(job, then);
        Some(Box::pin(async move { begun.await.map(|(begun, _)| begun) }))
    }

    fn begin_keyed_request(
        &self,
        request: RequestRecord<'_>,
        claim: KeyClaim,
    ) -> StoreFuture<'_, (BeginRequest, Option<Claim>)> {
        let (begin, then) = self.begin_job(request);
        let (owner, records) = (self.owner.clone(), self.records_id.clone());
        let job = move |txn: &Connection| {
            let begun = begin(txn)?;
            let claimed = match begun.0 {
                BeginRequest::Started => Some(claim_in(txn, &owner, &records, &claim)?),
                BeginRequest::Existing { .. } => None,
            };
            Ok((begun, claimed))
        };
        let begun = self.run_with(job, move |mirror, (begun, _)| then(mirror, begun));
        Box::pin(async move { begun.await.map(|((begun, _), claimed)| (begun, claimed)) })
    }

    fn append_batch(
        &self,
        session: &SessionId,
        epoch: &Epoch,
        stream: &StreamName,
        events: Vec<Bytes>,
        last: bool,
    ) -> StoreFuture<'_, u64> {
        self.append_events(session.as_str(), epoch, stream, events, last, None)
    }

    fn append_final(
        &self,
        session: &SessionId,
        epoch: &Epoch,
        stream: &StreamName,
        events: Vec<Bytes>,
        last: bool,
        key: &str,
    ) -> StoreFuture<'_, u64> {
        self.append_events(session.as_str(), epoch, stream, events, last, Some(key.to_owned()))
    }

    fn end_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let (s, e, st) = (session.as_str().to_owned(), epoch.to_string(), stream.to_string());
        let (session_, stream_) = (s.clone(), st.clone());
        let then = move |mirror: &Mirror, _: &u64| mirror.stream_ended(&session_, &stream_);
        let ends = self.ends.clone();
        let ended = self.run_with(
            move |txn| {
                check_live(txn, &s, &e)?;
                let head: Option<i64> = query_row(
                    txn,
                    "SELECT head FROM streams WHERE session = ?1 AND stream = ?2",
                    params![s, st],
                    |r| r.get(0),
                )
                .optional()
                .map_err(backend)?;
                let head = head.ok_or(StoreError::UnknownStream)?;
                execute(
                    txn,
                    concat!(
                        "UPDATE streams SET state = ?3, ended_order = ?4, ended_at_ms = ",
                        last_sweep!(),
                        " WHERE session = ?1 AND stream = ?2 AND state = 0"
                    ),
                    params![s, st, COMPLETE, ends.next()],
                )
                .map_err(backend)?;
                Ok(as_u64(head))
            },
            then,
        );
        let (session, stream) = (session.as_str().to_owned(), stream.clone());
        Box::pin(async move {
            let head = ended.await?;
            self.heads.notify(&session, &stream, head);
            Ok(())
        })
    }

    fn abort_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let (s, e, st) = (session.as_str().to_owned(), epoch.to_string(), stream.to_string());
        let (session_, stream_) = (s.clone(), st.clone());
        let then = move |mirror: &Mirror, _: &Option<u64>| mirror.forget_stream(&session_, &stream_);
        let ends = self.ends.clone();
        let aborted = self.run_with(
            move |txn| {
                check_live(txn, &s, &e)?;
                query_row(
                    txn,
                    concat!(
                        "UPDATE streams SET state = ?3, ended_order = ?4, ended_at_ms = ",
                        last_sweep!(),
                        " WHERE session = ?1 AND stream = ?2 AND state = 0 RETURNING head"
                    ),
                    params![s, st, ABORTED, ends.next()],
                    |r| r.get::<_, i64>(0),
                )
                .optional()
                .map(|head| head.map(as_u64))
                .map_err(backend)
            },
            then,
        );
        let (session, stream) = (session.as_str().to_owned(), stream.clone());
        Box::pin(async move {
            if let Some(head) = aborted.await? {
                self.heads.notify(&session, &stream, head);
            }
            Ok(())
        })
    }

    fn stream_range(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, Option<StreamRange>> {
        if let Some(range) = self.mirror.stream_range(session.as_str(), stream.as_str()) {
            return Box::pin(std::future::ready(Ok(Some(range))));
        }
        let (s, st) = (session.as_str().to_owned(), stream.to_string());
        self.query(move |txn| Ok(range_in(txn, &s, &st)?.map(|(range, _)| range)))
    }

    fn stream_request(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, Option<RequestKey>> {
        let (s, st) = (session.as_str().to_owned(), stream.to_string());
        self.query(move |txn| {
            query_row(
                txn,
                "SELECT request_key FROM streams WHERE session = ?1 AND stream = ?2 \
                 UNION ALL SELECT request_key FROM tombstones WHERE session = ?1 AND stream = ?2",
                params![s, st],
                |r| r.get::<_, Option<String>>(0),
            )
            .optional()
            .map_err(backend)?
            .flatten()
            .map(|key| RequestKey::parse(&key))
            .transpose()
            .map_err(backend)
        })
    }

    fn read(
        &self,
        session: &SessionId,
        stream: &StreamName,
        after: u64,
        max: usize,
    ) -> StoreFuture<'_, Vec<StoredEvent>> {
        if let Some(page) = self.mirror.read_page(session.as_str(), stream.as_str(), after, max) {
            return Box::pin(std::future::ready(Ok(page.events)));
        }
        let (s, st) = (session.as_str().to_owned(), stream.to_string());
        self.query(move |txn| events_in(txn, &s, &st, after, max))
    }

    fn read_page(
        &self,
        session: &SessionId,
        stream: &StreamName,
        after: u64,
        max: usize,
    ) -> StoreFuture<'_, Option<StreamPage>> {
        if let Some(page) = self.mirror.read_page(session.as_str(), stream.as_str(), after, max) {
            return Box::pin(std::future::ready(Ok(Some(page))));
        }
        let (s, st) = (session.as_str().to_owned(), stream.to_string());
        self.query(move |connection| {
            // One read transaction: the range, the tags and the events of one commit.
            let txn = connection.unchecked_transaction().map_err(backend)?;
            let Some((range, before_retained)) = range_in(&txn, &s, &st)? else { return Ok(None) };
            let at_cursor = if after.checked_add(1) == Some(range.retained_from) {
                before_retained
            } else if (range.retained_from..=range.head).contains(&after) {
                tag_in(&txn, &s, &st, after)?
            } else {
                None
            };
            let events = events_in(&txn, &s, &st, after, max)?;
            Ok(Some(StreamPage { range, at_cursor, before_retained, events }))
        })
    }

    fn watch(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, HeadWatch> {
        let range = self.stream_range(session, stream);
        let key = (session.as_str().to_owned(), stream.clone());
        Box::pin(async move {
            let range = range.await?.ok_or(StoreError::UnknownStream)?;
            Ok(self.heads.subscribe(&key.0, &key.1, range.head))
        })
    }

    fn retained_bytes(&self) -> StoreFuture<'_, Option<u64>> {
        self.query(|txn| {
            query_row(txn, "SELECT COALESCE(SUM(bytes), 0) FROM sessions WHERE ended IS NULL", [], |r| {
                r.get::<_, i64>(0)
            })
            .map(|bytes| Some(as_u64(bytes)))
            .map_err(backend)
        })
    }
}

impl KeyRecords for SqliteStore {
    fn records(&self) -> StoreFuture<'_, String> {
        Box::pin(std::future::ready(Ok(self.records_id.clone())))
    }

    fn claim_key(&self, claim: KeyClaim) -> StoreFuture<'_, Claim> {
        let (owner, records) = (self.owner.clone(), self.records_id.clone());
        self.run(move |txn| claim_in(txn, &owner, &records, &claim))
    }

    fn take_over_key(&self, claim: KeyClaim) -> StoreFuture<'_, bool> {
        let owner = self.owner.clone();
        self.run(move |txn| {
            let abandoned = matches!(
                key_record(txn, &claim.key, &owner)?,
                Some(KeyRecord { digest, state: KeyState::Running { abandoned: true, .. }, .. })
                    if digest == claim.params_digest
            );
            if !abandoned {
                return Ok(false);
            }
            let (session, stream) = claim.columns();
            execute(
                txn,
                "UPDATE keys SET owner = ?2, session = ?3, stream = ?4 WHERE key = ?1",
                params![claim.key, owner, session, stream],
            )
            .map_err(backend)?;
            Ok(true)
        })
    }

    fn key_state(&self, key: &str, _now_ms: u64) -> StoreFuture<'_, Option<KeyState>> {
        let (key, owner) = (key.to_owned(), self.owner.clone());
        self.query(move |txn| Ok(key_record(txn, &key, &owner)?.map(|record| record.state)))
    }

    fn finish_key(&self, key: &str, outcome: Bytes) -> StoreFuture<'_, ()> {
        let (key, owner) = (key.to_owned(), self.owner.clone());
        self.run(move |txn| finish_in(txn, &owner, &key, &outcome))
    }

    fn release_key(&self, key: &str) -> StoreFuture<'_, ()> {
        let (key, owner) = (key.to_owned(), self.owner.clone());
        self.run(move |txn| {
            execute(txn, "DELETE FROM keys WHERE key = ?1 AND owner = ?2 AND outcome IS NULL", params![key, owner])
                .map_err(backend)?;
            Ok(())
        })
    }
}

impl Relay for SqliteStore {
    fn relay_answer(&self, _answer: RelayedAnswer) -> StoreFuture<'_, bool> {
        // One process: the handler is here or nowhere.
        Box::pin(std::future::ready(Ok(false)))
    }

    fn relayed_answers(&self) -> Option<tokio::sync::broadcast::Receiver<RelayedAnswer>> {
        None
    }
}

impl CounterStore for SqliteStore {
    fn counter_add(&self, key: &str, amount: i64, once: Option<&str>) -> StoreFuture<'_, i64> {
        let (key, once) = (key.to_owned(), once.map(str::to_owned));
        self.run(move |txn| {
            if let Some(op) = &once {
                let done: Option<i64> =
                    query_row(txn, "SELECT value FROM counter_ops WHERE op = ?1", [op], |r| r.get(0))
                        .optional()
                        .map_err(backend)?;
                if let Some(value) = done {
                    return Ok(value);
                }
            }
            let value: i64 = query_row(
                txn,
                "INSERT INTO counters (key, value) VALUES (?1, ?2) \
                 ON CONFLICT(key) DO UPDATE SET value = value + excluded.value RETURNING value",
                params![key, amount],
                |r| r.get(0),
            )
            .map_err(backend)?;
            if let Some(op) = &once {
                execute(txn, "INSERT INTO counter_ops (op, value) VALUES (?1, ?2)", params![op, value])
                    .map_err(backend)?;
            }
            Ok(value)
        })
    }

    fn counter_get(&self, key: &str) -> StoreFuture<'_, i64> {
        let key = key.to_owned();
        self.query(move |txn| {
            query_row(txn, "SELECT value FROM counters WHERE key = ?1", [key], |r| r.get(0))
                .optional()
                .map(Option::unwrap_or_default)
                .map_err(backend)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_answered_at_commit_is_answered_before_the_flush_and_one_answered_at_flush_after_it() {
        let dir = std::env::temp_dir().join(format!("tether-answer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let path = dir.join("db");
        let mut connection = Connection::open(&path).expect("a database");
        connection.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (n INTEGER);").expect("a schema");
        let durability = Durability::default();
        // The commit waits at the flusher until the test flushes it.
        let (flusher, handed) = Flusher::holding();
        let checkpoints = Checkpoints::start(&mut connection, &path, checkpoint::START_AT).expect("a checkpointer");
        let mirror = Arc::new(Mirror::default());
        let insert = |n: i64| {
            move |txn: &Connection| execute(txn, "INSERT INTO t (n) VALUES (?1)", [n]).map(|_| n).map_err(backend)
        };
        let (at_commit, mut committed) = answered_at_commit(insert(1), |_, _| {}, Arc::clone(&mirror));
        let (at_flush, mut flushed) = answered_at_flush(insert(2), |_, _| {}, mirror);
        let (jobs, queue) = mpsc::channel::<Job>();
        jobs.send(at_commit).expect("queued");
        jobs.send(at_flush).expect("queued");
        drop(jobs);
        writer(&mut connection, &queue, &flusher, &durability, &checkpoints);
        assert_eq!(committed.try_recv(), Ok(Ok(1)), "not answered at its commit");
        assert!(flushed.try_recv().is_err(), "answered before its commit was flushed");
        let commit = handed.try_recv().expect("the commit was handed to the flusher");
        for completion in commit.completions {
            completion(Ok(()));
        }
        assert_eq!(flushed.try_recv(), Ok(Ok(2)), "not answered once flushed");
        drop((flusher, checkpoints, connection));
        std::fs::remove_dir_all(&dir).expect("removed");
    }
}
