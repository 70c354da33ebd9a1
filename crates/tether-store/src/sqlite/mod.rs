//! The embedded durable store: SQLite in WAL mode on one writer thread with group commit.
//!
//! Every write runs on the database thread inside a transaction shared with whatever else
//! queued up meanwhile; callers are answered only after that transaction is on disk (the flush
//! thread, `flush.rs`, flushes the WAL while the writer goes on with the next batch).
//! Reads run on their own connections and return only once what they could have seen is on
//! disk. So an event is durable before any connection can read it, and a crash loses nothing
//! that was acknowledged. Checkpoints run beside the writer (`checkpoint.rs`).
//!
//! This file holds the store and its threads; each trait it implements has a file of its own
//! (`sessions.rs`, `events.rs`, `keys.rs`, `tasks.rs`, `counters.rs`), and `schema.rs` holds the
//! tables.

mod checkpoint;
mod counters;
mod events;
mod flush;
mod keys;
mod log;
mod mirror;
mod schema;
mod sessions;
mod tasks;

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
use self::log::{Log, abort_abandoned};
use self::mirror::Mirror;
use self::{events::*, keys::*, schema::*};
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
use tether_core::tasks::{TaskChange, TaskId, TaskRecord};

/// Most operations committed in one transaction.
const MAX_BATCH: usize = 512;

/// Connections that only read, each on its own thread.
const READERS: usize = 2;

type Completion = Box<dyn FnOnce(Result<(), StoreError>) + Send>;
type Job = Box<dyn FnOnce(&mut Transaction<'_>, &mut Log) -> Completions + Send>;

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
    owner: Arc<str>,
    heads: Heads,
    /// Sessions, and the live sessions' streams as durable, in memory: reads never wait for the
    /// writer.
    mirror: Arc<Mirror>,
    /// How far commits are durable: reads wait for it.
    durability: Arc<Durability>,
    records_id: String,
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

/// A tag as SQLite keeps it: its 64 bits as a signed integer.
fn tag_column(tag: Tag) -> i64 {
    i64::from_ne_bytes(tag.bits().to_ne_bytes())
}

/// A tag read back from SQLite.
fn tag_of(column: i64) -> Tag {
    Tag::from_bits(u64::from_ne_bytes(column.to_ne_bytes()))
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

/// [`in_savepoint`] for a job that changes the writer's [`Log`]: if it fails after changing it,
/// the log is marked for a rebuild from the file.
fn in_logged_savepoint<T>(
    txn: &Connection,
    log: &mut Log,
    f: impl FnOnce(&Connection, &mut Log) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let applied = log.applied();
    let result = in_savepoint(txn, |txn| f(txn, log));
    if result.is_err() && log.applied() != applied {
        log.mark_dirty();
    }
    result
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

/// A stream's state as its column holds it.
fn state_of(code: i64) -> StreamState {
    match code {
        LIVE => StreamState::Live,
        COMPLETE => StreamState::Complete,
        _ => StreamState::Aborted,
    }
}

/// The column's code of a stream's state: [`state_of`]'s inverse.
fn state_code(state: StreamState) -> i64 {
    match state {
        StreamState::Live => LIVE,
        StreamState::Complete => COMPLETE,
        StreamState::Aborted => ABORTED,
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
        move_tables_into_log(&mut connection)?;
        connection.execute_batch(ADDED_INDEXES).map_err(backend)?;
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
        let loaded = Log::load(&connection)?;
        let log = abort_abandoned(&mut connection, loaded, owner)?;
        let mirror = Arc::new(Mirror::starting_from(log.clone().for_readers()));
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
                writer(&mut connection, log, &queue, &flusher, &writer_durability, &checkpoints);
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
            owner: Arc::from(owner),
            heads: Heads::default(),
            mirror,
            durability,
            records_id,
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
        self.run_logged(move |txn, _| f(txn), then)
    }

    /// [`SqliteStore::run_with`] for a job that reads or changes the writer's [`Log`].
    fn run_logged<T, F, A>(&self, f: F, then: A) -> StoreFuture<'static, T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &mut Log) -> Result<T, StoreError> + Send + 'static,
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
        F: FnOnce(&Connection, &mut Log) -> Result<T, StoreError> + Send + 'static,
        A: FnOnce(&Mirror, &T) + Send + 'static,
    {
        let (job, rx) = answered_at_commit(f, then, Arc::clone(&self.mirror));
        self.submit(job, rx)
    }

    /// The job that records `request` of a live session ([`begin`]); the mirror learns of it
    /// through [`mirror_begun`].
    fn begin_job(
        &self,
        request: RequestRecord<'_>,
    ) -> impl FnOnce(&Connection, &mut Log) -> Result<Begun, StoreError> + Send + 'static + use<> {
        let new = NewRequest {
            session: request.session.as_str().to_owned(),
            epoch: request.epoch.to_string(),
            key: request.key.encode(),
            digest: request.params_digest.to_owned(),
            stream: request.stream.clone(),
        };
        let owner = self.owner.clone();
        move |txn: &Connection, log: &mut Log| begin(txn, log, &owner, &new)
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
        let (owner, retention) = (self.owner.clone(), self.retention);
        let events: Vec<(Tag, Bytes)> = crate::tags::fresh_n(events.len()).into_iter().zip(events).collect();
        let then = move |mirror: &Mirror, appended: &Result<Appended, StoreError>| {
            if let Ok(appended) = appended {
                mirror.apply(&appended.changes);
                mirror.cache(appended.rows.iter().cloned());
            }
        };
        let done = self.run_logged(
            move |txn, log| {
                let append =
                    |txn: &Connection, log: &mut Log| append_in(txn, log, &s, &e, &st, &events, last, &retention);
                // Without a key, a failed append fails its job, whose savepoint undoes it. With one,
                // it undoes only its own writes: the outcome is recorded regardless.
                let Some(key) = record else { return append(txn, log).map(Ok) };
                let appended = in_logged_savepoint(txn, log, append);
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
    F: FnOnce(&Connection, &mut Log) -> Result<T, StoreError> + Send + 'static,
    A: FnOnce(&Mirror, &T) + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let job: Job = Box::new(move |txn: &mut Transaction<'_>, log: &mut Log| {
        let result = in_logged_savepoint(txn, log, f);
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
    F: FnOnce(&Connection, &mut Log) -> Result<T, StoreError> + Send + 'static,
    A: FnOnce(&Mirror, &T) + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let job: Job = Box::new(move |txn: &mut Transaction<'_>, log: &mut Log| {
        let result = in_logged_savepoint(txn, log, f);
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
    mut log: Log,
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
        let executed: Vec<Completions> = batch.into_iter().map(|job| job(&mut transaction, &mut log)).collect();
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
        // The log changed with rows that are not in the file: it is rebuilt from the file.
        let rebuild = outcome.is_err() || log.dirty();
        flusher.send(Committed { generation, outcome, completions });
        if rebuild {
            match Log::load(connection) {
                Ok(loaded) => log = loaded.swept_as(&log),
                Err(err) => tracing::error!(%err, "cannot rebuild the store's state from its file"),
            }
        }
        checkpoints.after_commit(connection);
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
            move |txn: &Connection, _: &mut Log| {
                execute(txn, "INSERT INTO t (n) VALUES (?1)", [n]).map(|_| n).map_err(backend)
            }
        };
        let (at_commit, mut committed) = answered_at_commit(insert(1), |_, _| {}, Arc::clone(&mirror));
        let (at_flush, mut flushed) = answered_at_flush(insert(2), |_, _| {}, mirror);
        let (jobs, queue) = mpsc::channel::<Job>();
        jobs.send(at_commit).expect("queued");
        jobs.send(at_flush).expect("queued");
        drop(jobs);
        writer(&mut connection, Log::default(), &queue, &flusher, &durability, &checkpoints);
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

    #[test]
    fn a_job_that_fails_after_changing_the_log_leaves_it_to_be_rebuilt_from_the_file() {
        let dir = std::env::temp_dir().join(format!("tether-dirty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let mut connection = Connection::open(dir.join("db")).expect("a database");
        connection.execute_batch(SCHEMA).expect("the schema");
        connection
            .execute_batch(
                "INSERT INTO sessions (id, epoch, protocol_version, client, idle_ttl_ms, expires_at_ms) \
                 VALUES ('s', 'e', '2025-06-18', '{}', 1, 1)",
            )
            .expect("a session");
        let mut log = Log::load(&connection).expect("loaded");
        let stream = StreamName::parse("r1").expect("a stream name");
        let open = |fails: bool| {
            let stream = stream.clone();
            move |txn: &Connection, log: &mut Log| {
                let row = log::Row { detail: Some("me"), ..log::Row::of(log::OPENED, "s", "r1") }.insert(txn)?;
                let opened =
                    log::Change::Opened { session: "s".into(), stream, row, owner: "me".into(), request_key: None };
                log.apply(&opened);
                if fails { Err(StoreError::Backend("fails once it changed the log".into())) } else { Ok(()) }
            }
        };
        let txn = connection.transaction().expect("a transaction");
        assert!(in_logged_savepoint(&txn, &mut log, open(true)).is_err());
        assert!(log.dirty(), "a failed job's change to the log is not taken back: it must be rebuilt");
        txn.commit().expect("committed");
        assert!(Log::load(&connection).expect("loaded").stream("s", "r1").is_none(), "the failed job's row stayed");
        let mut log = Log::load(&connection).expect("loaded");
        let txn = connection.transaction().expect("a transaction");
        assert!(in_logged_savepoint(&txn, &mut log, open(false)).is_ok());
        assert!(!log.dirty());
        txn.commit().expect("committed");
        assert!(Log::load(&connection).expect("loaded").stream("s", "r1").is_some());
        drop(connection);
        std::fs::remove_dir_all(&dir).expect("removed");
    }
}
