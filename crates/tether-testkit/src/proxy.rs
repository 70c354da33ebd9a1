//! A loopback TCP proxy (and round-robin balancer) that cuts SSE responses after a random number
//! of body bytes: the faults of a flaky network, placed anywhere inside a stream. Response heads
//! pass untouched, and JSON answers too unless `cut_responses` is set (a cut there leaves a
//! request's outcome unknown to the client).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A running proxy; stops when dropped.
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    /// How many responses were cut so far.
    pub cuts: Arc<AtomicU64>,
    /// Whether responses are being cut (off at start).
    pub cutting: Arc<AtomicBool>,
    /// Whether non-SSE response bodies (JSON answers) are cut too (off at start): then the budget
    /// counts every body byte the connection carries.
    pub cut_responses: Arc<AtomicBool>,
    /// While set, the network is partitioned: new connections are dropped at once and open
    /// ones are cut at their next byte.
    pub partitioned: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A small xorshift generator: reproducible from its seed, no dependency.
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Proxies each new connection to the next of `upstreams` in turn (a round-robin balancer when
/// there are several), or the one after it if that one refuses the connection; once `cutting`
/// is set, each SSE response is cut after between `min` and
/// `max` bytes of its body.
pub async fn start(upstreams: Vec<SocketAddr>, seed: u64, min: u64, max: u64) -> Proxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    let cuts = Arc::new(AtomicU64::new(0));
    let cutting = Arc::new(AtomicBool::new(false));
    let partitioned = Arc::new(AtomicBool::new(false));
    let cut_responses = Arc::new(AtomicBool::new(false));
    let (c, on, cut_all) = (Arc::clone(&cuts), Arc::clone(&cutting), Arc::clone(&partitioned));
    let any = Arc::clone(&cut_responses);
    let task = tokio::spawn(async move {
        let mut rng = Rng::new(seed);
        for turn in 0.. {
            let Ok((client, _)) = listener.accept().await else { return };
            if cut_all.load(Ordering::Relaxed) {
                continue;
            }
            let budget = min + rng.below(max - min + 1);
            let faults = Faults {
                cuts: Arc::clone(&c),
                cutting: Arc::clone(&on),
                partitioned: Arc::clone(&cut_all),
                cut_responses: Arc::clone(&any),
            };
            let upstreams = upstreams.clone();
            tokio::spawn(async move {
                // Past an upstream that refuses the connection (it is down), as a balancer's
                // health checks would take it out of the rotation.
                let mut server = None;
                for next in 0..upstreams.len() {
                    if let Ok(connected) = TcpStream::connect(upstreams[(turn + next) % upstreams.len()]).await {
                        server = Some(connected);
                        break;
                    }
                }
                let Some(server) = server else { return };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                relay(client, server, budget, faults).await;
            });
        }
    });
    Proxy { addr, cuts, cutting, cut_responses, partitioned, task }
}

/// The proxy's switches and counter, as one connection sees them.
struct Faults {
    cuts: Arc<AtomicU64>,
    cutting: Arc<AtomicBool>,
    partitioned: Arc<AtomicBool>,
    cut_responses: Arc<AtomicBool>,
}

async fn relay(client: TcpStream, server: TcpStream, budget: u64, faults: Faults) {
    let Faults { cuts, cutting, partitioned, cut_responses } = faults;
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    });
    // Bytes of the current SSE body forwarded, once its head has passed.
    let mut body: Option<u64> = None;
    let mut head = Vec::new();
    let mut buf = vec![0u8; 4096];
    loop {
        let read = tokio::select! {
            read = server_read.read(&mut buf) => read,
            () = until(&partitioned) => break,
        };
        let n = match read {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut limit = n;
        match body {
            Some(sent) if cutting.load(Ordering::Relaxed) => limit = budget.saturating_sub(sent).min(n as u64) as usize,
            Some(_) => {}
            None => {
                head.extend_from_slice(&buf[..n]);
                if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                    let is_sse =
                        String::from_utf8_lossy(&head[..end]).to_ascii_lowercase().contains("text/event-stream");
                    if is_sse || cut_responses.load(Ordering::Relaxed) {
                        body = Some(0);
                        let already = (head.len() - end - 4) as u64;
                        if cutting.load(Ordering::Relaxed) && already > budget {
                            limit = n - (already - budget) as usize;
                        }
                    }
                    head.clear();
                    if !is_sse {
                        head.shrink_to_fit();
                    }
                }
            }
        }
        if client_write.write_all(&buf[..limit]).await.is_err() {
            break;
        }
        if let Some(sent) = &mut body {
            *sent += limit as u64;
            // The last chunk of a chunked body: the connection may carry another response next.
            if buf[..limit].ends_with(b"0\r\n\r\n") {
                body = None;
            }
        }
        if limit < n {
            cuts.fetch_add(1, Ordering::Relaxed);
            break;
        }
    }
    upstream.abort();
}

/// Resolves once `flag` is set (polled: partitions are coarse events in tests).
async fn until(flag: &AtomicBool) {
    while !flag.load(Ordering::Relaxed) {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
