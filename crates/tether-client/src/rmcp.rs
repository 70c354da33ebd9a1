//! tether's client as an rmcp client transport (feature `rmcp`): an rmcp client gains
//! divergence detection, exact resumption and re-initialization without changing its code.
//!
//! The transport is a [`MessageLink`] whose application is rmcp: rmcp's `initialize` connects a
//! tether [`Client`] with the rmcp client's name, protocol version and
//! capabilities; its requests are tether requests (a `tools/call` carries an idempotency key and
//! is re-issued until its real outcome arrives, when the server offers it); notifications reach
//! rmcp once each, in order, after validation; the server's requests are answered by the rmcp
//! client handler. What tether itself observes (resumes, divergences, re-initializations,
//! re-issues) arrives on the receiver [`TetherTransport::new`] returns. A request whose outcome
//! is lost ends in an error with reason `outcome_unknown`, never in silence.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use rmcp::ServiceExt;
//! let config = tether_client::ClientConfig::new("http://127.0.0.1:8808/mcp");
//! let (transport, _events) = tether_client::rmcp::TetherTransport::new(config);
//! let client = ().serve(transport).await?;
//! let tools = client.list_all_tools().await?;
//! # Ok(()) }
//! ```

use ::rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use ::rmcp::service::RoleClient;
use ::rmcp::transport::Transport;
use tether_core::jsonrpc::{self, Message};
use tokio::sync::mpsc;

use crate::link::{FromServer, MessageLink, NotConnected};
use crate::{Client, ClientConfig, ClientEvent};

/// An rmcp client transport over a tether [`Client`].
#[derive(Debug)]
pub struct TetherTransport {
    link: MessageLink,
    from_server: mpsc::UnboundedReceiver<FromServer>,
}

impl TetherTransport {
    /// A transport that connects with `config` when rmcp initializes (its hooks, name and
    /// protocol version give way to the rmcp client's). The receiver gets what tether observes
    /// about the connection: every [`ClientEvent`] except messages, which go to rmcp.
    pub fn new(config: ClientConfig) -> (TetherTransport, mpsc::UnboundedReceiver<ClientEvent>) {
        let (link, from_server, events) = MessageLink::new(config);
        (TetherTransport { link, from_server }, events)
    }

    /// The tether client, once rmcp has initialized.
    pub fn client(&self) -> Option<Client> {
        self.link.client()
    }
}

/// rmcp's message in tether's types.
/// (Through a JSON value: no text is written or parsed.)
fn from_rmcp(message: &ClientJsonRpcMessage) -> Option<Message> {
    jsonrpc::message_from_value(serde_json::to_value(message).ok()?).ok()
}

/// tether's message in rmcp's types.
fn to_rmcp(message: &Message) -> Option<ServerJsonRpcMessage> {
    serde_json::from_value(serde_json::to_value(message).ok()?).ok()
}

impl Transport<RoleClient> for TetherTransport {
    type Error = NotConnected;

    fn send(&mut self, item: ClientJsonRpcMessage) -> impl Future<Output = Result<(), NotConnected>> + Send + 'static {
        let sent: std::pin::Pin<Box<dyn Future<Output = Result<(), NotConnected>> + Send>> = match from_rmcp(&item) {
            Some(message) => Box::pin(self.link.send(message)),
            None => {
                tracing::warn!("rmcp sent a message tether cannot read");
                Box::pin(std::future::ready(Ok(())))
            }
        };
        sent
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        loop {
            let FromServer { message, .. } = self.from_server.recv().await?;
            match to_rmcp(&message) {
                Some(message) => return Some(message),
                None => tracing::warn!(method = ?message.method(), "a server message rmcp cannot read was dropped"),
            }
        }
    }

    async fn close(&mut self) -> Result<(), NotConnected> {
        self.link.close().await;
        self.from_server.close();
        Ok(())
    }
}
