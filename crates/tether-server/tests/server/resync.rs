//! Exact resync, over real HTTP on the memory and embedded stores: a connection or a resume
//! gets every retained event after its cursor once, in order, and whatever is gone said once
//! by one resync event standing exactly where it was; never an empty 200 (but for the resume of
//! an ended stream from its last event, which holds nothing more).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tether_builtin::BuiltinHandler;
use tether_core::lineage::SessionId;
use tether_core::sse::Event;
use tether_server::{Builder, ServerConfig};
use tether_store::{MemoryStore, Retention, SqliteStore, Store};

use crate::common::*;

/// The two stores a single process serves from.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Memory,
    Embedded,
}

const KINDS: [Kind; 2] = [Kind::Memory, Kind::Embedded];

/// A server whose store keeps at most `max_events` events per stream and ended streams for
/// `retention`, with the store itself for looking at what it retains.
async fn server(kind: Kind, max_events: usize, retention: Duration) -> (TestServer, Arc<dyn Store>) {
    let retention = Retention {
        max_events_per_stream: max_events,
        ended_stream_ms: u64::try_from(retention.as_millis()).expect("short"),
        ..Retention::default()
    };
    let store: Arc<dyn Store> = match kind {
        Kind::Memory => Arc::new(MemoryStore::new(retention)),
        Kind::Embedded => {
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("tether-resync-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            Arc::new(SqliteStore::open(&dir, retention, "test").expect("open the embedded store"))
        }
    };
    let config = ServerConfig { retention, ..config() };
    let server = start_with(Builder::new(BuiltinHandler::in_memory()).config(config).store(Arc::clone(&store))).await;
    (server, store)
}

fn count(id: Value, to: u64) -> Value {
    request(id, "tools/call", json!({"name": "count", "arguments": {"to": to}, "_meta": {"progressToken": "p"}}))
}

/// What a client sees: `n` for event n, `resync a..b` (or `resync <reason>`) with the id's seq,
/// `trailer <reason>` for an event without an id.
fn shape(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .map(|e| match (e.event.as_deref(), e.id.as_deref()) {
            (Some("resync"), Some(id)) => {
                let notice: Value = serde_json::from_str(&e.data).expect("notice");
                match (notice["lost_from"].as_u64(), notice["lost_to"].as_u64()) {
                    (Some(from), Some(to)) => format!("resync {from}..{to} @{}", seq(id)),
                    _ => format!("resync {} @{}", notice["reason"].as_str().unwrap_or("?"), seq(id)),
                }
            }
            (None, Some(id)) => seq(id).to_string(),
            (None, None) => {
                let message: Value = serde_json::from_str(&e.data).expect("message");
                format!("trailer {}", message["error"]["data"]["reason"].as_str().unwrap_or("?"))
            }
            other => panic!("unexpected event {other:?}"),
        })
        .collect()
}

fn range(from: u64, to: u64) -> Vec<String> {
    (from..=to).map(|n| n.to_string()).collect()
}

fn cat(parts: &[&[String]]) -> Vec<String> {
    parts.concat()
}

fn s(text: &str) -> Vec<String> {
    vec![text.to_owned()]
}

/// Reproduction 1: a POST whose own connection fell behind a small retention was answered with
/// an empty 200 (2025-06-18) or the priming event alone (2025-11-25), and so was the same request
/// id sent again. Now: one resync for exactly what is gone, then the retained tail and the result.
#[tokio::test]
async fn a_post_that_falls_behind_retention_goes_on_with_a_resync_and_the_retained_tail() {
    for kind in KINDS {
        let (server, _store) = server(kind, 10, Duration::from_secs(300)).await;
        let client = Client::new(&server);
        for (version, primed) in [("2025-06-18", false), ("2025-11-25", true)] {
            let session = client.initialize(version).await;
            for attempt in ["first", "re-sent id"] {
                let mut response = client.post(Some(&session), &count(json!(1), 30)).send().await.expect("send");
                assert_eq!(response.status(), 200);
                let (events, ended) = drain(&mut response).await;
                assert!(ended, "{kind:?} {version} {attempt}");
                let prime = if primed { s("0") } else { Vec::new() };
                // 31 events (30 notifications, the result); the last 10 are retained.
                let expected = cat(&[&prime, &s("resync 1..21 @21"), &range(22, 31)]);
                assert_eq!(shape(&events), expected, "{kind:?} {version} {attempt}");
                let result = messages(&events).pop().expect("the result");
                assert_eq!(
                    (result["id"].clone(), result["result"]["content"][0]["text"].clone()),
                    (json!(1), json!("counted to 30"))
                );
            }
        }
    }
}

/// Reproduction 2: a resume from before the evicted part got a resync naming everything up to
/// the head and nothing else, although the tail (the result included) was retained.
#[tokio::test]
async fn a_resume_from_before_an_evicted_part_gets_the_retained_tail_after_the_resync() {
    for kind in KINDS {
        let (server, _store) = server(kind, 10, Duration::from_secs(300)).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-11-25").await;
        let mut response = client.post(Some(&session), &count(json!(1), 30)).send().await.expect("send");
        let (events, _) = drain(&mut response).await;
        for (cursor, expected) in [
            (0, cat(&[&s("resync 1..21 @21"), &range(22, 31)])),
            (20, cat(&[&s("resync 21..21 @21"), &range(22, 31)])),
            (21, range(22, 31)),
            (28, range(29, 31)),
        ] {
            let mut resumed = client.get(&session, Some(&id_at(&events, cursor))).send().await.expect("resume");
            assert_eq!(resumed.status(), 200);
            let (events, ended) = drain(&mut resumed).await;
            assert!(ended);
            assert_eq!(shape(&events), expected, "{kind:?} from {cursor}");
        }
    }
}

/// Reproduction 4: once a finished stream's retention ran out, a resume was told
/// `unknown_stream` with nothing lost and an id behind its cursor. The stream's tombstone now
/// says exactly what is gone, and the request's error ends it for whoever waits for the result.
#[tokio::test]
async fn a_stream_whose_retention_ran_out_is_resynced_with_its_exact_range() {
    for kind in KINDS {
        let (server, store) = server(kind, 10_000, Duration::from_millis(200)).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-11-25").await;
        let mut response = client.post(Some(&session), &count(json!(7), 3)).send().await.expect("send");
        let (events, _) = drain(&mut response).await;
        let cursor = events[2].id.clone().expect("event 2's id");
        let name = tether_core::lineage::EventId::parse(&cursor).expect("lineage id").stream;
        let deadline = tokio::time::Instant::now() + WAIT;
        while store
            .stream_range(&SessionId::parse(&session.id).expect("session id"), &name)
            .await
            .expect("range")
            .is_some_and(|r| r.retained_from <= r.head)
        {
            assert!(tokio::time::Instant::now() < deadline, "{kind:?}: retention never dropped the stream");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut resumed = client.get(&session, Some(&cursor)).send().await.expect("resume");
        let (events, ended) = drain(&mut resumed).await;
        assert!(ended);
        assert_eq!(shape(&events), ["resync 3..4 @4", "trailer request_history_expired"], "{kind:?}");
        assert_eq!(messages(&events)[1]["id"], 7, "the trailer answers the request");
        // The connection dropped between the notice and the error: a resume from the notice is
        // told again that the result is gone, never answered with an empty stream.
        let notice = events[0].id.clone().expect("the notice's id");
        let (events, _) = drain(&mut client.get(&session, Some(&notice)).send().await.expect("resume")).await;
        assert_eq!(shape(&events), ["trailer request_history_expired"], "{kind:?}");
        // The same request id sent again: what is gone, and that its outcome is not retained.
        let (again, _) = drain(&mut client.post(Some(&session), &count(json!(7), 3)).send().await.expect("send")).await;
        assert_eq!(shape(&again), ["0", "resync 1..4 @4", "trailer request_history_expired"], "{kind:?}");
        // A stream the session never had is still unknown, and its notice stands at the cursor.
        let unknown = format!("{}:rnever:5:AAAAAAAAAAA", session.epoch);
        let (events, _) = drain(&mut client.get(&session, Some(&unknown)).send().await.expect("resume")).await;
        assert_eq!(shape(&events), ["resync unknown_stream @5"], "{kind:?}");
    }
}

/// Reproduction 5: in a 2025-03-26 batch, a request's notifications were stored and never sent
/// (the answer was a JSON array of results). Now the batch's requests share one stream, answered
/// as SSE with every notification and every response.
#[tokio::test]
async fn a_batch_carries_every_notification_and_every_response_of_its_requests() {
    for kind in KINDS {
        let (server, _store) = server(kind, 10_000, Duration::from_secs(300)).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-03-26").await;
        let batch = json!([count(json!(1), 3), request(json!(2), "ping", json!({})), count(json!("c"), 2)]);
        let mut response = client.post(Some(&session), &batch).send().await.expect("send");
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream", "{kind:?}");
        let (events, ended) = drain(&mut response).await;
        assert!(ended, "the batch's stream ends once every request answered");
        let ids: Vec<u64> = events.iter().map(|e| seq(e.id.as_deref().expect("every event has an id"))).collect();
        assert_eq!(ids, (1..=8).collect::<Vec<_>>(), "one stream, contiguous: {kind:?}");
        let messages = messages(&events);
        let progress = messages.iter().filter(|m| m["method"] == "notifications/progress").count();
        assert_eq!(progress, 5, "every notification of both calls: {messages:?}");
        let mut answered: Vec<String> = messages.iter().filter_map(|m| m.get("id")).map(Value::to_string).collect();
        answered.sort();
        assert_eq!(answered, ["\"c\"", "1", "2"], "every response");
        // A batch whose requests answer at once is still answered as a JSON array.
        let quick = json!([
            request(json!(3), "ping", json!({})),
            request(json!(4), "tools/call", json!({"name": "counter_get", "arguments": {"key": "b"}}))
        ]);
        let response = client.post(Some(&session), &quick).send().await.expect("send");
        let body = json_body(response).await;
        let ids: Vec<_> = body.as_array().expect("array").iter().map(|r| r["id"].clone()).collect();
        assert_eq!(ids, [json!(3), json!(4)]);
    }
}

/// A re-sent request id whose stream lost its oldest events gets the resync and what is left,
/// the result included; a live request's re-send attaches from the start.
#[tokio::test]
async fn a_re_sent_request_id_gets_what_is_retained_of_its_stream() {
    for kind in KINDS {
        let (server, _store) = server(kind, 4, Duration::from_secs(300)).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-06-18").await;
        let call = request(json!(5), "tools/call", json!({"name": "count", "arguments": {"to": 8, "interval_ms": 1}}));
        let (first, _) = drain(&mut client.post(Some(&session), &call).send().await.expect("send")).await;
        let (again, ended) = drain(&mut client.post(Some(&session), &call).send().await.expect("send")).await;
        assert!(ended);
        assert_eq!(shape(&again), cat(&[&s("resync 1..5 @5"), &range(6, 9)]), "{kind:?} first: {:?}", shape(&first));
        assert_eq!(messages(&again).last().expect("result")["id"], 5);
    }
}

/// A reader reads a stream a page (256 events) at a time: a page that is full is not a gap.
#[tokio::test]
async fn a_gap_before_several_pages_of_retained_events_is_said_once() {
    for kind in KINDS {
        let (server, _store) = server(kind, 300, Duration::from_secs(300)).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-06-18").await;
        let (events, ended) =
            drain(&mut client.post(Some(&session), &count(json!(1), 600)).send().await.expect("send")).await;
        assert!(ended);
        // Resumed from the stream's start once the call ended: 302..601 are retained.
        let start = id_at(&events, 0);
        let (events, _) = drain(&mut client.get(&session, Some(&start)).send().await.expect("resume")).await;
        let got = shape(&events);
        let expected = cat(&[&s("resync 1..301 @301"), &range(302, 601)]);
        assert!(got == expected, "{kind:?}: {} items, from {:?}", got.len(), &got[..got.len().min(3)]);
    }
}

/// `call` with the idempotency key `key`.
fn keyed(mut call: Value, key: &str) -> Value {
    call["params"]["_meta"]["io.tether/idempotencyKey"] = json!(key);
    call
}

/// A keyed request that answers first in a batch records its outcome without ending the stream
/// the batch's requests share: the slower request's notifications and response still follow.
#[tokio::test]
async fn a_keyed_request_answering_first_leaves_its_batch_s_stream_open_for_the_others() {
    for kind in KINDS {
        let (server, _store) = server(kind, 10_000, Duration::from_secs(300)).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-03-26").await;
        let batch = json!([keyed(counting(1, 1, 0), "key-first"), counting(2, 3, 100)]);
        let (events, ended) = drain(&mut client.post(Some(&session), &batch).send().await.expect("send")).await;
        assert!(ended, "{kind:?}");
        let messages = messages(&events);
        let mut answered: Vec<String> =
            messages.iter().filter(|m| m.get("result").is_some()).map(|m| m["id"].to_string()).collect();
        answered.sort();
        assert_eq!(answered, ["1", "2"], "both results, the slower one after the keyed one's: {kind:?} {messages:?}");
        let progress = messages.iter().filter(|m| m["method"] == "notifications/progress").count();
        assert_eq!(progress, 4, "every notification of both calls: {kind:?} {messages:?}");
    }
}

/// A keyed request whose original ran in a batch gets the original's outcome, not the answer of
/// another request of the batch; and so does a batch's request whose id was sent before.
#[tokio::test]
async fn a_request_answered_from_a_batch_gets_its_own_requests_outcome() {
    for kind in KINDS {
        let (server, _store) = server(kind, 10_000, Duration::from_secs(300)).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-03-26").await;
        // The keyed request is the batch's slowest; another of its requests answers in between.
        let batch = json!([keyed(counting(1, 3, 300), "key-a"), counting(2, 2, 200)]);
        let mut answer = client.post(Some(&session), &batch).send().await.expect("send");
        let again = tokio::spawn({
            let (http, url, session, call) =
                (client.http.clone(), client.url.clone(), session.clone(), keyed(counting(3, 3, 300), "key-a"));
            async move {
                let client = Client { http, url };
                json_body(client.post(Some(&session), &call).send().await.expect("send")).await
            }
        });
        drain(&mut answer).await;
        let again = again.await.expect("the re-sent request");
        assert_eq!(
            (again["id"].clone(), again["result"]["content"][0]["text"].clone()),
            (json!(3), json!("counted to 3")),
            "{kind:?}"
        );
        // A batch re-sending an id of an earlier batch whose last answer was another request's.
        let first = json!([counting(10, 1, 0), counting(11, 3, 100)]);
        drain(&mut client.post(Some(&session), &first).send().await.expect("send")).await;
        let second = json!([counting(10, 1, 0)]);
        let body = json_body(client.post(Some(&session), &second).send().await.expect("send")).await;
        let answer = &body.as_array().expect("a JSON array")[0];
        assert_eq!(
            (answer["id"].clone(), answer["result"]["content"][0]["text"].clone()),
            (json!(10), json!("counted to 1")),
            "{kind:?}"
        );
    }
}

/// A `count` call with a progress token, `interval` ms between its `to` notifications.
fn counting(id: u64, to: u64, interval: u64) -> Value {
    let params =
        json!({"name": "count", "arguments": {"to": to, "interval_ms": interval}, "_meta": {"progressToken": "p"}});
    request(json!(id), "tools/call", params)
}

/// A batch's request whose id is sent again while the batch runs gets its own response, and
/// nothing else: not the batch's notifications, not another request's answer that came first.
#[tokio::test]
async fn a_batch_request_sent_again_while_the_batch_runs_gets_only_its_own_response() {
    for kind in KINDS {
        let (server, _store) = server(kind, 10_000, Duration::from_secs(300)).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-03-26").await;
        let mut batch =
            client.post(Some(&session), &json!([counting(20, 3, 300), counting(21, 1, 0)])).send().await.expect("send");
        // Once 21 has answered on the batch's stream, 20 runs on.
        let deadline = tokio::time::Instant::now() + WAIT;
        let answered = |e: &Event| serde_json::from_str::<Value>(&e.data).is_ok_and(|m| m["id"] == 21);
        while !events(&mut batch, 1).await.iter().any(answered) {
            assert!(tokio::time::Instant::now() < deadline, "{kind:?}: 21 never answered");
        }
        let again = client.post(Some(&session), &json!([counting(20, 3, 300)])).send().await.expect("send");
        let body = json_body(again).await;
        let answer = &body.as_array().expect("a JSON array: nothing was relayed before the response")[0];
        assert_eq!(
            (answer["id"].clone(), answer["result"]["content"][0]["text"].clone()),
            (json!(20), json!("counted to 3")),
            "{kind:?}"
        );
        drain(&mut batch).await;
    }
}

/// What a resume from `cursor` must show, given what the store retains of the (ended) stream:
/// one resync for exactly the events after the cursor that are gone, every retained event after
/// it, and the request's error if the result is gone (the gap took it, or the cursor stood for
/// it: a resume from the notice that named it lost).
fn expected_after(cursor: u64, retained: tether_core::lineage::StreamRange) -> Vec<String> {
    let first = retained.retained_from.max(cursor + 1);
    let mut out = Vec::new();
    let gone_to = retained.head.min(first - 1);
    if gone_to > cursor {
        out.push(format!("resync {}..{gone_to} @{gone_to}", cursor + 1));
    }
    out.extend(range(first, retained.head));
    if retained.retained_from > retained.head {
        out.push("trailer request_history_expired".into());
    }
    out
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..Default::default() })]

    /// For random retention limits, producers and cursors, on both stores: the POST's own answer
    /// and a resume from any cursor deliver exactly the retained events after the cursor, and
    /// one resync whose range is exactly what is missing.
    #[test]
    fn a_resume_delivers_exactly_the_retained_events_and_one_exact_resync(
        max_events in 1usize..12,
        to in 1u64..40,
        pick in 0u64..64,
        embedded in proptest::prelude::any::<bool>(),
        dropped in proptest::prelude::any::<bool>(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async move {
            let kind = if embedded { Kind::Embedded } else { Kind::Memory };
            // Either the stream's last events are retained, or (its retention run out) none.
            let retention = Duration::from_millis(if dropped { 1 } else { 300_000 });
            let (server, store) = server(kind, max_events, retention).await;
            let client = Client::new(&server);
            let session = client.initialize("2025-11-25").await;
            let (events, ended) = drain(&mut client.post(Some(&session), &count(json!(1), to)).send().await.expect("send")).await;
            assert!(ended);
            let priming = events[0].id.clone().expect("the priming event");
            let name = tether_core::lineage::EventId::parse(&priming).expect("lineage id").stream;
            let head = to + 1;
            // What the stores retain, as their retention says: the newest `max_events` of the
            // stream's events (the priming event counted), or nothing once dropped.
            let kept = if dropped { head + 1 } else { (head + 1).saturating_sub(max_events as u64) };
            let deadline = tokio::time::Instant::now() + WAIT;
            let range = loop {
                let range = store.stream_range(&SessionId::parse(&session.id).expect("session id"), &name).await.expect("range").expect("the stream");
                if range.retained_from == kept || tokio::time::Instant::now() > deadline {
                    break range;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            assert_eq!((range.retained_from, range.head), (kept, head), "{kind:?}");
            if !dropped {
                // The answer itself, from its priming event.
                assert_eq!(shape(&events[1..]), expected_after(0, range), "{kind:?} answer");
            }
            let cursor = pick % (range.head + 1);
            let resumed = client.get(&session, Some(&id_at(&events, cursor))).send().await;
            let (events, ended) = drain(&mut resumed.expect("resume")).await;
            assert!(ended);
            assert_eq!(shape(&events), expected_after(cursor, range), "{kind:?} from {cursor}");
        });
    }
}

/// A plain GET replaces the session's standalone stream; the one replaced is ended, so retention
/// drops it like any other (a client that opens GET after GET does not grow its session a
/// stream each time), and its resume gets what it held, then ends.
#[tokio::test]
async fn a_standalone_stream_a_plain_get_replaced_is_ended() {
    for kind in KINDS {
        let (server, store) = server(kind, 10_000, Duration::from_secs(60)).await;
        let client = Client::new(&server);
        let session = client.initialize("2025-11-25").await;
        let mut first = client.get(&session, None).send().await.expect("get");
        assert_eq!(first.status(), 200);
        let primed = events(&mut first, 1).await[0].id.clone().expect("the priming event's id");
        let name = tether_core::lineage::EventId::parse(&primed).expect("lineage id").stream;
        drop(first);
        // The server lets go of the first connection as it notices it closed; until then a
        // second plain GET is refused.
        let deadline = tokio::time::Instant::now() + WAIT;
        let second = loop {
            let response = client.get(&session, None).send().await.expect("get");
            if response.status() == 200 {
                break response;
            }
            assert_eq!(response.status(), 409, "{kind:?}");
            assert!(tokio::time::Instant::now() < deadline, "{kind:?}: the first GET stayed attached");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let id = SessionId::parse(&session.id).expect("session id");
        let range = store.stream_range(&id, &name).await.expect("range").expect("the replaced stream");
        assert_eq!(range.state, tether_core::lineage::StreamState::Complete, "{kind:?}");
        let mut resumed = client.get(&session, Some(&primed)).send().await.expect("resume");
        assert_eq!(resumed.status(), 200, "{kind:?}");
        let (events, ended) = drain(&mut resumed).await;
        assert!(ended && events.is_empty(), "{kind:?}: {events:?}");
        drop(second);
    }
}
