//! What the client counts: a session ended behind its back is a divergence, a re-initialization
//! and, for a keyed call, a re-issue; each is counted once.

use serde_json::json;
use tether_builtin::BuiltinHandler;
use tether_client::{Client, ClientConfig, ClientEvent};
use tether_server::Builder;

#[tokio::test(flavor = "current_thread")]
async fn divergences_reinitializations_and_reissues_are_counted() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    // Only this test's counts: the recorder is installed for this thread alone, which runs every
    // task of the test (the client's followers included).
    let _local = metrics::set_default_local_recorder(&recorder);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/mcp", listener.local_addr().expect("addr"));
    let app = Builder::new(BuiltinHandler::in_memory()).build().router("/mcp");
    let server =
        tokio::spawn(
            async move { tether_server::serve(listener, app, tether_server::ConnectionLimits::default()).await },
        );
    let (client, mut events) = Client::connect(ClientConfig::new(url.clone())).await.expect("connect");
    let first = client.session_id().expect("a session");
    // The session ends behind the client's back.
    let deleted = tether_client::tls::Trust::platform()
        .http_client()
        .build()
        .expect("client")
        .delete(&url)
        .header("mcp-session-id", &first)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .expect("delete");
    assert!(deleted.status().is_success());
    let result = client.call_tool("counter_add", json!({"key": "t", "amount": 1})).await.expect("re-issued call");
    assert_eq!(result["structuredContent"]["value"], 1, "answered once, in the new session");
    assert_ne!(client.session_id().as_deref(), Some(first.as_str()));
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(match event {
            ClientEvent::Divergence { reason } => format!("divergence {}", reason.kind()),
            ClientEvent::Reinitialized { .. } => "reinitialized".into(),
            ClientEvent::Reissued { .. } => "reissued".into(),
            other => format!("{other:?}"),
        });
    }
    assert_eq!(seen, ["divergence session_invalid", "reinitialized", "reissued"]);
    let text = handle.render();
    for line in [
        r#"tether_client_divergences_total{kind="session_invalid"} 1"#,
        "tether_client_reinitializations_total 1",
        "tether_client_reissues_total 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
    }
    client.close().await;
    server.abort();
}
