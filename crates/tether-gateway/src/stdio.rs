//! A stdio MCP server as an upstream: a child process that reads JSON-RPC messages from its
//! stdin and writes them to its stdout, one per line (the MCP stdio transport).

use std::process::Stdio;

use crate::upstream::{Connect, FromUpstream, LINK_QUEUE, Link};
use futures_util::future::BoxFuture;
use tether_core::jsonrpc;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Child;
use tokio::sync::mpsc;

use crate::Tasks;
use crate::lines::{next_line, write_messages};

/// How to start the child: a program and its arguments.
#[derive(Debug, Clone)]
pub struct Command {
    program: String,
    args: Vec<String>,
}

impl Command {
    /// `program` with `args`, found on `PATH` as a shell would.
    pub fn new(program: impl Into<String>, args: impl IntoIterator<Item = impl Into<String>>) -> Command {
        Command { program: program.into(), args: args.into_iter().map(Into::into).collect() }
    }
}

/// A running child: killed when dropped, with its reader and writer.
struct Running {
    _child: Child,
    _io: Tasks,
}

impl Connect for Command {
    fn connect(&self, _principal: Option<&str>) -> BoxFuture<'static, Result<Link, String>> {
        let spawned = tokio::process::Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn();
        let describe = self.describe();
        Box::pin(async move {
            let mut child = spawned.map_err(|err| format!("cannot start it: {err}"))?;
            // None only once the child is reaped; the pid only labels log lines.
            let pid = child.id().unwrap_or(0);
            // Piped above, so present: taken once, here.
            let (Some(stdin), Some(stdout), Some(stderr)) =
                (child.stdin.take(), child.stdout.take(), child.stderr.take())
            else {
                return Err("its standard streams are not piped".to_owned());
            };
            let (to_upstream, from_tether) = mpsc::channel(LINK_QUEUE);
            let (to_tether, from_upstream) = mpsc::channel(LINK_QUEUE);
            let io = Tasks(vec![
                tokio::spawn(write_messages(from_tether, stdin)).abort_handle(),
                tokio::spawn(read_messages(stdout, to_tether, pid)).abort_handle(),
                tokio::spawn(log_stderr(stderr, pid)).abort_handle(),
            ]);
            tracing::info!(pid, upstream = %describe, "started an upstream process");
            Ok(Link { to_upstream, from_upstream, keep: Box::new(Running { _child: child, _io: io }) })
        })
    }

    fn describe(&self) -> String {
        std::iter::once(self.program.as_str()).chain(self.args.iter().map(String::as_str)).collect::<Vec<_>>().join(" ")
    }
}

/// Reads one message per line until the child closes its stdout (it exited) or writes a line
/// too long to hold. A line that is not a JSON-RPC message is logged and skipped: servers
/// sometimes print a banner to stdout.
async fn read_messages(stdout: impl AsyncRead + Unpin, to_tether: mpsc::Sender<FromUpstream>, pid: u32) {
    let mut reader = BufReader::new(stdout);
    let ended = loop {
        let line = match next_line(&mut reader).await {
            Ok(line) => line,
            Err(ended) => break ended,
        };
        match jsonrpc::parse_message(&line) {
            Ok(message) => {
                // Waits while tether has LINK_QUEUE messages of it unread: the child then waits
                // to write.
                if to_tether.send(message.into()).await.is_err() {
                    return;
                }
            }
            Err(err) => tracing::warn!(
                pid, %err, line = %String::from_utf8_lossy(&line), "the upstream wrote a line that is not a JSON-RPC message"
            ),
        }
    };
    tracing::info!(pid, %ended, "the upstream's stdout ended");
}

/// The most of one stderr line of a child that is kept and logged; the rest of a longer line is
/// dropped (and counted), so a child that writes without a newline cannot grow the gateway.
pub const MAX_STDERR_LINE_BYTES: usize = 8 * 1024;

/// Logs what the child writes to stderr, a line at a time, each cut to
/// [`MAX_STDERR_LINE_BYTES`].
async fn log_stderr(stderr: impl AsyncRead + Unpin, pid: u32) {
    let mut lines = StderrLines::new(stderr);
    while let Some((line, dropped)) = lines.next().await {
        let line = String::from_utf8_lossy(&line);
        if dropped > 0 {
            metrics::counter!("tether_upstream_stderr_dropped_bytes_total").increment(dropped as u64);
            tracing::info!(target: "tether::upstream", pid, dropped, "{line}… (cut)");
        } else {
            tracing::info!(target: "tether::upstream", pid, "{line}");
        }
    }
}

/// A child's stderr as lines of at most [`MAX_STDERR_LINE_BYTES`].
struct StderrLines<R> {
    reader: BufReader<R>,
    line: Vec<u8>,
}

impl<R: AsyncRead + Unpin> StderrLines<R> {
    fn new(stderr: R) -> Self {
        StderrLines { reader: BufReader::new(stderr), line: Vec::new() }
    }

    /// The next line, cut to the bound, and how many of its bytes were dropped; `None` once the
    /// child closed stderr (or reading it failed) and nothing is left.
    async fn next(&mut self) -> Option<(Vec<u8>, usize)> {
        let mut dropped = 0;
        loop {
            let buffered = match self.reader.fill_buf().await {
                Ok(buffered) if !buffered.is_empty() => buffered,
                _ if self.line.is_empty() && dropped == 0 => return None,
                _ => return Some((std::mem::take(&mut self.line), dropped)),
            };
            let end = buffered.iter().position(|&byte| byte == b'\n');
            let chunk = &buffered[..end.unwrap_or(buffered.len())];
            let kept = chunk.len().min(MAX_STDERR_LINE_BYTES - self.line.len());
            self.line.extend_from_slice(&chunk[..kept]);
            dropped += chunk.len() - kept;
            let consumed = chunk.len() + usize::from(end.is_some());
            self.reader.consume(consumed);
            if end.is_some() {
                return Some((std::mem::take(&mut self.line), dropped));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stderr_line_is_kept_to_the_bound_and_the_rest_counted() {
        let long = vec![b'x'; 3 * MAX_STDERR_LINE_BYTES];
        let mut input = b"first\n".to_vec();
        input.extend_from_slice(&long);
        input.extend_from_slice(b"\nlast");
        let mut lines = StderrLines::new(&input[..]);
        assert_eq!(lines.next().await, Some((b"first".to_vec(), 0)));
        let (cut, dropped) = lines.next().await.expect("the long line");
        assert_eq!((cut.len(), dropped), (MAX_STDERR_LINE_BYTES, 2 * MAX_STDERR_LINE_BYTES));
        assert_eq!(lines.next().await, Some((b"last".to_vec(), 0)));
        assert_eq!(lines.next().await, None);
    }
}
