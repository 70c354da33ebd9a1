//! An rmcp client on tether's transport: every reconnect is proven continuous or the session is
//! re-initialized, and the events that tell so are printed beside rmcp's progress.
//! With `rmcp_server` (or any MCP server) running:
//! `cargo run -p tether-examples --example rmcp_client -- http://127.0.0.1:8808/mcp`.

use rmcp::model::{CallToolRequestParams, ClientRequest, ProgressNotificationParam, Request};
use rmcp::service::{NotificationContext, PeerRequestOptions};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use tether_client::ClientConfig;
use tether_client::rmcp::TetherTransport;

struct Printer;

impl ClientHandler for Printer {
    async fn on_progress(&self, params: ProgressNotificationParam, _: NotificationContext<RoleClient>) {
        println!("progress {}/{}", params.progress, params.total.unwrap_or_default());
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).unwrap_or_else(|| "http://127.0.0.1:8808/mcp".into());
    let (transport, mut events) = TetherTransport::new(ClientConfig::new(url));
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            println!("tether: {event:?}");
        }
    });
    let client = Printer.serve(transport).await?;
    let arguments = serde_json::json!({"to": 20, "interval_ms": 100});
    let params = CallToolRequestParams::new("count").with_arguments(arguments.as_object().cloned().unwrap_or_default());
    let call = ClientRequest::CallToolRequest(Request::new(params));
    let handle = client.send_cancellable_request(call, PeerRequestOptions::no_options()).await?;
    println!("{:?}", handle.await_response().await?);
    client.cancel().await?;
    Ok(())
}
