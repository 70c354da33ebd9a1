//! An rmcp `#[tool]` server served by tether on the embedded durable store: the only change
//! from rmcp's own setup is the transport (`RmcpHandler` instead of `StreamableHttpService`).
//! `cargo run -p tether-examples --example rmcp_server`, then
//! `tether call http://127.0.0.1:8808/mcp count --args '{"to": 20, "interval_ms": 100}'`.

use std::sync::Arc;

use tether_examples::rmcp_counter::{Counter, Stats};
use tether_gateway::rmcp::RmcpHandler;
use tether_server::Builder;
use tether_store::{Retention, SqliteStore};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let stats = Arc::new(Stats::default());
    let handler = RmcpHandler::new(move || Counter::new(Arc::clone(&stats)));
    let store = SqliteStore::open("./rmcp-counter-data".as_ref(), Retention::default(), "rmcp-counter")?;
    let server = Builder::new(handler).store(Arc::new(store)).build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8808").await?;
    println!("listening on http://127.0.0.1:8808/mcp");
    let app = server.endpoint("/mcp", axum::Router::new());
    tether_server::serve(listener, app, tether_server::ConnectionLimits::default()).await?;
    Ok(())
}
