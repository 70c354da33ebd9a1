//! The servers under test: how each is started on loopback, found, measured and stopped.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::BenchError;
use crate::wire::Endpoint;

/// A server the bench measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// `tether serve --store memory`.
    TetherMemory,
    /// `tether serve --store embedded` (SQLite, durable before delivery).
    TetherEmbedded,
    /// `tether serve --store redis` against a `redis-server` the bench starts.
    TetherRedis,
    /// The rmcp 3.x server of `tests/interop/rmcp_server`, with TCP_NODELAY.
    Rmcp,
    /// The TypeScript SDK server of `bench/servers/ts_server.mjs`.
    Ts,
    /// The Python SDK server of `bench/servers/py_server.py`.
    Python,
    /// [`crate::raw`]: the same bytes with no MCP logic; the ceiling for the machine.
    Raw,
    /// `tether gateway --store memory --upstream` the [`Target::Rmcp`] server: what fronting a
    /// server with tether costs, against that server measured directly in the same run.
    GatewayRmcp,
}

impl Target {
    /// Every target, in report order.
    pub const ALL: [Target; 8] = [
        Target::TetherMemory,
        Target::TetherEmbedded,
        Target::TetherRedis,
        Target::Rmcp,
        Target::Ts,
        Target::Python,
        Target::Raw,
        Target::GatewayRmcp,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Target::TetherMemory => "tether-memory",
            Target::TetherEmbedded => "tether-embedded",
            Target::TetherRedis => "tether-redis",
            Target::Rmcp => "rmcp",
            Target::Ts => "ts",
            Target::Python => "python",
            Target::Raw => "raw",
            Target::GatewayRmcp => "gateway-rmcp",
        }
    }

    /// The targets a command-line name selects: a target's own name, `tether` (all three
    /// stores) or `all`.
    pub fn select(name: &str) -> Option<Vec<Target>> {
        match name {
            "all" => Some(Target::ALL.to_vec()),
            "tether" => Some(vec![Target::TetherMemory, Target::TetherEmbedded, Target::TetherRedis]),
            other => Target::ALL.into_iter().find(|t| t.name() == other).map(|t| vec![t]),
        }
    }
}

/// Where the programs behind the targets are. A target whose program is missing is reported
/// as unavailable, with the reason, instead of failing the bench.
#[derive(Debug, Clone)]
pub struct Programs {
    /// The `tether` binary (also serves [`Target::Raw`] with `bench --serve-raw`).
    pub tether: PathBuf,
    /// The built rmcp server.
    pub rmcp: Option<PathBuf>,
    /// `node` and the directory holding `@modelcontextprotocol/sdk`.
    pub ts_sdk: Option<PathBuf>,
    /// A Python with the `mcp` package.
    pub python: Option<PathBuf>,
    /// The directory of `ts_server.mjs` and `py_server.py`.
    pub servers: PathBuf,
    /// `redis-server`.
    pub redis_server: PathBuf,
}

/// How the tool responses are sent: the `tool-call-json` scenario asks for JSON bodies, which
/// the SDKs only give when started for it (tether and raw choose per response).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Responses as SSE streams, with an event store for resumption.
    Sse,
    /// Responses as JSON bodies.
    Json,
}

/// What a target has started: killed, reaped and removed when dropped, from the moment each
/// piece exists, so no failed start leaves a process or a directory behind.
#[derive(Debug, Default)]
struct Processes {
    /// Helpers first (a `redis-server`), the server last.
    children: Vec<Child>,
    data_dir: Option<PathBuf>,
    /// The server a gateway fronts, stopped after the gateway.
    upstream: Option<Box<Running>>,
}

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = &self.data_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
        drop(self.upstream.take());
    }
}

/// A started target: stopped when dropped.
#[derive(Debug)]
pub struct Running {
    /// The MCP endpoint.
    pub endpoint: Endpoint,
    server_pid: u32,
    processes: Processes,
}

impl Running {
    /// The server's resident memory in KiB, from `/proc`.
    pub fn resident_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.server_pid)).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// The CPU time the target has used so far: its server's and its helpers' (a
    /// `redis-server`, the server a gateway fronts), from `/proc`; `None` where `/proc` cannot
    /// tell (not Linux). What a call costs the machine, whoever measures it: a load generator
    /// that shares the cores takes their rest, so calls/s alone compares the client as well.
    pub fn cpu_time(&self) -> Option<Duration> {
        let mut total = process_cpu_time(self.server_pid)?;
        for helper in &self.processes.children {
            if helper.id() != self.server_pid {
                total += process_cpu_time(helper.id())?;
            }
        }
        if let Some(upstream) = &self.processes.upstream {
            total += upstream.cpu_time()?;
        }
        Some(total)
    }
}

/// The CPU time (user and system, every thread's, the ended ones' too) process `pid` has used.
fn process_cpu_time(pid: u32) -> Option<Duration> {
    stat_cpu_time(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The CPU time of this process (the bench, whose load generator runs in it).
pub fn own_cpu_time() -> Option<Duration> {
    stat_cpu_time(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// `utime + stime` of a `/proc/PID/stat` line. Both count clock ticks of `USER_HZ`, which
/// Linux fixes at 100 per second for what it shows user space (`sysconf(_SC_CLK_TCK)`).
fn stat_cpu_time(stat: &str) -> Option<Duration> {
    const TICKS_PER_SECOND: u64 = 100;
    // The command name (field 2) is in parentheses and may hold spaces and parentheses itself:
    // the fields after it start after its last `)`, at field 3 (the state).
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().collect();
    let (utime, stime): (u64, u64) = (fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?);
    let ticks = utime.checked_add(stime)?;
    Some(Duration::from_millis(ticks.checked_mul(1_000 / TICKS_PER_SECOND)?))
}

/// A command that first raises its open-file limit to the hard limit: the fan-out scenario
/// holds over a thousand connections, more than the usual soft limit of 1,024.
fn with_file_limit(program: &std::path::Path, args: &[String]) -> Command {
    let mut command = Command::new("sh");
    command.arg("-c").arg("ulimit -n \"$(ulimit -Hn)\" 2>/dev/null; exec \"$0\" \"$@\"").arg(program).args(args);
    command
}

fn unavailable(target: Target, reason: &str) -> BenchError {
    BenchError::Start { target: target.name(), reason: reason.to_owned() }
}

/// A loopback port nobody listens on right now.
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts `target` and waits until it accepts connections.
pub fn start(target: Target, mode: Mode, programs: &Programs, max_events: u64) -> Result<Running, BenchError> {
    let fail = |reason: String| BenchError::Start { target: target.name(), reason };
    let tether = |store: &str| {
        let mut args: Vec<String> = ["serve", "--listen", "127.0.0.1:0", "--store", store, "--max-sessions", "50000"]
            .map(String::from)
            .to_vec();
        args.extend(["--max-events-per-stream".into(), max_events.to_string()]);
        args
    };
    let mut processes = Processes::default();
    let command = match target {
        Target::TetherMemory => with_file_limit(&programs.tether, &tether("memory")),
        Target::TetherEmbedded => {
            let dir = std::env::temp_dir().join(format!(
                "tether-bench-{}-{}",
                std::process::id(),
                free_port().map_err(|e| fail(e.to_string()))?
            ));
            let mut args = tether("embedded");
            args.extend(["--data-dir".into(), dir.display().to_string()]);
            processes.data_dir = Some(dir);
            with_file_limit(&programs.tether, &args)
        }
        Target::TetherRedis => {
            let port = free_port().map_err(|e| fail(e.to_string()))?;
            let redis = Command::new(&programs.redis_server)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| fail(format!("{}: {e}", programs.redis_server.display())))?;
            processes.children.push(redis);
            wait_accepting(SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_secs(10))
                .map_err(|e| fail(format!("redis-server: {e}")))?;
            let mut args = tether("redis");
            // The bench measures the transport: the Redis it starts keeps nothing on disk.
            args.extend([
                "--redis-url".into(),
                format!("redis://127.0.0.1:{port}/"),
                "--redis-durability".into(),
                "none".into(),
            ]);
            with_file_limit(&programs.tether, &args)
        }
        Target::Raw => with_file_limit(&programs.tether, &["bench".into(), "--serve-raw".into()]),
        Target::GatewayRmcp => {
            let upstream = start(Target::Rmcp, mode, programs, max_events)?;
            let url = format!("http://{}{}", upstream.endpoint.addr, upstream.endpoint.path);
            processes.upstream = Some(Box::new(upstream));
            let mut args: Vec<String> =
                ["gateway", "--listen", "127.0.0.1:0", "--store", "memory", "--max-sessions", "50000"]
                    .map(String::from)
                    .to_vec();
            args.extend(["--max-events-per-stream".into(), max_events.to_string(), "--upstream".into(), url]);
            with_file_limit(&programs.tether, &args)
        }
        Target::Rmcp => {
            let program = programs
                .rmcp
                .as_ref()
                .ok_or_else(|| unavailable(target, "no rmcp server built (scripts/bench builds it)"))?;
            with_file_limit(program, &sdk_args(None, &["0", "--nodelay"], mode))
        }
        Target::Ts => {
            let sdk = programs
                .ts_sdk
                .as_ref()
                .ok_or_else(|| unavailable(target, "no TypeScript SDK installed (scripts/bench installs it)"))?;
            let args = sdk_args(Some(&programs.servers.join("ts_server.mjs")), &["0"], mode);
            let mut command = with_file_limit(std::path::Path::new("node"), &args);
            command.env("TETHER_TS_SDK", sdk);
            command
        }
        Target::Python => {
            let python = programs
                .python
                .as_ref()
                .ok_or_else(|| unavailable(target, "no Python SDK installed (scripts/bench installs it)"))?;
            with_file_limit(python, &sdk_args(Some(&programs.servers.join("py_server.py")), &["0"], mode))
        }
    };
    launch(target, command, processes)
}

/// The arguments of an SDK server: its script (if it is one), `args`, and `--json` in JSON mode.
fn sdk_args(script: Option<&std::path::Path>, args: &[&str], mode: Mode) -> Vec<String> {
    let json: &[&str] = if mode == Mode::Json { &["--json"] } else { &[] };
    script
        .map(|s| s.display().to_string())
        .into_iter()
        .chain(args.iter().chain(json).map(|a| (*a).to_owned()))
        .collect()
}

/// Spawns the server, reads its `listening on http://ADDR/PATH` line and waits until it
/// accepts connections.
fn launch(target: Target, mut command: Command, mut processes: Processes) -> Result<Running, BenchError> {
    let fail = |reason: String| BenchError::Start { target: target.name(), reason };
    let mut server = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| fail(e.to_string()))?;
    let (tx, rx) = mpsc::channel();
    if let Some(stdout) = server.stdout.take() {
        // Reads the announcement, then keeps draining so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if !sent && let Some(url) = line.split("listening on ").nth(1) {
                    sent = tx.send(url.trim().to_owned()).is_ok();
                }
            }
        });
    }
    let server_pid = server.id();
    processes.children.push(server);
    let url = rx
        .recv_timeout(Duration::from_secs(30))
        .map_err(|_| fail("did not print `listening on URL` within 30 s".into()))?;
    let endpoint = Endpoint::parse(&url).ok_or_else(|| fail(format!("cannot use the announced URL {url:?}")))?;
    wait_accepting(endpoint.addr, Duration::from_secs(30)).map_err(fail)?;
    Ok(Running { endpoint, server_pid, processes })
}

fn wait_accepting(addr: SocketAddr, limit: Duration) -> Result<(), String> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("{addr} did not accept connections within {limit:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_user_and_system_time_whatever_the_command_name_holds() {
        let stat = "4242 (tokio (rt) 1) S 1 4242 4242 0 -1 4194560 900 0 0 0 1234 56 0 0 20 0 3 0 100 0 0";
        assert_eq!(stat_cpu_time(stat), Some(Duration::from_millis(12_900)));
        assert_eq!(stat_cpu_time("4242 (short) S 1"), None, "a truncated line");
        assert_eq!(stat_cpu_time("no parenthesis"), None);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn this_process_is_seen_to_use_the_cpu_it_spins() {
        let before = own_cpu_time().expect("/proc/self/stat is readable");
        let start = Instant::now();
        let mut spun = 0u64;
        let mut used = Duration::ZERO;
        while used < Duration::from_millis(50) && start.elapsed() < Duration::from_secs(10) {
            for _ in 0..1_000_000 {
                spun = std::hint::black_box(spun.wrapping_add(1));
            }
            used = own_cpu_time().expect("read once, readable again") - before;
        }
        assert!(used >= Duration::from_millis(50), "10 s of spinning counted as {used:?}");
    }
}
