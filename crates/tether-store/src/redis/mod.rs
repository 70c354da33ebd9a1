//! The distributed store: Redis, shared by every replica of a server.
//!
//! What it asks of Redis (its configuration, and how each acknowledged write is fenced) is in
//! `durability`.
//!
//! Each session's keys carry the `{session}` hash tag, so every check-and-write is one Lua
//! script over one hash slot (atomic, and valid on Redis Cluster). Events are Redis Streams with
//! ids `<seq>-1`; an append publishes a notification that every replica turns into a wake-up of
//! its local connections, so a client may resume on any replica and follow live events there.
//!
//! The store runs on one Redis, on a Redis Cluster or on the primary a set of Sentinels name
//! (`connection.rs`). On a cluster, every script and transaction touches one slot (`names.rs`
//! says which keys share one), and replicas talk over sharded channels (`pubsub.rs`).
//!
//! This file holds the store; each trait it implements has a file of its own (`sessions.rs`,
//! `events.rs`, `records.rs`, `tasks.rs`, `relay.rs`, `counters.rs`), beside the connection
//! (`connection.rs`), the key names (`names.rs`), the Lua scripts (`scripts.rs`), the
//! subscription (`pubsub.rs`) and the durability fence (`durability.rs`).

mod connection;
mod counters;
mod durability;
mod events;
mod names;
mod pubsub;
mod records;
mod relay;
mod scripts;
mod sessions;
mod tasks;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use futures_util::StreamExt;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncCommands, Script, Value};
use tether_core::lineage::{Epoch, SessionId, StreamName, StreamRange, StreamState, Tag};
use tether_core::mcp::ProtocolVersion;

use self::connection::{Connection, Deployment};
use self::{names::*, pubsub::*, scripts::*};
use crate::heads::Heads;
use crate::record::{
    BeginRequest, Claim, KeyClaim, KeyState, RequestRecord, Retention, SessionEnd, SessionRecord, SessionStatus,
    StoredEvent, StreamPage,
};
use crate::{
    CounterStore, EventLog, HeadWatch, KeyRecords, Relay, RelayedAnswer, ReplicaId, ReplicaMessage, RequestKey,
    SessionStore, StoreError, StoreFuture, StoredTask, TaskLimits, TaskStore,
};
use tether_core::idempotency::Acknowledged;
use tether_core::tasks::{TaskChange, TaskId, TaskRecord};

/// The channel appends and stream ends are announced on, but in a cluster (there, each
/// session's own: [`notify_channel`]).
const NOTIFY: &str = "tether:notify";
/// The channel server-wide announcements travel on between replicas: the announcing replica's
/// name, then the notification.
const ANNOUNCEMENTS: &str = "tether:announcements";
/// The channel the ids of changed tasks are announced on between replicas.
const TASK_CHANGES: &str = "tether:task-changes";
/// The channel clients' answers to server-to-client requests travel on between replicas.
const ANSWERS: &str = "tether:answers";
/// The channel of the messages replicas send one replica: the sender's name, then the message.
fn replica_channel(replica: &str) -> String {
    format!("tether:replica:{replica}")
}
const SESSIONS: &str = "tether:sessions";
/// Counters, and (under the same hash tag, so one script sees both) the additions made once.
const COUNTERS: &str = "tether:{counters}";
/// The hash tag of the idempotency records: a claim checks the records' name and count with the
/// key's record in one script, so they share a slot.
const RECORDS: &str = "tether:{records}";
/// Idempotency records by creation time, for expiry and the count bound.
const KEYS: &str = "tether:{records}:keys";
/// The name of this Redis's idempotency records, set by the first replica, or by the first
/// claim once a Redis lost it.
const RECORDS_ID: &str = "tether:{records}:id";
/// How many keys were ever claimed in these records: each claim's position.
const CLAIMS: &str = "tether:{records}:claims";
/// The highest position of a claim retention forgot.
const CLAIMS_FORGOTTEN: &str = "tether:{records}:claims-forgotten";
const OWNERS: &str = "tether:owners";
/// The hash tag of the tasks: a task is created with its place among the running, counted
/// against the caps, in one script.
const TASKS: &str = "tether:{tasks}";
/// Finished tasks by when they may be forgotten (by the sweep, on the servers' clock).
const TASKS_DUE: &str = "tether:{tasks}:due";
/// Ended sessions (`m<SEP>session`) and ended streams (`s<SEP>session<SEP>stream`) waiting out
/// their retention; the score is when a sweep first saw them (0 until then).
const RETIRING: &str = "tether:retiring";
const SEP: char = '\u{1f}';

pub use durability::RedisDurability;

/// What this process began in the store and has not finished, as it knows it: held against
/// what the store says it owns once Redis restarted or failed over (it may have gone back to
/// a time when this process still ran what it has finished since).
#[derive(Debug, Default)]
struct Held {
    /// Request streams, as members of the owner's set.
    streams: HashSet<String>,
    /// Idempotency keys.
    keys: HashSet<String>,
    /// Tasks.
    tasks: HashSet<String>,
}

/// A [`Store`](crate::Store) in Redis.
pub struct RedisStore {
    redis: Connection,
    /// Where Redis is: one server, a cluster, or behind Sentinels.
    deployment: Deployment,
    /// On a cluster, the connection sharded subscriptions are made on, and the sessions whose
    /// channels it subscribes to (those some connection of this process follows).
    shards: Option<Shards>,
    /// What each acknowledged write waits for.
    fence: durability::Fence,
    /// What an acknowledged write survives, in a sentence.
    guarantee: String,
    /// The run id of the Redis process last seen: another one means a restart or a failover.
    run_id: Mutex<String>,
    held: Mutex<Held>,
    answers: tokio::sync::broadcast::Sender<RelayedAnswer>,
    task_changes: tokio::sync::broadcast::Sender<TaskId>,
    announcements: tokio::sync::broadcast::Sender<Bytes>,
    replica_messages: tokio::sync::broadcast::Sender<ReplicaMessage>,
    retention: Retention,
    owner: String,
    /// Set once this process left ([`SessionStore::leave`]): it heartbeats no more.
    left: std::sync::atomic::AtomicBool,
    heads: Arc<Heads>,
    listener: tokio::task::JoinHandle<()>,
}

/// A cluster's sharded subscriptions.
struct Shards {
    subscriber: ClusterConnection,
    sessions: Mutex<HashSet<String>>,
}

/// What [`RedisStore::give_up`] gives up of what this process owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GiveUp {
    /// What it no longer holds (after Redis restarted or failed over).
    Unheld,
    /// All of it: the process leaves.
    All,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").field("owner", &self.owner).finish_non_exhaustive()
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

fn backend(err: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(err.to_string())
}

/// Maps a script's error reply to the store error it stands for.
fn script_error(err: redis::RedisError) -> StoreError {
    let text = err.to_string();
    if text.contains("SESSION_GONE") {
        StoreError::SessionGone
    } else if text.contains("DUPLICATE_SESSION") {
        StoreError::DuplicateSession
    } else if text.contains("UNKNOWN_STREAM") {
        StoreError::UnknownStream
    } else if text.contains("STREAM_ENDED") {
        StoreError::StreamEnded
    } else {
        backend(text)
    }
}

fn field<'a>(map: &'a HashMap<String, String>, name: &str) -> Result<&'a str, StoreError> {
    map.get(name).map(String::as_str).ok_or_else(|| backend(format!("session record lacks {name}")))
}

impl RedisStore {
    /// Connects to Redis at `url`, after checking that it can give what `durability` asks.
    /// `owner` names this process for request leases.
    pub async fn open(
        url: &str,
        retention: Retention,
        owner: &ReplicaId,
        durability: RedisDurability,
    ) -> Result<RedisStore, StoreError> {
        let owner = owner.as_str();
        let deployment = Deployment::parse(url)?;
        let mut redis = deployment.connect(durability.response_timeout()).await?;
        let (fence, guarantee) = durability::check(&mut redis, durability).await?;
        let run_id = durability::run_id(&mut redis).await?;
        let (subscription, shards) = if deployment.is_cluster() {
            let (pushes, received) = tokio::sync::mpsc::unbounded_channel();
            let mut subscriber = deployment.cluster_subscriber(pushes).await?;
            subscribe_shards(&mut subscriber, owner).await.map_err(backend)?;
            (Subscription::Shards(received), Some(Shards { subscriber, sessions: Mutex::default() }))
        } else {
            let client = deployment.subscriber().await?;
            (Subscription::Server(subscribe(&client, owner).await.map_err(backend)?), None)
        };
        let heads = Arc::new(Heads::default());
        let (answers, _) = tokio::sync::broadcast::channel(256);
        let (task_changes, _) = tokio::sync::broadcast::channel(256);
        let (announcements, _) = tokio::sync::broadcast::channel(256);
        let (replica_messages, _) = tokio::sync::broadcast::channel(1024);
        let listeners = Listeners {
            owner: owner.to_owned(),
            heads: Arc::clone(&heads),
            answers: answers.clone(),
            task_changes: task_changes.clone(),
            announcements: announcements.clone(),
            replica_messages: replica_messages.clone(),
        };
        let listener = tokio::spawn(listen(deployment.clone(), subscription, listeners));
        Ok(RedisStore {
            redis,
            deployment,
            shards,
            fence,
            guarantee,
            run_id: Mutex::new(run_id),
            held: Mutex::default(),
            answers,
            task_changes,
            announcements,
            replica_messages,
            retention,
            owner: owner.to_owned(),
            left: std::sync::atomic::AtomicBool::new(false),
            heads,
            listener,
        })
    }

    /// What an acknowledged write survives, as the store was opened to guarantee.
    pub fn guarantee(&self) -> &str {
        &self.guarantee
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        // Sets of names: consistent after a panic elsewhere.
        self.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until the writes made on `conn` in the slots of `keys` are as durable as the store
    /// guarantees: the keys of what is acknowledged, and of what must outlive it with it.
    async fn fenced(&self, conn: &mut Connection, keys: &[&str]) -> Result<(), StoreError> {
        self.fence.after_write(conn, keys).await
    }

    /// Whether Redis is another process than last time (it restarted, or a replica took over):
    /// then whatever this process owns in it but no longer runs was left behind by a Redis
    /// that went back in time, and is given up, so that nobody waits on it for ever.
    async fn notice_restart(&self, conn: &mut Connection) -> Result<(), StoreError> {
        let now = durability::run_id(conn).await?;
        let before = std::mem::replace(&mut *self.run_id.lock().unwrap_or_else(|p| p.into_inner()), now.clone());
        if before == now {
            return Ok(());
        }
        tracing::warn!(
            before,
            now,
            "Redis restarted or failed over: giving up what this replica owns there but no longer runs"
        );
        self.give_up(conn, GiveUp::Unheld).await
    }

    /// Gives up what the store says this process owns (all of it, or what this process does not
    /// hold): request streams end aborted, idempotency keys and tasks read as abandoned.
    async fn give_up(&self, conn: &mut Connection, what: GiveUp) -> Result<(), StoreError> {
        let streams: Vec<String> = conn.smembers(owned_key(&self.owner)).await.map_err(backend)?;
        let keys: Vec<String> = conn.smembers(owned_keys_key(&self.owner)).await.map_err(backend)?;
        let tasks: Vec<String> = conn.smembers(owned_tasks_key(&self.owner)).await.map_err(backend)?;
        let (streams, keys, tasks) = match what {
            GiveUp::All => (streams, keys, tasks),
            GiveUp::Unheld => {
                let held = self.held();
                (
                    streams.into_iter().filter(|m| !held.streams.contains(m)).collect::<Vec<_>>(),
                    keys.into_iter().filter(|k| !held.keys.contains(k)).collect::<Vec<_>>(),
                    tasks.into_iter().filter(|t| !held.tasks.contains(t)).collect::<Vec<_>>(),
                )
            }
        };
        for member in &streams {
            let Some((session, stream)) = member.split_once(SEP) else { continue };
            let aborted: i64 =
                self.abort_script(session, stream, &self.owner).invoke_async(conn).await.map_err(backend)?;
            if aborted == 1 {
                let _: i64 = conn.zadd(RETIRING, retiring_stream(session, stream), 0).await.map_err(backend)?;
            }
            let _: i64 = conn.srem(owned_key(&self.owner), member).await.map_err(backend)?;
        }
        for key in &keys {
            let _: i64 = self
                .disown_script(&key_record(key), &owned_keys_key(&self.owner), key)
                .invoke_async(conn)
                .await
                .map_err(backend)?;
        }
        for task in &tasks {
            let _: i64 = self
                .disown_script(&task_key(task), &owned_tasks_key(&self.owner), task)
                .invoke_async(conn)
                .await
                .map_err(backend)?;
            self.stop_counting(conn, task).await?;
        }
        if !(streams.is_empty() && keys.is_empty() && tasks.is_empty()) {
            let (streams, keys, tasks) = (streams.len(), keys.len(), tasks.len());
            match what {
                GiveUp::Unheld => {
                    tracing::warn!(
                        streams,
                        keys,
                        tasks,
                        "gave up what Redis says this replica runs but it no longer does"
                    )
                }
                GiveUp::All => tracing::warn!(streams, keys, tasks, "leaving: gave up what this replica still ran"),
            }
        }
        Ok(())
    }

    /// The connection one store operation's commands go over: the fence it ends with counts
    /// the writes before it ([`Connection::pinned`]).
    fn conn(&self) -> Connection {
        self.redis.pinned()
    }

    /// The script that ends `owner`'s request on `stream` of `session` aborted (if it still runs
    /// there), announcing the stream's end.
    fn abort_script(&self, session: &str, stream: &str, owner: &str) -> redis::ScriptInvocation<'static> {
        let mut abort = scripts().abort.key(stream_key(session, stream));
        abort.arg(notification_prefix(session, stream)).arg(owner).arg(self.notify_args(session));
        abort
    }

    /// The script that leaves `record` (a key's record or a task), unfinished and this process's,
    /// to nobody, and takes `id` out of this process's `owned` set.
    fn disown_script(&self, record: &str, owned: &str, id: &str) -> redis::ScriptInvocation<'static> {
        let mut disown = scripts().disown.key(record);
        disown.key(owned).arg(&self.owner).arg(id);
        disown
    }

    /// The command messages between replicas are published with: sharded on a cluster, so a
    /// message goes to the one shard of its channel.
    fn publish_command(&self) -> &'static str {
        if self.deployment.is_cluster() { "SPUBLISH" } else { "PUBLISH" }
    }

    /// Publishes `payload` on `channel`; answers how many subscribers received it (on a
    /// cluster, every subscriber of a sharded channel is on its shard, so all are counted).
    async fn publish(&self, channel: &str, payload: Vec<u8>) -> Result<i64, StoreError> {
        redis::cmd(self.publish_command())
            .arg(channel)
            .arg(payload)
            .query_async(&mut self.conn())
            .await
            .map_err(backend)
    }

    /// The command and channel the scripts announce a head of `session`'s streams with.
    fn notify_args(&self, session: &str) -> (&'static str, String) {
        let channel = if self.deployment.is_cluster() { notify_channel(session) } else { NOTIFY.to_owned() };
        (self.publish_command(), channel)
    }

    /// On a cluster, subscribes to `session`'s channel before a follower of it reads the store,
    /// so no announcement falls between the read and the subscription.
    async fn hear_session(&self, session: &str) -> Result<(), StoreError> {
        let Some(shards) = &self.shards else { return Ok(()) };
        if shards.sessions.lock().unwrap_or_else(|p| p.into_inner()).contains(session) {
            return Ok(());
        }
        shards.subscriber.clone().ssubscribe(notify_channel(session)).await.map_err(backend)?;
        shards.sessions.lock().unwrap_or_else(|p| p.into_inner()).insert(session.to_owned());
        Ok(())
    }

    /// On a cluster, stops hearing the sessions no connection of this process follows now.
    async fn stop_hearing(&self, followed: &[(String, StreamName)]) {
        let Some(shards) = &self.shards else { return };
        let unheard: Vec<String> = {
            let mut sessions = shards.sessions.lock().unwrap_or_else(|p| p.into_inner());
            let unheard: Vec<String> =
                sessions.iter().filter(|s| !followed.iter().any(|(f, _)| f == *s)).cloned().collect();
            for session in &unheard {
                sessions.remove(session);
            }
            unheard
        };
        for session in unheard {
            if let Err(err) = shards.subscriber.clone().sunsubscribe(notify_channel(&session)).await {
                tracing::debug!(%err, session, "could not stop hearing a session no follower follows");
            }
        }
    }

    /// Whether `owner` heartbeat within the lease before `now_ms`. A claim heartbeats first, and
    /// a sweep forgets owners only once they lapsed, so an owner missing here is gone.
    async fn owner_alive(&self, conn: &mut Connection, owner: &str, now_ms: u64) -> Result<bool, StoreError> {
        let heartbeat: Option<u64> = conn.hget(OWNERS, owner).await.map_err(backend)?;
        Ok(heartbeat.is_some_and(|h| h.saturating_add(self.retention.lease_ms) >= now_ms))
    }

    /// Reads an idempotency record: digest, owner and state.
    async fn read_key(
        &self,
        conn: &mut Connection,
        fields: Vec<Option<Vec<u8>>>,
        now_ms: u64,
    ) -> Result<Option<(String, String, KeyState)>, StoreError> {
        let text = |i: usize| fields.get(i).cloned().flatten().map(|b| String::from_utf8_lossy(&b).into_owned());
        let Some(digest) = text(0) else { return Ok(None) };
        let owner = text(1).unwrap_or_default();
        if let Some(Some(outcome)) = fields.get(4) {
            return Ok(Some((digest, owner, KeyState::Finished(Bytes::from(outcome.clone())))));
        }
        let stream = match (text(2).filter(|s| !s.is_empty()), text(3)) {
            (Some(session), Some(stream)) => {
                Some((SessionId::parse(&session).map_err(backend)?, StreamName::parse(&stream).map_err(backend)?))
            }
            _ => None,
        };
        let abandoned = !self.owner_alive(conn, &owner, now_ms).await?;
        Ok(Some((digest, owner, KeyState::Running { stream, abandoned })))
    }

    fn stream_keys(session: &str, stream: &str) -> [String; 4] {
        [meta(session), stream_key(session, stream), events_key(session, stream), streams_key(session)]
    }

    /// The script that ends session `id` (`how`: 1 terminated, 2 expired; with `now`, only if
    /// its deadline has passed, so a session renewed meanwhile survives).
    fn end_script(id: &str, epoch: String, how: i64, now: impl redis::ToRedisArgs) -> redis::ScriptInvocation<'static> {
        let mut invocation = scripts().end.key(meta(id));
        invocation
            .key(streams_key(id))
            .key(requests_key(id))
            .key(request_order_key(id))
            .arg(epoch)
            .arg(how)
            .arg(format!("tether:{{{id}}}:"))
            .arg(now);
        invocation
    }

    /// After the end script: the session leaves the expiry index, its data is queued for
    /// retirement, and this process's followers of its streams are released.
    async fn retire_session(&self, conn: &mut Connection, id: &str) -> Result<(), StoreError> {
        let _: i64 = conn.zrem(SESSIONS, id).await.map_err(backend)?;
        let _: i64 = conn.zadd(RETIRING, retiring_session(id), 0).await.map_err(backend)?;
        self.heads.forget_session(id);
        Ok(())
    }

    /// After a stream ended: it is queued for retirement and leaves this process's owned set,
    /// both sent at once (they may lie on two shards). The stream has ended either way, so a
    /// failure here is logged, not answered: the stream is then dropped with its session instead
    /// of after its retention.
    async fn retire_stream(&self, conn: &mut Connection, session: &str, stream: &str) {
        self.held().streams.remove(&owned_member(session, stream));
        let mut owned = conn.clone();
        let (queued, left) = tokio::join!(
            conn.zadd::<_, _, _, i64>(RETIRING, retiring_stream(session, stream), 0),
            owned.srem::<_, _, i64>(owned_key(&self.owner), owned_member(session, stream))
        );
        if let Err(err) = queued.and(left) {
            tracing::warn!(%err, session, stream, "could not queue an ended stream for retirement");
        }
    }
}
