//! Every request ends: each race of a request's life written as a deterministic interleaving
//! (a handler that returns exactly when it is cancelled, a store call that fails or waits at a
//! chosen point), on the memory and the embedded store. Each ends in a terminal event on the
//! request's stream, or a key that a re-send can run or read, never in a wait without end.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tether_server::{Builder, Context, Handler, HandlerFuture, ServerInfo, SessionHandle};
use tether_store::faults::{Call, FaultyStore};
use tether_store::{MemoryStore, Retention, SessionEnd, SqliteStore, Store};

use crate::common::*;

const KEY: &str = "lifecycle-key-1";

/// The tools of these tests:
/// - `until_cancelled` sends one notification, then returns as soon as it is cancelled;
/// - `quick` returns at once, the number of its runs so far;
/// - `end_session` ends its session as the server would (an upstream lost), with a grace of
///   two seconds for what runs.
#[derive(Default)]
struct Lifecycle {
    runs: Arc<AtomicUsize>,
    sessions: Arc<Mutex<Vec<SessionHandle>>>,
}

impl Handler for Lifecycle {
    fn info(&self) -> ServerInfo {
        tools_info("lifecycle")
    }

    fn call(&self, ctx: Context, _method: String, params: Value) -> HandlerFuture {
        let runs = Arc::clone(&self.runs);
        let sessions = Arc::clone(&self.sessions);
        Box::pin(async move {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            match params["name"].as_str() {
                Some("until_cancelled") => {
                    let _ = ctx.notify("notifications/message", json!({"level": "info", "data": "running"})).await;
                    ctx.cancelled().await;
                    Ok(json!({"content": [], "structuredContent": {"saw": "the cancellation"}}))
                }
                Some("end_session") => {
                    let session = sessions.lock().expect("sessions").pop().expect("a session");
                    tokio::spawn(async move { session.end(SessionEnd::UpstreamLost, Duration::from_secs(2)).await });
                    Ok(json!({"content": []}))
                }
                _ => Ok(json!({"content": [], "structuredContent": {"run": run}})),
            }
        })
    }

    fn read_only(&self, _method: &str, params: &Value) -> bool {
        params["arguments"]["read_only"] == true
    }

    fn session_started(&self, session: SessionHandle) {
        self.sessions.lock().expect("sessions").push(session);
    }
}

/// A store of each kind, wrapped so that faults can be planned; the directory to remove.
fn stores(name: &str) -> Vec<(&'static str, Arc<FaultyStore>, Option<std::path::PathBuf>)> {
    let dir = std::env::temp_dir().join(format!("tether-lifecycle-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let embedded = SqliteStore::open(&dir, Retention::default(), "lifecycle").expect("open the embedded store");
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new(Retention::default()));
    vec![
        ("memory", Arc::new(FaultyStore::new(memory)), None),
        ("embedded", Arc::new(FaultyStore::new(Arc::new(embedded))), Some(dir)),
    ]
}

async fn serve(store: &Arc<FaultyStore>) -> (TestServer, Arc<AtomicUsize>) {
    serve_with(store, config()).await
}

async fn serve_with(store: &Arc<FaultyStore>, config: tether_server::ServerConfig) -> (TestServer, Arc<AtomicUsize>) {
    let handler = Lifecycle::default();
    let runs = Arc::clone(&handler.runs);
    let store: Arc<dyn Store> = Arc::clone(store) as Arc<dyn Store>;
    (start_with(Builder::new(handler).config(config).store(store)).await, runs)
}

fn call(id: i64, tool: &str, arguments: Value, key: Option<&str>) -> Value {
    let mut params = json!({"name": tool, "arguments": arguments});
    if let Some(key) = key {
        params["_meta"] = json!({"io.tether/idempotencyKey": key});
    }
    request(json!(id), "tools/call", params)
}

fn cancel(id: i64) -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": id, "reason": "test"}})
}

/// The responses among `messages`, asserting there is one and it is the last.
fn the_response(messages: &[Value]) -> &Value {
    let responses: Vec<_> = messages.iter().filter(|m| m.get("id").is_some()).collect();
    assert_eq!(responses.len(), 1, "one response: {messages:?}");
    assert_eq!(messages.last(), Some(responses[0]), "the response ends the stream: {messages:?}");
    responses[0]
}

/// Sends the keyed `quick` call as request 1 in the background and returns once its claim is
/// in the store, held there before the claim returns.
async fn send_with_claim_held(
    store: &FaultyStore,
    client: &Client,
    session: &Session,
) -> (Arc<tether_store::faults::Hold>, tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>) {
    let hold = store.hold_next_after(Call::BeginKeyedRequest);
    let sent = tokio::spawn(client.post(Some(session), &call(1, "quick", json!({}), Some(KEY))).send());
    tokio::time::timeout(WAIT, hold.reached()).await.expect("claimed");
    (hold, sent)
}

/// The answer to the keyed `quick` call sent again as request `id`.
async fn resent(client: &Client, session: &Session, id: i64) -> Value {
    let again = client.post(Some(session), &call(id, "quick", json!({}), Some(KEY))).send().await.expect("send");
    tokio::time::timeout(WAIT, json_body(again)).await.expect("the re-send is answered")
}

/// (1) A handler that returns exactly when it is cancelled is answered with what it returned:
/// the response is not refused for the cancellation, and the stream (2025-06-18: no priming,
/// no connection deadline) ends with it rather than staying open.
#[tokio::test]
async fn a_handler_that_returns_as_it_is_cancelled_is_answered_with_what_it_returned() {
    for (name, store, dir) in stores("returns-on-cancel") {
        let (server, _) = serve(&store).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-06-18").await;
        let mut response =
            client.post(Some(&session), &call(1, "until_cancelled", json!({}), None)).send().await.expect("send");
        assert_eq!(messages(&events(&mut response, 1).await).len(), 1, "{name}: it runs");
        assert_eq!(client.post(Some(&session), &cancel(1)).send().await.expect("send").status(), 202);
        let (rest, ended) = drain(&mut response).await;
        assert!(ended, "{name}: the stream ended");
        let rest = messages(&rest);
        assert_eq!(the_response(&rest)["result"]["structuredContent"]["saw"], "the cancellation", "{name}");
        drop(server);
        dir.map(std::fs::remove_dir_all);
    }
}

/// (1) A final response the store refuses still ends the stream: aborted, with the
/// `request_aborted` error that says the request may have run.
#[tokio::test]
async fn a_final_response_the_store_refuses_ends_the_stream_as_aborted() {
    for (name, store, dir) in stores("final-refused") {
        let (server, runs) = serve(&store).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-06-18").await;
        store.fail_nth(Call::AppendBatch, 1);
        let mut response = client.post(Some(&session), &call(1, "quick", json!({}), None)).send().await.expect("send");
        let (events, ended) = drain(&mut response).await;
        assert!(ended, "{name}: the stream ended");
        let events = messages(&events);
        assert_eq!(the_response(&events)["error"]["data"]["reason"], "request_aborted", "{name}: {events:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}");
        drop(server);
        dir.map(std::fs::remove_dir_all);
    }
}

/// (2) and (3): a keyed request whose response the store refuses, and whose stream the store
/// will not let it abort (it keeps trying), keeps its outcome in its key's record first; a
/// re-send, which follows the stream that does not end, gets that outcome from the record.
#[tokio::test]
async fn a_resend_following_a_stream_that_never_ends_gets_the_recorded_outcome() {
    for (name, store, dir) in stores("never-ends") {
        let (server, runs) = serve(&store).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-06-18").await;
        store.fail_nth(Call::AppendFinal, 1);
        store.fail(Call::AbortStream, 0, 1_000);
        let hold = store.hold_next(Call::AppendFinal);
        let original = tokio::spawn(client.post(Some(&session), &call(1, "quick", json!({}), Some(KEY))).send());
        tokio::time::timeout(WAIT, hold.reached()).await.expect("the original is writing its response");
        // The re-send finds the original running, and follows its stream.
        let again = tokio::spawn(client.post(Some(&session), &call(2, "quick", json!({}), Some(KEY))).send());
        let deadline = tokio::time::Instant::now() + WAIT;
        while store.calls(Call::BeginKeyedRequest) < 2 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        hold.release();
        // The original's stream stays open: its client gives up on it.
        original.abort();
        let again = tokio::time::timeout(WAIT, again).await.expect("answered").expect("task").expect("response");
        let answer = tokio::time::timeout(WAIT, json_body(again)).await.expect("the re-send is answered");
        assert_eq!(answer["result"]["structuredContent"]["run"], 1, "{name}: the original's outcome: {answer}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: run once");
        drop(server);
        dir.map(std::fs::remove_dir_all);
    }
}

/// (3) A keyed POST whose client goes away while its claim is being written: the request is
/// started all the same (never claimed and left without a run), so a re-send gets its outcome.
#[tokio::test]
async fn a_keyed_request_whose_client_leaves_during_its_claim_runs_and_is_answered() {
    for (name, store, dir) in stores("client-leaves") {
        let (server, runs) = serve(&store).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-06-18").await;
        let (hold, sent) = send_with_claim_held(&store, &client, &session).await;
        // The client goes away while the claim is in the store, and the server notices.
        sent.abort();
        tokio::time::sleep(Duration::from_millis(200)).await;
        hold.release();
        let answer = resent(&client, &session, 2).await;
        assert_eq!(answer["result"]["structuredContent"]["run"], 1, "{name}: {answer}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: run once");
        drop(server);
        dir.map(std::fs::remove_dir_all);
    }
}

/// (3) A key claimed for a request that then cannot start (its session ended meanwhile) is
/// released: a re-send in a new session runs it, rather than waiting for an owner that will
/// never finish it.
#[tokio::test]
async fn a_key_claimed_for_a_request_that_cannot_start_is_released() {
    for (name, store, dir) in stores("released") {
        let (server, _) = serve(&store).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-06-18").await;
        let (hold, sent) = send_with_claim_held(&store, &client, &session).await;
        let deleted = client.http.delete(&server.url).header("mcp-session-id", &session.id);
        assert_eq!(
            deleted.header("mcp-protocol-version", &session.version).send().await.expect("delete").status(),
            200
        );
        hold.release();
        let refused = tokio::time::timeout(WAIT, sent).await.expect("answered").expect("task").expect("response");
        assert_eq!(refused.status(), 404, "{name}: the session ended before the request could start");
        let session = client.initialize("2025-06-18").await;
        let answer = resent(&client, &session, 2).await;
        assert_eq!(answer["result"]["structuredContent"]["run"], 1, "{name}: it runs now: {answer}");
        drop(server);
        dir.map(std::fs::remove_dir_all);
    }
}

/// (4) A resume of a cancelled request's stream finds the outcome its record has: the stream
/// ended with it, not empty.
#[tokio::test]
async fn a_resume_of_a_cancelled_requests_stream_ends_with_its_outcome() {
    for (name, store, dir) in stores("resume-cancelled") {
        let (server, _) = serve(&store).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-11-25").await;
        let mut response =
            client.post(Some(&session), &call(1, "until_cancelled", json!({}), None)).send().await.expect("send");
        let seen = events(&mut response, 2).await;
        assert_eq!(messages(&seen).len(), 1, "{name}: it runs");
        drop(response);
        assert_eq!(client.post(Some(&session), &cancel(1)).send().await.expect("send").status(), 202);
        let cursor = seen.last().and_then(|e| e.id.clone()).expect("an event id");
        let resumed = tokio::time::timeout(WAIT, async {
            loop {
                let mut resumed = client.get(&session, Some(&cursor)).send().await.expect("resume");
                assert_eq!(resumed.status(), 200, "{name}");
                let (events, ended) = drain(&mut resumed).await;
                let events = messages(&events);
                // A resume before the handler returned finds the stream still open: again.
                if ended && !events.is_empty() {
                    return events;
                }
            }
        })
        .await
        .expect("a resume finds the outcome");
        let response = the_response(&resumed);
        assert_eq!(response["result"]["structuredContent"]["saw"], "the cancellation", "{name}: {response}");
        drop(server);
        dir.map(std::fs::remove_dir_all);
    }
}

/// (8) A request that runs without waiting for its record (read only, on the embedded store,
/// the one that writes a record while the request runs) is registered before it runs: a
/// cancellation that comes while its record is still being written reaches it.
#[tokio::test]
async fn a_cancellation_while_a_read_only_request_is_recorded_reaches_it() {
    for (name, store, dir) in stores("pipelined").into_iter().filter(|(name, ..)| *name == "embedded") {
        let (server, _) = serve(&store).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-06-18").await;
        let hold = store.hold_next(Call::BeginRequestPipelined);
        let body = call(1, "until_cancelled", json!({"read_only": true}), None);
        let sent = tokio::spawn(client.post(Some(&session), &body).send());
        tokio::time::timeout(WAIT, hold.reached()).await.expect("begun");
        assert_eq!(client.post(Some(&session), &cancel(1)).send().await.expect("send").status(), 202);
        hold.release();
        let mut response = tokio::time::timeout(WAIT, sent).await.expect("answered").expect("task").expect("response");
        let (events, ended) = drain(&mut response).await;
        assert!(ended, "{name}: the cancellation reached the request");
        let events = messages(&events);
        assert_eq!(the_response(&events)["result"]["structuredContent"]["saw"], "the cancellation", "{name}");
        drop(server);
        dir.map(std::fs::remove_dir_all);
    }
}

/// (8) A session the server is ending takes no new request while its running ones get their
/// grace: a request sent then is refused (404), not started and cut off.
#[tokio::test]
async fn a_session_being_ended_refuses_new_requests() {
    for (name, store, dir) in stores("ending") {
        let (server, runs) = serve(&store).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-06-18").await;
        let mut running =
            client.post(Some(&session), &call(1, "until_cancelled", json!({}), None)).send().await.expect("send");
        assert_eq!(messages(&events(&mut running, 1).await).len(), 1, "{name}: it runs");
        let ended = json_body(
            client.post(Some(&session), &call(2, "end_session", json!({}), None)).send().await.expect("send"),
        );
        assert!(ended.await.get("result").is_some(), "{name}");
        let before = runs.load(Ordering::SeqCst);
        let late = client.post(Some(&session), &call(3, "quick", json!({}), None)).send().await.expect("send");
        assert_eq!(late.status(), 404, "{name}: the ending session takes nothing new");
        assert_eq!(runs.load(Ordering::SeqCst), before, "{name}: nothing started");
        drop(server);
        dir.map(std::fs::remove_dir_all);
    }
}

/// (9) A request whose answer the client can read no longer counts toward its session's
/// streams, though its task has not yet let it go (held here in the store's write of the
/// answer): a client with as many requests in flight as the session allows sends its next one
/// as soon as it has an answer, and is not refused for the one it just got.
#[tokio::test]
async fn a_request_whose_answer_is_out_leaves_room_for_the_next() {
    // Recorded before it runs, and read-only: on the embedded store a read-only request runs
    // while its record is written (the pipelined start); the memory store starts both alike.
    for arguments in [json!({}), json!({"read_only": true})] {
        for (name, store, dir) in stores("answered-room") {
            let config = tether_server::ServerConfig { max_streams_per_session: 1, ..config() };
            let (server, _) = serve_with(&store, config).await;
            let client = Client::new(&server);
            let session = client.initialize("2025-06-18").await;
            let first = call(1, "until_cancelled", arguments.clone(), None);
            let mut running = client.post(Some(&session), &first).send().await.expect("send");
            assert_eq!(messages(&events(&mut running, 1).await).len(), 1, "{name} {arguments}: it runs");
            let full = client.post(Some(&session), &call(2, "quick", json!({}), None)).send().await.expect("send");
            assert_eq!(full.status(), 429, "{name} {arguments}: the one stream the session may have is taken");
            let hold = store.hold_next_after(Call::AppendBatch);
            assert_eq!(client.post(Some(&session), &cancel(1)).send().await.expect("send").status(), 202);
            tokio::time::timeout(WAIT, hold.reached()).await.expect("the answer is written");
            let (rest, ended) = drain(&mut running).await;
            assert!(ended, "{name} {arguments}: the stream ended");
            assert!(the_response(&messages(&rest))["result"].is_object(), "{name} {arguments}");
            let next = client.post(Some(&session), &call(3, "quick", json!({}), None)).send().await.expect("send");
            assert_eq!(next.status(), 200, "{name} {arguments}: refused for a request whose answer the client has");
            hold.release();
            drop(server);
            dir.map(std::fs::remove_dir_all);
        }
    }
}

/// (3) A 2025-03-26 batch whose client goes away while a request of it is being recorded: the
/// request is started all the same, and the batch's stream is ended only once the request's
/// response is in it, so a re-send of its id gets that response, not a stream that ends without
/// one.
#[tokio::test]
async fn a_batch_whose_client_leaves_while_a_request_starts_keeps_its_stream_for_the_response() {
    for (name, store, dir) in stores("batch-leaves") {
        let (server, runs) = serve(&store).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-03-26").await;
        // The batch's own record first, then its request's, held once made.
        let batch = store.hold_next_after(Call::BeginRequest);
        let sent = tokio::spawn(client.post(Some(&session), &json!([call(1, "quick", json!({}), None)])).send());
        tokio::time::timeout(WAIT, batch.reached()).await.expect("the batch is recorded");
        let member = store.hold_next_after(Call::BeginRequest);
        batch.release();
        tokio::time::timeout(WAIT, member.reached()).await.expect("its request is recorded");
        // The client goes away while the request's record is in the store, and the server notices.
        sent.abort();
        tokio::time::sleep(Duration::from_millis(200)).await;
        member.release();
        let again = client.post(Some(&session), &call(1, "quick", json!({}), None)).send().await.expect("send");
        let (events, ended) = tokio::time::timeout(WAIT, async {
            let mut again = again;
            drain(&mut again).await
        })
        .await
        .expect("the re-send is answered");
        assert!(ended, "{name}");
        let messages = messages(&events);
        let answer = the_response(&messages);
        assert_eq!(
            (answer["id"].clone(), answer["result"]["structuredContent"]["run"].clone()),
            (json!(1), json!(1)),
            "{name}: {answer}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: run once");
        drop(server);
        dir.map(std::fs::remove_dir_all);
    }
}

/// (3) A request being recorded when the server begins to drain counts as running: the drain
/// waits for it, rather than letting the process exit under its start (the request was then
/// answered `start_failed`, its start cut off by the runtime's end).
#[tokio::test]
async fn a_request_being_recorded_counts_for_the_drain() {
    for (name, store, dir) in stores("drain") {
        let drain = tether_server::Drain::new();
        let store_dyn: Arc<dyn Store> = Arc::clone(&store) as Arc<dyn Store>;
        let builder = Builder::new(Lifecycle::default()).config(config()).store(store_dyn).drain(Arc::clone(&drain));
        let server = start_with(builder).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-06-18").await;
        let hold = store.hold_next_after(Call::BeginRequest);
        let sent = tokio::spawn(client.post(Some(&session), &call(1, "quick", json!({}), None)).send());
        tokio::time::timeout(WAIT, hold.reached()).await.expect("recorded");
        drain.begin();
        assert_eq!(drain.running(), 1, "{name}: the request being recorded runs, for the drain");
        hold.release();
        let answered = tokio::time::timeout(WAIT, sent).await.expect("answered").expect("task").expect("response");
        let answer = json_body(answered).await;
        assert_eq!(answer["result"]["structuredContent"]["run"], 1, "{name}: {answer}");
        tokio::time::timeout(WAIT, drain.idle()).await.expect("idle once it was answered");
        drop(server);
        dir.map(std::fs::remove_dir_all);
    }
}
