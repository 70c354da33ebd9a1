//! A `redis-server` of a test's own, on a free loopback port.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// A `redis-server` that keeps nothing on disk; killed when dropped.
pub struct RedisServer {
    child: Child,
    /// `redis://127.0.0.1:PORT/`.
    pub url: String,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

impl RedisServer {
    /// Starts one and waits until it accepts connections. The free port is only free when it is
    /// picked: if another process takes it first, this `redis-server` exits, and another port is
    /// tried (three at most, ten seconds each).
    pub async fn start() -> RedisServer {
        for _ in 0..3 {
            let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
            let mut child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("redis-server is installed (scripts/test installs it)");
            for _ in 0..1_000 {
                if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                    return RedisServer { child, url: format!("redis://127.0.0.1:{port}/") };
                }
                if matches!(child.try_wait(), Ok(Some(_))) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let _ = child.start_kill();
        }
        panic!("redis-server did not start on any of three free ports");
    }
}
