//! Checkpoints beside the writer, so a request never waits for one.
//!
//! A checkpoint copies the pages the WAL holds back into the database file and flushes it:
//! about 8 ms for 10,000 frames on the bench machine. Run inline by the writer (SQLite's
//! autocheckpoint), every request queued meanwhile waited for it: under sustained tool calls
//! that was one call in a hundred, the whole p99. Here a thread of its own copies the bulk on
//! its own connection while the writer goes on committing (WAL lets both run at once). Only
//! the WAL's restart needs the writer: SQLite starts the log over only when a write begins with
//! every frame copied, which a checkpoint running beside a busy writer never sees. So the
//! background thread checkpoints again until what was committed meanwhile is a few hundred
//! frames; the writer copies those itself, and its next transaction starts the log over.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use rusqlite::Connection;

use super::backend;
use crate::StoreError;

/// WAL frames (1 KiB pages) after which a background checkpoint starts. Each checkpoint ends
/// with a flush of the database file, which delays the writer's own flushes queued behind it
/// on the disk: 2,000 frames kept those delays short (p99 4.6 ms against 5.5-6.7 ms with
/// 10,000, the same calls/s, back to back under the tool-call wrk run).
pub(super) const START_AT: u32 = 2_000;

/// Frames not yet copied that the writer copies itself, so that the log starts over: a
/// fraction of a millisecond.
const WRITER_COPIES: u32 = 256;

/// How many times [`START_AT`] the WAL may grow before the writer stops waking the background
/// thread and checkpoints itself after every commit until the log starts over (its checkpoint
/// finds the lock taken while the background one still runs): a bound on the log's size, give
/// or take what one background checkpoint lets through, if that thread cannot keep up.
const WRITER_AT: u32 = 16;

/// The background checkpointer and what the writer knows of it.
pub(super) struct Checkpoints {
    /// Frames after which a background checkpoint starts.
    start_at: u32,
    /// Frames in the WAL after the writer's last commit, as SQLite's WAL hook reports them.
    frames: Arc<AtomicU32>,
    /// Wakes the checkpointer; holds one wake-up at most.
    nudge: Option<mpsc::SyncSender<()>>,
    /// Frames the last background checkpoint left copied (SQLite's count from the log's start).
    copied: Arc<AtomicU32>,
    /// Set by the checkpointer when a checkpoint has finished, cleared by the writer.
    finished: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpoints {
    /// Takes over checkpointing of `writer`'s database at `path`: SQLite's own autocheckpoint
    /// is replaced by the WAL hook, and a thread with its own connection does the copying.
    pub(super) fn start(writer: &mut Connection, path: &Path, start_at: u32) -> Result<Checkpoints, StoreError> {
        let frames = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&frames);
        writer
            .wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages: std::ffi::c_int| {
                counted.store(u32::try_from(pages).unwrap_or(0), Ordering::Relaxed);
                Ok(())
            }))
            .map_err(backend)?;
        let connection = Connection::open(path).map_err(backend)?;
        connection.execute_batch("PRAGMA synchronous = FULL;").map_err(backend)?;
        let (nudge, wakes) = mpsc::sync_channel::<()>(1);
        let copied = Arc::new(AtomicU32::new(0));
        let finished = Arc::new(AtomicBool::new(false));
        let (copied_, finished_) = (Arc::clone(&copied), Arc::clone(&finished));
        let thread = std::thread::Builder::new()
            .name("tether-sqlite-checkpoint".into())
            .spawn(move || {
                while wakes.recv().is_ok() {
                    match passive(&connection) {
                        Ok(Some(done)) => copied_.store(done, Ordering::Relaxed),
                        Ok(None) => {}
                        Err(err) => tracing::warn!(%err, "background checkpoint failed"),
                    }
                    finished_.store(true, Ordering::Release);
                }
            })
            .map_err(backend)?;
        Ok(Checkpoints { start_at, frames, nudge: Some(nudge), copied, finished, thread: Some(thread) })
    }

    /// Called by the writer after each commit, on its connection: starts a background
    /// checkpoint when the WAL has grown and again while one finished far behind; copies the
    /// rest itself once a finished one left little (so the log starts over), or when the WAL
    /// outgrew its bound.
    pub(super) fn after_commit(&self, writer: &Connection) {
        let frames = self.frames.load(Ordering::Relaxed);
        if frames < self.start_at {
            return;
        }
        let finished = self.finished.swap(false, Ordering::Acquire);
        let behind = frames.saturating_sub(self.copied.load(Ordering::Relaxed));
        if (finished && behind <= WRITER_COPIES) || frames >= self.start_at.saturating_mul(WRITER_AT) {
            if let Err(err) = passive(writer) {
                tracing::warn!(%err, "checkpoint failed");
            }
            return;
        }
        if let Some(nudge) = &self.nudge {
            // Full means a wake-up is already pending.
            let _ = nudge.try_send(());
        }
    }
}

impl Drop for Checkpoints {
    /// Stops the checkpointer and waits for it to close its connection.
    fn drop(&mut self) {
        drop(self.nudge.take());
        super::join(self.thread.take(), "checkpoint");
    }
}

/// A passive checkpoint (never waits for a lock): how many of the log's frames are copied now,
/// or `None` if another checkpoint was running.
fn passive(connection: &Connection) -> rusqlite::Result<Option<u32>> {
    connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        let (busy, copied) = (row.get::<_, i64>(0)?, row.get::<_, i64>(2)?);
        Ok((busy == 0).then(|| u32::try_from(copied).unwrap_or(0)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_starts_over_under_writes_that_never_pause() {
        let dir = std::env::temp_dir().join(format!("tether-checkpoint-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let path = dir.join("db");
        let mut writer = Connection::open(&path).expect("a database");
        writer
            .execute_batch(
                "PRAGMA page_size = 1024; PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF; \
                 CREATE TABLE t (n INTEGER PRIMARY KEY, data BLOB NOT NULL);",
            )
            .expect("a schema");
        let start_at = 64;
        let checkpoints = Checkpoints::start(&mut writer, &path, start_at).expect("a checkpointer");
        let (mut largest, mut restarts, mut previous) = (0, 0, 0);
        for n in 0..3_000 {
            writer.execute("INSERT INTO t (n, data) VALUES (?1, zeroblob(600))", [n]).expect("an insert");
            checkpoints.after_commit(&writer);
            let frames = checkpoints.frames.load(Ordering::Relaxed);
            if frames >= start_at {
                // A real writer's commit waits for the disk; without a pause this loop outruns
                // any checkpoint thread on a busy machine, and the bound is not what is tested.
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            if frames < previous {
                restarts += 1;
            }
            (largest, previous) = (largest.max(frames), frames);
        }
        drop(checkpoints);
        // Each insert adds a page or two: without restarts the log would hold thousands. The
        // writer's own bound is not exact: its checkpoint finds the background one busy and
        // tries again after its next commit.
        eprintln!("the log started over {restarts} times; at most {largest} frames");
        assert!(restarts >= 3, "the log started over {restarts} times in 3,000 commits");
        assert!(largest <= 2 * start_at * WRITER_AT, "the log grew to {largest} frames");
        let rows: i64 = writer.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0)).expect("a count");
        assert_eq!(rows, 3_000);
        drop(writer);
        std::fs::remove_dir_all(&dir).expect("removed");
    }
}
