//! The `io.tether/idempotency` extension: a request carrying a key runs at most once, in any
//! session and in both eras, and a re-send gets the first one's outcome.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tether_server::{Builder, Context, Handler, HandlerFuture, ServerConfig, ServerInfo};

use crate::common::*;

const KEY: &str = "6f1c8a4e-1d2b-4c3a-9e8f-0a1b2c3d4e5f";

/// One tool, `slow`: counts its runs, sends `steps` progress notifications 50 ms apart (each
/// after one whose params are no object, with `"odd": true`), and returns how many times it ran
/// so far.
struct Slow(Arc<AtomicUsize>);

impl Handler for Slow {
    fn info(&self) -> ServerInfo {
        tools_info("slow")
    }

    fn call(&self, ctx: Context, _method: String, params: Value) -> HandlerFuture {
        let runs = Arc::clone(&self.0);
        Box::pin(async move {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            let steps = params["arguments"]["steps"].as_u64().unwrap_or(0);
            for step in 1..=steps {
                if params["arguments"]["odd"] == true {
                    let _ = ctx.notify("notifications/progress", json!(["odd"])).await;
                }
                let _ = ctx.progress(step as f64, Some(steps as f64), None).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(json!({"content": [], "structuredContent": {"run": run}}))
        })
    }
}

fn keyed(name: &str, arguments: Value, key: &str, token: Option<&str>) -> Value {
    let mut meta = json!({"io.tether/idempotencyKey": key});
    if let Some(token) = token {
        meta["progressToken"] = json!(token);
    }
    json!({"name": name, "arguments": arguments, "_meta": meta})
}

async fn call(client: &Client, session: &Session, id: i64, params: Value) -> reqwest::Response {
    client.post(Some(session), &request(json!(id), "tools/call", params)).send().await.expect("tools/call")
}

async fn counter(client: &Client, session: &Session) -> i64 {
    let response = client.call(session, json!(99), "counter_get", json!({"key": "k"})).await;
    json_body(response).await["result"]["structuredContent"]["value"].as_i64().expect("counter value")
}

#[tokio::test]
async fn a_known_key_is_answered_from_its_record_in_any_session() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let first = client.initialize("2025-11-25").await;
    let add = keyed("counter_add", json!({"key": "k", "amount": 5}), KEY, None);
    let answered = json_body(call(&client, &first, 1, add.clone()).await).await;
    assert_eq!(answered["result"]["structuredContent"]["value"], 5);
    // A new session (the client re-initialized after a divergence) re-sends it under a new id.
    let second = client.initialize("2025-11-25").await;
    let again = json_body(call(&client, &second, 7, add).await).await;
    assert_eq!(again["id"], 7);
    assert_eq!(again["result"], answered["result"], "the recorded outcome, not a second run");
    assert_eq!(counter(&client, &second).await, 5);
}

/// The idempotency capability `server/discover` offers (`Null` without one).
async fn discovered(client: &Client) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 9, "method": "server/discover", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}});
    let response = client
        .post(None, &body)
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "server/discover")
        .send()
        .await
        .expect("discover");
    let discovered = json_body(response).await;
    discovered["result"]["capabilities"]["experimental"]["io.tether/idempotency"].clone()
}

#[tokio::test]
async fn the_capability_names_the_records_and_is_absent_when_off() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let body = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let offered = json_body(client.post(None, &body).send().await.expect("initialize")).await;
    let capability = &offered["result"]["capabilities"]["experimental"]["io.tether/idempotency"];
    assert_eq!(capability["version"], 1);
    assert!(capability["records"].as_str().is_some_and(|r| !r.is_empty()), "{capability}");
    // 2026-07-28 clients learn it from server/discover: the same offer.
    assert_eq!(discovered(&client).await, *capability);

    let off = start(ServerConfig { idempotency: false, ..config() }).await;
    let client = Client::new(&off);
    let plain = json_body(client.post(None, &body).send().await.expect("initialize")).await;
    assert!(plain["result"]["capabilities"]["experimental"].get("io.tether/idempotency").is_none());
    assert_eq!(discovered(&client).await, Value::Null);
    let session = client.initialize("2025-11-25").await;
    let add = keyed("counter_add", json!({"key": "k", "amount": 1}), KEY, None);
    call(&client, &session, 1, add.clone()).await;
    call(&client, &session, 2, add).await;
    assert_eq!(counter(&client, &session).await, 2, "without the extension a key means nothing");
}

#[tokio::test]
async fn a_key_reused_with_other_params_or_malformed_is_invalid_params() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    call(&client, &session, 1, keyed("counter_add", json!({"key": "k", "amount": 1}), KEY, None)).await;
    let other =
        json_body(call(&client, &session, 2, keyed("counter_add", json!({"key": "k", "amount": 2}), KEY, None)).await)
            .await;
    assert_eq!(
        (other["error"]["code"].as_i64(), other["error"]["data"]["reason"].as_str()),
        (Some(-32602), Some("idempotency_key_reused"))
    );
    // Another progress token is not other params.
    let token = json_body(
        call(&client, &session, 3, keyed("counter_add", json!({"key": "k", "amount": 1}), KEY, Some("t"))).await,
    )
    .await;
    assert_eq!(token["result"]["structuredContent"]["value"], 1);
    for bad in ["", "has space", &"k".repeat(129)] {
        let malformed = json_body(
            call(&client, &session, 4, keyed("counter_add", json!({"key": "k", "amount": 1}), bad, None)).await,
        )
        .await;
        assert_eq!(
            (malformed["error"]["code"].as_i64(), malformed["error"]["data"]["reason"].as_str()),
            (Some(-32602), Some("invalid_idempotency_key")),
            "{bad:?}"
        );
    }
    assert_eq!(counter(&client, &session).await, 1);
}

#[tokio::test]
async fn a_resend_while_the_original_runs_attaches_to_it() {
    let runs = Arc::new(AtomicUsize::new(0));
    let server = start_with(Builder::new(Slow(Arc::clone(&runs))).config(config())).await;
    let client = Client::new(&server);
    let (a, b) = (client.initialize("2025-11-25").await, client.initialize("2025-11-25").await);
    let mut original = call(&client, &a, 1, keyed("slow", json!({"steps": 8}), KEY, Some("first"))).await;
    let first = messages(&events(&mut original, 3).await);
    assert_eq!(first.last().expect("progress")["params"]["progress"], 2.0);
    let mut attached = call(&client, &b, 2, keyed("slow", json!({"steps": 8}), KEY, Some("second"))).await;
    let (events, ended) = drain(&mut attached).await;
    assert!(ended);
    let relayed = messages(&events);
    let (progress, response) = relayed.split_at(relayed.len() - 1);
    assert!(!progress.is_empty() && progress.iter().all(|p| p["params"]["progressToken"] == "second"), "{relayed:?}");
    let steps: Vec<f64> = progress.iter().filter_map(|p| p["params"]["progress"].as_f64()).collect();
    assert!(steps.windows(2).all(|w| w[0] < w[1]) && steps[0] > 2.0 && steps.last() == Some(&8.0), "{steps:?}");
    assert_eq!((response[0]["id"].as_i64(), &response[0]["result"]["structuredContent"]["run"]), (Some(2), &json!(1)));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "attached, not run again");
}

/// A progress notification of the original whose params are no object (as an upstream behind a
/// gateway may send) cannot carry the re-send's token: it is not relayed, and the re-send still
/// gets the original's outcome.
#[tokio::test]
async fn a_resend_attached_to_an_original_sending_odd_progress_still_gets_its_outcome() {
    let runs = Arc::new(AtomicUsize::new(0));
    let server = start_with(Builder::new(Slow(Arc::clone(&runs))).config(config())).await;
    let client = Client::new(&server);
    let (a, b) = (client.initialize("2025-11-25").await, client.initialize("2025-11-25").await);
    let arguments = json!({"steps": 6, "odd": true});
    let mut original = call(&client, &a, 1, keyed("slow", arguments.clone(), KEY, Some("first"))).await;
    events(&mut original, 3).await;
    let mut attached = call(&client, &b, 2, keyed("slow", arguments, KEY, Some("second"))).await;
    let (events, ended) = drain(&mut attached).await;
    assert!(ended);
    let relayed = messages(&events);
    let (progress, response) = relayed.split_at(relayed.len() - 1);
    assert!(progress.iter().all(|p| p["params"]["progressToken"] == "second"), "{relayed:?}");
    assert_eq!((response[0]["id"].as_i64(), &response[0]["result"]["structuredContent"]["run"]), (Some(2), &json!(1)));
}

/// A 2026-07-28 call of `slow` with `steps` under key `KEY`.
fn keyed_2026(client: &Client, id: i64, steps: u64) -> reqwest::RequestBuilder {
    let mut params = keyed("slow", json!({"steps": steps}), KEY, Some("p"));
    params["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
    params["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({});
    stateless_post(client, json!(id), "tools/call", params)
}

#[tokio::test]
async fn a_keyed_2026_request_runs_on_when_its_stream_closes_and_a_resend_gets_the_outcome() {
    let runs = Arc::new(AtomicUsize::new(0));
    let server = start_with(Builder::new(Slow(Arc::clone(&runs))).config(config())).await;
    let client = Client::new(&server);
    let mut dropped = keyed_2026(&client, 1, 4).send().await.expect("send");
    assert_eq!(events(&mut dropped, 1).await.len(), 1);
    drop(dropped);
    // Without a stream of its own the original's outcome is waited for, then answered as JSON.
    let answer = json_body(keyed_2026(&client, 2, 4).send().await.expect("send")).await;
    assert_eq!((answer["id"].as_i64(), &answer["result"]["structuredContent"]["run"]), (Some(2), &json!(1)));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "a closed stream does not cancel a keyed request");
}

#[tokio::test]
async fn a_keyed_2026_request_answered_on_its_stream_is_answered_from_its_record_when_sent_again() {
    let runs = Arc::new(AtomicUsize::new(0));
    let server = start_with(Builder::new(Slow(Arc::clone(&runs))).config(config())).await;
    let client = Client::new(&server);
    let mut first = keyed_2026(&client, 1, 2).send().await.expect("send");
    let (events, ended) = drain(&mut first).await;
    assert!(ended);
    let answered = messages(&events);
    assert_eq!(answered.last().expect("the response")["result"]["structuredContent"]["run"], 1, "{answered:?}");
    let again = tokio::time::timeout(WAIT, keyed_2026(&client, 2, 2).send()).await.expect("answered").expect("send");
    let answer = json_body(again).await;
    assert_eq!((answer["id"].as_i64(), &answer["result"]["structuredContent"]["run"]), (Some(2), &json!(1)));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "answered from the record, not run again");
}

/// Counters whose first addition is made, then answered as a broken connection: a Redis whose
/// reply is lost as it fails over.
struct LosingCounters {
    inner: tether_store::MemoryStore,
    additions: AtomicUsize,
}

impl tether_store::CounterStore for LosingCounters {
    fn counter_add(&self, key: &str, amount: i64, once: Option<&str>) -> tether_store::StoreFuture<'_, i64> {
        let (key, once) = (key.to_owned(), once.map(str::to_owned));
        Box::pin(async move {
            let value = self.inner.counter_add(&key, amount, once.as_deref()).await?;
            match self.additions.fetch_add(1, Ordering::SeqCst) {
                0 => Err(tether_store::StoreError::Backend("broken pipe".into())),
                _ => Ok(value),
            }
        })
    }

    fn counter_get(&self, key: &str) -> tether_store::StoreFuture<'_, i64> {
        self.inner.counter_get(key)
    }
}

/// A keyed `counter_add` (a handler that keys its own effects) whose store failed under it is
/// answered `store_unavailable`, and its key is left free: the re-send that answer asks for
/// runs it again and gets the value the first run made, where a recorded failure would be all
/// any re-send got. The re-send shows the claim the first answer acknowledged, as tether's
/// client does: released, that claim is no sign of records gone back in time.
#[tokio::test]
async fn a_keyed_call_failed_by_its_store_is_run_again_when_sent_again() {
    let counters = Arc::new(LosingCounters {
        inner: tether_store::MemoryStore::new(tether_store::Retention::default()),
        additions: AtomicUsize::new(0),
    });
    let handler = tether_builtin::BuiltinHandler::new(Arc::clone(&counters) as Arc<dyn tether_store::CounterStore>);
    let server = start_with(Builder::new(handler).config(config())).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let add = keyed("counter_add", json!({"key": "k", "amount": 5}), KEY, None);
    let first = call(&client, &session, 1, add.clone()).await;
    let claimed = first.headers().get("x-mcp-idempotency-claim").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let claimed = claimed.and_then(|v| tether_core::idempotency::Acknowledged::from_header(&v)).expect("a claim");
    let failed = json_body(first).await;
    assert_eq!(failed["error"]["data"]["reason"], "store_unavailable", "{failed}");
    let mut shown = add.clone();
    shown["_meta"]["io.tether/idempotencyClaim"] = claimed.to_meta();
    let again = json_body(call(&client, &session, 2, shown).await).await;
    assert_eq!(again["result"]["structuredContent"]["value"], 5, "run again, the addition made once: {again}");
    let replayed = json_body(call(&client, &session, 3, add).await).await;
    assert_eq!(replayed["result"], again["result"], "recorded once it ran to its result");
    assert_eq!(counters.additions.load(Ordering::SeqCst), 2);
    assert_eq!(counter(&client, &session).await, 5);
}

/// One tool, `flaky`, that keys its own effects: its first run waits for `fail`, then fails as
/// its store did; later runs return their number.
struct Flaky {
    runs: Arc<AtomicUsize>,
    fail: Arc<tokio::sync::Notify>,
}

impl Handler for Flaky {
    fn info(&self) -> ServerInfo {
        tools_info("flaky")
    }

    fn resumable(&self, _method: &str, _params: &Value) -> bool {
        true
    }

    fn call(&self, _ctx: Context, _method: String, _params: Value) -> HandlerFuture {
        let (runs, fail) = (Arc::clone(&self.runs), Arc::clone(&self.fail));
        Box::pin(async move {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            if run == 1 {
                fail.notified().await;
                return Err(tether_server::Refusal::StoreUnavailable.error("broken pipe"));
            }
            Ok(json!({"content": [], "structuredContent": {"run": run}}))
        })
    }
}

/// A server whose `flaky` tool's first run fails `store_unavailable` once a 2026-07-28 re-send
/// of it waits for its record (having no stream to follow). Request 1, the original, and
/// request 2, the waiter, are sent under `KEY`; with `failing_claim`, that many claims of the
/// key succeed and the store fails the next (the third is the waiter's own). Returns the
/// server, a client, the two answers, and the tool's runs.
async fn original_released_under_a_waiter(
    failing_claim: Option<u32>,
) -> (TestServer, Client, Value, Value, Arc<AtomicUsize>) {
    use tether_store::faults::{Call, FaultyStore};
    let store =
        Arc::new(FaultyStore::new(Arc::new(tether_store::MemoryStore::new(tether_store::Retention::default()))));
    if let Some(skip) = failing_claim {
        store.fail(Call::ClaimKey, skip, 1);
    }
    let (runs, fail) = (Arc::new(AtomicUsize::new(0)), Arc::new(tokio::sync::Notify::new()));
    let handler = Flaky { runs: Arc::clone(&runs), fail: Arc::clone(&fail) };
    let server =
        start_with(Builder::new(handler).config(config()).store(Arc::clone(&store) as Arc<dyn tether_store::Store>))
            .await;
    let client = Client::new(&server);
    let deadline = tokio::time::Instant::now() + WAIT;
    let original = tokio::spawn(flaky_2026(&client, 1).send());
    while runs.load(Ordering::SeqCst) < 1 {
        assert!(tokio::time::Instant::now() < deadline, "the original runs");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let waiter = tokio::spawn(flaky_2026(&client, 2).send());
    // The waiter claimed the key too, found the original running, and waits for its record.
    while store.calls(Call::ClaimKey) < 2 {
        assert!(tokio::time::Instant::now() < deadline, "the waiter claims the key");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    fail.notify_one();
    let failed = json_body(original.await.expect("joined").expect("sent")).await;
    let waited = tokio::time::timeout(WAIT, waiter).await.expect("answered").expect("joined").expect("sent");
    let waited = json_body(waited).await;
    (server, client, failed, waited, runs)
}

/// A 2026-07-28 call of `flaky` under `KEY`.
fn flaky_2026(client: &Client, id: i64) -> reqwest::RequestBuilder {
    let mut params = keyed("flaky", json!({}), KEY, None);
    params["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
    params["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({});
    stateless_post(client, json!(id), "tools/call", params)
}

/// When the original's store fails under it and its claim is released, a waiter of a handler
/// that keys its own effects claims the key itself and runs: it gets a result, not
/// `idempotency_record_lost`, and that result is what a later re-send replays.
#[tokio::test]
async fn a_waiter_whose_original_released_its_key_runs_a_resumable_request_itself() {
    let (_server, client, failed, ran, runs) = original_released_under_a_waiter(None).await;
    assert_eq!(failed["error"]["data"]["reason"], "store_unavailable", "{failed}");
    assert_eq!(ran["result"]["structuredContent"]["run"], 2, "the waiter ran it: {ran}");
    let replayed = json_body(flaky_2026(&client, 3).send().await.expect("sent")).await;
    assert_eq!(replayed["result"], ran["result"], "its outcome recorded under the key: {replayed}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A waiter that cannot claim the released key (the store fails again) is answered
/// `store_unavailable`, which asks for the re-send that then runs it, not
/// `idempotency_record_lost`, after which a client would not send it again.
#[tokio::test]
async fn a_waiter_that_cannot_claim_a_released_key_is_asked_to_send_it_again() {
    let (_server, client, _, waited, runs) = original_released_under_a_waiter(Some(2)).await;
    assert_eq!(waited["error"]["data"]["reason"], "store_unavailable", "{waited}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "nothing ran for the waiter");
    let again = json_body(flaky_2026(&client, 3).send().await.expect("sent")).await;
    assert_eq!(again["result"]["structuredContent"]["run"], 2, "the re-send ran it: {again}");
}

/// A keyed request whose record was made but whose key's claim failed (a backend that begins
/// and claims in two steps, such as Redis) will never run: its stream is aborted, so a re-send
/// of its id is told so at once instead of waiting for a response that never comes.
#[tokio::test]
async fn a_keyed_request_whose_claim_failed_after_its_record_ends_for_its_re_send() {
    use tether_store::faults::{Call, FaultyStore};
    let store =
        Arc::new(FaultyStore::new(Arc::new(tether_store::MemoryStore::new(tether_store::Retention::default()))));
    store.fail(Call::ClaimKey, 0, 1);
    let runs = Arc::new(AtomicUsize::new(0));
    let builder = Builder::new(Slow(Arc::clone(&runs))).config(config()).store(Arc::clone(&store) as _);
    let server = start_with(builder).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let params = keyed("slow", json!({"steps": 1}), KEY, None);
    let refused = call(&client, &session, 1, params.clone()).await;
    assert_eq!(refused.status(), 503, "the store failed the claim");
    let mut again = call(&client, &session, 1, params).await;
    let (events, ended) = tokio::time::timeout(WAIT, drain(&mut again)).await.expect("the re-send is answered");
    assert!(ended);
    let answer = messages(&events).pop().expect("an answer");
    assert_eq!(
        (answer["id"].clone(), answer["error"]["data"]["reason"].clone()),
        (json!(1), json!("request_aborted")),
        "{answer}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "it never ran");
}
