//! The MCP endpoint on its own, in front of a router for every other path.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::response::Response;
use futures_util::future::Either;

use crate::ServerState;
use crate::connection::App;

/// The MCP endpoint at its path, and `rest` (health probes, the authorization metadata, an
/// application's own routes) for every other path. A request for the endpoint goes straight to
/// the server, without a router's matching, extractors and boxed routes, which cost a call about
/// 4% of its instructions (docs/benchmarks.md). Made by [`Server::endpoint`](crate::Server::endpoint)
/// for [`serve`](crate::serve); to mount the endpoint in an axum or hyper application, use the
/// tower service [`Server::router`](crate::Server::router) instead.
#[derive(Clone)]
pub struct Endpoint {
    path: Arc<str>,
    shared: Arc<ServerState>,
    rest: Router,
}

impl Endpoint {
    pub(crate) fn new(path: &str, shared: Arc<ServerState>, rest: Router) -> Endpoint {
        Endpoint { path: Arc::from(path), shared, rest }
    }
}

impl App for Endpoint {
    // Inlined into the connection's task, the endpoint's future (kilobytes) is built where the
    // connection keeps it rather than moved through each wrapper: 1,000 instructions a call.
    #[inline(always)]
    fn answer(self, request: Request) -> impl Future<Output = Response> + Send + 'static {
        if request.uri().path() == &*self.path {
            Either::Left(super::endpoint(self.shared, request))
        } else {
            Either::Right(self.rest.answer(request))
        }
    }
}
