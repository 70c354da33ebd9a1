//! Where a request's output goes. A session's request writes to its stream in the store; a
//! 2026-07-28 request writes straight to its one connection. Both are a [`Sink`] with the same
//! operations, so a request's [`Context`](super::context::Context) never asks which era it
//! serves, only what its sink can do.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::StatusCode;
use tether_core::lineage::StreamName;
use tether_store::Store;
use tokio::sync::{mpsc, oneshot};

use super::context::ContextError;
use crate::session::{LogLevel, SessionRuntime};

/// How the first output of a request looked, which decides JSON or SSE for its response.
#[derive(Debug)]
pub(crate) enum FirstOutput {
    /// The result came before anything else: answer with JSON.
    Final(Answer),
    /// Something came before the result: answer with SSE.
    Event,
}

/// A request's response, serialized, and the HTTP status a 2026-07-28 connection answers it
/// with (a session's POST answers every response 200, and ignores it).
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    /// The JSON-RPC response.
    pub bytes: Bytes,
    /// See [`Refusal::stateless_status`](crate::refusal::Refusal::stateless_status).
    pub status: StatusCode,
}

/// What a message sent is to its request: the response ends it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Part<'a> {
    /// A notification or a request to the client.
    Event,
    /// The final response, recorded as the outcome of the idempotency key `record` where the
    /// output is stored, answered with `status` where it is direct.
    Response { record: Option<&'a str>, status: StatusCode },
}

/// Tells the POST how its response starts, once: whoever sends first decides.
#[derive(Clone)]
pub(crate) struct First(Arc<Mutex<Option<oneshot::Sender<FirstOutput>>>>);

impl First {
    /// A new signal, and the receiver the POST waits on.
    pub(crate) fn new() -> (First, oneshot::Receiver<FirstOutput>) {
        let (tx, rx) = oneshot::channel();
        (First(Arc::new(Mutex::new(Some(tx)))), rx)
    }

    /// The sender, if nobody used it yet.
    fn take(&self) -> Option<oneshot::Sender<FirstOutput>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take()
    }

    /// Sends the first output's kind, if nobody has yet.
    pub(crate) fn signal(&self, kind: impl FnOnce() -> FirstOutput) {
        if let Some(tx) = self.take() {
            // The POST may have gone away; the output is in the store either way.
            let _ = tx.send(kind());
        }
    }
}

/// Where a request's messages go, as the code that starts the request names it.
pub(crate) enum Output {
    /// A session's request: into the store, durable before any client sees it. `ends_stream`:
    /// the stream is the request's own and ends with its response; a batch's requests share
    /// one, which the batch ends once all of them did.
    Stored { store: Arc<dyn Store>, runtime: Arc<SessionRuntime>, stream: StreamName, ends_stream: bool },
    /// A 2026-07-28 request: straight to the one connection, which is the request's whole life.
    Direct { tx: mpsc::Sender<(Bytes, bool)> },
}

/// An [`Output`] opened for one request.
pub(crate) enum Sink {
    /// See [`Output::Stored`].
    Stored(StoredSink),
    /// See [`Output::Direct`].
    Direct(DirectSink),
}

impl Sink {
    /// Opens `output`; a stored one starts the request's writer, which signals `first`.
    pub(crate) fn open(output: Output, first: &First) -> Sink {
        match output {
            Output::Stored { store, runtime, stream, ends_stream } => {
                let failure = Arc::default();
                let writer = Writer {
                    store: Arc::clone(&store),
                    runtime: Arc::clone(&runtime),
                    stream: stream.clone(),
                    ends_stream,
                    failure: Arc::clone(&failure),
                    first: first.clone(),
                };
                let writes = if store.appends_at_once() {
                    Writes::Here(tokio::sync::Mutex::new(writer))
                } else {
                    let (writes, queue) = mpsc::channel(WRITE_QUEUE);
                    tokio::spawn(writer.run(queue));
                    Writes::Queued(writes)
                };
                Sink::Stored(StoredSink { store, runtime, stream, writes, failure })
            }
            Output::Direct { tx } => Sink::Direct(DirectSink { tx }),
        }
    }

    /// The session the output belongs to, if it has one.
    pub(crate) fn session(&self) -> Option<&Arc<SessionRuntime>> {
        match self {
            Sink::Stored(sink) => Some(&sink.runtime),
            Sink::Direct(_) => None,
        }
    }

    /// The session stream the output is written to, if it is stored.
    pub(crate) fn stream(&self) -> Option<&StreamName> {
        match self {
            Sink::Stored(sink) => Some(&sink.stream),
            Sink::Direct(_) => None,
        }
    }

    /// The least severe log level that is sent: the session's, or what the request `asked` for.
    pub(crate) fn log_threshold(&self, asked: Option<LogLevel>) -> Option<LogLevel> {
        match self {
            Sink::Stored(sink) => Some(sink.runtime.log_level()),
            Sink::Direct(_) => asked,
        }
    }

    /// Sends `bytes`, which are `part` of the request's output.
    pub(crate) async fn send(&self, bytes: Bytes, part: Part<'_>, first: &First) -> Result<(), ContextError> {
        match (self, part) {
            // The writer tells the POST how the response starts.
            (Sink::Stored(sink), Part::Response { record, .. }) => {
                sink.write(Some(bytes), true, record.map(str::to_owned)).await
            }
            (Sink::Stored(sink), Part::Event) => {
                sink.queue(Write { bytes: Some(bytes), last: false, record: None, done: None }).await
            }
            (Sink::Direct(sink), part) => sink.send(bytes, part, first).await,
        }
    }

    /// Answers the request with `response` at once, ahead of the handler's end: a request
    /// that became a task. Only a direct output has a request to answer so.
    pub(crate) async fn answer_now(&self, response: Bytes, first: &First) {
        if let Sink::Direct(sink) = self {
            // A client gone meanwhile re-sends its keyed request, or polls nothing: the task
            // runs either way.
            let _ = sink.send(response, Part::Response { record: None, status: StatusCode::OK }, first).await;
        }
    }

    /// Waits until everything sent so far is durable (at once where nothing is stored).
    pub(crate) async fn flush(&self) -> Result<(), ContextError> {
        match self {
            Sink::Stored(sink) => sink.write(None, false, None).await,
            Sink::Direct(_) => Ok(()),
        }
    }

    /// Ends the output's stream as aborted: its readers end it with a `request_aborted` notice
    /// instead of waiting for a response it will not get (tried until the store takes it). A
    /// direct output ends with its connection.
    pub(crate) async fn abort(&self) {
        let Sink::Stored(sink) = self else { return };
        let (id, epoch, stream) = (&sink.runtime.id, &sink.runtime.epoch, &sink.stream);
        let aborted = crate::persist::until_stored("the abort of a request's stream", || {
            sink.store.abort_stream(id, epoch, stream)
        })
        .await;
        if let Err(err) = aborted {
            tracing::debug!(%err, %stream, "a request's stream that will not get its response was not aborted");
        }
    }

    /// Closes the client's connection to the output's stream without ending the stream
    /// (SEP-1699). `false` where there is no stream to resume, so nothing to close.
    pub(crate) fn close_connection(&self) -> bool {
        match self {
            Sink::Stored(sink) => {
                sink.runtime.kick(&sink.stream);
                true
            }
            Sink::Direct(_) => false,
        }
    }
}

/// A session stream, written in order by the request's [`Writer`].
pub(crate) struct StoredSink {
    store: Arc<dyn Store>,
    runtime: Arc<SessionRuntime>,
    stream: StreamName,
    /// Where its writes go.
    writes: Writes,
    /// The writer's first failure, reported to the handler's next send.
    failure: Arc<Mutex<Option<ContextError>>>,
}

impl StoredSink {
    /// Queues `write` for the writer; fails with the writer's first failure.
    async fn queue(&self, write: Write) -> Result<(), ContextError> {
        if let Some(err) = self.failure.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone() {
            return Err(err);
        }
        match &self.writes {
            Writes::Queued(queue) => queue.send(write).await.map_err(|_| ContextError::Cancelled),
            Writes::Here(writer) => {
                writer.lock().await.commit(vec![write]).await;
                Ok(())
            }
        }
    }

    /// Queues `bytes` (or nothing) and waits until it and everything before it is durable.
    async fn write(&self, bytes: Option<Bytes>, last: bool, record: Option<String>) -> Result<(), ContextError> {
        let (done, written) = oneshot::channel();
        self.queue(Write { bytes, last, record, done: Some(done) }).await?;
        written.await.map_err(|_| ContextError::Cancelled)?
    }
}

/// How a stored output reaches its [`Writer`].
enum Writes {
    /// Through the queue of the writer's task, which batches what queued up while the store
    /// wrote the previous batch: for stores whose every append is a flush or a round trip.
    Queued(mpsc::Sender<Write>),
    /// To the writer itself, in the sender's task, one write at a time: for a store whose
    /// appends are done as they return (the memory store), where a batch saves nothing and a
    /// task of its own costs a hand-off between threads each way.
    Here(tokio::sync::Mutex<Writer>),
}

/// The one connection of a 2026-07-28 request: messages and whether each is the last.
pub(crate) struct DirectSink {
    tx: mpsc::Sender<(Bytes, bool)>,
}

impl DirectSink {
    /// A response that comes first is the JSON answer; anything else makes the answer a stream.
    async fn send(&self, bytes: Bytes, part: Part<'_>, first: &First) -> Result<(), ContextError> {
        let mut sender = first.take();
        if let (Part::Response { status, .. }, Some(sender)) = (part, sender.take()) {
            let _ = sender.send(FirstOutput::Final(Answer { bytes, status }));
            return Ok(());
        }
        if let Some(sender) = sender {
            let _ = sender.send(FirstOutput::Event);
        }
        let last = matches!(part, Part::Response { .. });
        self.tx.send((bytes, last)).await.map_err(|_| ContextError::Cancelled)
    }
}

/// One entry of a request's output, written to the store in order by the request's writer.
struct Write {
    /// The message; `None` only asks to be told when everything before it is written.
    bytes: Option<Bytes>,
    /// The message is the final response: the stream ends after it, if it is the request's own.
    last: bool,
    /// The final response is also the outcome of this idempotency key (the store's name).
    record: Option<String>,
    /// Told the outcome once the entry is durable (or failed).
    done: Option<oneshot::Sender<Result<(), ContextError>>>,
}

/// Most entries a request's writer commits together.
const MAX_WRITE_BATCH: usize = 256;
/// Entries a handler may have queued before its sends wait for the store.
const WRITE_QUEUE: usize = 1024;

/// Writes a request's output to the store in order. With a queue, whatever queued up while the
/// previous batch was being written goes in one [`EventLog::append_batch`](tether_store::EventLog::append_batch),
/// so a handler never waits for a disk flush per notification; the client still sees nothing
/// before it is durable, because delivery reads from the store. The POST learns how its
/// response starts only once the first batch is durable, so the response goes out with its
/// first events (and, for a short call, its end) at once. The first failure is kept and
/// answered to every later entry.
struct Writer {
    store: Arc<dyn Store>,
    runtime: Arc<SessionRuntime>,
    stream: StreamName,
    ends_stream: bool,
    /// The first failure, answered to every later entry and to the handler's next send.
    failure: Arc<Mutex<Option<ContextError>>>,
    first: First,
}

impl Writer {
    /// Writes what `queue` brings, a batch at a time.
    async fn run(self, mut queue: mpsc::Receiver<Write>) {
        while let Some(first) = queue.recv().await {
            // One turn for the handler to queue what it sends right after (often its result),
            // so that it joins this batch.
            tokio::task::yield_now().await;
            let batch = take_batch(first, &mut queue);
            self.commit(batch).await;
        }
    }

    /// Writes `batch` in one step and tells each of its entries the outcome.
    async fn commit(&self, batch: Vec<Write>) {
        let Writer { store, runtime, stream, first: first_output, failure, ends_stream } = self;
        let failed = failure.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        let outcome = match (failed, commit_of(&batch, *ends_stream)) {
            (Some(err), _) => Err(err),
            (None, Commit::Wait) => Ok(()),
            (None, Commit::Append { events, end, record, only_response }) => {
                let (count, started) = (events.len(), std::time::Instant::now());
                let appended = match record {
                    Some(key) => store.append_final(&runtime.id, &runtime.epoch, stream, events, end, &key).await,
                    None => store.append_batch(&runtime.id, &runtime.epoch, stream, events, end).await,
                };
                let appended = appended.map(drop).map_err(ContextError::from);
                if appended.is_ok() {
                    crate::telemetry::store_latency(crate::telemetry::StoreOp::Append, started.elapsed());
                    crate::telemetry::events_appended(count);
                    first_output.signal(|| {
                        only_response.map_or(FirstOutput::Event, |bytes| {
                            FirstOutput::Final(Answer { bytes, status: StatusCode::OK })
                        })
                    });
                }
                appended
            }
        };
        if let Err(err) = &outcome {
            failure.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get_or_insert_with(|| err.clone());
        }
        for write in batch {
            if let Some(done) = write.done {
                let _ = done.send(outcome.clone());
            }
        }
    }
}

/// The writes that go to the store with `first`: whatever is queued already, up to
/// [`MAX_WRITE_BATCH`], and nothing after the final response.
fn take_batch(first: Write, queue: &mut mpsc::Receiver<Write>) -> Vec<Write> {
    let mut batch = vec![first];
    while batch.len() < MAX_WRITE_BATCH && batch.last().is_some_and(|w| !w.last) {
        match queue.try_recv() {
            Ok(write) => batch.push(write),
            Err(_) => break,
        }
    }
    batch
}

/// What one batch of writes asks of the store.
#[derive(Debug, PartialEq)]
enum Commit {
    /// Nothing to write: the batch only waits for what came before it.
    Wait,
    /// Its events, in one step: the stream ends after them if `end`, and the outcome of the
    /// idempotency key `record` is recorded with them. `only_response`: the batch is the
    /// request's response alone, so its POST is answered with it as JSON.
    Append { events: Vec<Bytes>, end: bool, record: Option<String>, only_response: Option<Bytes> },
}

/// What `batch` asks of the store, for a stream that ends with the request's response if
/// `ends_stream` (a batch's requests share one that does not).
fn commit_of(batch: &[Write], ends_stream: bool) -> Commit {
    let events: Vec<Bytes> = batch.iter().filter_map(|w| w.bytes.clone()).collect();
    if events.is_empty() {
        return Commit::Wait;
    }
    let last = batch.iter().any(|w| w.last);
    let only_response = (last && events.len() == 1).then(|| events[0].clone());
    let record = batch.iter().find_map(|w| w.record.clone());
    Commit::Append { events, end: last && ends_stream, record, only_response }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(text: &'static str) -> Write {
        Write { bytes: Some(Bytes::from_static(text.as_bytes())), last: false, record: None, done: None }
    }

    fn response(record: Option<&str>) -> Write {
        Write {
            bytes: Some(Bytes::from_static(b"response")),
            last: true,
            record: record.map(str::to_owned),
            done: None,
        }
    }

    fn flush() -> Write {
        Write { bytes: None, last: false, record: None, done: None }
    }

    #[test]
    fn a_batch_holds_at_most_the_cap_and_nothing_after_the_response() {
        let (tx, mut queue) = mpsc::channel(MAX_WRITE_BATCH * 2);
        for _ in 0..MAX_WRITE_BATCH + 10 {
            tx.try_send(event("e")).expect("queued");
        }
        assert_eq!(take_batch(event("first"), &mut queue).len(), MAX_WRITE_BATCH);

        let (tx, mut queue) = mpsc::channel(8);
        for write in [event("e"), response(None), event("after")] {
            tx.try_send(write).expect("queued");
        }
        assert_eq!(take_batch(event("first"), &mut queue).len(), 3, "first, event, response");
        assert_eq!(take_batch(event("next"), &mut queue).len(), 2, "the next batch takes what followed");
    }

    #[test]
    fn a_batch_ends_its_own_stream_with_the_response_and_a_shared_one_never() {
        let Commit::Append { end, record, only_response, events } = commit_of(&[event("e"), response(Some("k"))], true)
        else {
            panic!("events to append")
        };
        assert_eq!((end, record.as_deref(), only_response, events.len()), (true, Some("k"), None, 2));
        let shared = commit_of(&[response(Some("k"))], false);
        let Commit::Append { end, only_response, .. } = shared else { panic!("events to append") };
        assert_eq!((end, only_response), (false, Some(Bytes::from_static(b"response"))));
        let Commit::Append { end, .. } = commit_of(&[event("e")], true) else { panic!("events to append") };
        assert!(!end, "a stream ends only with the response");
        assert_eq!(commit_of(&[flush()], true), Commit::Wait, "a flush alone writes nothing");
    }

    /// A flush returns once what was sent before it is durable, not when it is queued: a
    /// relayed call's output must be in its stream before the replica that answers the call
    /// learns its outcome and ends the stream with the response.
    #[tokio::test]
    async fn a_flush_returns_once_what_was_sent_before_it_is_durable() {
        use std::time::Duration;

        use tether_store::faults::{Call, FaultyStore};
        use tether_store::{EventLog as _, MemoryStore, Retention, SessionStore as _};

        let store = Arc::new(FaultyStore::new(Arc::new(MemoryStore::new(Retention::default()))));
        let record = crate::session::test_record(u64::MAX / 4, u64::MAX / 4);
        store.create_session(record.clone(), 1).await.expect("session");
        let stream = StreamName::parse("relayed").expect("stream");
        store.open_stream(&record.id, &record.epoch, &stream).await.expect("stream");
        let runtime = Arc::new(SessionRuntime::new(&record, "p".into()));
        let (first, _answer) = First::new();
        let output = Output::Stored {
            store: Arc::clone(&store) as Arc<dyn Store>,
            runtime,
            stream: stream.clone(),
            ends_stream: true,
        };
        let sink = Sink::open(output, &first);
        let hold = store.hold_next(Call::AppendBatch);
        sink.send(Bytes::from_static(b"progress"), Part::Event, &first).await.expect("queued");
        let flushed = sink.flush();
        tokio::pin!(flushed);
        tokio::time::timeout(Duration::from_secs(5), hold.reached()).await.expect("the writer appends");
        let early = tokio::time::timeout(Duration::from_millis(50), &mut flushed).await;
        assert!(early.is_err(), "the flush returned before the event was durable");
        hold.release();
        flushed.await.expect("flushed");
        let events = store.read(&record.id, &stream, 0, 10).await.expect("read");
        assert_eq!(events.iter().map(|e| e.data.clone()).collect::<Vec<_>>(), [Bytes::from_static(b"progress")]);
    }
}
