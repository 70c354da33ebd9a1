//! Multi round-trip requests (SEP-2322) against a real tether server: what the server asks is
//! answered through the client's hooks until the result is complete.

use std::sync::Arc;

use serde_json::{Value, json};
use tether_builtin::BuiltinHandler;
use tether_client::{Client, ClientConfig, HookFuture, ServerRequests};
use tether_core::mcp::ProtocolVersion;
use tether_server::Builder;

/// A user who is Ada, likes teal, and whose model always says "Bonjour".
struct Ada;

impl ServerRequests for Ada {
    fn capabilities(&self) -> Value {
        json!({"elicitation": {}, "sampling": {}, "roots": {}})
    }

    fn answer(&self, method: &str, _params: Value) -> HookFuture {
        let answer = match method {
            "elicitation/create" => json!({"action": "accept", "content": {"name": "Ada", "color": "teal"}}),
            "sampling/createMessage" => {
                json!({"role": "assistant", "content": {"type": "text", "text": "Bonjour"}, "model": "m"})
            }
            _ => json!({"roots": [{"uri": "file:///ada", "name": "home"}]}),
        };
        Box::pin(std::future::ready(Ok(answer)))
    }
}

/// In 2026-07-28 the client answers the rounds itself; in a 2025-11-25 session the server turns
/// the same handler's rounds into its own requests to the client. The application sees the same.
#[tokio::test]
async fn what_the_server_asks_is_answered_by_the_hooks_in_both_eras() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/mcp", listener.local_addr().expect("addr"));
    let app = Builder::new(BuiltinHandler::in_memory()).build().router("/mcp");
    let server =
        tokio::spawn(
            async move { tether_server::serve(listener, app, tether_server::ConnectionLimits::default()).await },
        );
    for version in [ProtocolVersion::V2026_07_28, ProtocolVersion::V2025_11_25] {
        let mut config = ClientConfig::new(url.clone());
        config.protocol_version = version;
        config.hooks = Arc::new(Ada);
        let (client, _events) = Client::connect(config).await.expect("connect");
        let text = |result: Value| result["content"][0]["text"].as_str().map(str::to_owned);
        for (tool, expected) in [
            ("test_input_required_result_elicitation", "Hello, Ada!"),
            ("test_input_required_result_multi_round", "Ada likes teal"),
            ("test_input_required_result_multiple_inputs", "Bonjour Ada (1 roots)"),
            ("test_input_required_result_request_state", "state-ok: confirmed"),
        ] {
            let result = client.call_tool(tool, json!({})).await.expect("a complete result");
            assert_ne!(result["resultType"], "input_required", "{version} {tool}");
            assert_eq!(text(result).as_deref(), Some(expected), "{version} {tool}");
        }
        client.close().await;
    }
    server.abort();
}
