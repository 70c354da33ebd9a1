//! The distributed store: Redis, shared by every replica of a server.
//!
//! What it asks of Redis (its configuration, and how each acknowledged write is fenced) is in
//! `durability`.
//!
//! Each session's keys carry the `{session}` hash tag, so every check-and-write is one Lua
//! script over one hash slot (atomic, and valid on Redis Cluster). Events are Redis Streams with
//! ids `<seq>-1`; an append publishes a notification that every replica turns into a wake-up of
//! its local connections, so a client may resume on any replica and follow live events there.

mod durability;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use futures_util::StreamExt;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script, Value};
use tether_core::lineage::{Epoch, SessionId, StreamName, StreamRange, StreamState, Tag};
use tether_core::mcp::ProtocolVersion;

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
use tether_core::tasks::{TaskChange, TaskRecord};

/// The channel appends and stream ends are announced on.
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
/// Idempotency records by creation time, for expiry and the count bound.
const KEYS: &str = "tether:keys";
/// The name of this Redis's idempotency records, set by the first replica, or by the first
/// claim once a Redis lost it.
const RECORDS_ID: &str = "tether:records-id";
/// How many keys were ever claimed in these records: each claim's position.
const CLAIMS: &str = "tether:claims";
/// The highest position of a claim retention forgot.
const CLAIMS_FORGOTTEN: &str = "tether:claims-forgotten";
const OWNERS: &str = "tether:owners";
/// Finished tasks by when they may be forgotten (by the sweep, on the servers' clock).
const TASKS_DUE: &str = "tether:tasks-due";
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
    redis: ConnectionManager,
    /// What each acknowledged write waits for.
    fence: durability::Fence,
    /// What an acknowledged write survives, in a sentence.
    guarantee: String,
    /// The run id of the Redis process last seen: another one means a restart or a failover.
    run_id: Mutex<String>,
    held: Mutex<Held>,
    answers: tokio::sync::broadcast::Sender<RelayedAnswer>,
    task_changes: tokio::sync::broadcast::Sender<String>,
    announcements: tokio::sync::broadcast::Sender<Bytes>,
    replica_messages: tokio::sync::broadcast::Sender<ReplicaMessage>,
    retention: Retention,
    owner: String,
    heads: Arc<Heads>,
    listener: tokio::task::JoinHandle<()>,
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

fn meta(session: &str) -> String {
    format!("tether:{{{session}}}:m")
}
fn stream_key(session: &str, stream: &str) -> String {
    format!("tether:{{{session}}}:s:{stream}")
}
fn events_key(session: &str, stream: &str) -> String {
    format!("tether:{{{session}}}:e:{stream}")
}
fn requests_key(session: &str) -> String {
    format!("tether:{{{session}}}:r")
}
/// The keys of [`requests_key`]'s hash, oldest first, for its bound.
fn request_order_key(session: &str) -> String {
    format!("tether:{{{session}}}:ro")
}
fn streams_key(session: &str) -> String {
    format!("tether:{{{session}}}:streams")
}
fn owned_key(owner: &str) -> String {
    format!("tether:owned:{owner}")
}
/// The idempotency keys `owner` claimed and has not finished.
fn owned_keys_key(owner: &str) -> String {
    format!("tether:owned-keys:{owner}")
}
/// The tasks `owner` runs and has not finished.
fn owned_tasks_key(owner: &str) -> String {
    format!("tether:owned-tasks:{owner}")
}
/// The tasks of every principal that run, by creation time: counted against `--max-tasks`.
const RUNNING_TASKS: &str = "tether:tasks-running";
/// The tasks of `principal` that run (`-` for none, `+` and the name for one).
fn running_tasks_key(principal: Option<&str>) -> String {
    match principal {
        None => "tether:tasks-running:-".to_owned(),
        Some(name) => format!("tether:tasks-running:+{name}"),
    }
}

/// A request's stream as a member of its owner's set (the sweep splits it at `SEP`).
fn owned_member(session: &str, stream: &str) -> String {
    format!("{session}{SEP}{stream}")
}
fn key_record(key: &str) -> String {
    format!("tether:k:{{{key}}}")
}
fn task_key(id: &str) -> String {
    format!("tether:task:{id}")
}

/// How often a task's change is retried when another replica changed it between the read and the
/// swap: each retry means another change won, so this bounds contention, not progress.
const TASK_SWAPS: usize = 64;

fn counter_op_key(op: &str) -> String {
    format!("{COUNTERS}:once:{op}")
}

/// Fails unless the session (KEYS[1]) is live in incarnation ARGV[1].
const CHECK_LIVE: &str = r"
local m = redis.call('HMGET', KEYS[1], 'epoch', 'ended')
if m[1] ~= ARGV[1] or m[2] ~= '0' then return redis.error_reply('SESSION_GONE') end
";

/// Creates a stream (KEYS[2] meta, KEYS[3] events, KEYS[4] the session's stream set) with its
/// priming event, whose tag is `primed`; ARGV[2] name, ARGV[3] owner, ARGV[4] request key or ''.
/// Each event is an entry `<seq>-1` with fields `d` (its data) and `t` (its tag); a stream's meta
/// keeps in `before` the tag of the last event dropped.
const NEW_STREAM: &str = r"
local function new_stream(primed)
  if redis.call('EXISTS', KEYS[2]) == 1 then return end
  redis.call('HSET', KEYS[2], 'head', 0, 'state', 0, 'owner', ARGV[3], 'rk', ARGV[4])
  redis.call('XADD', KEYS[3], '0-1', 'd', '', 't', primed)
  redis.call('SADD', KEYS[4], ARGV[2])
end
";

/// The tag of a stream entry as `XRANGE` answers it (`{id, {'d', data, 't', tag}}`).
/// A stream's `ended` field: when it ended, in microseconds of the server's clock. Over a
/// session's byte cap the earliest ended goes first, as in every store.
const ENDED_NOW: &str = r"
local function ended_now()
  local t = redis.call('TIME')
  return t[1] .. string.format('%06d', t[2])
end
";

const ENTRY_TAG: &str = r"
local function entry_tag(entry)
  local fields = entry[2]
  for i = 1, #fields, 2 do
    if fields[i] == 't' then return fields[i + 1] end
  end
  return false
end
";

/// Drops the events of the ended stream `name` of the session whose keys start with `prefix`,
/// keeping its meta (head, state, request key, the tag of its last event) as a tombstone, the newest `max` of them per
/// session (`{prefix}t`, oldest first); returns the bytes it held. The session's byte count is
/// the caller's to lower. A stream no longer in the session's set (buried already) is left alone.
const BURY: &str = r"
local function bury(prefix, name, max)
  local key = prefix .. 's:' .. name
  if redis.call('SISMEMBER', prefix .. 'streams', name) == 0 then return 0 end
  local bytes = tonumber(redis.call('HGET', key, 'bytes') or '0')
  local last = redis.call('XREVRANGE', prefix .. 'e:' .. name, '+', '-', 'COUNT', 1)[1]
  if last and entry_tag(last) then redis.call('HSET', key, 'before', entry_tag(last)) end
  redis.call('DEL', prefix .. 'e:' .. name)
  redis.call('HSET', key, 'bytes', 0)
  redis.call('SREM', prefix .. 'streams', name)
  redis.call('RPUSH', prefix .. 't', name)
  while redis.call('LLEN', prefix .. 't') > tonumber(max) do
    redis.call('DEL', prefix .. 's:' .. redis.call('LPOP', prefix .. 't'))
  end
  return bytes
end
";

fn script(body: &str) -> Script {
    Script::new(body)
}

struct Scripts {
    admit: Script,
    create: Script,
    touch: Script,
    end: Script,
    open: Script,
    begin: Script,
    append: Script,
    end_stream: Script,
    bury: Script,
    abort: Script,
    standalone: Script,
    claim: Script,
    forget: Script,
    take_over: Script,
    finish: Script,
    release: Script,
    disown: Script,
    counter_once: Script,
    task_swap: Script,
    task_create: Script,
}

fn scripts() -> &'static Scripts {
    static SCRIPTS: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
    SCRIPTS.get_or_init(|| Scripts {
        // KEYS[1] a task, KEYS[2] the tasks to forget; ARGV[1] its record as read, ARGV[2] the new
        // one, ARGV[3] when it may be forgotten (0: not yet), ARGV[4] its id. 1: swapped; 0: it
        // changed meanwhile.
        task_swap: script(
            r"
if redis.call('HGET', KEYS[1], 'record') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'record', ARGV[2])
if ARGV[3] ~= '0' then redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4]) end
return 1",
        ),
        // KEYS[1] the live sessions by deadline; ARGV[1] most live, ARGV[2] deadline, ARGV[3] id.
        // 1: admitted; 0: too many; -1: the id is live already.
        admit: script(
            r"
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then return -1 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
return 1",
        ),
        // KEYS[1] the key's record; ARGV[1] digest, ARGV[2] owner, ARGV[3] session, ARGV[4]
        // stream. Returns the existing record's fields, or nothing once claimed.
        // KEYS[1] the key's record, KEYS[2] the records' name, KEYS[3] their count of claims,
        // KEYS[4] the highest claim forgotten, KEYS[5] the owner's keys; ARGV[1] digest, ARGV[2]
        // owner, ARGV[3] session, ARGV[4] stream, ARGV[5] a name for records that have none (a
        // Redis that lost them), ARGV[6] the records the client was acknowledged in ('' if none),
        // ARGV[7] the position, ARGV[8] the key. The regression check is
        // `Acknowledged::regressed`'s.
        claim: script(
            r"
local records = redis.call('GET', KEYS[2])
if not records then
  records = ARGV[5]
  redis.call('SET', KEYS[2], records)
end
local claims = tonumber(redis.call('GET', KEYS[3]) or '0')
local r = redis.call('HMGET', KEYS[1], 'digest', 'owner', 'session', 'stream', 'outcome', 'at')
if ARGV[6] ~= '' then
  local seen = tonumber(ARGV[7])
  local held = r[1] and tonumber(r[6] or '0')
  local forgotten = tonumber(redis.call('GET', KEYS[4]) or '0')
  if ARGV[6] ~= records or seen > claims or (held and held ~= seen) or (not held and seen > forgotten) then
    return {'regressed'}
  end
end
if r[1] then return {'existing', records, r[6], r[1], r[2], r[3], r[4], r[5]} end
claims = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[1], 'digest', ARGV[1], 'owner', ARGV[2], 'session', ARGV[3], 'stream', ARGV[4], 'at', claims)
redis.call('SADD', KEYS[5], ARGV[8])
return {'claimed', records, tostring(claims)}",
        ),
        // KEYS[1] the key's record, KEYS[2] the keys by age, KEYS[3] the highest claim
        // forgotten; ARGV[1] the key.
        forget: script(
            r"
local at = tonumber(redis.call('HGET', KEYS[1], 'at') or '0')
if at > tonumber(redis.call('GET', KEYS[3]) or '0') then redis.call('SET', KEYS[3], at) end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1",
        ),
        // KEYS[1] the key's record, KEYS[2] the new owner's keys; ARGV[1] digest, ARGV[2] the
        // owner found gone, ARGV[3] the new owner, ARGV[4] session, ARGV[5] stream, ARGV[6] key.
        take_over: script(
            r"
local r = redis.call('HMGET', KEYS[1], 'digest', 'owner', 'outcome')
if r[1] ~= ARGV[1] or r[2] ~= ARGV[2] or r[3] then return 0 end
redis.call('HSET', KEYS[1], 'owner', ARGV[3], 'session', ARGV[4], 'stream', ARGV[5])
redis.call('SADD', KEYS[2], ARGV[6])
return 1",
        ),
        // KEYS[1] the key's record, KEYS[2] its owner's keys; ARGV[1] owner, ARGV[2] outcome,
        // ARGV[3] key.
        finish: script(
            r"
local r = redis.call('HMGET', KEYS[1], 'owner', 'outcome')
if r[1] ~= ARGV[1] or r[2] then return 0 end
redis.call('HSET', KEYS[1], 'outcome', ARGV[2])
redis.call('SREM', KEYS[2], ARGV[3])
return 1",
        ),
        // KEYS[1] the key's record, KEYS[2] its owner's keys, KEYS[3] the keys by age; ARGV[1]
        // the owner, ARGV[2] the key. A claim whose request never ran is forgotten.
        release: script(
            r"
local r = redis.call('HMGET', KEYS[1], 'owner', 'outcome')
if r[1] ~= ARGV[1] or r[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[2])
return 1",
        ),
        // KEYS[1] the running tasks, KEYS[2] the principal's, KEYS[3] the task, KEYS[4] the
        // owner's tasks, KEYS[5] the owners' heartbeats; ARGV[1] most running in all, ARGV[2] most
        // of the principal, ARGV[3] the id, ARGV[4] the record, ARGV[5] the owner, ARGV[6] now.
        // 1: created; -1: too many of the principal; 0: too many in all.
        task_create: script(
            r"
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2]) then return -1 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[5], ARGV[5], ARGV[6])
redis.call('HSET', KEYS[3], 'record', ARGV[4], 'owner', ARGV[5])
redis.call('SADD', KEYS[4], ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[6], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[6], ARGV[3])
return 1",
        ),
        // KEYS[1] a key's record or a task, KEYS[2] its owner's set; ARGV[1] the owner, ARGV[2]
        // the key or task. One its owner no longer runs: unfinished, it is nobody's, so it reads
        // as abandoned.
        disown: script(
            r"
local r = redis.call('HMGET', KEYS[1], 'owner', 'outcome')
if r[1] == ARGV[1] and not r[2] then redis.call('HSET', KEYS[1], 'owner', '') end
redis.call('SREM', KEYS[2], ARGV[2])
return 1",
        ),
        // KEYS[1] counters, KEYS[2] the addition's record; ARGV[1] counter, ARGV[2] amount,
        // ARGV[3] how long the addition is remembered.
        counter_once: script(
            r"
local done = redis.call('GET', KEYS[2])
if done then return tonumber(done) end
local value = redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
redis.call('SET', KEYS[2], value, 'PX', ARGV[3])
return value",
        ),
        create: script(
            r"
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.error_reply('DUPLICATE_SESSION') end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'pv', ARGV[2], 'client', ARGV[3], 'ttl', ARGV[4], 'exp', ARGV[5], 'ended', 0, 'replica', ARGV[7])
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'principal', ARGV[6]) end
return 1",
        ),
        touch: script(&format!(
            "{CHECK_LIVE}
if tonumber(redis.call('HGET', KEYS[1], 'exp')) <= tonumber(ARGV[2]) then return redis.error_reply('SESSION_GONE') end
local exp = tonumber(ARGV[2]) + tonumber(redis.call('HGET', KEYS[1], 'ttl'))
redis.call('HSET', KEYS[1], 'exp', exp)
return exp"
        )),
        // KEYS[1] meta, KEYS[2] streams set, KEYS[3] requests, KEYS[4] their order; ARGV[2] how,
        // ARGV[3] key prefix of the session's streams. With ARGV[4] = a time, only if due by then.
        end: script(&format!(
            "{CHECK_LIVE}
if ARGV[4] ~= '' and tonumber(redis.call('HGET', KEYS[1], 'exp')) > tonumber(ARGV[4]) then return 0 end
for _, name in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  redis.call('DEL', ARGV[3] .. 's:' .. name, ARGV[3] .. 'e:' .. name)
end
for _, name in ipairs(redis.call('LRANGE', ARGV[3] .. 't', 0, -1)) do
  redis.call('DEL', ARGV[3] .. 's:' .. name)
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], ARGV[3] .. 't')
redis.call('HSET', KEYS[1], 'ended', ARGV[2])
return 1"
        )),
        // ARGV[5] the priming event's tag.
        open: script(&format!("{CHECK_LIVE}{NEW_STREAM}\nnew_stream(ARGV[5])\nreturn 1")),
        // KEYS[5] requests, KEYS[6] their keys oldest first; ARGV[5] request key, ARGV[6]
        // digest, ARGV[7] most requests remembered, ARGV[8] the priming event's tag.
        begin: script(&format!(
            "{CHECK_LIVE}{NEW_STREAM}
local existing = redis.call('HGET', KEYS[5], ARGV[5])
if existing then return existing end
redis.call('HSET', KEYS[5], ARGV[5], ARGV[6] .. '\\31' .. ARGV[2])
redis.call('RPUSH', KEYS[6], ARGV[5])
while redis.call('LLEN', KEYS[6]) > tonumber(ARGV[7]) do
  redis.call('HDEL', KEYS[5], redis.call('LPOP', KEYS[6]))
end
new_stream(ARGV[8])
return ''"
        )),
        // KEYS[2] stream meta, KEYS[3] events, KEYS[4] the session's stream set; ARGV[2] last,
        // ARGV[3] max events, ARGV[4] max session bytes, ARGV[5] notification prefix, ARGV[6] key
        // prefix of the session's streams, ARGV[7] this stream's name, ARGV[8] most tombstones,
        // ARGV[9...] the events, each its data then its tag. Over the session's byte cap, ended
        // streams go first (their tombstones stay), then this stream's oldest events.
        append: script(&format!(
            "{CHECK_LIVE}{ENTRY_TAG}{BURY}{ENDED_NOW}
local s = redis.call('HMGET', KEYS[2], 'head', 'state')
if not s[1] then return redis.error_reply('UNKNOWN_STREAM') end
if s[2] ~= '0' then return redis.error_reply('STREAM_ENDED') end
local seq = tonumber(s[1])
local added = 0
for i = 9, #ARGV, 2 do
  seq = seq + 1
  redis.call('XADD', KEYS[3], seq .. '-1', 'd', ARGV[i], 't', ARGV[i + 1])
  added = added + string.len(ARGV[i])
end
redis.call('HSET', KEYS[2], 'head', seq)
local total = tonumber(redis.call('HGET', KEYS[1], 'bytes') or '0')
if added > 0 then
  redis.call('HINCRBY', KEYS[2], 'bytes', added)
  total = redis.call('HINCRBY', KEYS[1], 'bytes', added)
end
local function drop_oldest()
  local oldest = redis.call('XRANGE', KEYS[3], '-', '+', 'COUNT', 1)[1]
  if not oldest or oldest[1] == seq .. '-1' then return false end
  local size = string.len(oldest[2][2])
  if entry_tag(oldest) then redis.call('HSET', KEYS[2], 'before', entry_tag(oldest)) end
  redis.call('XDEL', KEYS[3], oldest[1])
  if size > 0 then
    redis.call('HINCRBY', KEYS[2], 'bytes', -size)
    total = redis.call('HINCRBY', KEYS[1], 'bytes', -size)
  end
  return true
end
while redis.call('XLEN', KEYS[3]) > tonumber(ARGV[3]) and drop_oldest() do end
if total > tonumber(ARGV[4]) then
  local ended = {{}}
  for _, name in ipairs(redis.call('SMEMBERS', KEYS[4])) do
    local f = redis.call('HMGET', ARGV[6] .. 's:' .. name, 'state', 'ended')
    if name ~= ARGV[7] and f[1] ~= '0' then table.insert(ended, {{tonumber(f[2]) or 0, name}}) end
  end
  table.sort(ended, function(a, b) if a[1] ~= b[1] then return a[1] < b[1] end return a[2] < b[2] end)
  for _, e in ipairs(ended) do
    if total <= tonumber(ARGV[4]) then break end
    local size = bury(ARGV[6], e[2], ARGV[8])
    if size > 0 then total = redis.call('HINCRBY', KEYS[1], 'bytes', -size) end
  end
  while total > tonumber(ARGV[4]) and drop_oldest() do end
end
if ARGV[2] == '1' then redis.call('HSET', KEYS[2], 'state', 1, 'ended', ended_now()) end
redis.call('PUBLISH', '{NOTIFY}', ARGV[5] .. seq)
return seq"
        )),
        // KEYS[2] stream meta; ARGV[2] notification prefix.
        end_stream: script(&format!(
            "{CHECK_LIVE}{ENDED_NOW}
local s = redis.call('HMGET', KEYS[2], 'head', 'state')
if not s[1] then return redis.error_reply('UNKNOWN_STREAM') end
if s[2] == '0' then redis.call('HSET', KEYS[2], 'state', 1, 'ended', ended_now()) end
redis.call('PUBLISH', '{NOTIFY}', ARGV[2] .. s[1])
return 1"
        )),
        standalone: script(&format!("{CHECK_LIVE}\nredis.call('HSET', KEYS[1], 'standalone', ARGV[2])\nreturn 1")),
        // KEYS[1] session meta; ARGV[1] key prefix of the session's streams, ARGV[2] the stream,
        // ARGV[3] most tombstones. Only an ended stream is buried.
        bury: script(&format!(
            "{ENTRY_TAG}{BURY}
if redis.call('HGET', ARGV[1] .. 's:' .. ARGV[2], 'state') == '0' then return 0 end
local bytes = bury(ARGV[1], ARGV[2], ARGV[3])
if bytes > 0 and redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HINCRBY', KEYS[1], 'bytes', -bytes) end
return 1"
        )),
        // KEYS[1] stream meta; ARGV[1] notification prefix, ARGV[2] the owner whose lease lapsed.
        // An owner's set may name a stream it never began (a re-sent request id found another's).
        abort: script(&format!(
            "{ENDED_NOW}
local s = redis.call('HMGET', KEYS[1], 'head', 'state', 'rk', 'owner')
if not s[1] or s[2] ~= '0' or s[3] == '' or s[4] ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'state', 2, 'ended', ended_now())
redis.call('PUBLISH', '{NOTIFY}', ARGV[1] .. s[1])
return 1"
        )),
    })
}

/// A stream's `head`, `state` and `before` fields, as `HMGET` answers them (`None` for a stream
/// that does not exist).
type RangeMeta = (Option<u64>, Option<i64>, Option<String>);

/// Queues what a stream's range is read from: its meta, then its first retained event. In one
/// transaction, an append and trim cannot fall between the two.
fn queue_range(pipe: &mut redis::Pipeline, session: &str, stream: &str) {
    pipe.cmd("HMGET").arg(stream_key(session, stream)).arg("head").arg("state").arg("before");
    pipe.cmd("XRANGE").arg(events_key(session, stream)).arg("-").arg("+").arg("COUNT").arg(1);
}

/// The range from the answers to [`queue_range`]'s commands.
fn range_of((head, state, _): &RangeMeta, first: &Value) -> Option<StreamRange> {
    let (Some(head), Some(state)) = (*head, *state) else { return None };
    let retained_from = first_id(first).and_then(|id| parse_seq(&id)).unwrap_or(head + 1);
    let state = match state {
        0 => StreamState::Live,
        1 => StreamState::Complete,
        _ => StreamState::Aborted,
    };
    Some(StreamRange { retained_from, head, state })
}

/// Reads up to `max` events of a stream from `from` on.
fn page_cmd(session: &str, stream: &str, from: u64, max: usize) -> redis::Cmd {
    let mut cmd = redis::cmd("XRANGE");
    cmd.arg(events_key(session, stream)).arg(format!("{from}-1")).arg("+").arg("COUNT").arg(max.min(1 << 20));
    cmd
}

fn retiring_session(session: &str) -> String {
    format!("m{SEP}{session}")
}

fn retiring_stream(session: &str, stream: &str) -> String {
    format!("s{SEP}{session}{SEP}{stream}")
}

fn notification_prefix(session: &str, stream: &str) -> String {
    format!("{session}{SEP}{stream}{SEP}")
}

fn parse_seq(id: &str) -> Option<u64> {
    id.split('-').next()?.parse().ok()
}

fn field<'a>(map: &'a HashMap<String, String>, name: &str) -> Result<&'a str, StoreError> {
    map.get(name).map(String::as_str).ok_or_else(|| backend(format!("session record lacks {name}")))
}

async fn subscribe(client: &redis::Client, owner: &str) -> redis::RedisResult<redis::aio::PubSub> {
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe(NOTIFY).await?;
    pubsub.subscribe(ANSWERS).await?;
    pubsub.subscribe(TASK_CHANGES).await?;
    pubsub.subscribe(ANNOUNCEMENTS).await?;
    pubsub.subscribe(replica_channel(owner)).await?;
    Ok(pubsub)
}

/// Where [`listen`] hands what the other replicas publish.
struct Listeners {
    /// This process's name: its own announcements are not for it.
    owner: String,
    heads: Arc<Heads>,
    answers: tokio::sync::broadcast::Sender<RelayedAnswer>,
    task_changes: tokio::sync::broadcast::Sender<String>,
    announcements: tokio::sync::broadcast::Sender<Bytes>,
    replica_messages: tokio::sync::broadcast::Sender<ReplicaMessage>,
}

/// Turns notifications into wake-ups of local followers and relayed answers into messages for
/// local handlers. If the subscription drops, it resubscribes and wakes every follower, so none
/// waits for a notification lost in between.
async fn listen(client: redis::Client, mut pubsub: redis::aio::PubSub, to: Listeners) {
    let Listeners { owner, heads, answers, task_changes, announcements, replica_messages } = to;
    let mine = replica_channel(&owner);
    loop {
        let mut messages = pubsub.into_on_message();
        while let Some(message) = messages.next().await {
            if message.get_channel_name() == mine {
                let payload = message.get_payload_bytes();
                let mut parts = payload.splitn(2, |b| *b == SEP as u8);
                if let (Some(from), Some(body)) = (parts.next(), parts.next())
                    && let Ok(from) = ReplicaId::parse(&String::from_utf8_lossy(from))
                {
                    let _ = replica_messages.send(ReplicaMessage { from, body: Bytes::copy_from_slice(body) });
                }
                continue;
            }
            if message.get_channel_name() == ANNOUNCEMENTS {
                let payload = message.get_payload_bytes();
                let mut parts = payload.splitn(2, |b| *b == SEP as u8);
                if let (Some(from), Some(announcement)) = (parts.next(), parts.next())
                    && from != owner.as_bytes()
                {
                    let _ = announcements.send(Bytes::copy_from_slice(announcement));
                }
                continue;
            }
            if message.get_channel_name() == TASK_CHANGES {
                if let Ok(id) = message.get_payload::<String>() {
                    let _ = task_changes.send(id);
                }
                continue;
            }
            if message.get_channel_name() == ANSWERS {
                let payload = message.get_payload_bytes();
                let mut parts = payload.splitn(3, |b| *b == SEP as u8);
                if let (Some(session), Some(id), Some(response)) = (parts.next(), parts.next(), parts.next())
                    && let Ok(session) = SessionId::parse(&String::from_utf8_lossy(session))
                {
                    let _ = answers.send(RelayedAnswer {
                        session,
                        request_id: String::from_utf8_lossy(id).into_owned(),
                        response: Bytes::copy_from_slice(response),
                    });
                }
                continue;
            }
            let Ok(payload) = message.get_payload::<String>() else { continue };
            let mut parts = payload.split(SEP);
            let (Some(session), Some(stream), Some(seq)) = (parts.next(), parts.next(), parts.next()) else { continue };
            let (Ok(stream), Ok(seq)) = (StreamName::parse(stream), seq.parse::<u64>()) else { continue };
            heads.notify(session, &stream, seq);
        }
        tracing::warn!("redis subscription lost; resubscribing");
        pubsub = loop {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            match subscribe(&client, &owner).await {
                Ok(pubsub) => break pubsub,
                Err(err) => tracing::warn!(%err, "redis resubscribe failed"),
            }
        };
        heads.wake_all();
    }
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
        let client = redis::Client::open(url).map_err(backend)?;
        let config =
            redis::aio::ConnectionManagerConfig::new().set_response_timeout(Some(durability.response_timeout()));
        let mut redis = client.get_connection_manager_with_config(config).await.map_err(backend)?;
        let (fence, guarantee) = durability::check(&mut redis, durability).await?;
        let run_id = durability::run_id(&mut redis).await?;
        let pubsub = subscribe(&client, owner).await.map_err(backend)?;
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
        let listener = tokio::spawn(listen(client, pubsub, listeners));
        Ok(RedisStore {
            redis,
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

    /// Waits until the writes made on `conn` are as durable as the store guarantees.
    async fn fenced(&self, conn: &mut ConnectionManager) -> Result<(), StoreError> {
        self.fence.after_write(conn).await
    }

    /// Whether Redis is another process than last time (it restarted, or a replica took over):
    /// then whatever this process owns in it but no longer runs was left behind by a Redis
    /// that went back in time, and is given up, so that nobody waits on it for ever.
    async fn notice_restart(&self, conn: &mut ConnectionManager) -> Result<(), StoreError> {
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
        self.give_up_unheld(conn).await
    }

    /// Gives up what the store says this process owns but this process does not hold: request
    /// streams end aborted, idempotency keys and tasks read as abandoned.
    async fn give_up_unheld(&self, conn: &mut ConnectionManager) -> Result<(), StoreError> {
        let streams: Vec<String> = conn.smembers(owned_key(&self.owner)).await.map_err(backend)?;
        let keys: Vec<String> = conn.smembers(owned_keys_key(&self.owner)).await.map_err(backend)?;
        let tasks: Vec<String> = conn.smembers(owned_tasks_key(&self.owner)).await.map_err(backend)?;
        let (streams, keys, tasks) = {
            let held = self.held();
            (
                streams.into_iter().filter(|m| !held.streams.contains(m)).collect::<Vec<_>>(),
                keys.into_iter().filter(|k| !held.keys.contains(k)).collect::<Vec<_>>(),
                tasks.into_iter().filter(|t| !held.tasks.contains(t)).collect::<Vec<_>>(),
            )
        };
        for member in &streams {
            let Some((session, stream)) = member.split_once(SEP) else { continue };
            let aborted: i64 = scripts()
                .abort
                .key(stream_key(session, stream))
                .arg(notification_prefix(session, stream))
                .arg(&self.owner)
                .invoke_async(conn)
                .await
                .map_err(backend)?;
            if aborted == 1 {
                let _: i64 = conn.zadd(RETIRING, retiring_stream(session, stream), 0).await.map_err(backend)?;
            }
            let _: i64 = conn.srem(owned_key(&self.owner), member).await.map_err(backend)?;
        }
        for key in &keys {
            let mut disown = scripts().disown.key(key_record(key));
            disown.key(owned_keys_key(&self.owner)).arg(&self.owner).arg(key);
            let _: i64 = disown.invoke_async(conn).await.map_err(backend)?;
        }
        for task in &tasks {
            let mut disown = scripts().disown.key(task_key(task));
            disown.key(owned_tasks_key(&self.owner)).arg(&self.owner).arg(task);
            let _: i64 = disown.invoke_async(conn).await.map_err(backend)?;
            self.stop_counting(conn, task).await?;
        }
        if !(streams.is_empty() && keys.is_empty() && tasks.is_empty()) {
            tracing::warn!(
                streams = streams.len(),
                keys = keys.len(),
                tasks = tasks.len(),
                "gave up what Redis says this replica runs but it no longer does"
            );
        }
        Ok(())
    }

    fn conn(&self) -> ConnectionManager {
        self.redis.clone()
    }

    /// Whether `owner` heartbeat within the lease before `now_ms`. A claim heartbeats first, and
    /// a sweep forgets owners only once they lapsed, so an owner missing here is gone.
    async fn owner_alive(&self, conn: &mut ConnectionManager, owner: &str, now_ms: u64) -> Result<bool, StoreError> {
        let heartbeat: Option<u64> = conn.hget(OWNERS, owner).await.map_err(backend)?;
        Ok(heartbeat.is_some_and(|h| h.saturating_add(self.retention.lease_ms) >= now_ms))
    }

    /// Reads an idempotency record: digest, owner and state.
    async fn read_key(
        &self,
        conn: &mut ConnectionManager,
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
    async fn retire_session(&self, conn: &mut ConnectionManager, id: &str) -> Result<(), StoreError> {
        let _: i64 = conn.zrem(SESSIONS, id).await.map_err(backend)?;
        let _: i64 = conn.zadd(RETIRING, retiring_session(id), 0).await.map_err(backend)?;
        self.heads.forget_session(id);
        Ok(())
    }

    /// After a stream ended: it is queued for retirement and leaves this process's owned set, in
    /// one round trip. The stream has ended either way, so a failure here is logged, not
    /// answered: the stream is then dropped with its session instead of after its retention.
    async fn retire_stream(&self, conn: &mut ConnectionManager, session: &str, stream: &str) {
        self.held().streams.remove(&owned_member(session, stream));
        let retired = redis::pipe()
            .zadd(RETIRING, retiring_stream(session, stream), 0)
            .ignore()
            .srem(owned_key(&self.owner), owned_member(session, stream))
            .ignore()
            .query_async::<()>(conn)
            .await;
        if let Err(err) = retired {
            tracing::warn!(%err, session, stream, "could not queue an ended stream for retirement");
        }
    }
}

impl SessionStore for RedisStore {
    fn create_session(&self, record: SessionRecord, max_live: usize) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let mut conn = self.conn();
            // Admitted first, in the index of live sessions every replica shares: its size is the
            // count, checked and grown in one step.
            let admitted: i64 = scripts()
                .admit
                .key(SESSIONS)
                .arg(max_live)
                .arg(record.expires_at_ms)
                .arg(record.id.as_str())
                .invoke_async(&mut conn)
                .await
                .map_err(backend)?;
            match admitted {
                1 => {}
                0 => return Err(StoreError::TooManySessions),
                _ => return Err(StoreError::DuplicateSession),
            }
            let created = scripts()
                .create
                .key(meta(record.id.as_str()))
                .arg(record.epoch.as_str())
                .arg(record.protocol_version.as_str())
                .arg(record.client.to_string())
                .arg(record.idle_ttl_ms)
                .arg(record.expires_at_ms)
                .arg(record.principal.clone().unwrap_or_default())
                .arg(&self.owner)
                .invoke_async::<i64>(&mut conn)
                .await
                .map_err(script_error);
            match created {
                Ok(_) => {}
                // Refused: it takes no place. Any other failure may have created it all the
                // same (a lost reply); its index entry stays, and the sweep removes it if the
                // session is not there.
                Err(StoreError::DuplicateSession) => {
                    let _: i64 = conn.zrem(SESSIONS, record.id.as_str()).await.map_err(backend)?;
                    return Err(StoreError::DuplicateSession);
                }
                Err(err) => return Err(err),
            }
            self.fenced(&mut conn).await
        })
    }

    fn session(&self, id: &SessionId, _now_ms: u64) -> StoreFuture<'_, SessionStatus> {
        let session_id = id.clone();
        let id = id.as_str().to_owned();
        Box::pin(async move {
            let mut conn = self.conn();
            let map: HashMap<String, String> = conn.hgetall(meta(&id)).await.map_err(backend)?;
            if map.is_empty() {
                return Ok(SessionStatus::Unknown);
            }
            Ok(match field(&map, "ended")? {
                "1" => SessionStatus::Ended(SessionEnd::Terminated),
                "2" => SessionStatus::Ended(SessionEnd::Expired),
                "3" => SessionStatus::Ended(SessionEnd::UpstreamLost),
                "4" => SessionStatus::Ended(SessionEnd::HistoryRewritten),
                _ => SessionStatus::Live(SessionRecord {
                    epoch: Epoch::parse(field(&map, "epoch")?).map_err(backend)?,
                    principal: map.get("principal").cloned(),
                    protocol_version: field(&map, "pv")?.parse::<ProtocolVersion>().map_err(backend)?,
                    client: std::sync::Arc::new(serde_json::from_str(field(&map, "client")?).map_err(backend)?),
                    idle_ttl_ms: field(&map, "ttl")?.parse().map_err(backend)?,
                    expires_at_ms: field(&map, "exp")?.parse().map_err(backend)?,
                    id: session_id,
                }),
            })
        })
    }

    fn touch_session(&self, id: &SessionId, epoch: &Epoch, now_ms: u64) -> StoreFuture<'_, ()> {
        let (id, epoch) = (id.as_str().to_owned(), epoch.to_string());
        Box::pin(async move {
            let mut conn = self.conn();
            let expires: u64 = scripts()
                .touch
                .key(meta(&id))
                .arg(epoch)
                .arg(now_ms)
                .invoke_async(&mut conn)
                .await
                .map_err(script_error)?;
            // XX: only a deadline still in the index moves. A session that ended meanwhile left
            // it, and must not come back to be counted among the live.
            let _: i64 = redis::cmd("ZADD")
                .arg(SESSIONS)
                .arg("XX")
                .arg(expires)
                .arg(&id)
                .query_async(&mut conn)
                .await
                .map_err(backend)?;
            Ok(())
        })
    }

    fn end_session(&self, id: &SessionId, epoch: &Epoch, end: SessionEnd) -> StoreFuture<'_, ()> {
        let (id, epoch) = (id.as_str().to_owned(), epoch.to_string());
        let how = match end {
            SessionEnd::Terminated => 1,
            SessionEnd::Expired => 2,
            SessionEnd::UpstreamLost => 3,
            SessionEnd::HistoryRewritten => 4,
        };
        Box::pin(async move {
            let mut conn = self.conn();
            Self::end_script(&id, epoch, how, "").invoke_async::<i64>(&mut conn).await.map_err(script_error)?;
            self.retire_session(&mut conn, &id).await?;
            self.fenced(&mut conn).await
        })
    }

    fn set_standalone_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let (session, epoch, stream) = (session.as_str().to_owned(), epoch.to_string(), stream.to_string());
        Box::pin(async move {
            let mut conn = self.conn();
            scripts()
                .standalone
                .key(meta(&session))
                .arg(epoch)
                .arg(stream)
                .invoke_async::<i64>(&mut conn)
                .await
                .map_err(script_error)?;
            self.fenced(&mut conn).await
        })
    }

    fn standalone_stream(&self, session: &SessionId) -> StoreFuture<'_, Option<StreamName>> {
        let key = meta(session.as_str());
        Box::pin(async move {
            let (name, ended): (Option<String>, Option<String>) = redis::cmd("HMGET")
                .arg(key)
                .arg("standalone")
                .arg("ended")
                .query_async(&mut self.conn())
                .await
                .map_err(backend)?;
            match (name, ended.as_deref()) {
                (Some(name), Some("0")) => StreamName::parse(&name).map(Some).map_err(backend),
                _ => Ok(None),
            }
        })
    }

    fn sweep(&self, now_ms: u64) -> StoreFuture<'_, Vec<SessionId>> {
        Box::pin(async move {
            let mut conn = self.conn();
            self.notice_restart(&mut conn).await?;
            let _: i64 = conn.hset(OWNERS, &self.owner, now_ms).await.map_err(backend)?;
            // Sessions past their deadline: each is re-checked atomically before it expires.
            let due: Vec<String> = conn.zrangebyscore(SESSIONS, "-inf", now_ms).await.map_err(backend)?;
            let mut expired = Vec::new();
            for id in due {
                let epoch: Option<String> = conn.hget(meta(&id), "epoch").await.map_err(backend)?;
                let Some(epoch) = epoch else {
                    let _: i64 = conn.zrem(SESSIONS, &id).await.map_err(backend)?;
                    continue;
                };
                let ended = Self::end_script(&id, epoch, 2, now_ms).invoke_async::<i64>(&mut conn).await;
                match ended {
                    // Renewed in the meantime: its index entry already has the new deadline.
                    Ok(0) => {}
                    Ok(_) => {
                        self.retire_session(&mut conn, &id).await?;
                        expired.push(SessionId::parse(&id).map_err(backend)?);
                    }
                    Err(err) if matches!(script_error(err.clone()), StoreError::SessionGone) => {
                        let _: i64 = conn.zrem(SESSIONS, &id).await.map_err(backend)?;
                    }
                    Err(err) => return Err(backend(err)),
                }
            }
            // Requests of owners whose heartbeat lapsed will never finish: abort them.
            let owners: HashMap<String, u64> = conn.hgetall(OWNERS).await.map_err(backend)?;
            for (owner, heartbeat) in owners {
                if heartbeat.saturating_add(self.retention.lease_ms) >= now_ms {
                    continue;
                }
                let members: Vec<String> = conn.smembers(owned_key(&owner)).await.map_err(backend)?;
                for member in members {
                    let Some((session, stream)) = member.split_once(SEP) else { continue };
                    let aborted: i64 = scripts()
                        .abort
                        .key(stream_key(session, stream))
                        .arg(notification_prefix(session, stream))
                        .arg(&owner)
                        .invoke_async(&mut conn)
                        .await
                        .map_err(backend)?;
                    if aborted == 1 {
                        let _: i64 = conn.zadd(RETIRING, retiring_stream(session, stream), 0).await.map_err(backend)?;
                    }
                }
                // Its keys and tasks read as abandoned by its lapsed heartbeat already; its tasks
                // no longer count as running.
                let tasks: Vec<String> = conn.smembers(owned_tasks_key(&owner)).await.map_err(backend)?;
                for task in &tasks {
                    self.stop_counting(&mut conn, task).await?;
                }
                let sets = [owned_key(&owner), owned_keys_key(&owner), owned_tasks_key(&owner)];
                let _: i64 = conn.del(&sets[..]).await.map_err(backend)?;
                let _: i64 = conn.hdel(OWNERS, &owner).await.map_err(backend)?;
            }
            self.forget_keys(&mut conn, now_ms).await?;
            let mut tasks: Vec<String> = conn.zrangebyscore(TASKS_DUE, 0, now_ms).await.map_err(backend)?;
            // Past the bound, the finished tasks due first.
            let finished: usize = conn.zcard(TASKS_DUE).await.map_err(backend)?;
            let over = finished.saturating_sub(tasks.len()).saturating_sub(self.retention.max_finished_tasks);
            if over > 0 {
                let first = tasks.len();
                let more: Vec<String> = conn
                    .zrange(
                        TASKS_DUE,
                        isize::try_from(first).unwrap_or(isize::MAX),
                        isize::try_from(first + over - 1).unwrap_or(isize::MAX),
                    )
                    .await
                    .map_err(backend)?;
                tasks.extend(more);
            }
            for id in tasks {
                redis::pipe()
                    .atomic()
                    .del(task_key(&id))
                    .ignore()
                    .zrem(TASKS_DUE, &id)
                    .ignore()
                    .query_async::<()>(&mut conn)
                    .await
                    .map_err(backend)?;
            }
            // Retention: stamp what ended since the last sweep, drop what has waited long enough.
            let fresh: Vec<String> = conn.zrangebyscore(RETIRING, 0, 0).await.map_err(backend)?;
            for member in fresh {
                let _: i64 = conn.zadd(RETIRING, member, now_ms.max(1)).await.map_err(backend)?;
            }
            let oldest = now_ms.saturating_sub(self.retention.ended_stream_ms.min(self.retention.tombstone_ms));
            let due: Vec<(String, u64)> = conn.zrangebyscore_withscores(RETIRING, 1, oldest).await.map_err(backend)?;
            for (member, since) in due {
                let mut parts = member.split(SEP);
                let waited = now_ms.saturating_sub(since);
                match (parts.next(), parts.next(), parts.next()) {
                    (Some("m"), Some(session), None) if waited >= self.retention.tombstone_ms => {
                        let _: i64 = conn.del(meta(session)).await.map_err(backend)?;
                    }
                    (Some("s"), Some(session), Some(stream)) if waited >= self.retention.ended_stream_ms => {
                        let _: i64 = scripts()
                            .bury
                            .key(meta(session))
                            .arg(format!("tether:{{{session}}}:"))
                            .arg(stream)
                            .arg(self.retention.max_tombstones_per_session())
                            .invoke_async(&mut conn)
                            .await
                            .map_err(backend)?;
                    }
                    _ => continue,
                }
                let _: i64 = conn.zrem(RETIRING, &member).await.map_err(backend)?;
            }
            // Watches of streams that retention dropped end with the stream.
            for (session, stream) in self.heads.followed() {
                let exists: bool = conn.exists(stream_key(&session, stream.as_str())).await.map_err(backend)?;
                if !exists {
                    self.heads.forget(&session, &stream);
                }
            }
            Ok(expired)
        })
    }
}

impl EventLog for RedisStore {
    fn open_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let stream_name = stream.clone();
        let (session, epoch, stream) = (session.as_str().to_owned(), epoch.to_string(), stream.to_string());
        Box::pin(async move {
            let mut conn = self.conn();
            let [m, s, e, set] = Self::stream_keys(&session, &stream);
            scripts()
                .open
                .key(m)
                .key(s)
                .key(e)
                .key(set)
                .arg(epoch)
                .arg(&stream)
                .arg(&self.owner)
                .arg("")
                .arg(Tag::priming(&stream_name).to_string())
                .invoke_async::<i64>(&mut conn)
                .await
                .map_err(script_error)?;
            self.fenced(&mut conn).await
        })
    }

    fn begin_request(&self, request: RequestRecord<'_>) -> StoreFuture<'_, BeginRequest> {
        let (session, epoch, key, digest) = (
            request.session.as_str().to_owned(),
            request.epoch.to_string(),
            request.key.encode(),
            request.params_digest.to_owned(),
        );
        let stream_name = request.stream.clone();
        let stream = request.stream.to_string();
        Box::pin(async move {
            let mut conn = self.conn();
            let [m, s, e, set] = Self::stream_keys(&session, &stream);
            let member = owned_member(&session, &stream);
            let mut begin = scripts().begin.key(m);
            begin
                .key(s)
                .key(e)
                .key(set)
                .key(requests_key(&session))
                .key(request_order_key(&session))
                .arg(epoch)
                .arg(&stream)
                .arg(&self.owner)
                .arg(&key)
                .arg(&key)
                .arg(&digest)
                .arg(self.retention.max_tombstones_per_session())
                .arg(Tag::priming(&stream_name).to_string());
            // The stream joins this process's owned set before it exists (queued first on the
            // shared connection; both go in one round trip): if the process dies once the
            // stream exists, its request is found and aborted, never left live.
            let mut owned = conn.clone();
            let fresh = self.held().streams.insert(member.clone());
            let (added, begun) = tokio::join!(
                owned.sadd::<_, _, i64>(owned_key(&self.owner), &member),
                begin.invoke_async::<String>(&mut conn)
            );
            let existing = begun.map_err(script_error);
            if fresh && !matches!(existing.as_deref(), Ok("")) {
                self.held().streams.remove(&member);
            }
            if matches!(existing.as_deref(), Ok("")) {
                // Begun: failing the call now would leave a live stream nobody runs. Without its
                // entry the request runs and ends as usual; only a crash would strand it.
                if let Err(err) = added {
                    tracing::warn!(%err, session, stream, "a begun request is missing from its owner's set");
                }
                self.fenced(&mut conn).await?;
                return Ok(BeginRequest::Started);
            }
            // Not begun here: the entry comes out again. Were it left, it would only grow the set
            // (the abort script checks the owner), so this is best effort.
            if added.is_ok()
                && let Err(err) = conn.srem::<_, _, i64>(owned_key(&self.owner), &member).await
            {
                tracing::debug!(%err, "could not take a request that was not begun out of the owner's set");
            }
            let existing = existing?;
            let (existing_digest, existing_stream) =
                existing.split_once(SEP).ok_or_else(|| backend("bad request record"))?;
            Ok(BeginRequest::Existing {
                stream: StreamName::parse(existing_stream).map_err(backend)?,
                same_params: existing_digest == digest,
            })
        })
    }

    fn append_batch(
        &self,
        session: &SessionId,
        epoch: &Epoch,
        stream: &StreamName,
        events: Vec<Bytes>,
        last: bool,
    ) -> StoreFuture<'_, u64> {
        let (session, epoch, stream) = (session.as_str().to_owned(), epoch.to_string(), stream.to_string());
        Box::pin(async move {
            let mut conn = self.conn();
            let [m, s, e, set] = Self::stream_keys(&session, &stream);
            let script = &scripts().append;
            let mut invocation = script.key(m);
            invocation
                .key(s)
                .key(e)
                .key(set)
                .arg(epoch)
                .arg(if last { "1" } else { "0" })
                .arg(self.retention.max_events_per_stream.max(1))
                .arg(self.retention.max_bytes_per_session)
                .arg(notification_prefix(&session, &stream))
                .arg(format!("tether:{{{session}}}:"))
                .arg(&stream)
                .arg(self.retention.max_tombstones_per_session());
            for (data, tag) in events.iter().zip(crate::tags::fresh_n(events.len())) {
                invocation.arg(&data[..]).arg(tag.to_string());
            }
            let seq: u64 = invocation.invoke_async(&mut conn).await.map_err(script_error)?;
            if last {
                self.retire_stream(&mut conn, &session, &stream).await;
            }
            self.fenced(&mut conn).await?;
            // Local followers need not wait for the round trip through pub/sub.
            if let Ok(name) = StreamName::parse(&stream) {
                self.heads.notify(&session, &name, seq);
            }
            Ok(seq)
        })
    }

    fn end_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let (session, epoch, stream) = (session.as_str().to_owned(), epoch.to_string(), stream.to_string());
        Box::pin(async move {
            let mut conn = self.conn();
            let [m, s, _, _] = Self::stream_keys(&session, &stream);
            scripts()
                .end_stream
                .key(m)
                .key(s)
                .arg(epoch)
                .arg(notification_prefix(&session, &stream))
                .invoke_async::<i64>(&mut conn)
                .await
                .map_err(script_error)?;
            self.retire_stream(&mut conn, &session, &stream).await;
            self.fenced(&mut conn).await
        })
    }

    fn abort_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let (session, epoch, stream) = (session.clone(), epoch.clone(), stream.clone());
        Box::pin(async move {
            let mut conn = self.conn();
            if !matches!(self.session(&session, 0).await?, SessionStatus::Live(record) if record.epoch == epoch) {
                return Err(StoreError::SessionGone);
            }
            let (session, stream) = (session.as_str(), stream.as_str());
            let mut abort = scripts().abort.key(stream_key(session, stream));
            abort.arg(notification_prefix(session, stream)).arg(&self.owner);
            let _: i64 = abort.invoke_async(&mut conn).await.map_err(backend)?;
            self.retire_stream(&mut conn, session, stream).await;
            self.fenced(&mut conn).await
        })
    }

    fn stream_range(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, Option<StreamRange>> {
        let mut pipe = redis::pipe();
        queue_range(pipe.atomic(), session.as_str(), stream.as_str());
        Box::pin(async move {
            let (meta, first): (RangeMeta, Value) = pipe.query_async(&mut self.conn()).await.map_err(backend)?;
            Ok(range_of(&meta, &first))
        })
    }

    fn stream_request(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, Option<RequestKey>> {
        let key = stream_key(session.as_str(), stream.as_str());
        Box::pin(async move {
            let mut conn = self.conn();
            let rk: Option<String> = conn.hget(key, "rk").await.map_err(backend)?;
            rk.filter(|k| !k.is_empty()).map(|k| RequestKey::parse(&k)).transpose().map_err(backend)
        })
    }

    fn read(
        &self,
        session: &SessionId,
        stream: &StreamName,
        after: u64,
        max: usize,
    ) -> StoreFuture<'_, Vec<StoredEvent>> {
        let read = page_cmd(session.as_str(), stream.as_str(), after.saturating_add(1), max);
        Box::pin(async move {
            let reply: Value = read.query_async(&mut self.conn()).await.map_err(backend)?;
            Ok(stream_entries(&reply))
        })
    }

    /// The range and the page in one transaction: one round trip per page read by a response,
    /// a replay or a relay. The page starts at the cursor's own event, for its tag.
    fn read_page(
        &self,
        session: &SessionId,
        stream: &StreamName,
        after: u64,
        max: usize,
    ) -> StoreFuture<'_, Option<StreamPage>> {
        let mut pipe = redis::pipe();
        queue_range(pipe.atomic(), session.as_str(), stream.as_str());
        pipe.add_command(page_cmd(session.as_str(), stream.as_str(), after, max.saturating_add(1)));
        Box::pin(async move {
            let (meta, first, page): (RangeMeta, Value, Value) =
                pipe.query_async(&mut self.conn()).await.map_err(backend)?;
            let Some(range) = range_of(&meta, &first) else { return Ok(None) };
            let before_retained = meta.2.as_deref().map(Tag::parse).transpose().map_err(backend)?;
            let mut events = stream_entries(&page);
            let own = events.first().filter(|event| event.seq == after).map(|event| event.tag);
            if own.is_some() {
                events.remove(0);
            }
            events.truncate(max);
            let at_cursor = if after.checked_add(1) == Some(range.retained_from) { before_retained } else { own };
            Ok(Some(StreamPage { range, at_cursor, before_retained, events }))
        })
    }

    fn watch(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, HeadWatch> {
        let range = self.stream_range(session, stream);
        let key = (session.as_str().to_owned(), stream.clone());
        Box::pin(async move {
            let range = range.await?.ok_or(StoreError::UnknownStream)?;
            Ok(self.heads.subscribe(&key.0, &key.1, range.head))
        })
    }

    fn retained_bytes(&self) -> StoreFuture<'_, Option<u64>> {
        Box::pin(std::future::ready(Ok(None)))
    }
}

impl KeyRecords for RedisStore {
    fn records(&self) -> StoreFuture<'_, String> {
        Box::pin(async move {
            let mut conn = self.conn();
            // A Redis that lost its records (restarted empty) gets a new name: they are others.
            let _: bool = conn.set_nx(RECORDS_ID, crate::new_records_id()?).await.map_err(backend)?;
            conn.get(RECORDS_ID).await.map_err(backend)
        })
    }

    fn claim_key(&self, claim: KeyClaim) -> StoreFuture<'_, Claim> {
        Box::pin(async move {
            let mut conn = self.conn();
            // The heartbeat, then the index entry (NX: a known key keeps its age), in one round
            // trip and before the claim: a claim never exists without both, so no replica takes
            // it for abandoned and no record escapes expiry.
            redis::pipe()
                .hset(OWNERS, &self.owner, claim.now_ms)
                .ignore()
                .cmd("ZADD")
                .arg(KEYS)
                .arg("NX")
                .arg(claim.now_ms)
                .arg(&claim.key)
                .ignore()
                .query_async::<()>(&mut conn)
                .await
                .map_err(backend)?;
            let (session, stream) = claim.columns();
            let (seen_records, seen_position) = match &claim.acknowledged {
                Some(acknowledged) => (acknowledged.records.as_str(), acknowledged.position),
                None => ("", 0),
            };
            // Held before it may be claimed: a claim is never owned here without being held.
            let fresh = self.held().keys.insert(claim.key.clone());
            let mut invocation = scripts().claim.key(key_record(&claim.key));
            invocation
                .key(RECORDS_ID)
                .key(CLAIMS)
                .key(CLAIMS_FORGOTTEN)
                .key(owned_keys_key(&self.owner))
                .arg(&claim.params_digest)
                .arg(&self.owner)
                .arg(session.unwrap_or_default())
                .arg(stream.unwrap_or_default())
                .arg(crate::new_records_id()?)
                .arg(seen_records)
                .arg(seen_position)
                .arg(&claim.key);
            let reply: Result<Vec<Option<Vec<u8>>>, StoreError> =
                invocation.invoke_async(&mut conn).await.map_err(backend);
            let claimed = matches!(&reply, Ok(reply) if reply.first().and_then(Option::as_deref) == Some(b"claimed"));
            if fresh && !claimed {
                self.held().keys.remove(&claim.key);
            }
            let mut reply = reply?;
            self.fenced(&mut conn).await?;
            // The records' name and the claim's position (0 for a claim made before positions).
            let acknowledged = |reply: &[Option<Vec<u8>>]| {
                let text = |i: usize| reply.get(i).and_then(Option::as_deref).and_then(|b| std::str::from_utf8(b).ok());
                let records = text(1).ok_or_else(|| backend("a claim without its records"))?.to_owned();
                Ok::<_, StoreError>(Acknowledged {
                    records,
                    position: text(2).and_then(|n| n.parse().ok()).unwrap_or(0),
                })
            };
            match reply.first().and_then(Option::as_deref) {
                Some(b"regressed") => Ok(Claim::Regressed),
                Some(b"claimed") => Ok(Claim::Claimed(acknowledged(&reply)?)),
                Some(b"existing") => {
                    let acknowledged = acknowledged(&reply)?;
                    let fields = reply.split_off(3);
                    let (digest, _, state) = self
                        .read_key(&mut conn, fields, claim.now_ms)
                        .await?
                        .ok_or_else(|| backend("a record without a digest"))?;
                    Ok(Claim::Existing { same_params: digest == claim.params_digest, state, acknowledged })
                }
                _ => Err(backend("the claim script answered something else")),
            }
        })
    }

    fn take_over_key(&self, claim: KeyClaim) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let mut conn = self.conn();
            let fields = key_fields(&mut conn, &claim.key).await?;
            let found = self.read_key(&mut conn, fields, claim.now_ms).await?;
            let Some((digest, gone, KeyState::Running { abandoned: true, .. })) = found else { return Ok(false) };
            if digest != claim.params_digest {
                return Ok(false);
            }
            let _: i64 = conn.hset(OWNERS, &self.owner, claim.now_ms).await.map_err(backend)?;
            let (session, stream) = claim.columns();
            let fresh = self.held().keys.insert(claim.key.clone());
            let mut invocation = scripts().take_over.key(key_record(&claim.key));
            invocation
                .key(owned_keys_key(&self.owner))
                .arg(&claim.params_digest)
                .arg(gone)
                .arg(&self.owner)
                .arg(session.unwrap_or_default())
                .arg(stream.unwrap_or_default())
                .arg(&claim.key);
            let taken: Result<i64, StoreError> = invocation.invoke_async(&mut conn).await.map_err(backend);
            if fresh && !matches!(taken, Ok(1)) {
                self.held().keys.remove(&claim.key);
            }
            let taken = taken? == 1;
            if taken {
                self.fenced(&mut conn).await?;
            }
            Ok(taken)
        })
    }

    fn key_state(&self, key: &str, now_ms: u64) -> StoreFuture<'_, Option<KeyState>> {
        let key = key.to_owned();
        Box::pin(async move {
            let mut conn = self.conn();
            let fields = key_fields(&mut conn, &key).await?;
            Ok(self.read_key(&mut conn, fields, now_ms).await?.map(|(_, _, state)| state))
        })
    }

    fn release_key(&self, key: &str) -> StoreFuture<'_, ()> {
        let key = key.to_owned();
        Box::pin(async move {
            let mut conn = self.conn();
            let mut release = scripts().release.key(key_record(&key));
            release.key(owned_keys_key(&self.owner)).key(KEYS).arg(&self.owner).arg(&key);
            let _: i64 = release.invoke_async(&mut conn).await.map_err(backend)?;
            self.held().keys.remove(&key);
            self.fenced(&mut conn).await
        })
    }

    fn finish_key(&self, key: &str, outcome: Bytes) -> StoreFuture<'_, ()> {
        let key = key.to_owned();
        Box::pin(async move {
            let mut conn = self.conn();
            let mut finish = scripts().finish.key(key_record(&key));
            finish.key(owned_keys_key(&self.owner)).arg(&self.owner).arg(&outcome[..]).arg(&key);
            let _: i64 = finish.invoke_async(&mut conn).await.map_err(backend)?;
            self.held().keys.remove(&key);
            self.fenced(&mut conn).await
        })
    }
}

impl RedisStore {
    /// Reads a task: its record as stored (for the swap) and as read, and whether its owner's
    /// heartbeat lapsed.
    async fn read_task(
        &self,
        conn: &mut ConnectionManager,
        id: &str,
        now_ms: u64,
    ) -> Result<Option<(String, StoredTask)>, StoreError> {
        let (text, owner): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(task_key(id))
            .arg("record")
            .arg("owner")
            .query_async(conn)
            .await
            .map_err(backend)?;
        let Some(text) = text else { return Ok(None) };
        let value: serde_json::Value = serde_json::from_str(&text).map_err(backend)?;
        let record = TaskRecord::from_json(&value).map_err(backend)?;
        let abandoned = !self.owner_alive(conn, owner.as_deref().unwrap_or_default(), now_ms).await?;
        Ok(Some((text, StoredTask { record, abandoned })))
    }

    /// Stops counting task `id` as running: its owner gave it up or died.
    async fn stop_counting(&self, conn: &mut ConnectionManager, id: &str) -> Result<(), StoreError> {
        let text: Option<String> = conn.hget(task_key(id), "record").await.map_err(backend)?;
        let principal = text
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
            .and_then(|value| TaskRecord::from_json(&value).ok())
            .map(|record| record.principal);
        let mut pipe = redis::pipe();
        pipe.zrem(RUNNING_TASKS, id);
        if let Some(principal) = principal {
            pipe.zrem(running_tasks_key(principal.as_deref()), id);
        }
        pipe.query_async::<()>(conn).await.map_err(backend)
    }
}

impl TaskStore for RedisStore {
    fn create_task(&self, record: TaskRecord, key: Option<(String, Bytes)>, limits: TaskLimits) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let mut conn = self.conn();
            // The heartbeat first, in the same step: the task is never without a live owner.
            // Held before it is created: a task is never owned here without being held.
            let id = record.task.id.clone();
            self.held().tasks.insert(id.clone());
            let mut create = scripts().task_create.key(RUNNING_TASKS);
            create
                .key(running_tasks_key(record.principal.as_deref()))
                .key(task_key(&id))
                .key(owned_tasks_key(&self.owner))
                .key(OWNERS)
                .arg(limits.total)
                .arg(limits.per_principal)
                .arg(&id)
                .arg(record.to_json().to_string())
                .arg(&self.owner)
                .arg(record.task.created_at_ms);
            let created = match create.invoke_async::<i64>(&mut conn).await.map_err(backend) {
                Ok(1) => Ok(()),
                Ok(0) => Err(StoreError::TooManyTasks { principal: false }),
                Ok(_) => Err(StoreError::TooManyTasks { principal: true }),
                Err(err) => Err(err),
            };
            if created.is_err() {
                self.held().tasks.remove(&id);
            }
            created?;
            self.fenced(&mut conn).await?;
            if let Some((key, outcome)) = key {
                self.finish_key(&key, outcome).await?;
            }
            Ok(())
        })
    }

    fn task(&self, id: &str, now_ms: u64) -> StoreFuture<'_, Option<StoredTask>> {
        let id = id.to_owned();
        Box::pin(async move { Ok(self.read_task(&mut self.conn(), &id, now_ms).await?.map(|(_, task)| task)) })
    }

    fn task_changes(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        Some(self.task_changes.subscribe())
    }

    fn update_task(&self, id: &str, change: TaskChange, now_ms: u64) -> StoreFuture<'_, Option<(StoredTask, bool)>> {
        let id = id.to_owned();
        Box::pin(async move {
            let mut conn = self.conn();
            for _ in 0..TASK_SWAPS {
                let Some((read, mut stored)) = self.read_task(&mut conn, &id, now_ms).await? else { return Ok(None) };
                if !stored.record.apply(change.clone(), now_ms) {
                    return Ok(Some((stored, false)));
                }
                let swapped: i64 = scripts()
                    .task_swap
                    .key(task_key(&id))
                    .key(TASKS_DUE)
                    .arg(read)
                    .arg(stored.record.to_json().to_string())
                    .arg(stored.record.forget_at_ms().unwrap_or(0))
                    .arg(&id)
                    .invoke_async(&mut conn)
                    .await
                    .map_err(backend)?;
                if swapped == 1 {
                    if stored.record.task.status.is_final() {
                        // Finished: nothing of it is left to run.
                        let running = running_tasks_key(stored.record.principal.as_deref());
                        redis::pipe()
                            .srem(owned_tasks_key(&self.owner), &id)
                            .zrem(RUNNING_TASKS, &id)
                            .zrem(running, &id)
                            .query_async::<()>(&mut conn)
                            .await
                            .map_err(backend)?;
                        self.held().tasks.remove(&id);
                    }
                    self.fenced(&mut conn).await?;
                    // A hint for the replicas waiting on it; they poll anyway.
                    if let Err(err) = conn.publish::<_, _, i64>(TASK_CHANGES, &id).await {
                        tracing::debug!(%err, "could not announce a task change");
                    }
                    return Ok(Some((stored, true)));
                }
            }
            Err(StoreError::Backend(format!("task {id} kept changing under {TASK_SWAPS} attempts to change it")))
        })
    }
}

impl Relay for RedisStore {
    fn relay_answer(&self, answer: RelayedAnswer) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let mut payload = format!("{}{SEP}{}{SEP}", answer.session, answer.request_id).into_bytes();
            payload.extend_from_slice(&answer.response);
            let receivers: i64 = self.conn().publish(ANSWERS, payload).await.map_err(backend)?;
            Ok(receivers > 0)
        })
    }

    fn relayed_answers(&self) -> Option<tokio::sync::broadcast::Receiver<RelayedAnswer>> {
        Some(self.answers.subscribe())
    }

    fn announce(&self, announcement: Bytes) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let mut payload = format!("{}{SEP}", self.owner).into_bytes();
            payload.extend_from_slice(&announcement);
            let _: i64 = self.conn().publish(ANNOUNCEMENTS, payload).await.map_err(backend)?;
            Ok(())
        })
    }

    fn announcements(&self) -> Option<tokio::sync::broadcast::Receiver<Bytes>> {
        Some(self.announcements.subscribe())
    }

    fn session_replica(&self, session: &SessionId) -> StoreFuture<'_, Option<ReplicaId>> {
        let key = meta(session.as_str());
        Box::pin(async move {
            let replica: Option<String> = self.conn().hget(key, "replica").await.map_err(backend)?;
            // A record without a replica (or with a name no replica could have) has no holder.
            Ok(replica.and_then(|replica| ReplicaId::parse(&replica).ok()))
        })
    }

    fn replica_alive(&self, replica: &ReplicaId, now_ms: u64) -> StoreFuture<'_, bool> {
        let replica = replica.as_str().to_owned();
        Box::pin(async move { self.owner_alive(&mut self.conn(), &replica, now_ms).await })
    }

    fn send_to_replica(&self, to: &ReplicaId, body: Bytes) -> StoreFuture<'_, bool> {
        let channel = replica_channel(to.as_str());
        Box::pin(async move {
            let mut payload = format!("{}{SEP}", self.owner).into_bytes();
            payload.extend_from_slice(&body);
            let receivers: i64 = self.conn().publish(channel, payload).await.map_err(backend)?;
            Ok(receivers > 0)
        })
    }

    fn replica_messages(&self) -> Option<tokio::sync::broadcast::Receiver<ReplicaMessage>> {
        Some(self.replica_messages.subscribe())
    }
}

impl CounterStore for RedisStore {
    fn counter_add(&self, key: &str, amount: i64, once: Option<&str>) -> StoreFuture<'_, i64> {
        let (key, once) = (key.to_owned(), once.map(str::to_owned));
        Box::pin(async move {
            let mut conn = self.conn();
            let value: i64 = match once {
                None => conn.hincr(COUNTERS, key, amount).await.map_err(backend)?,
                Some(op) => scripts()
                    .counter_once
                    .key(COUNTERS)
                    .key(counter_op_key(&op))
                    .arg(key)
                    .arg(amount)
                    .arg(self.retention.idempotency_ms.max(1))
                    .invoke_async(&mut conn)
                    .await
                    .map_err(backend)?,
            };
            self.fenced(&mut conn).await?;
            Ok(value)
        })
    }

    fn counter_get(&self, key: &str) -> StoreFuture<'_, i64> {
        let key = key.to_owned();
        Box::pin(async move {
            let value: Option<i64> = self.conn().hget(COUNTERS, key).await.map_err(backend)?;
            Ok(value.unwrap_or(0))
        })
    }
}

/// The fields of an idempotency record, in the order the claim script returns them.
async fn key_fields(conn: &mut ConnectionManager, key: &str) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
    redis::cmd("HMGET")
        .arg(key_record(key))
        .arg(&["digest", "owner", "session", "stream", "outcome"])
        .query_async(conn)
        .await
        .map_err(backend)
}

impl RedisStore {
    /// Forgets idempotency records past their time, then the oldest finished ones past the
    /// count bound. (Additions made once expire on their own.)
    /// Forgets one idempotency record, keeping the highest position of a claim forgotten.
    async fn forget_key(&self, conn: &mut ConnectionManager, key: &str) -> Result<(), StoreError> {
        let mut forget = scripts().forget.key(key_record(key));
        forget.key(KEYS).key(CLAIMS_FORGOTTEN).arg(key);
        let _: i64 = forget.invoke_async(conn).await.map_err(backend)?;
        Ok(())
    }

    async fn forget_keys(&self, conn: &mut ConnectionManager, now_ms: u64) -> Result<(), StoreError> {
        let cutoff = now_ms.saturating_sub(self.retention.idempotency_ms);
        let old: Vec<String> = conn.zrangebyscore(KEYS, "-inf", cutoff).await.map_err(backend)?;
        for key in old {
            self.forget_key(conn, &key).await?;
        }
        let count: usize = conn.zcard(KEYS).await.map_err(backend)?;
        let mut excess = count.saturating_sub(self.retention.max_idempotency_records);
        // Oldest first, skipping running requests, a page at a time.
        const PAGE: isize = 256;
        let mut start = 0;
        while excess > 0 {
            let page: Vec<String> = conn.zrange(KEYS, start, start + PAGE - 1).await.map_err(backend)?;
            if page.is_empty() {
                break;
            }
            for key in &page {
                if excess == 0 {
                    break;
                }
                let finished: bool = conn.hexists(key_record(key), "outcome").await.map_err(backend)?;
                if finished {
                    self.forget_key(conn, key).await?;
                    excess -= 1;
                } else {
                    start += 1;
                }
            }
        }
        Ok(())
    }
}

/// The id of the first entry of an XRANGE reply.
fn first_id(reply: &Value) -> Option<String> {
    match reply {
        Value::Array(entries) => match entries.first()? {
            Value::Array(entry) => match entry.first()? {
                Value::BulkString(id) => String::from_utf8(id.clone()).ok(),
                Value::SimpleString(id) => Some(id.clone()),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    }
}

/// The events of an XRANGE reply (`[[id, [field, value]], ...]`).
fn stream_entries(reply: &Value) -> Vec<StoredEvent> {
    let Value::Array(entries) = reply else { return Vec::new() };
    entries
        .iter()
        .filter_map(|entry| {
            let Value::Array(entry) = entry else { return None };
            let id = match entry.first()? {
                Value::BulkString(id) => String::from_utf8(id.clone()).ok()?,
                Value::SimpleString(id) => id.clone(),
                _ => return None,
            };
            let Value::Array(fields) = entry.get(1)? else { return None };
            let (mut data, mut tag) = (Bytes::new(), None);
            for pair in fields.chunks_exact(2) {
                match (&pair[0], &pair[1]) {
                    (Value::BulkString(name), Value::BulkString(value)) if name == b"d" => {
                        data = Bytes::from(value.clone());
                    }
                    (Value::BulkString(name), Value::BulkString(value)) if name == b"t" => {
                        tag = std::str::from_utf8(value).ok().and_then(|t| Tag::parse(t).ok());
                    }
                    _ => {}
                }
            }
            // An entry stored before events had tags reads as tag 0, as the embedded store's
            // rows of that time do: the same every time it is read.
            Some(StoredEvent { seq: parse_seq(&id)?, tag: tag.unwrap_or(Tag::from_bits(0)), data })
        })
        .collect()
}
