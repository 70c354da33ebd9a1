//! Running a request: record it, run the handler (where it starts until it must wait, then in a
//! task of the request's own: [`eager`]), and send its outcome to the request's output. A
//! request runs to completion even if the client's connection drops; only cancellation (or, in
//! 2026-07-28, a closed response stream) stops it.

use std::sync::Arc;

use bytes::Bytes;

use serde_json::{Value, json};
use tether_core::idempotency::Acknowledged;
use tether_core::input_required::InputError;
use tether_core::jsonrpc::{ErrorObject, Message, Request, Response};
use tether_core::lifecycle;
use tether_core::lineage::{Digest, StreamName};
use tether_core::mcp;
use tether_core::tasks::Creation;
use tether_store::{BeginRequest, Claim, KeyClaim, RequestKey, RequestRecord, StoreError};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::ServerState;
use crate::ids;
use crate::refusal::Refusal;
use crate::request::context::{Context, Input, RequestMeta};
use crate::request::eager::{self, Started};
use crate::request::idempotency::{self, Answer, ClaimGuard, Keyed, Plan};
use crate::request::input::{self, Answerer, Params};
use crate::request::output::{FirstOutput, Output};
use crate::session::{LogLevel, SessionRuntime};
use crate::tasks::{self, TaskSlot};
use crate::telemetry::Ended;

/// How a sessionful request started.
pub(crate) enum StartedSessionful {
    /// It runs.
    Running(Running),
    /// Its id was used before in this incarnation with the same params: attach to that stream.
    Attach { stream: StreamName },
    /// Its id was used before with other params, or its idempotency key is malformed.
    Conflict(ErrorObject),
}

/// A request that runs.
pub(crate) struct Running {
    /// The stream it writes to.
    pub stream: StreamName,
    /// Tells whether its first output was the result (JSON) or not (SSE).
    pub first: oneshot::Receiver<FirstOutput>,
    /// Ends once its outcome is stored.
    pub task: Started<()>,
    /// Its idempotency key's claim, as the records acknowledge it, for the client.
    pub claimed: Option<Acknowledged>,
}

/// The responses that end the requests of a stream recorded under `key` with `error`: sent, as
/// events without ids, when the stream will never carry their own (their producer died, or
/// their responses are no longer retained).
pub(crate) fn trailer(key: &RequestKey, error: &ErrorObject) -> Vec<Bytes> {
    key.request_ids()
        .into_iter()
        .map(|id| Bytes::from(Message::Response(Response::error(Some(id), error.clone())).to_vec()))
        .collect()
}

/// The request's `_meta.progressToken`, if any.
fn progress_token(params: &Value) -> Option<Value> {
    params.get("_meta")?.get("progressToken").filter(|t| t.is_string() || t.is_number()).cloned()
}

/// Runs `start`, which records a request and starts it, so that a client that goes away
/// meanwhile drops only the wait, never a request half started (its key claimed and nothing
/// running it).
async fn detached<T: Send + 'static>(
    start: impl Future<Output = Result<T, DispatchError>> + Send + 'static,
) -> Result<T, DispatchError> {
    eager::start(start).join().await.unwrap_or_else(|stopped| Err(DispatchError::StartFailed(stopped.to_string())))
}

/// Starts a request of a session: recorded in the store with its own stream, so it is
/// executed once however often its id is sent, and its output survives the connection. With an
/// idempotency key, once however often it is sent at all (see [`idempotency`]).
pub(crate) async fn start_sessionful(
    shared: &Arc<ServerState>,
    runtime: &Arc<SessionRuntime>,
    principal: Option<&str>,
    request: Request,
) -> Result<StartedSessionful, DispatchError> {
    let (shared, runtime, principal) = (Arc::clone(shared), Arc::clone(runtime), principal.map(str::to_owned));
    detached(async move { start_sessionful_here(&shared, &runtime, principal.as_deref(), request).await }).await
}

/// [`start_sessionful`], in the task that records and starts the request.
async fn start_sessionful_here(
    shared: &Arc<ServerState>,
    runtime: &Arc<SessionRuntime>,
    principal: Option<&str>,
    request: Request,
) -> Result<StartedSessionful, DispatchError> {
    let stream = ids::stream_name('r')?;
    let entry = match Entry::of(shared, principal, request) {
        Ok(entry) => entry,
        Err(error) => return Ok(StartedSessionful::Conflict(error)),
    };
    if entry.pipelined()
        && let Some(begun) = shared.store.begin_request_pipelined(entry.store_record(runtime, &stream))
    {
        return start_pipelined(shared, runtime, principal, entry, stream, begun).await;
    }
    Ok(match record(shared, runtime, entry, &stream, true).await? {
        Recorded::New(work) => {
            StartedSessionful::Running(run_recorded(shared, runtime, principal, *work, stream, true).await?)
        }
        Recorded::Again { original, .. } => StartedSessionful::Attach { stream: original },
        Recorded::Conflict(error) => StartedSessionful::Conflict(error),
    })
}

/// Starts a request without effects and without an idempotency key at once, while the store
/// writes its record, which it has ordered before the request's output: the output need not
/// wait for a store step of its own. If the store says the id was used before, the run is
/// cancelled; it wrote nothing, for its stream was never opened. The run is registered for
/// cancellation before it starts, so a cancellation or the session's end is never lost in the
/// meantime (a re-sent id whose original runs is not registered: it is the original's to cancel).
async fn start_pipelined(
    shared: &Arc<ServerState>,
    runtime: &Arc<SessionRuntime>,
    principal: Option<&str>,
    entry: Entry,
    stream: StreamName,
    begun: tether_store::StoreFuture<'static, BeginRequest>,
) -> Result<StartedSessionful, DispatchError> {
    let Entry { key, request, params_bytes, .. } = entry;
    let cancel = CancellationToken::new();
    if runtime.closing() {
        return Err(DispatchError::SessionEnded);
    }
    let registered = runtime.start_request(&key, &stream, cancel.clone());
    let (ctx, first) = context(shared, runtime, principal, &request, &stream, true, None, &cancel);
    let (decided, decision) = oneshot::channel();
    let id = request.id.clone();
    let (runtime, shared) = (Arc::clone(runtime), Arc::clone(shared));
    let task = eager::start(async move {
        let run_ctx = ctx.clone();
        let decide = async {
            let started = std::time::Instant::now();
            let begun = begun.await;
            crate::telemetry::store_latency(crate::telemetry::StoreOp::BeginRequest, started.elapsed());
            let begun = begun.map_err(DispatchError::from).and_then(|begun| match begun {
                // Not registered, yet new: the session began to end meanwhile.
                BeginRequest::Started if !registered => Err(DispatchError::SessionEnded),
                begun => Ok(begun),
            });
            if !matches!(begun, Ok(BeginRequest::Started)) {
                ctx.void();
            }
            // The POST may have gone away; a request that runs runs to its end regardless.
            let _ = decided.send(begun);
        };
        let finish = Finish::Sessionful(registered.then_some(&key));
        let running = run(&shared, run_ctx, request, Some(params_bytes), Job::Run(None), cancel.clone(), finish);
        tokio::join!(running, decide);
        if registered {
            runtime.finish_request(&key);
        }
    });
    let begun = decision.await.map_err(|_| DispatchError::StartFailed("the request's task stopped".into()))??;
    Ok(match begun {
        BeginRequest::Started => StartedSessionful::Running(Running { stream, first, task, claimed: None }),
        BeginRequest::Existing { stream: original, same_params: true } => {
            StartedSessionful::Attach { stream: original }
        }
        BeginRequest::Existing { same_params: false, .. } => StartedSessionful::Conflict(id_reused(&id)),
    })
}

/// Starts a request of a 2025-03-26 batch on the batch's `stream`, which it leaves open (the
/// batch ends it once all of its requests answered). An id sent before is answered, on the
/// batch's stream, with the original's outcome. `Err` with the error that answers the request
/// instead. Run in a task the caller spawned for the request's whole life, so a client that
/// goes away never leaves it half started.
pub(crate) async fn start_in_batch(
    shared: &Arc<ServerState>,
    runtime: &Arc<SessionRuntime>,
    principal: Option<&str>,
    request: Request,
    stream: &StreamName,
) -> Result<Result<Running, ErrorObject>, DispatchError> {
    let entry = match Entry::of(shared, principal, request) {
        Ok(entry) => entry,
        Err(error) => return Ok(Err(error)),
    };
    let work = match record(shared, runtime, entry, stream, false).await? {
        Recorded::New(work) => *work,
        Recorded::Again { original, request } => {
            // Its own key is the original's, which may be running: the relay is tracked apart.
            let key = RequestKey::Resent { id: request.id.clone(), stream: stream.clone() };
            let follow =
                Answer::Follow { session: runtime.id.clone(), stream: original, request: Some(request.id.clone()) };
            let relay = Job::Answer(follow, None);
            Work { key, request, params_bytes: None, job: Prepared::Ready(relay) }
        }
        Recorded::Conflict(error) => return Ok(Err(error)),
    };
    Ok(Ok(run_recorded(shared, runtime, principal, work, stream.clone(), false).await?))
}

/// Why a request could not be started, for the transport to answer as it answers refusals.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DispatchError {
    /// The store failed, or says the session is gone.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No stream name could be minted.
    #[error(transparent)]
    Random(#[from] ids::RandomError),
    /// The session ended before the request could start.
    #[error("the session ended")]
    SessionEnded,
    /// A 2026-07-28 request's idempotency key is malformed (sessions answer it in the
    /// response instead).
    #[error("{0}")]
    InvalidIdempotencyKey(String),
    /// A 2026-07-28 request's `inputResponses` or `requestState` is refused (SEP-2322).
    #[error(transparent)]
    InvalidInput(#[from] InputError),
    /// A tool that runs only as a task, called by a client that does not declare tasks.
    #[error("tool {0:?} runs only as a task, and the request does not declare the tasks extension")]
    TasksRequired(String),
    /// The task that records and starts the request failed (a panic: a bug).
    #[error("starting the request failed: {0}")]
    StartFailed(String),
}

/// What the store said of a request before anything of it runs.
enum Recorded {
    /// It is new: recorded, with its stream opened, it is to run.
    New(Box<Work>),
    /// Its id was used before in this incarnation with the same params: the original's stream.
    Again { original: StreamName, request: Request },
    /// Its id was used before with other params, or its idempotency key is malformed.
    Conflict(ErrorObject),
}

/// A request about to run.
struct Work {
    /// The key it runs under in this process (its cancellation).
    key: RequestKey,
    /// The request, its params set.
    request: Request,
    /// Its params as its record serialized them, if it was recorded.
    params_bytes: Option<Vec<u8>>,
    job: Prepared,
}

/// A request's job, or what decides it once the request has a context.
enum Prepared {
    Ready(Job),
    /// A keyed request: its key, the key's claim, and the store's answer to the claim if it
    /// came with the begin.
    Keyed {
        keyed: Keyed,
        claim: KeyClaim,
        claimed: Option<Claim>,
    },
}

/// A request as the store records it: its key in the session, its params (set), serialized and
/// their digest, its idempotency key, and whether it is without effects.
struct Entry {
    key: RequestKey,
    request: Request,
    params_bytes: Vec<u8>,
    digest: String,
    keyed: Option<Keyed>,
    read_only: bool,
}

impl Entry {
    /// `Err` with the error that answers the request: its idempotency key is malformed.
    fn of(shared: &ServerState, principal: Option<&str>, request: Request) -> Result<Entry, ErrorObject> {
        let key = RequestKey::of(&request.id);
        let params = request.params.unwrap_or_else(|| json!({}));
        let keyed = Keyed::of(shared, principal, &request.method, &params)?;
        // Straight to bytes, not through `Display`'s formatter.
        let params_bytes = serde_json::to_vec(&params).expect("a serde_json::Value serializes: its keys are strings");
        let digest = Digest::of(&key.encode(), &params_bytes).to_string();
        let read_only = shared.handler.read_only(&request.method, &params);
        let request = Request { params: Some(params), ..request };
        Ok(Entry { key, request, params_bytes, digest, keyed, read_only })
    }

    /// What the store records of it, sent in `runtime`'s incarnation with its output on `stream`.
    fn store_record<'a>(&'a self, runtime: &'a SessionRuntime, stream: &'a StreamName) -> RequestRecord<'a> {
        RequestRecord {
            session: &runtime.id,
            epoch: &runtime.epoch,
            key: &self.key,
            params_digest: &self.digest,
            stream,
        }
    }

    /// Whether it may run while its record is written: it has no effects a second run could
    /// repeat, and no idempotency key to claim first.
    fn pipelined(&self) -> bool {
        self.read_only && self.keyed.is_none()
    }
}

/// The error that answers a request whose id was used before in this incarnation with other
/// params.
fn id_reused(id: &tether_core::jsonrpc::RequestId) -> ErrorObject {
    Refusal::RequestIdReused.error(format!("request id {id} was already used in this session with other params"))
}

/// Records a request (and claims its idempotency key) with `stream` as its stream, the
/// request's `own` or a batch's. A key's claim names only a request's own stream: a re-send
/// follows it; one sharing a batch's waits for the key's record instead.
async fn record(
    shared: &Arc<ServerState>,
    runtime: &Arc<SessionRuntime>,
    entry: Entry,
    stream: &StreamName,
    own: bool,
) -> Result<Recorded, DispatchError> {
    let store = &shared.store;
    let started = std::time::Instant::now();
    let followed = own.then(|| (runtime.id.clone(), stream.clone()));
    let claim = entry.keyed.as_ref().map(|keyed| keyed.claim(followed));
    let recorded = entry.store_record(runtime, stream);
    let (begun, claimed) = match &claim {
        Some(claim) => store.begin_keyed_request(recorded, claim.clone()).await,
        None => {
            // A pipelined begin is awaited before anything of the request runs all the same here:
            // the request shares a batch's stream, or the store declined it.
            let pipelined = entry.pipelined().then(|| store.begin_request_pipelined(recorded));
            match pipelined.flatten() {
                Some(begun) => begun.await,
                None => store.begin_request(recorded).await,
            }
            .map(|begun| (begun, None))
        }
    }?;
    crate::telemetry::store_latency(crate::telemetry::StoreOp::BeginRequest, started.elapsed());
    let Entry { key, request, params_bytes, keyed, .. } = entry;
    Ok(match begun {
        BeginRequest::Existing { stream: original, same_params: true } => Recorded::Again { original, request },
        BeginRequest::Existing { same_params: false, .. } => Recorded::Conflict(id_reused(&request.id)),
        BeginRequest::Started => {
            let job = match keyed.zip(claim) {
                Some((keyed, claim)) => Prepared::Keyed { keyed, claim, claimed },
                None => Prepared::Ready(Job::Run(None)),
            };
            Recorded::New(Box::new(Work { key, request, params_bytes: Some(params_bytes), job }))
        }
    })
}

/// The context of a request of a session (and of `principal`, the session's), writing to
/// `stream` (which ends with its response if `ends_stream`), and the receiver of its first
/// output's kind.
#[allow(clippy::too_many_arguments)]
fn context(
    shared: &Arc<ServerState>,
    runtime: &Arc<SessionRuntime>,
    principal: Option<&str>,
    request: &Request,
    stream: &StreamName,
    ends_stream: bool,
    idempotency_key: Option<String>,
    cancel: &CancellationToken,
) -> (Context, oneshot::Receiver<FirstOutput>) {
    let output = Output::Stored {
        store: Arc::clone(&shared.store),
        runtime: Arc::clone(runtime),
        stream: stream.clone(),
        ends_stream,
    };
    let params = request.params.as_ref().unwrap_or(&Value::Null);
    let meta = RequestMeta {
        progress_token: progress_token(params),
        client_capabilities: runtime.client_capabilities.clone(),
        log_level: None,
        client_request_timeout: shared.config.client_request_timeout,
        idempotency_key,
        principal: principal.map(str::to_owned),
    };
    Context::new(output, meta, Input::default(), cancel.clone(), Arc::clone(shared), None)
}

/// Runs a recorded request ([`eager`]: here until it must wait, then in a task of its own),
/// writing to `stream` (which ends with its response if `ends_stream`).
async fn run_recorded(
    shared: &Arc<ServerState>,
    runtime: &Arc<SessionRuntime>,
    principal: Option<&str>,
    work: Work,
    stream: StreamName,
    ends_stream: bool,
) -> Result<Running, DispatchError> {
    let Work { key, request, params_bytes, job } = work;
    let cancel = CancellationToken::new();
    if !runtime.start_request(&key, &stream, cancel.clone()) {
        if let Prepared::Keyed { keyed, claimed: Some(Claim::Claimed(_)), .. } = &job {
            // Claimed with its begin, and it will not run: released.
            drop(ClaimGuard::new(&shared.store, &keyed.name));
        }
        return Err(DispatchError::SessionEnded);
    }
    let idempotency_key = match &job {
        Prepared::Keyed { keyed, .. } => Some(keyed.name.clone()),
        Prepared::Ready(_) => None,
    };
    let (ctx, first) = context(shared, runtime, principal, &request, &stream, ends_stream, idempotency_key, &cancel);
    let job = match job {
        Prepared::Ready(job) => Ok(KeyedJob { job, acknowledged: None, claim: None }),
        Prepared::Keyed { keyed, claim, claimed } => keyed_job(shared, keyed, claim, claimed).await,
    };
    let KeyedJob { job, acknowledged: claimed, claim } = match job {
        Ok(job) => job,
        Err(rejection) => {
            // Nothing ran, and nothing will: readers of the request's stream are told so.
            ctx.abort_stream().await;
            runtime.finish_request(&key);
            return Err(rejection);
        }
    };
    let (runtime, shared) = (Arc::clone(runtime), Arc::clone(shared));
    let task = eager::start(async move {
        if let Some(claim) = claim {
            claim.running();
        }
        run(&shared, ctx, request, params_bytes, job, cancel, Finish::Sessionful(Some(&key))).await;
        runtime.finish_request(&key);
    });
    Ok(Running { stream, first, task, claimed })
}

/// What a request's task does.
enum Job {
    /// Runs the handler; with a key, records the outcome under it.
    Run(Option<Keyed>),
    /// Answers from the original request: of its key, or of its id (a batch's request).
    Answer(Answer, Option<Keyed>),
}

/// What a keyed request does, as its claim decided.
struct KeyedJob {
    job: Job,
    /// The claim as the records acknowledge it, for the client.
    acknowledged: Option<Acknowledged>,
    /// This process's claim, if the request is to run under it: released unless it does.
    claim: Option<ClaimGuard>,
}

/// Turns the store's answer to a request's claim (claiming it now if `claimed` is `None`) into a
/// job, with the claim as the records acknowledge it.
async fn keyed_job(
    shared: &ServerState,
    keyed: Keyed,
    claim: KeyClaim,
    claimed: Option<Claim>,
) -> Result<KeyedJob, DispatchError> {
    let store = &shared.store;
    let claimed = match claimed {
        Some(claimed) => claimed,
        None => {
            let started = std::time::Instant::now();
            let claimed = store.claim_key(claim.clone()).await?;
            crate::telemetry::store_latency(crate::telemetry::StoreOp::ClaimKey, started.elapsed());
            claimed
        }
    };
    let acknowledged = match &claimed {
        Claim::Claimed(acknowledged) | Claim::Existing { acknowledged, .. } => Some(acknowledged.clone()),
        Claim::Regressed => None,
    };
    // Held from here: a claim made (or taken over) for a request that then fails to start is
    // released when this job is dropped.
    let fresh = matches!(claimed, Claim::Claimed(_)).then(|| ClaimGuard::new(store, &keyed.name));
    let plan = idempotency::plan(store, claim, claimed, keyed.resumable).await?;
    Ok(match plan {
        Plan::Run => {
            let claim = fresh.or_else(|| Some(ClaimGuard::new(store, &keyed.name)));
            KeyedJob { job: Job::Run(Some(keyed)), acknowledged, claim }
        }
        Plan::Answer(answer) => KeyedJob { job: Job::Answer(answer, Some(keyed)), acknowledged, claim: None },
    })
}

/// How a 2026-07-28 request started.
pub(crate) struct StartedStateless {
    /// Tells whether its first output was the result (JSON) or not (SSE).
    pub first: oneshot::Receiver<FirstOutput>,
    /// Whether closing its response stream cancels it: not for a keyed request, whose outcome
    /// the client will fetch by re-sending it.
    pub cancel_on_close: bool,
    /// Its idempotency key's claim, as the records acknowledge it, for the client.
    pub claimed: Option<Acknowledged>,
}

/// Starts a 2026-07-28 request: no session, output straight to the connection, cancelled when
/// `cancel` fires (the response stream was closed). With an idempotency key, it is recorded
/// like a sessionful one, and runs once however often it is sent. `request` is as read from
/// `message`, the body it came in.
pub(crate) async fn start_stateless(
    shared: &Arc<ServerState>,
    principal: Option<&str>,
    request: Request,
    message: Bytes,
    output: Output,
    cancel: CancellationToken,
) -> Result<StartedStateless, DispatchError> {
    let (shared, principal) = (Arc::clone(shared), principal.map(str::to_owned));
    detached(async move { start_stateless_here(&shared, principal.as_deref(), request, message, output, cancel).await })
        .await
}

/// [`start_stateless`], in the task that records and starts the request.
async fn start_stateless_here(
    shared: &Arc<ServerState>,
    principal: Option<&str>,
    request: Request,
    message: Bytes,
    output: Output,
    cancel: CancellationToken,
) -> Result<StartedStateless, DispatchError> {
    let params = request.params.unwrap_or_else(|| json!({}));
    let keyed = Keyed::of(shared, principal, &request.method, &params)
        .map_err(|e| DispatchError::InvalidIdempotencyKey(e.message))?;
    let input = input::of(shared, &request.method, &params)?;
    let request_meta = params.get("_meta");
    let meta = RequestMeta {
        progress_token: progress_token(&params),
        client_capabilities: request_meta
            .and_then(|m| m.get(mcp::meta::CLIENT_CAPABILITIES))
            .cloned()
            .unwrap_or_else(|| json!({})),
        log_level: request_meta
            .and_then(|m| m.get(mcp::meta::LOG_LEVEL))
            .and_then(Value::as_str)
            .and_then(LogLevel::parse),
        client_request_timeout: shared.config.client_request_timeout,
        idempotency_key: keyed.as_ref().map(|k| k.name.clone()),
        principal: principal.map(str::to_owned),
    };
    let cancel_on_close = keyed.is_none();
    let task = match request.method.as_str() {
        mcp::method::TOOLS_CALL => {
            let tool = params.get("name").and_then(Value::as_str).unwrap_or_default();
            match tether_core::tasks::creation(
                shared.handler.task_support(tool),
                tether_core::tasks::declares_tasks(&meta.client_capabilities),
            ) {
                Creation::MissingCapability => return Err(DispatchError::TasksRequired(tool.to_owned())),
                Creation::Task => Some(Arc::new(TaskSlot::new(
                    request.id.clone(),
                    principal.map(str::to_owned),
                    CancellationToken::new(),
                ))),
                Creation::Immediate => None,
            }
        }
        _ => None,
    };
    // A request that may become a task runs under a token of its own: the connection's end
    // cancels it only until it has become one.
    let run_cancel = match &task {
        Some(slot) => {
            tokio::spawn(cancel_until_escalated(cancel.clone(), Arc::clone(slot)));
            slot.cancel.clone()
        }
        None => cancel.clone(),
    };
    let KeyedJob { job, acknowledged: claimed, claim } = match keyed {
        Some(keyed) => {
            let claim = keyed.claim(None);
            keyed_job(shared, keyed, claim, None).await?
        }
        None => KeyedJob { job: Job::Run(None), acknowledged: None, claim: None },
    };
    let (ctx, first) = Context::new(output, meta, input, run_cancel.clone(), Arc::clone(shared), task);
    let finish = Finish::Stateless { message };
    let shared = Arc::clone(shared);
    let request = Request { params: Some(params), ..request };
    // Here until it must wait, then in a task of its own; its end is told through `first`
    // and its output, never through this handle.
    drop(eager::start(async move {
        if let Some(claim) = claim {
            claim.running();
        }
        // Once the run is over, nothing is left to cancel (and the linking task ends).
        let _over = run_cancel.clone().drop_guard();
        run(&shared, ctx, request, None, job, run_cancel, finish).await;
    }));
    Ok(StartedStateless { first, cancel_on_close, claimed })
}

/// Cancels the run of a request that may become a task when its connection's `cancel` fires,
/// unless it has become a task by then.
pub(crate) async fn cancel_until_escalated(connection: CancellationToken, slot: Arc<TaskSlot>) {
    tokio::select! {
        () = connection.cancelled() => slot.cancel_unless_task().await,
        () = slot.cancel.cancelled() => {}
    }
}

/// How long a cancelled handler may run on before it is aborted.
const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// What a request's era makes of its handler's input requests and result.
enum Finish<'k> {
    /// A session's request: the server asks the client for the input a handler needs, in
    /// rounds of its own, and the result goes out as the handler returned it. The key it is
    /// registered under in its session, if it is ([`SessionRuntime::start_request`]).
    Sessionful(Option<&'k RequestKey>),
    /// A 2026-07-28 request, `message` as it came: a request for input is the result, its state
    /// sealed to the request (SEP-2322), and the result carries the server's info.
    Stateless { message: Bytes },
}

/// Runs `job` for `request` (whose params are set, and `params_bytes` serialized, if they were)
/// and sends its outcome, finished as its era says, recording it under the request's key if it
/// ran.
async fn run(
    shared: &ServerState,
    ctx: Context,
    request: Request,
    params_bytes: Option<Vec<u8>>,
    job: Job,
    cancel: CancellationToken,
    finish: Finish<'_>,
) {
    let _running = shared.drain.start();
    let began = std::time::Instant::now();
    let Request { id, method, params } = request;
    let params = Params { tree: params.unwrap_or_default(), bytes: params_bytes };
    // At `debug`, as tower-http's request spans are: enabled, it costs every call a few
    // microseconds to format and register (docs/benchmarks.md). The events tether writes at
    // `warn` or above from a request name the request themselves.
    let span = tracing::debug_span!(
        "mcp",
        %method,
        request = %id,
        session = ctx.session_id().unwrap_or_default(),
        stream = ctx.stream().map(StreamName::as_str).unwrap_or_default(),
    );
    let tool = (method == mcp::method::TOOLS_CALL)
        .then(|| params.tree.get("name").and_then(Value::as_str).map(str::to_owned))
        .flatten();
    let mut otel = crate::trace::RequestSpan::start(
        &method,
        tool.as_deref(),
        &params.tree,
        &id,
        ctx.session_id(),
        ctx.protocol_version(),
    );
    let handling = otel.as_ref().map(|span| span.child("tether.handler"));
    let trace = handling.as_ref().map(crate::trace::ChildSpan::trace_context);
    if let Some(trace) = trace.or_else(|| tether_core::trace_context::TraceContext::from_meta(&params.tree)) {
        ctx.set_trace_context(trace);
    }
    async move {
        let sessionful = matches!(finish, Finish::Sessionful(_));
        // Only a request answered from its key's original may take the key over.
        let mut taken: Option<Arc<TakenOver>> = None;
        let (work, record): (crate::HandlerFuture, Option<Keyed>) = match job {
            Job::Run(keyed) => (handler_run(&ctx, &method, params, sessionful), keyed),
            Job::Answer(answer, keyed) => {
                crate::telemetry::idempotent_replay();
                let (ctx, method) = (ctx.clone(), method.clone());
                let taken = Arc::clone(taken.insert(Arc::default()));
                let work = async move {
                    match idempotency::answer(ctx.clone(), keyed, answer).await {
                        idempotency::Answered::Outcome(outcome) => outcome,
                        idempotency::Answered::Run(keyed, claim) => {
                            // Dropped unused, the claim is released.
                            if !taken.take(keyed) {
                                return Err(idempotency::cancelled());
                            }
                            claim.running();
                            handler_run(&ctx, &method, params, sessionful).await
                        }
                    }
                };
                (Box::pin(work), None)
            }
        };
        let mut work = CatchPanic(Some(work));
        // A handler that finished is answered with what it returned, even if a cancellation
        // came meanwhile: the request ran, and its stream and record say how it ended.
        let finished = tokio::select! {
            biased;
            finished = &mut work => Some(finished),
            () = cancel.cancelled() => None,
        };
        let record = record.or_else(|| taken.and_then(|taken| taken.close()));
        let outcome = match finished {
            Some(Ok(outcome)) => Some(outcome),
            Some(Err(Panicked)) => {
                tracing::error!(
                    %method,
                    request = %id,
                    session = ctx.session_id().unwrap_or_default(),
                    "handler panicked"
                );
                Some(Err(Refusal::HandlerPanicked.error("the handler failed")))
            }
            None => {
                // Give the handler a moment to notice the cancellation and clean up (nothing it
                // sends from now on is delivered), then drop it.
                tokio::spawn(tokio::time::timeout(CANCEL_GRACE, work).in_current_span());
                None
            }
        };
        drop(handling);
        if let (Finish::Sessionful(Some(key)), Some(runtime)) = (&finish, ctx.runtime()) {
            runtime.answering(key);
        }
        let ended = if matches!(outcome, Some(Ok(_))) { Ended::Result } else { Ended::Error };
        let took = began.elapsed();
        crate::telemetry::request_finished(&method, ended, took);
        crate::telemetry::tool_outcome(&method, tool.as_deref(), outcome.as_ref(), took);
        tracing::info!(
            target: crate::telemetry::ACCESS,
            %method,
            tool = tool.as_deref().unwrap_or_default(),
            request = %id,
            session = ctx.session_id().unwrap_or_default(),
            outcome = ended.as_str(),
            duration_ms = took.as_secs_f64() * 1000.0,
            "request ended"
        );
        if let Some(span) = &mut otel {
            span.record(outcome.as_ref());
        }
        // Dropped before the request's span, which ends once the outcome is written.
        let _writing = otel.as_ref().map(|span| span.child("tether.store.write"));
        if let Some(task) = ctx.task_id() {
            // The request was answered with its task: the outcome is the task's.
            tasks::finish(shared, task, outcome).await;
            return;
        }
        let mut outcome = outcome.unwrap_or_else(|| Err(idempotency::cancelled()));
        if let Finish::Stateless { message } = &finish {
            input::seal(shared, &method, message, &mut outcome);
            if let Ok(result) = &mut outcome {
                tether_core::translate::stateless_result(&method, result, &shared.server_info);
            }
        }
        let unavailable = outcome
            .as_ref()
            .is_err_and(|error| error.reason().and_then(Refusal::from_reason) == Some(Refusal::StoreUnavailable));
        let resumable = record.as_ref().is_some_and(|keyed| keyed.resumable);
        let mut record = record.map(|keyed| keyed.name);
        if let Some(key) = &record
            && lifecycle::settle(unavailable, resumable) == lifecycle::Settle::Release
        {
            // Released before the answer goes out: the re-send it asks for runs the request.
            idempotency::release(shared.store.as_ref(), key).await;
            record = None;
        }
        end(shared, &ctx, Response { id: Some(id), outcome }, record).await;
    }
    .instrument(span)
    .await
}

/// The handler's run of `method` with `params` for the request of `ctx`: in rounds that ask the
/// client for input when the method may ask in a session (`sessionful`), or when the request
/// may become a task; else the handler's call as it is.
fn handler_run(ctx: &Context, method: &str, params: Params, sessionful: bool) -> crate::HandlerFuture {
    let handler = Arc::clone(&ctx.server().handler);
    let answerer = if sessionful && tether_core::methods::may_ask_input(method) {
        Answerer::Session
    } else if ctx.may_become_task() {
        Answerer::Task
    } else {
        return handler.call(ctx.clone(), method.to_owned(), params.tree);
    };
    Box::pin(input::rounds(handler, ctx.clone(), method.to_owned(), params, answerer))
}

/// Whether a request answered from its key's original took the key over and runs
/// ([`idempotency::Answered::Run`]), so that its outcome is recorded under the key: decided
/// once, between the run and the request's end. A takeover after the request ended (it was
/// cancelled while claiming) does not run, and its claim is released.
#[derive(Default)]
struct TakenOver(std::sync::Mutex<TakeOver>);

#[derive(Default)]
enum TakeOver {
    /// The request is answered from the original, or waits for it.
    #[default]
    Waiting,
    /// It took the key over and runs under it.
    Taken(Keyed),
    /// It ended; its outcome's key, if it took one, was handed over.
    Ended,
}

impl TakenOver {
    /// The request runs under `keyed`'s claim, unless it already ended.
    fn take(&self, keyed: Keyed) -> bool {
        let mut state = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match *state {
            TakeOver::Waiting => {
                *state = TakeOver::Taken(keyed);
                true
            }
            TakeOver::Taken(_) | TakeOver::Ended => false,
        }
    }

    /// The request ended: the key it ran under, if it took one over.
    fn close(&self) -> Option<Keyed> {
        let mut state = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match std::mem::replace(&mut *state, TakeOver::Ended) {
            TakeOver::Taken(keyed) => Some(keyed),
            TakeOver::Waiting | TakeOver::Ended => None,
        }
    }
}

/// Ends a request with its response, the one terminal event every request's stream gets (a
/// cancelled request's is the `request_cancelled` error), recording it as the outcome of its
/// idempotency key `record` if it has one: with the response, in the same store step, on a
/// session stream. If the response cannot be written there, the key gets the outcome on its
/// own, and then the stream is ended as aborted, so that nobody waits for it: in that order,
/// since a store that keeps refusing the abort must not keep the key's re-sends waiting too.
async fn end(shared: &ServerState, ctx: &Context, response: Response, record: Option<String>) {
    let answer = if response.outcome.is_ok() { "result" } else { "error" };
    let status = Refusal::stateless_status(&response.outcome);
    let response = Bytes::from(Message::Response(response).to_vec());
    let stored = ctx.stream().is_some();
    let written = ctx.respond(response.clone(), status, record.as_deref().filter(|_| stored)).await;
    if let Err(err) = &written {
        tracing::debug!(%err, "final response not delivered");
    }
    let abort = match lifecycle::after_response(written.is_ok()) {
        lifecycle::AfterResponse::Ended => {
            tracing::debug!(answer, "answered");
            false
        }
        lifecycle::AfterResponse::AbortStream => true,
    };
    if let Some(key) = record.filter(|_| abort || !stored) {
        idempotency::finish(shared.store.as_ref(), &key, response).await;
    }
    if abort {
        ctx.abort_stream().await;
    }
}

/// A handler panicked while it was polled.
struct Panicked;

/// A handler's future, polled in the request's own task (no task of its own per request), with
/// a panic turned into [`Panicked`] so that the request is still answered. A finished handler
/// is dropped at once (what it holds goes before its response is stored), and a panic while it
/// is dropped counts as the handler's (it is the handler's code that panicked).
struct CatchPanic(Option<crate::HandlerFuture>);

impl std::future::Future for CatchPanic {
    type Output = Result<Result<Value, ErrorObject>, Panicked>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        use std::panic::{AssertUnwindSafe, catch_unwind};
        use std::task::Poll;
        // Polled again after it finished (which futures may not be, and no caller does): never
        // ready again.
        let Some(handler) = self.0.as_mut() else { return Poll::Pending };
        let outcome = match catch_unwind(AssertUnwindSafe(|| handler.as_mut().poll(cx))) {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(outcome)) => Ok(outcome),
            Err(_) => Err(Panicked),
        };
        let handler = self.0.take();
        match catch_unwind(AssertUnwindSafe(move || drop(handler))) {
            Ok(()) => Poll::Ready(outcome),
            Err(_) => Poll::Ready(Err(Panicked)),
        }
    }
}

#[cfg(test)]
mod tests {
    use tether_core::jsonrpc::RequestId;

    use super::*;

    /// A takeover before the request ended is recorded under its key once; one after it ended
    /// is refused, so its claim is released instead of left running unrecorded.
    #[test]
    fn a_takeover_counts_only_before_the_request_ends() {
        let keyed =
            |name: &str| Keyed { name: name.into(), params_digest: "d".into(), acknowledged: None, resumable: true };
        let taken = TakenOver::default();
        assert!(taken.take(keyed("k")));
        assert!(!taken.take(keyed("other")), "taken once");
        assert_eq!(taken.close().map(|keyed| keyed.name), Some("k".into()));
        assert!(taken.close().is_none(), "handed over once");
        let late = TakenOver::default();
        assert!(late.close().is_none());
        assert!(!late.take(keyed("k")), "the request ended before the takeover");
    }

    /// A hand-written handler that answers at once and keeps `T` until it is dropped (an
    /// `async` block would drop what it captured as soon as it finished).
    struct Holding<T>(T);

    impl<T: Unpin> std::future::Future for Holding<T> {
        type Output = Result<Value, ErrorObject>;

        fn poll(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
            std::task::Poll::Ready(Ok(json!(1)))
        }
    }

    /// Polls `work` once, which must then be ready.
    fn poll_once(work: std::pin::Pin<&mut CatchPanic>) -> Result<Result<Value, ErrorObject>, Panicked> {
        use std::future::Future as _;
        match work.poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
            std::task::Poll::Ready(finished) => finished,
            std::task::Poll::Pending => panic!("a handler with nothing to wait for must be ready"),
        }
    }

    #[test]
    fn a_panic_in_a_handlers_body_or_its_drop_is_caught_not_unwound() {
        let answers = CatchPanic(Some(Box::pin(async { Ok(json!(1)) })));
        assert!(matches!(poll_once(std::pin::pin!(answers)), Ok(Ok(_))));
        let panics = CatchPanic(Some(Box::pin(async { panic!("in the body") })));
        assert!(matches!(poll_once(std::pin::pin!(panics)), Err(Panicked)));
        struct PanicsOnDrop;
        impl Drop for PanicsOnDrop {
            fn drop(&mut self) {
                panic!("in drop");
            }
        }
        let panics_on_drop = CatchPanic(Some(Box::pin(Holding(PanicsOnDrop))));
        assert!(matches!(poll_once(std::pin::pin!(panics_on_drop)), Err(Panicked)));
    }

    #[test]
    fn a_finished_handler_is_dropped_at_once() {
        let held = Arc::new(());
        let mut work = std::pin::pin!(CatchPanic(Some(Box::pin(Holding(Arc::clone(&held))))));
        assert!(matches!(poll_once(work.as_mut()), Ok(Ok(_))));
        assert_eq!(Arc::strong_count(&held), 1, "the finished handler still holds what it captured");
    }

    #[test]
    fn a_trailer_ends_every_request_of_the_stream() {
        let error = Refusal::RequestAborted.error("gone");
        let stream = StreamName::parse("b1").expect("a stream name");
        let responses =
            trailer(&RequestKey::Batch { stream, ids: vec![RequestId::Number(1), RequestId::Number(2)] }, &error);
        let ids: Vec<_> = responses
            .iter()
            .map(|bytes| match tether_core::jsonrpc::parse_message(bytes) {
                Ok(Message::Response(Response { id, outcome: Err(e) })) => (id, e.reason().map(str::to_owned)),
                other => panic!("not an error response: {other:?}"),
            })
            .collect();
        let aborted = Some("request_aborted".to_owned());
        assert_eq!(ids, [(Some(RequestId::Number(1)), aborted.clone()), (Some(RequestId::Number(2)), aborted)]);
    }
}
