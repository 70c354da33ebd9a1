//! MCP's stdio framing: one JSON-RPC message per line, both ways.

use tether_core::jsonrpc::Message;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// The longest line a peer may write: a message larger than this ends the exchange rather than
/// growing tether's memory without bound.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// Why a peer's lines ended.
#[derive(Debug)]
pub(crate) enum LinesEnded {
    /// It closed its end.
    Closed,
    /// It wrote a line over [`MAX_LINE_BYTES`].
    TooLong,
    /// Reading failed.
    Failed(std::io::Error),
}

impl std::fmt::Display for LinesEnded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinesEnded::Closed => f.write_str("closed"),
            LinesEnded::TooLong => write!(f, "a line over {MAX_LINE_BYTES} bytes"),
            LinesEnded::Failed(err) => write!(f, "reading failed: {err}"),
        }
    }
}

/// Reads the next non-blank line (without its line break).
pub(crate) async fn next_line<R: AsyncRead + Unpin>(reader: &mut BufReader<R>) -> Result<Vec<u8>, LinesEnded> {
    loop {
        let mut line = Vec::new();
        match reader.take(MAX_LINE_BYTES as u64 + 1).read_until(b'\n', &mut line).await {
            Ok(0) => return Err(LinesEnded::Closed),
            Ok(_) if line.len() > MAX_LINE_BYTES => return Err(LinesEnded::TooLong),
            Ok(_) => {}
            Err(err) => return Err(LinesEnded::Failed(err)),
        }
        let text = line.trim_ascii();
        if !text.is_empty() {
            return Ok(text.to_vec());
        }
    }
}

/// Writes each message as one line; stops when the sender is dropped or the peer stops reading.
pub(crate) async fn write_messages(mut messages: mpsc::Receiver<Message>, mut output: impl AsyncWrite + Unpin) {
    while let Some(message) = messages.recv().await {
        let mut line = message.to_vec();
        line.push(b'\n');
        if output.write_all(&line).await.is_err() || output.flush().await.is_err() {
            return;
        }
    }
}
