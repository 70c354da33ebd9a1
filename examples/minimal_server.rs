//! The smallest tether server: one tool, the embedded durable store, loopback.
//! `cargo run -p tether-examples --example minimal_server`, then
//! `tether call http://127.0.0.1:8808/mcp greet --args '{"name":"Ada"}'`.

use std::sync::Arc;

use serde_json::{Value, json};
use tether_server::tools::{ToolSet, text_result};
use tether_server::{Builder, Context, Handler, HandlerFuture, ServerInfo};
use tether_store::{Retention, SqliteStore};

struct Greeter(ToolSet);

impl Handler for Greeter {
    fn info(&self) -> ServerInfo {
        ServerInfo {
            name: "greeter".into(),
            version: "1.0.0".into(),
            instructions: None,
            capabilities: json!({"tools": {}}),
        }
    }

    fn call(&self, ctx: Context, method: String, params: Value) -> HandlerFuture {
        match method.as_str() {
            "tools/list" => Box::pin(std::future::ready(Ok(self.0.list()))),
            _ => self.0.call(ctx, &params),
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut tools = ToolSet::new();
    tools.add(
        json!({"name": "greet", "description": "Greets someone.", "inputSchema": {"type": "object", "properties": {"name": {"type": "string"}}}}),
        |ctx: Context, args: Value| async move {
            ctx.progress(0.5, Some(1.0), Some("thinking")).await.ok();
            Ok(text_result(format!("Hello, {}!", args["name"].as_str().unwrap_or("world"))))
        },
    );
    let store = SqliteStore::open("./greeter-data".as_ref(), Retention::default(), "greeter")?;
    let server = Builder::new(Greeter(tools)).store(Arc::new(store)).build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8808").await?;
    println!("listening on http://127.0.0.1:8808/mcp");
    let app = server.endpoint("/mcp", axum::Router::new());
    tether_server::serve(listener, app, tether_server::ConnectionLimits::default()).await?;
    Ok(())
}
