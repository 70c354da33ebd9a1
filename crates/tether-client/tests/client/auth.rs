//! A token that expires in the middle of a streamed call, through a server that enforces it
//! (`--auth jwt`) and a proxy that cuts the stream: the client refreshes the token and resumes
//! the stream exactly, and the call runs once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use tether_builtin::BuiltinHandler;
use tether_client::oauth::{FollowRedirect, OAuthConfig};
use tether_client::{Backoff, Client, ClientConfig, ClientEvent};
use tether_core::jsonrpc::Message;
use tether_server::{Builder, FetchFuture, Jwt, JwtConfig, KeySetSource, ProtectedResource, ServerConfig};
use tether_testkit::oauth::{Issuer, IssuerServer};
use tether_testkit::proxy;

const COUNT_TO: u64 = 24;
const WAIT: Duration = Duration::from_secs(60);

/// The test's issuer as the server's key source.
struct Minted(Arc<Issuer>);

impl KeySetSource for Minted {
    fn fetch(&self) -> FetchFuture<'_> {
        Box::pin(std::future::ready(Ok(self.0.jwks().into_bytes())))
    }
}

/// What the authorization server and the resource saw of one call's tokens.
struct Seen {
    /// Codes exchanged: one per authorization.
    authorizations: usize,
    /// Refresh tokens exchanged.
    refreshes: usize,
    /// Requests the resource refused 401.
    refusals: usize,
}

/// Runs a streamed call of about three token lifetimes through a cutting proxy; answers what
/// the authorization server and the resource saw.
async fn streamed_call_across_expiries(announce_lifetime: bool) -> Seen {
    let issuer = IssuerServer::start().await;
    issuer.grants.lifetime.store(1, Ordering::SeqCst);
    issuer.grants.announce_lifetime.store(announce_lifetime, Ordering::SeqCst);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let upstream = listener.local_addr().expect("addr");
    let proxy = proxy::start(vec![upstream], 0x0a7f, 200, 900).await;
    let endpoint = format!("http://{}/mcp", proxy.addr);
    let resource = ProtectedResource::new(&endpoint, issuer.issuer.issuer()).expect("a resource");
    let jwt = Jwt::new(
        JwtConfig { leeway: Duration::ZERO, ..JwtConfig::new(issuer.issuer.issuer()) },
        resource,
        Minted(Arc::clone(&issuer.issuer)),
    );
    let config = ServerConfig { sse_retry: Duration::from_millis(5), ..ServerConfig::default() };
    let refusals = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&refusals);
    let app = Builder::new(BuiltinHandler::in_memory()).config(config).authenticator(jwt).build().router("/mcp").layer(
        axum::middleware::map_response(move |response: axum::response::Response| {
            let counted = Arc::clone(&counted);
            async move {
                if response.status() == axum::http::StatusCode::UNAUTHORIZED {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
                response
            }
        }),
    );
    let server =
        tokio::spawn(
            async move { tether_server::serve(listener, app, tether_server::ConnectionLimits::default()).await },
        );

    let mut config = ClientConfig::new(&endpoint);
    let agent = FollowRedirect::new("http://127.0.0.1:9/callback", &config.trust).expect("an agent");
    config.oauth = Some(OAuthConfig::new(Arc::new(agent)));
    config.backoff = Backoff {
        initial: Duration::from_millis(5),
        max: Duration::from_millis(50),
        max_attempts_without_progress: 50,
    };
    let (client, mut events) = Client::connect(config).await.expect("connect");
    proxy.cutting.store(true, Ordering::Relaxed);

    let call = {
        let client = client.clone();
        tokio::spawn(async move { client.call_tool("count", json!({"to": COUNT_TO, "interval_ms": 250})).await })
    };
    let mut counts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut on_event = |event: ClientEvent| match event {
        ClientEvent::Message { id, message: Message::Notification(n), ack, .. } => {
            ack.done();
            let stream = id.unwrap_or_default().split(':').next().unwrap_or_default().to_owned();
            let count = n.params.as_ref().and_then(|p| p["data"]["count"].as_u64()).expect("a count");
            counts.entry(stream).or_default().push(count);
        }
        ClientEvent::Divergence { reason } => panic!("divergence: {reason}"),
        _ => {}
    };
    let mut call = call;
    let result = tokio::time::timeout(WAIT, async {
        loop {
            tokio::select! {
                Some(event) = events.recv() => on_event(event),
                joined = &mut call => break joined.expect("the call's task"),
            }
        }
    })
    .await
    .expect("the call ends");
    assert_eq!(result.expect("the call's result")["content"][0]["text"], format!("counted to {COUNT_TO}"));
    proxy.cutting.store(false, Ordering::Relaxed);
    // What was delivered before the result and is still queued.
    while let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(300), events.recv()).await {
        on_event(event);
    }
    let seen: Vec<&Vec<u64>> = counts.values().collect();
    assert_eq!(seen, [&(1..=COUNT_TO).collect::<Vec<_>>()], "each count once, in order, on one stream");
    assert!(proxy.cuts.load(Ordering::Relaxed) > 0, "the stream was cut");
    client.close().await;
    server.abort();
    Seen {
        authorizations: issuer.grants.exchanged(),
        refreshes: issuer.grants.refreshed(),
        refusals: refusals.load(Ordering::SeqCst),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_whose_lifetime_is_announced_is_refreshed_mid_stream_and_the_stream_resumed_exactly() {
    let Seen { authorizations, refreshes, refusals } = streamed_call_across_expiries(true).await;
    assert_eq!(authorizations, 1, "one authorization, then refreshes");
    assert!(refreshes >= 2, "the token was refreshed as it expired ({refreshes} refreshes)");
    // The first request's challenge, and at most a few tokens that expired in flight: each
    // refresh came ahead of the expiry, not after a refusal.
    assert!(refusals <= refreshes, "refreshed after refusals, not ahead: {refusals} refusals, {refreshes} refreshes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_refused_as_expired_mid_stream_is_refreshed_and_the_stream_resumed_exactly() {
    let Seen { authorizations, refreshes, refusals } = streamed_call_across_expiries(false).await;
    assert_eq!(authorizations, 1, "one authorization, then refreshes");
    assert!(refreshes >= 2, "the refusals were answered by refreshing ({refreshes} refreshes)");
    // The first request's challenge, then one refusal before each refresh.
    assert!(refusals > refreshes, "{refusals} refusals for {refreshes} refreshes");
}
