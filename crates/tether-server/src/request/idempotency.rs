//! Exactly-once execution of requests that carry an idempotency key
//! (`_meta["io.tether/idempotencyKey"]`, see docs/PROTOCOL.md).
//!
//! The key is claimed in the store before the request runs. A request whose key is known never
//! runs again: it gets the recorded outcome, or attaches to the running original, or, if the
//! original's process died mid-run, an explicit `request_aborted` error. What happens to a
//! keyed request is decided here only ([`plan`]); the dispatcher carries the plan out.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tether_core::idempotency::{Acknowledged, IdempotencyKey};
use tether_core::jsonrpc::{self, ErrorObject, Message, RequestId};
use tether_core::lifecycle::{self, RecordGone};
use tether_core::lineage::{Digest, SessionId, StreamName, StreamState};
use tether_core::mcp::{meta, method};
use tether_store::{Claim, KeyClaim, KeyState, Store, StoreError};

use crate::reader::{Ending, Item, StreamReader};
use crate::refusal::Refusal;
use crate::request::context::Context;
use crate::{ServerState, now_ms};
/// The longest pause between two looks at a running original's record.
const MAX_POLL: Duration = Duration::from_millis(250);
/// The first pause between two looks at a record.
const FIRST_POLL: Duration = Duration::from_millis(10);

/// Adds the `io.tether/idempotency` capability to `capabilities` if the extension is on: the
/// version, and the name of the records keys are claimed in, as the store names them now
/// ([`KeyRecords::records`](tether_store::KeyRecords::records)).
pub(crate) async fn advertise(shared: &ServerState, capabilities: &mut Value) -> Result<(), StoreError> {
    if shared.config.idempotency && capabilities.is_object() {
        let records = shared.store.records().await?;
        let capability = json!({"version": 1, "records": records});
        tether_core::mcp::set_experimental(capabilities, meta::IDEMPOTENCY_CAPABILITY, capability);
    }
    Ok(())
}

/// A request's idempotency key, as the store records it.
#[derive(Debug, Clone)]
pub(crate) struct Keyed {
    /// The principal and the key, digested: opaque, bounded, and one principal's keys never meet
    /// another's.
    pub name: String,
    /// The digest of the method and the params without `_meta` (a re-send may carry another
    /// progress token).
    pub params_digest: String,
    /// The key's claim as the client was acknowledged it when it sent the key before.
    pub acknowledged: Option<Acknowledged>,
    /// Its handler keys its own effects ([`Handler::resumable`](crate::Handler::resumable)):
    /// running it again applies nothing twice.
    pub resumable: bool,
}

impl Keyed {
    /// The key `params` carry, if the extension is on and they carry one; a malformed key is an
    /// invalid-params error.
    pub fn of(
        shared: &ServerState,
        principal: Option<&str>,
        method: &str,
        params: &Value,
    ) -> Result<Option<Keyed>, ErrorObject> {
        if !shared.config.idempotency {
            return Ok(None);
        }
        let Some(raw) = params.get("_meta").and_then(|m| m.get(meta::IDEMPOTENCY_KEY)) else { return Ok(None) };
        let key = raw.as_str().and_then(|k| IdempotencyKey::parse(k).ok()).ok_or_else(|| {
            Refusal::InvalidIdempotencyKey
                .error(format!("_meta[{:?}] must be 1 to 128 printable ASCII characters", meta::IDEMPOTENCY_KEY))
        })?;
        let acknowledged = match params.get("_meta").and_then(|m| m.get(meta::IDEMPOTENCY_CLAIM)) {
            None => None,
            Some(shown) => Some(Acknowledged::from_meta(shown).ok_or_else(|| {
                Refusal::InvalidIdempotencyKey.error(format!(
                    "_meta[{:?}] must be {{\"records\": <the X-MCP-Idempotency-Claim records>, \"position\": <its position>}}",
                    meta::IDEMPOTENCY_CLAIM
                ))
            })?),
        };
        let principal = principal.unwrap_or_default();
        let name = Digest::of(&format!("idempotency {} {principal}", principal.len()), key.as_str().as_bytes());
        // The params without `_meta`, serialized without copying them (the map is ordered, so
        // the bytes are those of the params less that member).
        let bare = match params {
            Value::Object(map) => {
                let bare: std::collections::BTreeMap<_, _> = map.iter().filter(|(k, _)| *k != "_meta").collect();
                serde_json::to_string(&bare).expect("a map of strings to serde_json::Values serializes")
            }
            other => other.to_string(),
        };
        let params_digest = Digest::of(method, bare.as_bytes());
        Ok(Some(Keyed {
            name: name.to_string(),
            params_digest: params_digest.to_string(),
            acknowledged,
            resumable: shared.handler.resumable(method, params),
        }))
    }

    /// The claim of this key by a request whose events go to `stream`.
    pub fn claim(&self, stream: Option<(SessionId, StreamName)>) -> KeyClaim {
        KeyClaim {
            key: self.name.clone(),
            params_digest: self.params_digest.clone(),
            stream,
            now_ms: now_ms(),
            acknowledged: self.acknowledged.clone(),
        }
    }
}

/// What a keyed request does.
#[derive(Debug)]
pub(crate) enum Plan {
    /// Its key is new (or was taken over): run the handler and record the outcome.
    Run,
    /// Its key is known: answer from the original request.
    Answer(Answer),
}

/// How a request whose key is known is answered, without running anything.
#[derive(Debug)]
pub(crate) enum Answer {
    /// The original finished: its recorded outcome.
    Replay(Result<Value, ErrorObject>),
    /// The original is running, or stopped: what remains of its stream, then its outcome. With
    /// `request`, the stream is shared (a batch's): only that request's response is the outcome,
    /// and nothing else of the stream is relayed.
    Follow { session: SessionId, stream: StreamName, request: Option<RequestId> },
    /// The original is running without a stream (2026-07-28): its outcome, once recorded.
    Await,
    /// This error.
    Fail(ErrorObject),
}

/// Decides what a request does whose `claim` the store answered with `claimed`.
/// `resumable`: the handler keys its own effects, so running an abandoned request again applies
/// nothing twice, and is better than an `aborted` answer.
pub(crate) async fn plan(
    store: &Arc<dyn Store>,
    claim: KeyClaim,
    claimed: Claim,
    resumable: bool,
) -> Result<Plan, StoreError> {
    let (same_params, state) = match claimed {
        Claim::Claimed(_) => return Ok(Plan::Run),
        Claim::Existing { same_params, state, .. } => (same_params, state),
        Claim::Regressed => return Ok(Plan::Answer(Answer::Fail(records_regressed()))),
    };
    if !same_params {
        return Ok(Plan::Answer(Answer::Fail(
            Refusal::IdempotencyKeyReused.error("this idempotency key was used for a request with other params"),
        )));
    }
    Ok(Plan::Answer(match state {
        KeyState::Finished(outcome) => Answer::Replay(decode(&outcome)),
        KeyState::Running { abandoned: true, .. } if take_over_abandoned(store, resumable, claim).await? => {
            return Ok(Plan::Run);
        }
        KeyState::Running { stream: Some((session, stream)), .. } => Answer::Follow { session, stream, request: None },
        KeyState::Running { stream: None, abandoned: false } => Answer::Await,
        KeyState::Running { stream: None, abandoned: true } => Answer::Fail(aborted()),
    }))
}

/// What became of a request whose key is known.
pub(crate) enum Answered {
    /// It has the original's outcome, or the reason it has none.
    Outcome(Result<Value, ErrorObject>),
    /// It took the key over ([`take_over`]) and is to run under `claim`, which is released
    /// unless it does.
    Run(Keyed, ClaimGuard),
}

/// Carries out `answer` for the request of `ctx`: its outcome is the original's, unless the
/// key's record went while it waited ([`take_over`]), or its original's process stopped
/// ([`take_over_abandoned`]), and it takes the key over. Without a key
/// (a batch's request whose id was sent before), an original whose stream ended without the
/// response is answered as the stream ended: `request_aborted`, or `request_history_expired`.
pub(crate) async fn answer(ctx: Context, keyed: Option<Keyed>, answer: Answer) -> Answered {
    let store = Arc::clone(ctx.store());
    let (awaited, keyed) = match (answer, keyed) {
        (Answer::Replay(outcome), _) => return Answered::Outcome(outcome),
        (Answer::Fail(error), _) => return Answered::Outcome(Err(error)),
        (Answer::Follow { session, stream, request }, Some(keyed)) => {
            // The stream and the key's record are watched both: whichever has the outcome first
            // answers, so a stream that never ends cannot keep the re-send waiting.
            let awaited = {
                let relayed = relay(&ctx, &session, stream, request);
                let recorded = await_outcome(&store, &keyed.name);
                tokio::pin!(relayed, recorded);
                tokio::select! {
                    biased;
                    relayed = &mut relayed => match relayed {
                        Relayed::Outcome(outcome) => Awaited::Outcome(outcome),
                        // The key's record knows more than the stream.
                        Relayed::Aborted | Relayed::Lost => recorded.await,
                    },
                    awaited = &mut recorded => awaited,
                }
            };
            (awaited, keyed)
        }
        (Answer::Follow { session, stream, request }, None) => {
            return Answered::Outcome(match relay(&ctx, &session, stream, request).await {
                Relayed::Outcome(outcome) => outcome,
                Relayed::Aborted => Err(aborted()),
                Relayed::Lost => Err(history_expired()),
            });
        }
        (Answer::Await, Some(keyed)) => (await_outcome(&store, &keyed.name).await, keyed),
        (Answer::Await, None) => return Answered::Outcome(Err(history_expired())),
    };
    after_waiting(&store, keyed, awaited).await
}

/// What a request that waited for its key's original does once the wait came to `awaited`:
/// answered with the original's outcome, or run under the key taken over (the original's
/// process stopped, or its record went, and the handler may run again).
async fn after_waiting(store: &Arc<dyn Store>, keyed: Keyed, mut awaited: Awaited) -> Answered {
    loop {
        match awaited {
            Awaited::Outcome(outcome) => return Answered::Outcome(outcome),
            Awaited::Abandoned => match take_over_abandoned(store, keyed.resumable, keyed.claim(None)).await {
                Ok(true) => {
                    let claim = ClaimGuard::new(store, &keyed.name);
                    return Answered::Run(keyed, claim);
                }
                // Another request took the key over first, or the original finished meanwhile:
                // its outcome is awaited.
                Ok(false) if keyed.resumable => {}
                Ok(false) => return Answered::Outcome(Err(aborted())),
                Err(err) => {
                    return Answered::Outcome(Err(Refusal::of_store_failure(&err).error(format!(
                        "the original of this request stopped before it finished, and taking its key over \
                         failed: {err}"
                    ))));
                }
            },
            Awaited::Gone => return gone(store, keyed).await,
        }
        tokio::time::sleep(FIRST_POLL).await;
        awaited = await_outcome(store, &keyed.name).await;
    }
}

/// What a request whose key's record went while it waited does: it claims the key and runs, if
/// [`lifecycle::record_gone`] says it may.
async fn gone(store: &Arc<dyn Store>, keyed: Keyed) -> Answered {
    match take_over(store, &keyed).await {
        Ok(Some(claim)) => Answered::Run(keyed, claim),
        Ok(None) => Answered::Outcome(Err(record_lost())),
        // Sent again, the request finds the key free and runs, which a resumable one may.
        Err(err) => Answered::Outcome(Err(Refusal::of_store_failure(&err).error(format!(
            "the record of this idempotency key went while this request waited for the original, and \
                 claiming it failed: {err}"
        )))),
    }
}

/// Takes over, with `claim`, the key of a request whose original's process stopped before it
/// finished, if its handler keys its own effects (`resumable`), so that running it again
/// applies nothing twice: whether it did (not if it may not, or if the key is no longer
/// abandoned). For a request that finds the key so, and for one that waited for it.
async fn take_over_abandoned(store: &Arc<dyn Store>, resumable: bool, claim: KeyClaim) -> Result<bool, StoreError> {
    Ok(resumable && store.take_over_key(claim).await?)
}

/// Claims anew the key of a request whose key's record went while it waited for the original
/// (released because the store failed under it, or forgotten), if
/// [`lifecycle::record_gone`] says it runs. `None` if it does not, or if another request claimed
/// the key first: it is answered `idempotency_record_lost`.
async fn take_over(store: &Arc<dyn Store>, keyed: &Keyed) -> Result<Option<ClaimGuard>, StoreError> {
    if lifecycle::record_gone(keyed.resumable) == RecordGone::Unknown {
        return Ok(None);
    }
    Ok(match store.claim_key(keyed.claim(None)).await? {
        Claim::Claimed(_) => Some(ClaimGuard::new(store, &keyed.name)),
        Claim::Existing { .. } | Claim::Regressed => None,
    })
}

/// How following the original's stream ended.
enum Relayed {
    /// With its response.
    Outcome(Result<Value, ErrorObject>),
    /// Its producer died first.
    Aborted,
    /// Without the response: gone, or no longer retained.
    Lost,
}

/// Relays the notifications the original sends from now on, and returns its response if its
/// stream carries it. A shared stream (`request` names the original's id) is read from its
/// start, for that response only.
async fn relay(ctx: &Context, session: &SessionId, stream: StreamName, request: Option<RequestId>) -> Relayed {
    let store = Arc::clone(ctx.store());
    let Ok(Some(range)) = store.stream_range(session, &stream).await else { return Relayed::Lost };
    // A running original's notifications from now on; of an ended one, only its last event,
    // which may be the response it recorded (what it sent before was for its own client).
    let live = range.state == StreamState::Live;
    let from = match (&request, live) {
        (Some(_), _) => 0,
        (None, true) => range.head,
        (None, false) => range.head.saturating_sub(1),
    };
    let forwarding = live && request.is_none();
    let mut reader = StreamReader::new(store, session, stream, from);
    loop {
        let Ok(items) = reader.read().await else { return Relayed::Lost };
        for item in &items {
            match item {
                Item::Event(event) => match jsonrpc::parse_message(&event.data) {
                    Ok(Message::Response(response)) if request.is_none() || response.id == request => {
                        return Relayed::Outcome(response.outcome);
                    }
                    Ok(Message::Notification(notification)) if forwarding => forward(ctx, notification).await,
                    // The original's requests to the client are answered on its own stream.
                    _ => {}
                },
                // Notifications lost to retention are not relayed; a lost response shows as the end.
                Item::Gap(..) => {}
                Item::End(Ending::Aborted(..)) => return Relayed::Aborted,
                Item::End(_) => return Relayed::Lost,
            }
        }
        if items.is_empty() && reader.changed().await.is_err() {
            return Relayed::Lost;
        }
    }
}

/// Sends the original's notification as this request's: progress carries this request's token
/// (and is dropped if it asked for none, or if its params are no object to carry one).
async fn forward(ctx: &Context, notification: jsonrpc::Notification) {
    let mut params = notification.params.unwrap_or_else(|| json!({}));
    if notification.method == method::PROGRESS {
        let (Some(token), Some(fields)) = (ctx.progress_token(), params.as_object_mut()) else { return };
        fields.insert("progressToken".to_owned(), token.clone());
    }
    if let Err(err) = ctx.notify(&notification.method, params).await {
        tracing::debug!(%err, "relaying a notification of an attached request");
    }
}

/// What waiting for the original's record came to.
enum Awaited {
    /// Its outcome, or why there is none.
    Outcome(Result<Value, ErrorObject>),
    /// The original's process stopped before it finished.
    Abandoned,
    /// The record went: released, or forgotten.
    Gone,
}

/// Waits until the original's record holds its outcome, or says its process died, or is gone.
async fn await_outcome(store: &Arc<dyn Store>, name: &str) -> Awaited {
    let mut pause = FIRST_POLL;
    loop {
        match store.key_state(name, now_ms()).await {
            Ok(Some(KeyState::Finished(outcome))) => return Awaited::Outcome(decode(&outcome)),
            Ok(Some(KeyState::Running { abandoned: true, .. })) => return Awaited::Abandoned,
            Ok(Some(KeyState::Running { abandoned: false, .. })) => {}
            Ok(None) => return Awaited::Gone,
            Err(err) => return Awaited::Outcome(Err(Refusal::StoreFailed.error(err.to_string()))),
        }
        tokio::time::sleep(pause).await;
        pause = next_pause(pause);
    }
}

/// The pause after `pause` between two looks at a record: twice as long, up to `MAX_POLL`.
fn next_pause(pause: Duration) -> Duration {
    (pause * 2).min(MAX_POLL)
}

/// Records `outcome` as the outcome of this process's claim of `key`, trying until the store
/// takes it: a key left running by a live process keeps every re-send waiting.
pub(crate) async fn finish(store: &dyn Store, key: &str, outcome: Bytes) {
    if let Err(err) =
        crate::persist::until_stored("a keyed request's outcome", || store.finish_key(key, outcome.clone())).await
    {
        tracing::error!(%err, key, "could not record a keyed request's outcome");
    }
}

/// Releases this process's claim of `key`, trying until the store takes it: a re-send then runs
/// the request. Left claimed by a live process, the key would keep every re-send waiting.
pub(crate) async fn release(store: &dyn Store, key: &str) {
    if let Err(err) = crate::persist::until_stored("the release of a key's claim", || store.release_key(key)).await {
        tracing::warn!(%err, key, "could not release the claim of a keyed request");
    }
}

/// A key this process claimed for a request that is not running yet. Dropped before the request
/// runs (it could not start, or its start failed or panicked), it releases the claim, so that a
/// re-send runs the request instead of waiting for an owner that will never finish it.
pub(crate) struct ClaimGuard {
    store: Arc<dyn Store>,
    key: Option<String>,
}

impl ClaimGuard {
    /// The claim of `key`, released unless [`ClaimGuard::running`] is called.
    pub fn new(store: &Arc<dyn Store>, key: &str) -> ClaimGuard {
        ClaimGuard { store: Arc::clone(store), key: Some(key.to_owned()) }
    }

    /// The request runs: its run records the key's outcome.
    pub fn running(mut self) {
        self.key = None;
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        let store = Arc::clone(&self.store);
        let release = async move { release(store.as_ref(), &key).await };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(release)),
            Err(_) => tracing::warn!("a claim of a request that never ran outlived the runtime: it stays claimed"),
        }
    }
}

/// The answer for a key whose request's process stopped before it finished.
pub(crate) fn aborted() -> ErrorObject {
    Refusal::RequestAborted.error("the server running this request stopped before it finished; it may have partly run")
}

/// The answer for a request whose stream no longer holds its response: it ran (or runs), but
/// its outcome is no longer retained where this request looked.
pub(crate) fn history_expired() -> ErrorObject {
    Refusal::RequestHistoryExpired.error("this request's outcome is no longer retained; its stream's history expired")
}

/// The answer for a key whose claim, as the client was acknowledged it, the records no longer
/// hold: they went back in time, so whether the request ran is unknown, and it is not run again.
pub(crate) fn records_regressed() -> ErrorObject {
    Refusal::RecordsRegressed.error(
        "the idempotency records no longer hold this key's claim as they acknowledged it (the store went back in \
         time); the request may have run, and was not run again",
    )
}

/// The answer for a key whose record went while its request waited for the original, when the
/// request does not run itself ([`take_over`]).
fn record_lost() -> ErrorObject {
    Refusal::IdempotencyRecordLost.error(
        "the record of this idempotency key went while this request waited for the original (released, or \
         forgotten); the request may have run",
    )
}

/// The outcome recorded for a keyed request that was cancelled.
pub(crate) fn cancelled() -> ErrorObject {
    Refusal::RequestCancelled.error("the request was cancelled before it finished; it may have partly run")
}

/// An outcome as the store records it: a JSON-RPC response with id 0, so the message codec
/// reads it back.
pub(crate) fn encode(outcome: &Result<Value, ErrorObject>) -> Bytes {
    let response = jsonrpc::Response { id: Some(jsonrpc::RequestId::Number(0)), outcome: outcome.clone() };
    Bytes::from(Message::Response(response).to_vec())
}

fn decode(bytes: &[u8]) -> Result<Value, ErrorObject> {
    match jsonrpc::parse_message(bytes) {
        Ok(Message::Response(response)) => response.outcome,
        _ => Err(Refusal::StoreFailed.error("the recorded outcome is unreadable")),
    }
}

#[cfg(test)]
mod tests {
    use tether_store::KeyRecords;

    use super::*;

    #[test]
    fn outcomes_round_trip_through_their_record() {
        let result = Ok(json!({"content": [], "structuredContent": {"value": 3}}));
        assert_eq!(decode(&encode(&result)), result);
        let error = Err(aborted());
        assert_eq!(decode(&encode(&error)), error);
        assert_eq!(decode(b"{}").map_err(|e| e.reason().map(str::to_owned)), Err(Some("store_failed".into())));
    }

    /// A store that fails the finishes of a key for longer than a fenced write is refused in a
    /// failover (twenty failures, about sixteen seconds) does not leave the key running: the
    /// outcome is recorded once the store takes it (paused clock: the pauses between tries).
    #[tokio::test(start_paused = true)]
    async fn an_outcome_is_recorded_through_failures_of_the_store() {
        use tether_store::faults::{Call, FaultyStore};
        let store = FaultyStore::new(Arc::new(tether_store::MemoryStore::new(tether_store::Retention::default())));
        let claim =
            KeyClaim { key: "k".into(), params_digest: "d".into(), stream: None, now_ms: 1, acknowledged: None };
        assert!(matches!(store.claim_key(claim).await, Ok(Claim::Claimed(_))));
        store.fail(Call::FinishKey, 0, 20);
        let outcome = encode(&Ok(json!({"done": true})));
        finish(&store, "k", outcome.clone()).await;
        assert_eq!(store.calls(Call::FinishKey), 21, "tried until the store took it");
        assert_eq!(store.key_state("k", 2).await, Ok(Some(KeyState::Finished(outcome))));
    }

    /// A claim dropped before its request runs is released, so that a re-send runs the request;
    /// one whose request runs is kept for the run to finish.
    #[tokio::test]
    async fn a_claim_whose_request_never_ran_is_released() {
        let store: Arc<dyn Store> = Arc::new(tether_store::MemoryStore::new(tether_store::Retention::default()));
        let claim = |key: &str| KeyClaim {
            key: key.into(),
            params_digest: "d".into(),
            stream: None,
            now_ms: 1,
            acknowledged: None,
        };
        for key in ["dropped", "running"] {
            assert!(matches!(store.claim_key(claim(key)).await, Ok(Claim::Claimed(_))));
        }
        drop(ClaimGuard::new(&store, "dropped"));
        ClaimGuard::new(&store, "running").running();
        for _ in 0..100 {
            if store.key_state("dropped", 2).await == Ok(None) {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(store.key_state("dropped", 2).await, Ok(None), "released");
        let running = Some(KeyState::Running { stream: None, abandoned: false });
        assert_eq!(store.key_state("running", 2).await, Ok(running), "kept");
    }

    #[test]
    fn a_record_is_looked_at_less_and_less_often() {
        assert_eq!(next_pause(Duration::from_millis(10)), Duration::from_millis(20));
        assert_eq!(next_pause(MAX_POLL), MAX_POLL);
    }

    #[test]
    fn the_stopped_requests_errors_are_server_errors_with_their_reason() {
        for (error, reason) in [(aborted(), "request_aborted"), (cancelled(), "request_cancelled")] {
            assert_eq!((error.code, error.reason()), (-32000, Some(reason)));
        }
    }

    /// A store in which `claim`'s key was left running by a process that died: an embedded
    /// store reopened by another owner.
    async fn abandoned(claim: &KeyClaim) -> (Arc<dyn Store>, Claim, std::path::PathBuf) {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tether-plan-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let retention = tether_store::Retention::default();
        let dead = tether_store::SqliteStore::open(&dir, retention, "dead").expect("open");
        assert!(matches!(dead.claim_key(claim.clone()).await, Ok(Claim::Claimed(_))));
        drop(dead);
        let store: Arc<dyn Store> =
            Arc::new(tether_store::SqliteStore::open(&dir, retention, "alive").expect("reopen"));
        let claimed = store.claim_key(claim.clone()).await.expect("claim");
        (store, claimed, dir)
    }

    fn claim(stream: Option<(SessionId, StreamName)>) -> KeyClaim {
        KeyClaim { key: "k".into(), params_digest: "d".into(), stream, now_ms: now_ms(), acknowledged: None }
    }

    #[tokio::test]
    async fn an_abandoned_request_is_run_again_only_if_its_handler_resumes_it() {
        let (store, claimed, dir) = abandoned(&claim(None)).await;
        let Claim::Existing { state: KeyState::Running { abandoned: true, .. }, .. } = &claimed else {
            panic!("abandoned, not {claimed:?}")
        };
        let plan_for = |resumable| {
            let (store, claimed) = (Arc::clone(&store), claimed.clone());
            async move { plan(&store, claim(None), claimed, resumable).await.expect("plan") }
        };
        let Plan::Answer(Answer::Fail(error)) = plan_for(false).await else { panic!("not resumable: aborted") };
        assert_eq!(error.reason(), Some("request_aborted"));
        assert!(matches!(plan_for(true).await, Plan::Run), "resumable: taken over and run");
        // Taken over: a later re-send finds it running here, and waits for it.
        let again = store.claim_key(claim(None)).await.expect("claim");
        assert!(matches!(plan(&store, claim(None), again, true).await.expect("plan"), Plan::Answer(Answer::Await)));
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A re-send waiting for its original (following it, or awaiting its record) that finds its
    /// process stopped takes the key over and runs, if its handler keys its own effects; else it
    /// is answered `request_aborted`.
    #[tokio::test]
    async fn a_waiter_whose_original_stopped_runs_it_only_if_its_handler_resumes_it() {
        let (store, _, dir) = abandoned(&claim(None)).await;
        let keyed = |resumable| Keyed { name: "k".into(), params_digest: "d".into(), acknowledged: None, resumable };
        let awaited = await_outcome(&store, "k").await;
        assert!(matches!(awaited, Awaited::Abandoned), "the wait ends at the stopped original");
        let Answered::Outcome(Err(error)) = after_waiting(&store, keyed(false), awaited).await else {
            panic!("not resumable: answered")
        };
        assert_eq!(error.reason(), Some("request_aborted"));
        let awaited = await_outcome(&store, "k").await;
        let Answered::Run(_, claim_guard) = after_waiting(&store, keyed(true), awaited).await else {
            panic!("resumable: taken over and run")
        };
        claim_guard.running();
        let state = store.key_state("k", now_ms()).await;
        assert_eq!(state, Ok(Some(KeyState::Running { stream: None, abandoned: false })), "taken over");
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A waiter that finds its original's process stopped but another request took the key over
    /// first is answered with that request's outcome, not `request_aborted`.
    #[tokio::test]
    async fn a_waiter_that_lost_the_take_over_gets_the_winners_outcome() {
        let (store, _, dir) = abandoned(&claim(None)).await;
        assert_eq!(store.take_over_key(claim(None)).await, Ok(true), "another request takes it over first");
        let keyed = Keyed { name: "k".into(), params_digest: "d".into(), acknowledged: None, resumable: true };
        let outcome = encode(&Ok(json!({"done": true})));
        let (answered, finished) =
            tokio::join!(after_waiting(&store, keyed, Awaited::Abandoned), store.finish_key("k", outcome));
        finished.expect("the winner finishes");
        let Answered::Outcome(outcome) = answered else { panic!("answered, not run again") };
        assert_eq!(outcome, Ok(json!({"done": true})));
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn an_abandoned_request_with_a_stream_is_followed_unless_resumed() {
        let stream = Some((SessionId::parse("s").expect("session id"), StreamName::parse("r1").expect("stream")));
        let (store, claimed, dir) = abandoned(&claim(stream.clone())).await;
        let followed = plan(&store, claim(stream.clone()), claimed.clone(), false).await.expect("plan");
        assert!(matches!(followed, Plan::Answer(Answer::Follow { request: None, .. })), "{followed:?}");
        assert!(matches!(plan(&store, claim(stream), claimed, true).await.expect("plan"), Plan::Run));
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }
}
