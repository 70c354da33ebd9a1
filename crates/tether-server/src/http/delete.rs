//! DELETE: the client ends its session; later requests with its id get 404 `terminated`.

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode};
use tether_store::SessionEnd;

use super::{live_session, session_headers};
use crate::ServerState;
use crate::refusal::Rejection;

pub(crate) async fn delete(
    shared: &Arc<ServerState>,
    headers: &HeaderMap,
    principal: Option<String>,
) -> Result<Response, Rejection> {
    let (record, runtime) = live_session(shared, headers, principal.as_deref()).await?;
    shared.store.end_session(&record.id, &record.epoch, SessionEnd::Terminated).await.map_err(Rejection::from)?;
    shared.sessions.remove(&record.id);
    crate::telemetry::session_terminated();
    tracing::debug!(session = %record.id, "session terminated by the client");
    let mut response = StatusCode::OK.into_response();
    response.headers_mut().extend(session_headers(&runtime));
    Ok(response)
}
