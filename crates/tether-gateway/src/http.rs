//! A Streamable HTTP MCP server as an upstream, reached through tether's client: each instance
//! is a client session of its own (the downstream client's `initialize` params, its requests
//! keyed when the upstream offers idempotency keys), and every reconnect to the upstream is
//! proven continuous or the instance ends. The upstream's silent gaps, replays from zero and
//! lost sessions are not passed on as a well-formed stream: the client diverges, the instance
//! stops, the downstream session ends as `upstream_lost` and its running requests with
//! `request_aborted`.

use crate::upstream::{Connect, FromUpstream, LINK_QUEUE, Link};
use futures_util::future::BoxFuture;
use tether_client::link::{FromServer, MessageLink};
use tether_client::{ClientConfig, ClientEvent, DivergenceReason};
use tokio::sync::mpsc;

use crate::Tasks;

/// An HTTP upstream: where it is and how tether's client talks to it.
#[derive(Debug, Clone)]
pub struct Remote {
    config: ClientConfig,
    forward_principal: Option<String>,
}

impl Remote {
    /// The server `config` names, reached with `config`'s policy and backoff. A divergence ends
    /// the instance rather than re-initializing it: a new upstream session would answer the
    /// downstream session from reset state.
    pub fn new(mut config: ClientConfig) -> Remote {
        config.reinitialize = false;
        Remote { config, forward_principal: None }
    }

    /// Tells the upstream who each instance serves: the downstream client's principal in the
    /// `header` of every request (an upstream that trusts the gateway may act on it). Without,
    /// the upstream is not told. The client's own credentials are never passed on.
    pub fn forward_principal(mut self, header: impl Into<String>) -> Remote {
        self.forward_principal = Some(header.into());
        self
    }
}

impl Connect for Remote {
    fn connect(&self, principal: Option<&str>) -> BoxFuture<'static, Result<Link, String>> {
        let mut config = self.config.clone();
        if let (Some(header), Some(principal)) = (&self.forward_principal, principal) {
            config.headers.retain(|(name, _)| !name.eq_ignore_ascii_case(header));
            config.headers.push((header.clone(), principal.to_owned()));
        }
        let (mut link, mut from_server, mut events) = MessageLink::new(config);
        let url = self.config.url.clone();
        Box::pin(async move {
            let (to_upstream, mut from_tether) = mpsc::channel(LINK_QUEUE);
            let (to_tether, from_upstream) = mpsc::channel::<FromUpstream>(LINK_QUEUE);
            // What tether sends, in order; once tether lets go of the instance, its session ends.
            tokio::spawn(async move {
                while let Some(message) = from_tether.recv().await {
                    if link.send(message).await.is_err() {
                        break;
                    }
                }
                link.close().await;
            });
            // What the upstream sends, until tether lets go (the instance's `keep` is dropped) or
            // the client can no longer vouch for the session.
            let relay = tokio::spawn(async move {
                loop {
                    tokio::select! {
                        message = from_server.recv() => {
                            let Some(message) = message else { break };
                            let FromServer { message, origin } = message;
                            if to_tether.send(FromUpstream { message, origin }).await.is_err() {
                                break;
                            }
                        }
                        event = events.recv() => match event {
                            None | Some(ClientEvent::Closed { fatal: true, .. }) => break,
                            Some(ClientEvent::Divergence { reason }) if !matches!(reason, DivergenceReason::TaskStream { .. }) => {
                                tracing::warn!(upstream = %url, kind = reason.kind(), %reason, "the upstream session diverged: the instance ends");
                                break;
                            }
                            Some(event) => tracing::debug!(upstream = %url, ?event, "upstream"),
                        },
                    }
                }
            });
            Ok(Link { to_upstream, from_upstream, keep: Box::new(Tasks(vec![relay.abort_handle()])) })
        })
    }

    fn describe(&self) -> String {
        self.config.url.clone()
    }
}
