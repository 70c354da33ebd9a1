//! Work run where it is started until it first has to wait, and only then in a task of its
//! own. A request whose every step is ready at once (the memory store's record and writes, a
//! tool that answers without waiting) then costs no task and no hand-off between threads; one
//! that waits finishes in its task whatever happens to the code that started it, as if it had
//! been spawned from the start.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::task::{Context, Poll, Waker};

use tokio::task::JoinHandle;

/// Work started with [`start`].
pub(crate) enum Started<T> {
    /// It finished in its first poll.
    Finished(T),
    /// It had to wait, and goes on in a task of its own.
    Spawned(JoinHandle<T>),
    /// Its first poll panicked: a bug, reported as [`Stopped`], as a panicking task is.
    Panicked,
}

/// Work that ended without its output: it panicked, or its runtime shut down.
#[derive(Debug, thiserror::Error)]
#[error("the work stopped before its end: {0}")]
pub(crate) struct Stopped(String);

/// Polls `work` once here; spawns the rest if it has to wait. The first poll's waker wakes
/// nothing: a future that waits registers the waker of each poll, and the task polls it again
/// at once.
pub(crate) fn start<T: Send + 'static>(work: impl Future<Output = T> + Send + 'static) -> Started<T> {
    let mut work = Box::pin(work);
    let mut cx = Context::from_waker(Waker::noop());
    match catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(&mut cx))) {
        Ok(Poll::Ready(output)) => Started::Finished(output),
        Ok(Poll::Pending) => Started::Spawned(tokio::spawn(work)),
        Err(_) => Started::Panicked,
    }
}

impl<T> Started<T> {
    /// Waits for the work's end: its output, or why it has none.
    pub(crate) async fn join(self) -> Result<T, Stopped> {
        match self {
            Started::Finished(output) => Ok(output),
            Started::Spawned(task) => task.await.map_err(|e| Stopped(e.to_string())),
            Started::Panicked => Err(Stopped("it panicked".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_ready_at_once_runs_here_and_work_that_waits_goes_on_alone() {
        let here = std::thread::current().id();
        let Started::Finished(thread) = start(async { std::thread::current().id() }) else {
            panic!("work with nothing to wait for was spawned")
        };
        assert_eq!(thread, here);

        let (tx, rx) = tokio::sync::oneshot::channel();
        let (done_tx, done) = tokio::sync::oneshot::channel();
        let started = start(async move {
            let value = rx.await.expect("sent");
            let _ = done_tx.send(value);
            value
        });
        assert!(matches!(started, Started::Spawned(_)), "work that waits was not spawned");
        drop(started);
        tx.send(7).expect("the work waits");
        assert_eq!(done.await.expect("the work went on after its starter let go"), 7);
    }

    #[tokio::test]
    async fn a_panic_in_the_first_poll_is_reported_not_unwound() {
        let started = start(async { panic!("a bug") });
        assert!(started.join().await.is_err());
    }
}
