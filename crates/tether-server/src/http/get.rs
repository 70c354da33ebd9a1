//! GET in the sessionful era: open the standalone stream, or resume any stream with `Last-Event-ID`.

use std::sync::Arc;

use axum::response::Response;
use http::HeaderMap;
use tether_core::lineage::{EventId, InvalidReason, ServerDecision, StreamState, decide_resume};
use tether_store::{SessionStatus, StreamPage};

use super::sse::{Connection, Prelude};
use super::{check_load, guard, live_session, names, session_headers, session_id, session_status, sse};
use crate::reader::StreamReader;
use crate::refusal::{Refusal, Rejection};
use crate::session::service;
use crate::{ServerState, ids, now_ms};

pub(crate) async fn get(
    shared: &Arc<ServerState>,
    headers: &HeaderMap,
    principal: Option<String>,
) -> Result<Response, Rejection> {
    guard::get_media(headers)?;
    match headers.get(names::LAST_EVENT_ID) {
        Some(cursor) => resume(shared, headers, principal.as_deref(), cursor.to_str().unwrap_or("")).await,
        None => standalone(shared, headers, principal.as_deref()).await,
    }
}

/// A plain GET: a new standalone stream for server-initiated messages. One at a time. The one
/// it replaces is ended: nothing is written to it again, and ended, retention drops it (a
/// client that opens GET after GET would otherwise grow its session by a stream each time).
async fn standalone(
    shared: &Arc<ServerState>,
    headers: &HeaderMap,
    principal: Option<&str>,
) -> Result<Response, Rejection> {
    let record = live_session(shared, headers, principal).await?;
    let runtime = service::follow(shared, &record);
    check_load(shared, &runtime, 1)?;
    let stream = ids::stream_name('g').map_err(|e| Refusal::RandomFailed.with(e.to_string()))?;
    let Some(attachment) = runtime.attach_new_get_stream(&stream) else {
        return Err(Refusal::GetStreamAttached
            .with("the session's standalone stream is already open; resume it with Last-Event-ID instead"));
    };
    let store = &shared.store;
    let replaced = store.standalone_stream(&runtime.id).await.map_err(Rejection::from)?;
    store.open_stream(&runtime.id, &runtime.epoch, &stream).await.map_err(Rejection::from)?;
    store.set_standalone_stream(&runtime.id, &runtime.epoch, &stream).await.map_err(Rejection::from)?;
    if let Some(replaced) = replaced
        && let Err(err) = store.end_stream(&runtime.id, &runtime.epoch, &replaced).await
    {
        tracing::debug!(%err, stream = %replaced, "ending the standalone stream a new one replaced");
    }
    let headers = session_headers(&runtime.id, &runtime.epoch);
    let connection = Connection::fresh(shared, runtime, stream, attachment);
    Ok(sse::response(connection.into_body(), headers))
}

/// A resume: seed 004's three-way branch, decided by `decide_resume` alone.
async fn resume(
    shared: &Arc<ServerState>,
    headers: &HeaderMap,
    principal: Option<&str>,
    raw: &str,
) -> Result<Response, Rejection> {
    let id = session_id(headers)?;
    let malformed = |why: String| {
        let raw = crate::excerpt::quoted(raw);
        Refusal::MalformedCursor.with(format!("Last-Event-ID {raw} is not an event id of this server: {why}"))
    };
    let cursor = EventId::parse(raw).map_err(|e| malformed(e.to_string()))?;
    let tag = cursor.tag.ok_or_else(|| malformed("it has no tag".into()))?;
    let now = now_ms();
    let status = session_status(shared, &id, principal, now).await?;
    let page = match &status {
        SessionStatus::Live(_) => {
            shared.store.read_page(&id, &cursor.stream, cursor.seq, 0).await.map_err(Rejection::from)?
        }
        _ => None,
    };
    let decision = decide_resume(status.lookup(), &cursor, tag, page.as_ref().map(StreamPage::at), now);
    crate::telemetry::resume(&decision);
    let (record, after) = match (status, decision) {
        (SessionStatus::Live(record), ServerDecision::SessionInvalid(InvalidReason::HistoryRewritten)) => {
            service::end_rewritten(shared, &service::follow(shared, &record), &cursor.stream).await;
            return Err(Rejection::session_invalid(InvalidReason::HistoryRewritten));
        }
        (_, ServerDecision::SessionInvalid(reason)) => return Err(Rejection::session_invalid(reason)),
        (SessionStatus::Live(record), ServerDecision::Replay { after, .. }) => (record, Ok(after)),
        (SessionStatus::Live(record), ServerDecision::Resync(notice)) => (record, Err(notice)),
        _ => {
            return Err(Refusal::DecisionInconsistent.with("a resume was allowed for a session that is not live"));
        }
    };
    // Only a resume the decision allowed renews the session.
    service::renew(shared, &record, now).await?;
    let runtime = service::follow(shared, &record);
    if runtime.attaching_adds_load(&cursor.stream) {
        check_load(shared, &runtime, 1)?;
    }
    let headers = session_headers(&runtime.id, &runtime.epoch);
    let after = match after {
        Ok(after) => after,
        Err(notice) => {
            crate::telemetry::resync_sent(notice.reason);
            return Ok(sse::response(sse::notice_body(record.epoch.as_str(), &notice), headers));
        }
    };
    let request = shared.store.stream_request(&id, &cursor.stream).await.map_err(Rejection::from)?;
    let live = page.as_ref().is_some_and(|page| page.range.state == StreamState::Live);
    if request.is_none() && live {
        // A resumed standalone stream is the session's standalone stream again (after a restart,
        // or on another replica, server messages follow the client back). One a plain GET
        // replaced has ended: its resume gets what it holds, and ends.
        runtime.adopt_get_stream(&cursor.stream);
        shared.store.set_standalone_stream(&record.id, &record.epoch, &cursor.stream).await.map_err(Rejection::from)?;
    }
    let attachment = runtime.attach(&cursor.stream);
    let reader = StreamReader::resumed(Arc::clone(&shared.store), &record.id, cursor.stream, after, Some(tag));
    let connection =
        Connection { shared: Arc::clone(shared), runtime, reader, prelude: Prelude::None, resumed: true, attachment };
    Ok(sse::response(connection.into_body(), headers))
}
