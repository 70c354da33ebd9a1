//! Redis that outlives a server: a Redis Cluster of primaries with replicas, and a primary with a
//! replica watched by three Sentinels. Each process on a free loopback port, stopped when the
//! value is dropped.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::RedisServer;
use crate::redis::{command, free_port, fresh_dir, spawn_from};

/// How long a cluster or Sentinels may take to agree (on slots, on a new primary).
const AGREE_WITHIN: Duration = Duration::from_secs(30);

/// Waits until `check` holds, polling every 100 ms; panics with `what` after [`AGREE_WITHIN`].
async fn until<F: std::future::Future<Output = bool>>(what: &str, check: impl FnMut() -> F) -> Duration {
    match poll_until(AGREE_WITHIN, check).await {
        Some(took) => took,
        None => panic!("{what} within {AGREE_WITHIN:?}"),
    }
}

/// How long `check` took to hold, polling every 100 ms; `None` if it did not within `within`.
async fn poll_until<F: std::future::Future<Output = bool>>(
    within: Duration,
    mut check: impl FnMut() -> F,
) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        if check().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// A Redis Cluster of `redis-server --cluster-enabled yes` nodes, made by `redis-cli --cluster
/// create`. A primary whose node stops answering for a second is replaced by its replica.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Which nodes were killed and not started again.
    down: Vec<bool>,
}

impl RedisCluster {
    /// `primaries` primaries with `replicas` replicas each, keeping nothing on disk.
    pub async fn start(primaries: usize, replicas: usize) -> RedisCluster {
        RedisCluster::start_with(primaries, replicas, &["--save", "", "--appendonly", "no"]).await
    }

    /// [`RedisCluster::start`] with each node started with `args` too.
    pub async fn start_with(primaries: usize, replicas: usize, args: &[&str]) -> RedisCluster {
        let mut nodes = Vec::new();
        let node_args = || {
            // The cluster bus on a port of its own, picked for each port tried: port + 10000 may
            // be past 65535.
            let bus = free_port().to_string();
            let mut node_args = vec![
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                &bus,
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                // A replica takes over however long ago it last heard its primary.
                "--cluster-replica-validity-factor",
                "0",
                "--repl-diskless-sync-delay",
                "0",
            ];
            node_args.extend_from_slice(args);
            node_args.into_iter().map(str::to_owned).collect()
        };
        for _ in 0..primaries * (1 + replicas) {
            nodes.push(RedisServer::start_each_try(node_args).await);
        }
        let addresses: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .await
            .expect("redis-cli is installed (scripts/test installs it)");
        assert!(created.status.success(), "redis-cli --cluster create: {}", String::from_utf8_lossy(&created.stdout));
        let down = vec![false; nodes.len()];
        let cluster = RedisCluster { nodes, down };
        cluster.wait_healthy().await;
        cluster
    }

    /// `redis+cluster://` and every node, as tether's `--redis-url` takes it.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// The nodes still running, by their index.
    fn running(&self) -> impl Iterator<Item = (usize, &RedisServer)> {
        self.nodes.iter().enumerate().filter(|(i, _)| !self.down[*i])
    }

    /// Waits until every running node says the cluster is whole and agrees on who serves each
    /// slot, and every replica is in sync with its primary; answers how long that took.
    pub async fn wait_healthy(&self) -> Duration {
        until("every node says cluster_state:ok, agrees on the slots, and is in sync", || async {
            let mut views = Vec::new();
            for (_, node) in self.running() {
                let info = command(node.port(), &["CLUSTER", "INFO"]).await.unwrap_or_default();
                let replication = command(node.port(), &["INFO", "replication"]).await.unwrap_or_default();
                let syncing = if replication.contains("role:slave") {
                    !replication.contains("master_link_status:up")
                } else {
                    replication.lines().any(|l| l.starts_with("slave") && !l.contains("state=online"))
                };
                if !info.contains("cluster_state:ok") || syncing {
                    return false;
                }
                views.push(self.slot_owners(node).await);
            }
            views.windows(2).all(|w| w[0] == w[1])
        })
        .await
    }

    /// The ports of the primaries `node` says serve slots, sorted.
    async fn slot_owners(&self, node: &RedisServer) -> Vec<String> {
        let nodes = command(node.port(), &["CLUSTER", "NODES"]).await.unwrap_or_default();
        let mut owners: Vec<String> = nodes
            .lines()
            .filter(|line| line.contains("master") && !line.contains("fail") && line.split(' ').count() > 8)
            .filter_map(|line| line.split(' ').nth(1).map(|addr| addr.split('@').next().unwrap_or(addr).to_owned()))
            .collect();
        owners.sort();
        owners
    }

    /// The index of each running node that is a primary.
    pub async fn primaries(&self) -> Vec<usize> {
        let mut primaries = Vec::new();
        for (i, node) in self.running() {
            if command(node.port(), &["ROLE"]).await.is_some_and(|role| role.starts_with("master")) {
                primaries.push(i);
            }
        }
        primaries
    }

    /// The index of the primary serving `key`'s slot.
    pub async fn primary_of(&self, key: &str) -> usize {
        let (_, entry) = self.running().next().expect("a running node");
        let slot: u16 = command(entry.port(), &["CLUSTER", "KEYSLOT", key])
            .await
            .and_then(|reply| reply.trim_start_matches(':').parse().ok())
            .expect("CLUSTER KEYSLOT");
        let nodes = command(entry.port(), &["CLUSTER", "NODES"]).await.expect("CLUSTER NODES");
        for line in nodes.lines().filter(|line| line.contains("master") && !line.contains("fail")) {
            let fields: Vec<&str> = line.split(' ').collect();
            let serves = fields.iter().skip(8).any(|range| {
                let (first, last) = range.split_once('-').unwrap_or((range, range));
                matches!((first.parse::<u16>(), last.parse::<u16>()), (Ok(f), Ok(l)) if f <= slot && slot <= l)
            });
            let port = fields.get(1).and_then(|a| a.split('@').next()).and_then(|a| a.rsplit(':').next());
            if serves && let Some(index) = self.nodes.iter().position(|n| Some(n.port().to_string().as_str()) == port) {
                return index;
            }
        }
        panic!("no primary serves slot {slot}");
    }

    /// Sends one command to node `index` and returns its reply, as [`RedisServer::command`].
    pub async fn command(&self, index: usize, args: &[&str]) -> String {
        self.nodes[index].command(args).await
    }

    /// The node id of node `index`.
    pub async fn node_id(&self, index: usize) -> String {
        command(self.nodes[index].port(), &["CLUSTER", "MYID"]).await.expect("CLUSTER MYID")
    }

    /// Kills node `index` (SIGKILL, as a crash would) and waits until it is gone.
    pub async fn kill(&mut self, index: usize) {
        self.nodes[index].kill().await;
        self.down[index] = true;
    }

    /// Starts node `index` again with what it kept (its cluster configuration): a primary that
    /// was replaced meanwhile comes back as its replacement's replica.
    pub async fn restart(&mut self, index: usize) {
        self.nodes[index].restart().await;
        self.down[index] = false;
    }

    /// Moves `slots` slots from node `from` to node `to` with `redis-cli --cluster reshard`,
    /// while the cluster serves; answers redis-cli's output if it failed.
    pub async fn reshard(&self, from: usize, to: usize, slots: usize) -> Result<(), String> {
        let (from_id, to_id) = (self.node_id(from).await, self.node_id(to).await);
        let (_, entry) = self.running().next().expect("a running node");
        let moved = Command::new("redis-cli")
            .arg("--cluster")
            .arg("reshard")
            .arg(format!("127.0.0.1:{}", entry.port()))
            .args(["--cluster-from", &from_id, "--cluster-to", &to_id, "--cluster-slots", &slots.to_string()])
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()
            .await
            .expect("redis-cli");
        if moved.status.success() {
            Ok(())
        } else {
            Err(format!("{}{}", String::from_utf8_lossy(&moved.stdout), String::from_utf8_lossy(&moved.stderr)))
        }
    }
}

/// A primary and a replica, watched by three Sentinels that promote the replica once the primary
/// stops answering for three seconds.
pub struct RedisSentinels {
    servers: Vec<RedisServer>,
    /// The server killed last, until it is started again.
    killed: Option<usize>,
    /// The primary's configuration epoch once the last failover this kit made was agreed.
    epoch: Option<u64>,
    sentinels: Vec<Sentinel>,
}

/// How long a server may not answer before a Sentinel takes it for down. A Sentinel pings each
/// server once a second at most, and counts from the moment it connected to a server it was not
/// watching yet (as the primary it just promoted): at 1,000 ms, a ping answered a moment late
/// made the new primary down a second after its promotion, and the Sentinels failed over again,
/// to a replica that had just begun to sync.
const DOWN_AFTER_MS: u64 = 3_000;

/// One `redis-server --sentinel`, killed when dropped (its directory removed).
struct Sentinel {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The name the Sentinels monitor the primary under.
pub const SENTINEL_PRIMARY: &str = "tether";

impl RedisSentinels {
    /// The primary and its replica started with `args`, once the replica is in sync and every
    /// Sentinel knows both.
    pub async fn start_with(args: &[&str]) -> RedisSentinels {
        let mut args = args.to_vec();
        args.extend_from_slice(&["--repl-diskless-sync-delay", "0"]);
        let args = &args[..];
        let primary = RedisServer::start_with(args).await;
        let primary_port = primary.port().to_string();
        let mut replica_args = args.to_vec();
        replica_args.extend_from_slice(&["--replicaof", "127.0.0.1", &primary_port]);
        let replica = RedisServer::start_with(&replica_args).await;
        until("the replica is in sync", || async {
            command(replica.port(), &["INFO", "replication"]).await.is_some_and(|i| i.contains("master_link_status:up"))
        })
        .await;
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            sentinels.push(Sentinel::start(primary.port()).await);
        }
        let ha = RedisSentinels { servers: vec![primary, replica], killed: None, epoch: None, sentinels };
        until("every Sentinel knows the replica and the other Sentinels", || async {
            let mut all = true;
            for sentinel in &ha.sentinels {
                let known = command(sentinel.port, &["SENTINEL", "MASTER", SENTINEL_PRIMARY]).await.unwrap_or_default();
                all &= known.contains("num-slaves\n1") && known.contains("num-other-sentinels\n2");
            }
            all
        })
        .await;
        ha
    }

    /// `redis+sentinel://` and the Sentinels, then the primary's name.
    pub fn url(&self) -> String {
        self.url_as("")
    }

    /// [`RedisSentinels::url`] with `credentials` (`user:password@`, or empty) before the nodes.
    pub fn url_as(&self, credentials: &str) -> String {
        let sentinels: Vec<String> = self.sentinels.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect();
        format!("redis+sentinel://{credentials}{}/{SENTINEL_PRIMARY}", sentinels.join(","))
    }

    /// Adds the ACL user `name` with `password`, allowed everything, to every server and every
    /// Sentinel (the default user stays as it was, so this kit's own commands still work).
    pub async fn add_user(&self, name: &str, password: &str) {
        let password = format!(">{password}");
        let ports = self.servers.iter().map(RedisServer::port).chain(self.sentinels.iter().map(|s| s.port));
        for port in ports {
            let added = command(port, &["ACL", "SETUSER", name, "on", &password, "~*", "&*", "+@all"]).await;
            assert_eq!(added.as_deref(), Some("+OK"), "ACL SETUSER on {port}");
        }
    }

    /// What `CLIENT LIST` says of the connections to the primary the Sentinels name.
    pub async fn primary_clients(&self) -> String {
        command(self.primary_port().await, &["CLIENT", "LIST"]).await.expect("the primary answers")
    }

    /// The port of the primary, as the first Sentinel names it.
    pub async fn primary_port(&self) -> u16 {
        let named = command(self.sentinels[0].port, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_PRIMARY])
            .await
            .expect("a Sentinel answers");
        named.lines().nth(1).and_then(|port| port.parse().ok()).expect("the Sentinel names a primary")
    }

    /// Kills the primary (SIGKILL), then waits until every Sentinel names the replica instead;
    /// answers how long that took.
    pub async fn kill_primary(&mut self) -> Duration {
        let old = self.primary_port().await;
        let index = self.servers.iter().position(|s| s.port() == old).expect("the primary is one of ours");
        self.servers[index].kill().await;
        self.killed = Some(index);
        let started = Instant::now();
        until("the Sentinels promote the replica", || async {
            let mut moved = true;
            for sentinel in &self.sentinels {
                let named = command(sentinel.port, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_PRIMARY]).await;
                moved &= named.is_some_and(|n| !n.ends_with(&old.to_string()));
            }
            moved
        })
        .await;
        let took = started.elapsed();
        self.epoch = Some(self.config_epoch().await);
        took
    }

    /// The primary's configuration epoch as the first Sentinel knows it: each failover sets a
    /// higher one.
    async fn config_epoch(&self) -> u64 {
        let known = command(self.sentinels[0].port, &["SENTINEL", "MASTER", SENTINEL_PRIMARY]).await;
        let known = known.expect("a Sentinel answers");
        let mut fields = known.lines();
        while let Some(field) = fields.next() {
            if field == "config-epoch" {
                return fields.next().and_then(|n| n.parse().ok()).expect("config-epoch is a number");
            }
        }
        panic!("SENTINEL MASTER names no config-epoch: {known}")
    }

    /// Whether the Sentinels failed over again, on their own, after the last failover this kit
    /// made ([`RedisSentinels::kill_primary`]).
    pub async fn failed_over_again(&self) -> bool {
        match self.epoch {
            Some(epoch) => self.config_epoch().await != epoch,
            None => false,
        }
    }
}

impl RedisSentinels {
    /// Starts the server killed last again, as a replica of the primary the Sentinels name now,
    /// as Redis's Sentinel documentation asks of an instance that keeps nothing on disk: come
    /// back as a primary, it is an empty one until the Sentinels reconfigure it (under load they
    /// sometimes took 30 s), and a primary with no history that the old replicas may be made to
    /// follow is a store gone back in time, which is another test's. Answers once it is in sync.
    pub async fn restart_killed(&mut self) {
        let Some(index) = self.killed.take() else { return };
        let primary = self.primary_port().await;
        self.servers[index].restart_as_replica_of(primary).await;
        let port = self.servers[index].port();
        until("the old primary is back as a replica in sync", || async {
            command(port, &["INFO", "replication"])
                .await
                .is_some_and(|i| i.contains("role:slave") && i.contains("master_link_status:up"))
        })
        .await;
    }
}

impl Sentinel {
    async fn start(primary: u16) -> Sentinel {
        let dir = fresh_dir();
        let config = dir.join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "sentinel monitor {SENTINEL_PRIMARY} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {SENTINEL_PRIMARY} {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout {SENTINEL_PRIMARY} 5000\n\
                 sentinel parallel-syncs {SENTINEL_PRIMARY} 1\n"
            ),
        )
        .expect("write sentinel.conf");
        for _ in 0..3 {
            let port = free_port();
            if let Some(child) = spawn_from(Some(&config), port, &dir, &["--sentinel".to_owned()]).await {
                return Sentinel { child, port, dir };
            }
        }
        panic!("redis-server --sentinel did not start on any of three free ports");
    }
}
