//! A client that keeps its checkpoint in a file: run it, stop it at any point, run it again, and
//! it resumes the same session's standalone stream where the application last acknowledged, or
//! reports why it cannot (and re-initializes). It also calls a tool, under an idempotency key
//! when the server offers them.
//! `cargo run -p tether-examples --example checkpoint_client -- http://127.0.0.1:8808/mcp`.

use serde_json::json;
use tether_client::{Client, ClientConfig, ClientEvent};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).unwrap_or_else(|| "http://127.0.0.1:8808/mcp".into());
    let mut config = ClientConfig::new(url);
    config.checkpoint_file = Some("./checkpoint.json".into());
    let (client, mut events) = Client::connect(config).await?;
    client.follow_standalone().await;
    let result = client.call_tool("counter_add", json!({"key": "example", "amount": 1})).await;
    println!("counter_add: {result:?}");
    while let Some(event) = events.recv().await {
        match event {
            ClientEvent::Message { message, ack, .. } => {
                println!("{}", String::from_utf8_lossy(&message.to_vec()));
                // Only now is the message's cursor written to the checkpoint file.
                ack.done();
            }
            ClientEvent::Resynced { notice, ack, .. } => {
                println!("the server says these events are gone: {notice:?}");
                ack.done();
            }
            ClientEvent::Closed { reason, fatal: true } => return Err(reason.into()),
            other => println!("{other:?}"),
        }
    }
    Ok(())
}
