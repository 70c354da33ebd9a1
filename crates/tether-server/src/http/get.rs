//! GET in the legacy era: open the standalone stream, or resume any stream with `Last-Event-ID`.

use std::sync::Arc;

use axum::response::Response;
use http::{HeaderMap, StatusCode};
use tether_core::lineage::{EventId, ResyncReason, ServerDecision, Then, decide_resume};
use tether_core::mcp::header;
use tether_store::SessionStatus;

use super::reject::Rejection;
use super::sse::{Connection, Prelude};
use super::{check_load, guard, live_session, renew, session_headers, session_id, session_status, sse};
use crate::dispatch::request_id_of_key;
use crate::{Shared, ids, now_ms};

pub(crate) async fn get(
    shared: &Arc<Shared>,
    headers: &HeaderMap,
    principal: Option<String>,
) -> Result<Response, Rejection> {
    guard::get_media(headers)?;
    match headers.get(header::LAST_EVENT_ID) {
        Some(cursor) => resume(shared, headers, principal.as_deref(), cursor.to_str().unwrap_or("")).await,
        None => standalone(shared, headers, principal.as_deref()).await,
    }
}

/// A plain GET: a new standalone stream for server-initiated messages. One at a time.
async fn standalone(shared: &Arc<Shared>, headers: &HeaderMap, principal: Option<&str>) -> Result<Response, Rejection> {
    let (_, runtime) = live_session(shared, headers, principal).await?;
    check_load(shared, &runtime)?;
    let stream = ids::stream_name('g').map_err(|e| Rejection::internal("random_failed", e.to_string()))?;
    let Some(attachment) = runtime.attach_new_get_stream(&stream) else {
        return Err(Rejection::new(
            StatusCode::CONFLICT,
            -32000,
            "get_stream_attached",
            "the session's standalone stream is already open; resume it with Last-Event-ID instead",
        ));
    };
    let store = &shared.store;
    store.open_stream(&runtime.id, &runtime.epoch, &stream).await.map_err(|e| crate::store_rejection(&e))?;
    store.set_standalone_stream(&runtime.id, &runtime.epoch, &stream).await.map_err(|e| crate::store_rejection(&e))?;
    let headers = session_headers(&runtime);
    let connection = Connection::fresh(shared, runtime, stream, attachment);
    Ok(sse::response(connection.into_body(), headers))
}

/// A resume: seed 004's three-way branch, decided by `decide_resume` alone.
async fn resume(
    shared: &Arc<Shared>,
    headers: &HeaderMap,
    principal: Option<&str>,
    raw: &str,
) -> Result<Response, Rejection> {
    let id = session_id(headers)?;
    let cursor = EventId::parse(raw).map_err(|e| {
        Rejection::bad_request(
            "malformed_cursor",
            format!("Last-Event-ID {raw:?} is not an event id of this server: {e}"),
        )
    })?;
    let now = now_ms();
    let status = session_status(shared, id, principal, now).await?;
    let range = match &status {
        SessionStatus::Live(_) => {
            shared.store.stream_range(id, &cursor.stream).await.map_err(|e| crate::store_rejection(&e))?
        }
        _ => None,
    };
    let decision = decide_resume(status.lookup(), &cursor, range, now);
    crate::telemetry::resume(&decision);
    let SessionStatus::Live(record) = status else {
        return Err(match decision {
            ServerDecision::SessionInvalid(reason) => Rejection::session_invalid(reason),
            _ => Rejection::internal("decision_inconsistent", "a resume was allowed for a session that is not live"),
        });
    };
    let request = shared.store.stream_request(id, &cursor.stream).await.map_err(|e| crate::store_rejection(&e))?;
    let (cursor_seq, prelude, then) = match decision {
        ServerDecision::SessionInvalid(reason) => return Err(Rejection::session_invalid(reason)),
        ServerDecision::Replay { after, then } => (after, Prelude::None, then),
        ServerDecision::Resync { notice, then } => {
            let aborted = match notice.reason {
                ResyncReason::RequestAborted => request.as_deref().and_then(request_id_of_key),
                _ => None,
            };
            (notice.head, Prelude::Resync(notice, aborted), then)
        }
    };
    // Only a resume the decision allowed renews the session.
    renew(shared, &record, now).await?;
    let runtime = shared.sessions.runtime(&record, &shared.process_token);
    if request.is_none() && range.is_some() {
        // A resumed standalone stream is the session's standalone stream again (after a plain
        // GET elsewhere replaced it, server messages follow the client back).
        runtime.adopt_get_stream(&cursor.stream);
        shared
            .store
            .set_standalone_stream(&record.id, &record.epoch, &cursor.stream)
            .await
            .map_err(|e| crate::store_rejection(&e))?;
    }
    let attachment = runtime.attach(&cursor.stream);
    let headers = session_headers(&runtime);
    let connection = Connection {
        shared: Arc::clone(shared),
        runtime,
        stream: cursor.stream,
        cursor: cursor_seq,
        prelude,
        follow: then == Then::FollowLive,
        resumed: true,
        attachment,
    };
    Ok(sse::response(connection.into_body(), headers))
}
