//! DELETE: the client ends its session; later requests with its id get 404 `terminated`.

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode};

use super::{live_session, session_headers};
use crate::ServerState;
use crate::refusal::Rejection;
use crate::session::service;

pub(crate) async fn delete(
    shared: &Arc<ServerState>,
    headers: &HeaderMap,
    principal: Option<String>,
) -> Result<Response, Rejection> {
    let record = live_session(shared, headers, principal.as_deref()).await?;
    service::terminate(shared, &record).await?;
    let mut response = StatusCode::OK.into_response();
    response.headers_mut().extend(session_headers(&record.id, &record.epoch));
    Ok(response)
}
