//! A `redis-server` of a test's own, on a free loopback port, in a directory of its own.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// A `redis-server`, killed when dropped (its directory removed).
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: PathBuf,
    args: Vec<String>,
    /// `redis://127.0.0.1:PORT/`.
    pub url: String,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port free on 127.0.0.1 when asked (another process may take it before it is used).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// Where the next server keeps its files.
pub(crate) fn fresh_dir() -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tether-redis-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a directory for redis-server");
    dir
}

/// The file in `dir` a server on `port` logs to, appended to by each start.
fn log_path(dir: &Path, port: u16) -> PathBuf {
    dir.join(format!("redis-{port}.log"))
}

fn log(dir: &Path, port: u16) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new().create(true).append(true).open(log_path(dir, port))
}

/// Starts `redis-server` on `port` in `dir` with `args`; `None` if it did not accept
/// connections within ten seconds (another process took the port, most likely).
async fn spawn(port: u16, dir: &Path, args: &[String]) -> Option<Child> {
    spawn_from(None, port, dir, args).await
}

/// [`spawn`], reading the configuration file `config` first if there is one (a Sentinel's,
/// which it rewrites).
pub(crate) async fn spawn_from(config: Option<&Path>, port: u16, dir: &Path, args: &[String]) -> Option<Child> {
    let mut child = Command::new("redis-server")
        .args(config)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--dir"])
        .arg(dir)
        .args(args)
        .stdout(log(dir, port).map_or_else(|_| Stdio::null(), Stdio::from))
        .stderr(log(dir, port).map_or_else(|_| Stdio::null(), Stdio::from))
        .kill_on_drop(true)
        .spawn()
        .expect("redis-server is installed (scripts/test installs it)");
    for _ in 0..1_000 {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return None;
        }
        // Whatever answers on the port must be this process: another test's server (or any
        // listener) that took the port first would otherwise be used, and killed under this test.
        match serving_pid(port).await {
            Some(pid) if Some(pid) == child.id() => return Some(child),
            Some(_) => {
                let _ = child.start_kill();
                return None;
            }
            None => {}
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = child.start_kill();
    None
}

/// Sends one command to the Redis (or Sentinel) on `port` and returns its reply as
/// [`RedisServer::command`] does; `None` if nothing answers within two seconds.
pub(crate) async fn command(port: u16, args: &[&str]) -> Option<String> {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        let mut request = format!("*{}\r\n", args.len());
        for arg in args {
            request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut reader = tokio::io::BufReader::new(stream);
        let mut lines = Vec::new();
        // Values still to read: an array adds its elements (nested arrays are flattened).
        let mut pending = 1usize;
        while pending > 0 && lines.len() < 100_000 {
            pending -= 1;
            let mut line = String::new();
            reader.read_line(&mut line).await.ok()?;
            let line = line.trim_end();
            if let Some(count) = line.strip_prefix('*').and_then(|n| n.parse::<usize>().ok()) {
                pending += count;
            } else if let Some(length) = line.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()) {
                let mut bulk = vec![0; length + 2];
                tokio::io::AsyncReadExt::read_exact(&mut reader, &mut bulk).await.ok()?;
                bulk.truncate(length);
                lines.push(String::from_utf8_lossy(&bulk).into_owned());
            } else {
                lines.push(line.to_owned());
            }
        }
        Some(lines.join("\n"))
    };
    tokio::time::timeout(Duration::from_secs(2), exchange).await.ok()?
}

/// The `process_id` of the Redis answering `INFO server` on `port`, if one does.
async fn serving_pid(port: u16) -> Option<u32> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    stream.write_all(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n").await.ok()?;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    let read = async {
        while !reply.windows(11).any(|w| w == b"process_id:") || !reply.ends_with(b"\r\n") {
            let n = stream.read(&mut chunk).await.ok()?;
            if n == 0 || reply.len() > 64 << 10 {
                return None;
            }
            reply.extend_from_slice(&chunk[..n]);
        }
        Some(())
    };
    tokio::time::timeout(Duration::from_secs(2), read).await.ok()??;
    let text = String::from_utf8_lossy(&reply);
    text.lines().find_map(|line| line.strip_prefix("process_id:"))?.trim().parse().ok()
}

impl RedisServer {
    /// One that keeps nothing on disk.
    pub async fn start() -> RedisServer {
        RedisServer::start_with(&["--save", "", "--appendonly", "no"]).await
    }

    /// One started with `args` besides its port and directory, once it accepts connections.
    /// The free port is only free when it is picked: if another process takes it first, this
    /// `redis-server` exits, and another port is tried (three at most, ten seconds each).
    pub async fn start_with(args: &[&str]) -> RedisServer {
        RedisServer::start_each_try(|| args.iter().map(|a| (*a).to_owned()).collect()).await
    }

    /// [`RedisServer::start_with`] with the arguments made anew for each port tried: a Cluster
    /// node's bus port is picked free like its own port, and may be taken meanwhile as well.
    pub(crate) async fn start_each_try(args: impl Fn() -> Vec<String>) -> RedisServer {
        let dir = fresh_dir();
        let mut tried = Vec::new();
        for _ in 0..3 {
            let (port, args) = (free_port(), args());
            if let Some(child) = spawn(port, &dir, &args).await {
                return RedisServer { child, port, dir, args, url: format!("redis://127.0.0.1:{port}/") };
            }
            tried.push(port);
        }
        let said: Vec<String> = tried
            .iter()
            .map(|&port| {
                let log = std::fs::read_to_string(log_path(&dir, port)).unwrap_or_default();
                let last: Vec<&str> = log.lines().rev().take(3).collect();
                format!("port {port}: {}", last.into_iter().rev().collect::<Vec<_>>().join(" | "))
            })
            .collect();
        panic!("redis-server did not start on any of three free ports; its last words:\n{}", said.join("\n"));
    }

    /// Sends one command and returns its reply: a status, error or integer line as sent
    /// (`+OK`, `-ERR …`, `:3`), a bulk string's text, an array's elements on lines of their own.
    pub async fn command(&self, args: &[&str]) -> String {
        command(self.port, args).await.expect("a reply from redis")
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its directory, where it keeps what it keeps on disk.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Kills it (SIGKILL, as a crash would) and waits until it is gone.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Starts it again on the same port, with the same arguments and directory: it comes back
    /// with what it kept on disk. Kills it first if it still runs.
    pub async fn restart(&mut self) {
        let args = self.args.clone();
        self.restart_with(&args).await;
    }

    /// [`RedisServer::restart`], as a replica of the server on `primary` (127.0.0.1) from its
    /// first command on.
    pub async fn restart_as_replica_of(&mut self, primary: u16) {
        let mut args = self.args.clone();
        args.extend(["--replicaof".to_owned(), "127.0.0.1".to_owned(), primary.to_string()]);
        self.restart_with(&args).await;
    }

    async fn restart_with(&mut self, args: &[String]) {
        self.kill().await;
        for _ in 0..3 {
            if let Some(child) = spawn(self.port, &self.dir, args).await {
                self.child = child;
                return;
            }
        }
        panic!("redis-server did not start again on port {}", self.port);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port another server already answers on is no start: before, the other one was taken
    /// for this test's, and a test saw its store reset when the other test ended.
    #[tokio::test]
    async fn a_port_another_server_answers_on_is_not_taken_for_ours() {
        let other = RedisServer::start().await;
        let dir = fresh_dir();
        let args = vec!["--save".to_owned(), String::new()];
        assert!(spawn(other.port, &dir, &args).await.is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
