//! Where the MCP endpoint is served: on its own at its path, before a router for every other
//! path ([`tether_server::Endpoint`]), or as a route of an application's axum router.

use axum::routing::get;
use serde_json::json;
use tether_builtin::BuiltinHandler;
use tether_server::Builder;

use crate::common::*;

/// Serves `app` on a loopback port; the server, and its base URL.
async fn serve(app: impl tether_server::App) -> (TestServer, String) {
    let server = serve_app(app, tether_server::ConnectionLimits::default()).await;
    let base = server.url.strip_suffix("/mcp").expect("an /mcp url").to_owned();
    (server, base)
}

/// The status and body of a GET of `url`.
async fn fetch(url: &str) -> (u16, String) {
    let response = http_client().build().expect("client").get(url).send().await.expect("GET");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

/// The MCP endpoint's path reaches the server, whatever the query; every other path, a path
/// below the endpoint's included, reaches the router given for the rest.
#[tokio::test]
async fn the_endpoint_answers_its_path_and_the_rest_answers_every_other() {
    let rest = axum::Router::new().route("/other", get(|| async { "other" }));
    let server = Builder::new(BuiltinHandler::in_memory()).config(config()).build();
    let (_served, base) = serve(server.endpoint("/mcp", rest)).await;
    let client = Client { http: http_client().build().expect("client"), url: format!("{base}/mcp?tenant=a") };
    let session = client.initialize("2025-11-25").await;
    assert!(!session.id.is_empty());
    // A GET without a session is the endpoint's to refuse, not a router's 404 or 405.
    let (status, body) = fetch(&format!("{base}/mcp")).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("Mcp-Session-Id"), "{body}");
    assert_eq!(fetch(&format!("{base}/other")).await, (200, "other".to_owned()));
    for path in ["/mcp/", "/mcp/x", "/MCP", "/nothing"] {
        assert_eq!(fetch(&format!("{base}{path}")).await.0, 404, "{path}");
    }
}

/// The router a server makes is a route like any other of an application's axum router.
#[tokio::test]
async fn the_router_mounts_the_endpoint_in_an_application() {
    let server = Builder::new(BuiltinHandler::in_memory()).config(config()).build();
    let app = axum::Router::new().route("/other", get(|| async { "other" })).merge(server.router("/mcp"));
    let (_served, base) = serve(app).await;
    let client = Client { http: http_client().build().expect("client"), url: format!("{base}/mcp") };
    let session = client.initialize("2025-11-25").await;
    let mut called = client.call(&session, json!(1), "count", json!({"to": 2, "interval_ms": 0})).await;
    assert_eq!(called.status(), 200);
    let (events, _) = drain(&mut called).await;
    let answer = messages(&events).pop().expect("a response");
    assert_eq!(answer["id"], 1, "{answer}");
    assert!(answer["result"].is_object(), "{answer}");
    assert_eq!(fetch(&format!("{base}/other")).await, (200, "other".to_owned()));
    assert_eq!(fetch(&format!("{base}/nothing")).await.0, 404);
}
