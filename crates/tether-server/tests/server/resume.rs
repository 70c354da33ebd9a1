//! Every branch of the resume decision, over real HTTP, and the rules around it.

use std::time::Duration;

use serde_json::json;
use tether_server::ServerConfig;
use tether_store::Retention;

use crate::common::*;

/// Calls `count` to `to` and returns the ids of its events (priming first) after the stream ended.
async fn counted(client: &Client, session: &Session, id: i64, to: u64) -> Vec<String> {
    // A little pacing keeps the request's own connection from falling behind a small retention.
    let mut response = client.call(session, json!(id), "count", json!({"to": to, "interval_ms": 2})).await;
    let (events, ended) = drain(&mut response).await;
    assert!(ended);
    events.into_iter().map(|e| e.id.expect("every event has an id")).collect()
}

#[tokio::test]
async fn resume_replays_exactly_the_events_after_the_cursor_then_ends() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let ids = counted(&client, &session, 1, 5).await;
    assert_eq!(ids.len(), 7, "priming, 5 notifications, result");
    for cursor in 0..=6u64 {
        let mut response = client.get(&session, Some(&ids[cursor as usize])).send().await.expect("send");
        assert_eq!(response.status(), 200, "{cursor} {ids:?}");
        assert_eq!(response.headers()["x-mcp-replay-epoch"].to_str().expect("ascii"), session.epoch);
        let (events, ended) = drain(&mut response).await;
        assert!(ended, "a finished request's stream ends after the replay");
        let seqs: Vec<u64> = events.iter().map(|e| seq(e.id.as_deref().expect("id"))).collect();
        assert_eq!(seqs, ((cursor + 1)..=6).collect::<Vec<_>>(), "cursor {cursor}");
    }
}

#[tokio::test]
async fn resume_of_a_live_stream_continues_without_gap_or_duplicate() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let mut response = client.call(&session, json!(1), "count", json!({"to": 15, "interval_ms": 10})).await;
    let first = events(&mut response, 4).await;
    drop(response);
    let cursor = first.last().and_then(|e| e.id.clone()).expect("cursor");
    let mut resumed = client.get(&session, Some(&cursor)).send().await.expect("send");
    let (rest, ended) = drain(&mut resumed).await;
    assert!(ended);
    let all: Vec<u64> = first.iter().chain(&rest).map(|e| seq(e.id.as_deref().expect("id"))).collect();
    assert_eq!(all, (0..=16).collect::<Vec<_>>());
    let result = messages(&rest).pop().expect("result");
    assert_eq!(result["id"], 1);
}

#[tokio::test]
async fn evicted_history_is_said_once_then_the_retained_tail_follows() {
    let retention = Retention { max_events_per_stream: 4, ..Retention::default() };
    let server = start(ServerConfig { retention, ..config() }).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let ids = counted(&client, &session, 1, 10).await;
    let mut response = client.get(&session, Some(&ids[1])).send().await.expect("send");
    assert_eq!(response.status(), 200);
    let (events, ended) = drain(&mut response).await;
    assert!(ended);
    assert_eq!(events[0].event.as_deref(), Some("resync"));
    assert_eq!(seq(events[0].id.as_deref().expect("an id")), 7, "its id is the gap's end");
    let notice: serde_json::Value = serde_json::from_str(&events[0].data).expect("json");
    assert_eq!(notice["reason"], "evicted");
    assert_eq!(
        (notice["after"].clone(), notice["lost_from"].clone(), notice["lost_to"].clone(), notice["head"].clone()),
        (json!(1), json!(2), json!(7), json!(11))
    );
    let tail: Vec<u64> = events[1..].iter().map(|e| seq(e.id.as_deref().expect("id"))).collect();
    assert_eq!(tail, [8, 9, 10, 11], "the retained tail, the result included");
    assert_eq!(messages(&events).last().expect("result")["id"], 1);
    // Resuming from the resync event's id replays the tail, not the notice: told once.
    let mut again = client.get(&session, events[0].id.as_deref()).send().await.expect("send");
    let again: Vec<u64> = drain(&mut again).await.0.iter().map(|e| seq(e.id.as_deref().expect("id"))).collect();
    assert_eq!(again, [8, 9, 10, 11]);
}

#[tokio::test]
async fn an_unknown_stream_gets_resync_and_a_cursor_past_the_head_ends_the_session() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let ids = counted(&client, &session, 1, 2).await;
    let unknown = format!("{}:rNoSuchStream1:4:AAAAAAAAAAA", session.epoch);
    let mut response = client.get(&session, Some(&unknown)).send().await.expect("send");
    let events = drain(&mut response).await.0;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].event.as_deref(), Some("resync"));
    assert!(events[0].data.contains("\"unknown_stream\""));
    // Position 99 was never handed out by this stream: a store that had it went back in time.
    let ids: Vec<_> = ids.iter().map(|id| tether_core::lineage::EventId::parse(id).expect("lineage id")).collect();
    let ahead = tether_core::lineage::EventId { seq: 99, ..ids[3].clone() };
    let response = client.get(&session, Some(&ahead.to_string())).send().await.expect("send");
    assert_eq!(response.status(), 404);
    assert_eq!(reason(response).await, "history_rewritten");
    let response = client.post(Some(&session), &request(json!(2), "ping", json!({}))).send().await.expect("send");
    assert_eq!(reason(response).await, "history_rewritten", "the session is over, everywhere");
}

/// A cursor whose tag is not the one the store holds at its position names another history
/// than the store's: the session ends, and says why.
#[tokio::test]
async fn a_cursor_with_another_tag_ends_the_session_as_rewritten() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let ids = counted(&client, &session, 1, 2).await;
    let seen = tether_core::lineage::EventId::parse(&ids[2]).expect("lineage id");
    let other = tether_core::lineage::EventId { tag: Some(tether_core::lineage::Tag::from_bits(7)), ..seen };
    let response = client.get(&session, Some(&other.to_string())).send().await.expect("send");
    assert_eq!(response.status(), 404);
    assert_eq!(reason(response).await, "history_rewritten");
    let response = client.get(&session, Some(&ids[2])).send().await.expect("send");
    assert_eq!(reason(response).await, "history_rewritten", "not even the true cursor continues it");
}

#[tokio::test]
async fn a_cursor_never_crosses_sessions_or_incarnations() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let a = client.initialize("2025-11-25").await;
    let b = client.initialize("2025-11-25").await;
    let ids = counted(&client, &a, 1, 3).await;
    // Session A's cursor presented with session B's id: B's epoch differs, so it is refused
    // without replaying any of A's events.
    let response = client.get(&b, Some(&ids[1])).send().await.expect("send");
    assert_eq!(response.status(), 404);
    assert_eq!(reason(response).await, "incarnation_mismatch");
    let forged = format!("AAAAAAAAAAAAAAAAAAAAAA:{}", ids[1].split_once(':').expect("id").1);
    let response = client.get(&a, Some(&forged)).send().await.expect("send");
    assert_eq!(reason(response).await, "incarnation_mismatch");
}

#[tokio::test]
async fn a_cursor_of_one_stream_never_replays_another() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let first = counted(&client, &session, 1, 3).await;
    let second = counted(&client, &session, 2, 3).await;
    let mut response = client.get(&session, Some(&first[1])).send().await.expect("send");
    let events = drain(&mut response).await.0;
    let ids: Vec<String> = events.iter().map(|e| e.id.clone().expect("id")).collect();
    assert_eq!(ids, first[2..], "exactly the rest of the cursor's own stream");
    assert!(ids.iter().all(|id| !second.contains(id)), "nothing of the other stream");
    let replayed = messages(&events);
    assert_eq!(replayed.last().expect("the result")["id"], 1, "its own result, not request 2's");
}

#[tokio::test]
async fn malformed_cursor_is_400_and_unknown_session_404() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    // An id without a tag is not one this server hands out: its history could not be checked.
    let untagged = format!("{}:r1:1", session.epoch);
    for bad in ["garbage", "1041", "a:b:c", &format!("{}:s:01", session.epoch), &untagged] {
        let response = client.get(&session, Some(bad)).send().await.expect("send");
        assert_eq!(response.status(), 400, "{bad}");
        assert_eq!(reason(response).await, "malformed_cursor");
    }
    let ghost = Session { id: "gone".into(), ..session.clone() };
    let response = client.get(&ghost, Some(&format!("{}:r1:1:AAAAAAAAAAA", session.epoch))).send().await.expect("send");
    assert_eq!(response.status(), 404);
    assert_eq!(reason(response).await, "unknown_session");
}

#[tokio::test]
async fn session_that_expired_during_a_partition_gets_404_although_history_is_retained() {
    // Seed 004's incident, scaled down: TTL 300 ms, history retained much longer.
    let server = start(ServerConfig { session_idle_ttl: Duration::from_millis(300), ..config() }).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let ids = counted(&client, &session, 1, 2).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let response = client.get(&session, Some(&ids[1])).send().await.expect("send");
    assert_eq!(response.status(), 404);
    assert_eq!(reason(response).await, "expired");
    // The resume attempt did not renew it.
    let response = client.post(Some(&session), &request(json!(2), "ping", json!({}))).send().await.expect("send");
    assert_eq!(reason(response).await, "expired");
}

/// A ping past the session's idle TTL: whether the session was still alive.
async fn alive_after_the_ttl(client: &Client, session: &Session) -> bool {
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let response = client.post(Some(session), &request(json!(9), "ping", json!({}))).send().await.expect("send");
    response.status() == 200
}

#[tokio::test]
async fn an_open_stream_alone_keeps_a_session_alive() {
    let server = start(ServerConfig { session_idle_ttl: Duration::from_millis(1_000), ..config() }).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let stream = client.get(&session, None).send().await.expect("send");
    assert!(alive_after_the_ttl(&client, &session).await, "an open stream is activity");
    drop(stream);
    let idle = client.initialize("2025-11-25").await;
    assert!(!alive_after_the_ttl(&client, &idle).await, "without activity the session expires");
}

#[tokio::test]
async fn a_running_request_alone_keeps_a_session_alive() {
    let server = start(ServerConfig { session_idle_ttl: Duration::from_millis(1_000), ..config() }).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    // Its answer is JSON, so no stream is open while it runs.
    let running = client.call(&session, json!(1), "sleep", json!({"ms": 2_500}));
    let (result, alive) =
        tokio::join!(async { json_body(running.await).await }, alive_after_the_ttl(&client, &session));
    assert!(alive, "a running request is activity");
    assert_eq!(result["result"]["content"][0]["text"], "slept 2500 ms");
}

#[tokio::test]
async fn finished_streams_stay_replayable_for_the_retention_then_resync() {
    let retention = Retention { ended_stream_ms: 1_000, ..Retention::default() };
    let server = start(ServerConfig { retention, ..config() }).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let ids = counted(&client, &session, 1, 2).await;
    let mut soon = client.get(&session, Some(&ids[0])).send().await.expect("send");
    assert_eq!(drain(&mut soon).await.0.len(), 3, "the result is recoverable after completion");
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    let mut late = client.get(&session, Some(&ids[0])).send().await.expect("send");
    let events = drain(&mut late).await.0;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0].event.as_deref(), Some("resync"), "dropped history is reported, never silent");
    let notice: serde_json::Value = serde_json::from_str(&events[0].data).expect("json");
    assert_eq!((notice["lost_from"].clone(), notice["lost_to"].clone()), (json!(1), json!(3)), "exactly what is gone");
    let error: serde_json::Value = serde_json::from_str(&events[1].data).expect("json");
    assert_eq!(
        (error["id"].clone(), error["error"]["data"]["reason"].clone()),
        (json!(1), json!("request_history_expired"))
    );
}

#[tokio::test]
async fn a_resume_takes_over_the_connection_already_attached() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let mut old = client.call(&session, json!(1), "count", json!({"to": 200, "interval_ms": 20})).await;
    let seen = events(&mut old, 3).await;
    let cursor = seen.last().and_then(|e| e.id.clone()).expect("cursor");
    let mut new = client.get(&session, Some(&cursor)).send().await.expect("send");
    assert_eq!(events(&mut new, 1).await.len(), 1);
    let (rest, ended) = drain(&mut old).await;
    assert!(ended, "the half-open connection was closed");
    // Closed when the resume arrived, not when the stream ended: it never got the result.
    let answered = messages(&rest).iter().any(|m| m.get("id").is_some());
    assert!(!answered, "the old connection went on to the result ({} more events)", rest.len());
    let (taken, _) = drain(&mut new).await;
    assert_eq!(messages(&taken).last().expect("the result")["id"], 1, "the new connection carries the stream");
}

#[tokio::test]
async fn server_closes_long_connections_with_retry_and_the_client_resumes() {
    let server = start(ServerConfig { max_connection_duration: Duration::from_millis(200), ..config() }).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let mut stream = client.get(&session, None).send().await.expect("send");
    let (events, ended) = drain(&mut stream).await;
    assert!(ended, "closed by the server after max_connection_duration");
    let priming = events[0].clone();
    assert!(priming.retry.is_some());
    client.call(&session, json!(1), "broadcast", json!({"count": 2})).await;
    let mut resumed = client.get(&session, priming.id.as_deref()).send().await.expect("send");
    let got = messages(&crate::common::events(&mut resumed, 2).await);
    assert_eq!(got.len(), 2, "broadcasts sent while disconnected are delivered on resume");
}

/// A body as text until it ends (bounded by `WAIT`), and whether it ended.
async fn text_until_end(response: &mut reqwest::Response) -> (String, bool) {
    let (body, ended) = body_until_end(response).await;
    (String::from_utf8(body).expect("SSE is UTF-8"), ended)
}

#[tokio::test]
async fn a_connection_the_server_closes_ends_by_saying_when_to_come_back() {
    let polled = ServerConfig {
        max_connection_duration: Duration::from_millis(200),
        sse_retry: Duration::from_millis(750),
        ..config()
    };
    let server = start(polled).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    // Closed at its deadline: the last block sets only the delay, after the priming event's.
    let mut standalone = client.get(&session, None).send().await.expect("send");
    let (text, ended) = text_until_end(&mut standalone).await;
    assert!(ended, "closed after max_connection_duration");
    let blocks: Vec<&str> = text.split_terminator("\n\n").collect();
    assert!(blocks.len() >= 2 && blocks[0].contains("retry: 750"), "{text:?}");
    assert_eq!(blocks.last(), Some(&"retry: 750"), "{text:?}");
    // Closed because a resume took its stream over (long before its deadline).
    let server = start(ServerConfig { sse_retry: Duration::from_millis(750), ..config() }).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let mut old = client.call(&session, json!(1), "count", json!({"to": 200, "interval_ms": 20})).await;
    let cursor = events(&mut old, 3).await.last().and_then(|e| e.id.clone()).expect("cursor");
    let mut new = client.get(&session, Some(&cursor)).send().await.expect("send");
    assert_eq!(events(&mut new, 1).await.len(), 1);
    let (text, ended) = text_until_end(&mut old).await;
    assert!(ended, "the connection taken over was closed");
    // What is left after the events already read: maybe more events, then the delay alone.
    assert!(text == "retry: 750\n\n" || text.ends_with("\n\nretry: 750\n\n"), "{text:?}");
}

#[tokio::test]
async fn test_reconnection_delivers_its_result_after_the_resume() {
    let server = start(config()).await;
    let client = Client::new(&server);
    let session = client.initialize("2025-11-25").await;
    let mut response = client.call(&session, json!("rc"), "test_reconnection", json!({})).await;
    let (events, ended) = drain(&mut response).await;
    assert!(ended);
    assert!(events[0].data.is_empty() && events[0].id.is_some() && events[0].retry.is_some(), "priming with retry");
    assert!(messages(&events).iter().all(|m| m.get("id").is_none()), "no result before the close");
    let cursor = events.last().and_then(|e| e.id.clone()).expect("cursor");
    let mut resumed = client.get(&session, Some(&cursor)).send().await.expect("send");
    let rest = messages(&drain(&mut resumed).await.0);
    assert_eq!(rest.last().expect("result")["id"], "rc");
}
