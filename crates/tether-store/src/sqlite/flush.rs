//! Durability after the commit, on a thread of its own, so the writer never waits for the disk.
//!
//! The writer commits with `synchronous = NORMAL`: its frames reach the WAL file but not the
//! disk. This thread then flushes the WAL (`fdatasync`, one per batch or fewer: whatever
//! committed meanwhile shares it) and only then answers the batch's callers, so nothing is
//! acknowledged before it is durable, as with `synchronous = FULL`. The writer meanwhile
//! executes the next batch: the flush of one batch and the work of the next overlap.
//!
//! What a commit makes visible is visible to the reader connections before it is durable. So
//! every read waits, after it ran, until every commit it could have seen is flushed
//! ([`Durability::wait`]): no connection is told of anything a crash could take back.
//!
//! A failed flush poisons the store: the kernel may have dropped the pages it could not write,
//! so nothing committed after it could be promised either. Every later write is rolled back and
//! every caller, reader or writer, is told; only a restart (which recovers what the disk holds)
//! serves again.

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use tokio::sync::watch;

use super::Completion;
use crate::StoreError;

/// How far commits are known durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flushed {
    /// Every commit up to this generation is on disk.
    Through(u64),
    /// A flush failed: nothing is promised any more.
    Failed,
}

/// The count of commits and of those durable, shared by the writer, the flusher and the readers.
#[derive(Debug)]
pub(super) struct Durability {
    /// The generation of the latest commit begun: raised before the commit makes it visible.
    committing: AtomicU64,
    flushed: watch::Sender<Flushed>,
}

impl Default for Durability {
    fn default() -> Durability {
        Durability { committing: AtomicU64::new(0), flushed: watch::Sender::new(Flushed::Through(0)) }
    }
}

fn poisoned() -> StoreError {
    StoreError::Backend("a flush of the database to disk failed earlier; restart to recover what it holds".into())
}

impl Durability {
    /// The writer, before it commits: the generation of that commit, or the poison.
    pub(super) fn begin_commit(&self) -> Result<u64, StoreError> {
        if *self.flushed.borrow() == Flushed::Failed {
            return Err(poisoned());
        }
        Ok(self.committing.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// A reader, after its read: the generation every commit it could have seen is within.
    pub(super) fn seen(&self) -> u64 {
        self.committing.load(Ordering::SeqCst)
    }

    /// Waits until the commits up to `generation` are durable.
    pub(super) async fn wait(&self, generation: u64) -> Result<(), StoreError> {
        let durable = |flushed: &Flushed| matches!(flushed, Flushed::Through(done) if *done >= generation);
        if durable(&self.flushed.borrow()) {
            return Ok(());
        }
        let mut flushed = self.flushed.subscribe();
        match flushed.wait_for(|f| durable(f) || *f == Flushed::Failed).await.map(|f| *f) {
            Ok(Flushed::Through(_)) => Ok(()),
            Ok(Flushed::Failed) | Err(_) => Err(poisoned()),
        }
    }
}

/// A commit on its way to the disk, with the callers to answer once it is there.
pub(super) struct Committed {
    /// Its generation, from [`Durability::begin_commit`].
    pub(super) generation: u64,
    /// How the commit itself went.
    pub(super) outcome: Result<(), StoreError>,
    pub(super) completions: Vec<Completion>,
}

/// The flushing thread.
pub(super) struct Flusher {
    commits: Option<mpsc::Sender<Committed>>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    /// Starts flushing `wal` (the WAL file, opened by the store) for commits sent to it.
    pub(super) fn start(wal: File, durability: Arc<Durability>) -> Result<Flusher, StoreError> {
        let (commits, queue) = mpsc::channel::<Committed>();
        let thread = std::thread::Builder::new()
            .name("tether-sqlite-flush".into())
            .spawn(move || flush(&wal, &queue, &durability))
            .map_err(super::backend)?;
        Ok(Flusher { commits: Some(commits), thread: Some(thread) })
    }

    /// Hands a commit over: its callers are answered once it is durable.
    pub(super) fn send(&self, committed: Committed) {
        let Some(commits) = &self.commits else { return };
        if let Err(mpsc::SendError(committed)) = commits.send(committed) {
            // The thread is gone (it panicked, and poisoned the store as it went).
            for completion in committed.completions {
                completion(Err(poisoned()));
            }
        }
    }
}

#[cfg(test)]
impl Flusher {
    /// A flusher that flushes nothing: what it is handed waits in the receiver, for a test to
    /// answer when it chooses.
    pub(super) fn holding() -> (Flusher, mpsc::Receiver<Committed>) {
        let (commits, queue) = mpsc::channel();
        (Flusher { commits: Some(commits), thread: None }, queue)
    }
}

impl Drop for Flusher {
    /// Flushes what was handed over and answers its callers before the store closes.
    fn drop(&mut self) {
        drop(self.commits.take());
        super::join(self.thread.take(), "flush");
    }
}

/// Poisons the store if the flush thread unwinds (a completion panicked): reads waiting for a
/// flush are told at once instead of waiting for ever.
struct PoisonOnPanic<'a>(&'a Durability);

impl Drop for PoisonOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.flushed.send_replace(Flushed::Failed);
        }
    }
}

fn flush(wal: &File, queue: &mpsc::Receiver<Committed>, durability: &Durability) {
    let _poison = PoisonOnPanic(durability);
    while let Ok(first) = queue.recv() {
        let mut commits = vec![first];
        commits.extend(queue.try_iter());
        let flushed = match *durability.flushed.borrow() {
            Flushed::Failed => Err(poisoned()),
            Flushed::Through(_) => wal.sync_data().map_err(|err| {
                tracing::error!(%err, "flushing the database to disk failed: the store stops accepting writes");
                StoreError::Backend(format!("flushing the database to disk failed: {err}"))
            }),
        };
        let last = commits.iter().map(|c| c.generation).max().unwrap_or(0);
        durability.flushed.send_replace(match flushed {
            Ok(()) => Flushed::Through(last),
            Err(_) => Flushed::Failed,
        });
        for commit in commits {
            let outcome = commit.outcome.and(flushed.clone());
            for completion in commit.completions {
                completion(outcome.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorder() -> (Completion, mpsc::Receiver<Result<(), StoreError>>) {
        let (tx, rx) = mpsc::channel();
        (Box::new(move |outcome| drop(tx.send(outcome))), rx)
    }

    /// A flusher of a real file (unlinked at once: the open file stays).
    fn flushing_a_file(name: &str) -> (Arc<Durability>, Flusher) {
        let path = std::env::temp_dir().join(format!("tether-flush-{name}-{}", std::process::id()));
        let wal = File::create(&path).expect("a file");
        std::fs::remove_file(&path).expect("removed");
        let durability = Arc::new(Durability::default());
        let flusher = Flusher::start(wal, Arc::clone(&durability)).expect("a flusher");
        (durability, flusher)
    }

    #[test]
    fn a_read_waits_for_the_flush_of_every_commit_it_could_have_seen() {
        use futures_util::FutureExt;
        let durability = Durability::default();
        let first = durability.begin_commit().expect("not poisoned");
        let second = durability.begin_commit().expect("not poisoned");
        assert_eq!(durability.seen(), second);
        assert!(durability.wait(first).now_or_never().is_none(), "released before any flush");
        durability.flushed.send_replace(Flushed::Through(first));
        assert!(matches!(durability.wait(first).now_or_never(), Some(Ok(()))));
        assert!(durability.wait(second).now_or_never().is_none(), "released before its commit's flush");
        durability.flushed.send_replace(Flushed::Through(second));
        assert!(matches!(durability.wait(second).now_or_never(), Some(Ok(()))));
    }

    #[test]
    fn callers_are_answered_once_their_commit_is_flushed() {
        let (durability, flusher) = flushing_a_file("answered");
        let generation = durability.begin_commit().expect("not poisoned");
        assert_eq!(durability.seen(), generation);
        // The caller learns, with its answer, how far the flush mark stood when it was answered.
        let (tx, answered) = mpsc::channel();
        let mark = Arc::clone(&durability);
        let completion: Completion = Box::new(move |outcome| drop(tx.send((outcome, *mark.flushed.borrow()))));
        flusher.send(Committed { generation, outcome: Ok(()), completions: vec![completion] });
        let (answer, flushed) = answered.recv_timeout(std::time::Duration::from_secs(10)).expect("an answer");
        assert!(answer.is_ok(), "{answer:?}");
        assert_eq!(flushed, Flushed::Through(generation), "a caller was answered before its commit was marked flushed");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
        runtime.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(10), durability.wait(generation))
                .await
                .expect("the read is released")
                .expect("durable");
        });
    }

    #[test]
    fn a_dead_flush_thread_releases_the_reads_waiting_for_it() {
        let (durability, flusher) = flushing_a_file("dead");
        let generation = durability.begin_commit().expect("not poisoned");
        let later = durability.begin_commit().expect("not poisoned");
        let completion: Completion = Box::new(|_| panic!("a completion panicked"));
        flusher.send(Committed { generation, outcome: Ok(()), completions: vec![completion] });
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
        let read = runtime
            .block_on(async { tokio::time::timeout(std::time::Duration::from_secs(10), durability.wait(later)).await });
        assert!(matches!(read, Ok(Err(_))), "a read kept waiting for a flush thread that died: {read:?}");
        assert!(durability.begin_commit().is_err(), "a commit began after the flush thread died");
    }

    #[test]
    fn a_failed_flush_fails_its_callers_every_later_commit_and_every_read() {
        // fdatasync of a pipe fails (EINVAL): a real failing flush.
        let (_reader, writer) = std::io::pipe().expect("a pipe");
        let wal = File::from(std::os::fd::OwnedFd::from(writer));
        let durability = Arc::new(Durability::default());
        let flusher = Flusher::start(wal, Arc::clone(&durability)).expect("a flusher");
        let generation = durability.begin_commit().expect("not poisoned yet");
        let (completion, answered) = recorder();
        flusher.send(Committed { generation, outcome: Ok(()), completions: vec![completion] });
        let answer = answered.recv_timeout(std::time::Duration::from_secs(10)).expect("an answer");
        assert!(answer.is_err(), "a caller was told its write is durable after the flush failed");
        assert!(durability.begin_commit().is_err(), "a commit began after a failed flush");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
        let read = runtime.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(10), durability.wait(generation)).await
        });
        assert!(matches!(read, Ok(Err(_))), "a read was released after a failed flush: {read:?}");
    }
}
