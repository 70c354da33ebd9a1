//! Where tether's Redis is, and the connection to it: one server, a cluster, or the primary a
//! set of Sentinels names. Commands and scripts are written once against [`Connection`]; the
//! redis crate routes them (by slot on a cluster) and this file only connects again (asking the
//! Sentinels for the primary) once the connection it had stops answering as a primary's.
//!
//! A fence (`WAIT`, `WAITAOF`) counts the writes its own connection made: sent on a connection
//! made since, it counts none, and passes for writes that no replica or disk has. So a store
//! operation's commands go over one connection ([`Connection::pinned`]): once that one fails,
//! so does the rest of the operation, fence included.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, IntoConnectionInfo as _, Pipeline, RedisError, RedisFuture, Value};

use super::backend;
use crate::StoreError;

/// How long connecting to a Redis node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Where tether's Redis is, as its URL says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Deployment {
    /// `redis://host:port/…`: one server (perhaps with replicas that tether does not follow).
    Single(String),
    /// `redis+cluster://host:port,host:port`: a Redis Cluster, reached through any of these
    /// nodes.
    Cluster(Vec<String>),
    /// `redis+sentinel://host:port,host:port/name`: the primary the Sentinels call `name`.
    Sentinel {
        /// The Sentinels, as `redis://` URLs.
        sentinels: Vec<String>,
        /// The name the Sentinels monitor the primary under.
        primary: String,
    },
}

impl Deployment {
    /// Reads a store URL. The cluster and Sentinel forms list their nodes separated by commas;
    /// credentials before the first node apply to every node.
    pub(super) fn parse(url: &str) -> Result<Deployment, StoreError> {
        let nodes = |rest: &str| -> Result<Vec<String>, StoreError> {
            let (credentials, hosts) = match rest.rsplit_once('@') {
                Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
                None => (String::new(), rest),
            };
            let nodes: Vec<String> = hosts
                .split(',')
                .map(str::trim)
                .filter(|host| !host.is_empty())
                .map(|host| format!("redis://{credentials}{host}/"))
                .collect();
            if nodes.is_empty() {
                return Err(backend(format!("{url} names no Redis node")));
            }
            Ok(nodes)
        };
        if let Some(rest) = url.strip_prefix("redis+cluster://") {
            return Ok(Deployment::Cluster(nodes(rest.trim_end_matches('/'))?));
        }
        if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            let (hosts, primary) = rest.split_once('/').unwrap_or((rest, ""));
            if primary.is_empty() || primary.contains('/') {
                return Err(backend(format!(
                    "{url} names no primary: write redis+sentinel://host:port,host:port/name"
                )));
            }
            return Ok(Deployment::Sentinel { sentinels: nodes(hosts)?, primary: primary.to_owned() });
        }
        Ok(Deployment::Single(url.to_owned()))
    }

    /// Whether the keys of one command or script must share a hash slot.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Deployment::Cluster(_))
    }

    /// Connects for commands, each answered within `response_timeout`.
    pub(super) async fn connect(&self, response_timeout: Duration) -> Result<Connection, StoreError> {
        let config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(response_timeout))
            .set_connection_timeout(Some(CONNECT_TIMEOUT));
        let mut source = match self {
            Deployment::Single(url) => Source::Server(redis::Client::open(url.as_str()).map_err(backend)?),
            Deployment::Cluster(nodes) => {
                let client = ClusterClient::builder(nodes.iter().map(String::as_str))
                    .response_timeout(response_timeout)
                    .connection_timeout(CONNECT_TIMEOUT)
                    .build()
                    .map_err(backend)?;
                return Ok(Connection::Cluster(client.get_async_connection().await.map_err(backend)?));
            }
            Deployment::Sentinel { sentinels, primary } => Source::Sentinels(sentinel_client(sentinels, primary)?),
        };
        let connection = source.connect(&config).await?;
        Ok(Connection::Primary(Primary {
            source: Arc::new(tokio::sync::Mutex::new(source)),
            current: Arc::new(std::sync::Mutex::new((0, connection))),
            pinned: None,
            config,
        }))
    }

    /// A client of the one server subscriptions are made on (not for a cluster, whose
    /// subscriptions are sharded: [`Deployment::cluster_subscriber`]). For Sentinel, the primary
    /// as the Sentinels name it now.
    pub(super) async fn subscriber(&self) -> Result<redis::Client, StoreError> {
        match self {
            Deployment::Single(url) => redis::Client::open(url.as_str()).map_err(backend),
            Deployment::Cluster(_) => Err(backend("a cluster's subscriptions are sharded")),
            Deployment::Sentinel { sentinels, primary } => {
                sentinel_client(sentinels, primary)?.async_get_client().await.map_err(backend)
            }
        }
    }

    /// A cluster connection that hands what its sharded subscriptions receive to `pushes`, and
    /// subscribes again by itself after a node fails over or a slot moves.
    pub(super) async fn cluster_subscriber(
        &self,
        pushes: tokio::sync::mpsc::UnboundedSender<redis::PushInfo>,
    ) -> Result<ClusterConnection, StoreError> {
        let Deployment::Cluster(nodes) = self else { return Err(backend("not a cluster")) };
        let client = ClusterClient::builder(nodes.iter().map(String::as_str))
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(pushes)
            .connection_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(backend)?;
        client.get_async_connection().await.map_err(backend)
    }
}

/// A client of `sentinels` that asks them for the primary they call `primary`.
/// The URL's credentials, like its nodes' addresses, are the Sentinels'; they are the primary's
/// too (and its replicas'), so that a password-protected deployment is one URL.
fn sentinel_client(sentinels: &[String], primary: &str) -> Result<SentinelClient, StoreError> {
    let first = sentinels.first().ok_or_else(|| backend("no Sentinel named"))?;
    let credentials = first.as_str().into_connection_info().map_err(backend)?.redis_settings().clone();
    let node = SentinelNodeConnectionInfo::default().set_redis_connection_info(credentials);
    SentinelClient::build(sentinels.to_vec(), primary.to_owned(), Some(node), SentinelServerType::Master)
        .map_err(backend)
}

/// Where the primary's next connection comes from.
enum Source {
    /// The one server.
    Server(redis::Client),
    /// The primary the Sentinels name then (they are asked each time, and it is checked to
    /// answer `ROLE` as a primary): not the address it had, where a replica may be now, or the
    /// old primary restarted empty.
    Sentinels(SentinelClient),
}

impl Source {
    /// A new connection to the primary.
    async fn connect(&mut self, config: &redis::AsyncConnectionConfig) -> Result<MultiplexedConnection, StoreError> {
        let client = match self {
            Source::Server(client) => client.clone(),
            Source::Sentinels(sentinels) => sentinels.async_get_client().await.map_err(backend)?,
        };
        client.get_multiplexed_async_connection_with_config(config).await.map_err(backend)
    }
}

/// A connection to tether's Redis, cheap to clone: each clone shares the same connections.
#[derive(Clone)]
pub(super) enum Connection {
    /// One server, or the primary the Sentinels name.
    Primary(Primary),
    /// A cluster: each command goes to the primary of its keys' slot.
    Cluster(ClusterConnection),
}

/// The connection to one primary (the server, or the one the Sentinels name), made again once
/// it stops answering as a primary's.
#[derive(Clone)]
pub(super) struct Primary {
    source: Arc<tokio::sync::Mutex<Source>>,
    /// The primary's connection, numbered: a failure of number `n` replaces number `n` only.
    current: Arc<std::sync::Mutex<(u64, MultiplexedConnection)>>,
    /// The connection this handle's commands go over, if it is pinned to one.
    pinned: Option<(u64, MultiplexedConnection)>,
    config: redis::AsyncConnectionConfig,
}

/// Whether `err` says the server is no primary any more, or gone: then it is connected to again.
fn primary_lost(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_refusal()
        || err.is_connection_dropped()
        || err.is_timeout()
        || err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
}

impl Primary {
    fn current(&self) -> (u64, MultiplexedConnection) {
        // A number and a handle: consistent after a panic elsewhere.
        self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// The connection a command goes over: the pinned one, or the current one.
    fn connection(&self) -> (u64, MultiplexedConnection) {
        match &self.pinned {
            Some(pinned) => pinned.clone(),
            None => self.current(),
        }
    }

    /// Connects to the primary again, unless a failure of a later connection than `failed` did
    /// already. The command that failed still fails: it may have run.
    async fn replace(&self, failed: u64) {
        let mut source = self.source.lock().await;
        if self.current().0 != failed {
            return;
        }
        match tokio::time::timeout(CONNECT_TIMEOUT * 2, source.connect(&self.config)).await {
            Ok(Ok(connection)) => {
                *self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = (failed + 1, connection);
                tracing::info!("connected to the Redis primary again");
            }
            Ok(Err(err)) => tracing::warn!(%err, "no Redis primary could be reached"),
            Err(_) => tracing::warn!("no Redis primary could be reached in time"),
        }
    }

    /// Hands on `reply`, which connection number `number` gave, after connecting again if it
    /// says this one is lost.
    async fn checked<T>(&self, number: u64, reply: redis::RedisResult<T>) -> redis::RedisResult<T> {
        if let Err(err) = &reply
            && primary_lost(err)
        {
            self.replace(number).await;
        }
        reply
    }
}

impl ConnectionLike for Primary {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (number, mut connection) = self.connection();
            let reply = connection.req_packed_command(cmd).await;
            self.checked(number, reply).await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (number, mut connection) = self.connection();
            let reply = connection.req_packed_commands(pipeline, offset, count).await;
            self.checked(number, reply).await
        })
    }

    fn get_db(&self) -> i64 {
        self.connection().1.get_db()
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Primary(conn) => conn.req_packed_command(cmd),
            Connection::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Primary(conn) => conn.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Primary(conn) => conn.get_db(),
            Connection::Cluster(conn) => conn.get_db(),
        }
    }
}

impl Connection {
    /// This connection, its commands sent over the connection to the primary it has now (a
    /// failure of which fails them all, not only the first), so that a fence sent last counts
    /// the writes sent before it. A cluster's are the redis crate's connections to its nodes,
    /// made again by itself: not pinned.
    pub(super) fn pinned(&self) -> Connection {
        match self {
            Connection::Primary(primary) => {
                Connection::Primary(Primary { pinned: Some(primary.connection()), ..primary.clone() })
            }
            Connection::Cluster(_) => self.clone(),
        }
    }

    /// Sends `cmd` to every primary and answers each one's reply, in no set order: on one server
    /// or behind Sentinels, the one primary's. For what is asked of each server (`INFO`,
    /// `CONFIG GET`).
    pub(super) async fn on_every_primary<T: redis::FromRedisValue>(&mut self, cmd: &Cmd) -> Result<Vec<T>, StoreError> {
        match self {
            Connection::Cluster(conn) => {
                let routing = redis::cluster_routing::RoutingInfo::MultiNode((
                    redis::cluster_routing::MultipleNodeRoutingInfo::AllMasters,
                    None,
                ));
                let reply = conn.route_command(cmd.clone(), routing).await.map_err(backend)?;
                let Value::Map(replies) = reply else {
                    return Err(backend("the cluster answered a command sent to every primary with no map"));
                };
                replies
                    .into_iter()
                    .map(|(node, reply)| {
                        if let Value::ServerError(err) = &reply {
                            return Err(backend(format!("{node:?}: {err:?}")));
                        }
                        redis::from_redis_value(reply).map_err(backend)
                    })
                    .collect()
            }
            _ => Ok(vec![cmd.query_async(self).await.map_err(backend)?]),
        }
    }

    /// Sends `cmd` to the primary of each of `keys`' slots (once per slot), and answers each
    /// reply: on one server or behind Sentinels, the one primary's. For a fence (`WAIT`,
    /// `WAITAOF`), which counts the writes this connection made on the node it is sent to.
    pub(super) async fn on_primaries_of<T: redis::FromRedisValue>(
        &mut self,
        keys: &[&str],
        cmd: &Cmd,
    ) -> Result<Vec<T>, StoreError> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let Connection::Cluster(conn) = self else {
            return Ok(vec![cmd.query_async(self).await.map_err(backend)?]);
        };
        let mut routes = Vec::new();
        for key in keys {
            let route = Route::with_key(key, SlotAddr::Master);
            if !routes.contains(&route) {
                routes.push(route);
            }
        }
        let mut replies = Vec::new();
        for route in routes {
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
            let reply = conn.route_command(cmd.clone(), routing).await.map_err(backend)?;
            replies.push(redis::from_redis_value(reply).map_err(backend)?);
        }
        Ok(replies)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::durability::Fence;
    use tether_testkit::RedisServer;

    /// A fence counts the writes of its own connection: sent on a connection made since, it
    /// counts none, and `WAIT` passes for a write the replica does not have (asleep, it has not
    /// taken it). Pinned, an operation's fence goes over the connection its write went over, and
    /// fails with it.
    #[tokio::test]
    async fn a_fence_does_not_pass_on_a_connection_made_after_the_write() {
        let primary = RedisServer::start().await;
        let port = primary.port().to_string();
        let replica = RedisServer::start_with(&[
            "--save",
            "",
            "--appendonly",
            "no",
            "--enable-debug-command",
            "yes",
            "--replicaof",
            "127.0.0.1",
            &port,
        ])
        .await;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !primary.command(&["INFO", "replication"]).await.contains("state=online") {
            assert!(std::time::Instant::now() < deadline, "the replica never came online");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(primary.command(&["WAIT", "1", "1500"]).await, ":1", "the replica never acknowledged");
        let conn = Deployment::Single(primary.url.clone()).connect(Duration::from_secs(5)).await.expect("connect");
        let mut operation = conn.pinned();
        let asleep = tokio::spawn(async move {
            replica.command(&["DEBUG", "SLEEP", "2"]).await;
            replica
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _: () = redis::cmd("SET").arg("k").arg("v").query_async(&mut operation).await.expect("the write");
        // The connection breaks; the next command (another operation's) fails, and connects
        // again.
        primary.command(&["CLIENT", "KILL", "TYPE", "normal"]).await;
        let broken = redis::cmd("PING").query_async::<String>(&mut conn.pinned()).await;
        assert!(broken.is_err(), "the old connection is gone");
        let fenced = Fence::Wait { replicas: 1, timeout_ms: 500 }.after_write(&mut operation, &["k"]).await;
        assert!(fenced.is_err(), "the write's fence passed on another connection");
        drop(asleep.await);
    }

    #[test]
    fn urls_name_one_server_a_cluster_or_a_primary_behind_sentinels() {
        assert_eq!(
            Deployment::parse("redis://127.0.0.1:6379/"),
            Ok(Deployment::Single("redis://127.0.0.1:6379/".into()))
        );
        assert_eq!(
            Deployment::parse("redis+cluster://127.0.0.1:7000, 127.0.0.1:7001/"),
            Ok(Deployment::Cluster(vec!["redis://127.0.0.1:7000/".into(), "redis://127.0.0.1:7001/".into()]))
        );
        assert_eq!(
            Deployment::parse("redis+sentinel://:secret@127.0.0.1:26379,127.0.0.1:26380/tether"),
            Ok(Deployment::Sentinel {
                sentinels: vec!["redis://:secret@127.0.0.1:26379/".into(), "redis://:secret@127.0.0.1:26380/".into()],
                primary: "tether".into(),
            })
        );
        assert!(Deployment::parse("redis+sentinel://127.0.0.1:26379").is_err(), "no primary named");
        assert!(Deployment::parse("redis+cluster://").is_err(), "no node");
    }
}
