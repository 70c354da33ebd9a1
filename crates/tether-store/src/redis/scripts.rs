//! The Lua scripts that make each of the store's steps one atomic step in Redis, loaded once.

use super::*;

/// Fails unless the session (KEYS[1]) is live in incarnation ARGV[1].
///
/// The scripts that move a stream's head announce it with `redis.call(command, channel,
/// message)`: `PUBLISH` on the channel every replica hears, or in a cluster `SPUBLISH` on the
/// session's own channel, which lies in its slot.
pub(super) const CHECK_LIVE: &str = r"
local m = redis.call('HMGET', KEYS[1], 'epoch', 'ended')
if m[1] ~= ARGV[1] or m[2] ~= '0' then return redis.error_reply('SESSION_GONE') end
";

/// Creates a stream (KEYS[2] meta, KEYS[3] events, KEYS[4] the session's stream set) with its
/// priming event, whose tag is `primed`; ARGV[2] name, ARGV[3] owner, ARGV[4] request key or ''.
/// Each event is an entry `<seq>-1` with fields `d` (its data) and `t` (its tag); a stream's meta
/// keeps in `before` the tag of the last event dropped.
pub(super) const NEW_STREAM: &str = r"
local function new_stream(primed)
  if redis.call('EXISTS', KEYS[2]) == 1 then return end
  redis.call('HSET', KEYS[2], 'head', 0, 'state', 0, 'owner', ARGV[3], 'rk', ARGV[4])
  redis.call('XADD', KEYS[3], '0-1', 'd', '', 't', primed)
  redis.call('SADD', KEYS[4], ARGV[2])
end
";

/// Raises the highest claim forgotten (the key `forgotten`) to the claim of the key's record
/// `record`, which is forgotten: by retention, or released because its request did not run or
/// must run again.
pub(super) const FORGET_CLAIM: &str = r"
local function forget_claim(record, forgotten)
  local at = tonumber(redis.call('HGET', record, 'at') or '0')
  if at > tonumber(redis.call('GET', forgotten) or '0') then redis.call('SET', forgotten, at) end
end
";

/// The tag of a stream entry as `XRANGE` answers it (`{id, {'d', data, 't', tag}}`).
/// A stream's `ended` field: when it ended, in microseconds of the server's clock. Over a
/// session's byte cap the earliest ended goes first, as in every store.
pub(super) const ENDED_NOW: &str = r"
local function ended_now()
  local t = redis.call('TIME')
  return t[1] .. string.format('%06d', t[2])
end
";

pub(super) const ENTRY_TAG: &str = r"
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
pub(super) const BURY: &str = r"
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

pub(super) fn script(body: &str) -> Script {
    Script::new(body)
}

pub(super) struct Scripts {
    pub(super) admit: Script,
    pub(super) create: Script,
    pub(super) touch: Script,
    pub(super) end: Script,
    pub(super) open: Script,
    pub(super) begin: Script,
    pub(super) append: Script,
    pub(super) end_stream: Script,
    pub(super) bury: Script,
    pub(super) abort: Script,
    pub(super) standalone: Script,
    pub(super) claim: Script,
    pub(super) forget: Script,
    pub(super) take_over: Script,
    pub(super) finish: Script,
    pub(super) release: Script,
    pub(super) disown: Script,
    pub(super) counter_once: Script,
    pub(super) task_swap: Script,
    pub(super) task_create: Script,
}

pub(super) fn scripts() -> &'static Scripts {
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
  if ARGV[6] ~= records or seen > claims or (not held and seen > forgotten)
    or (held and (held < seen or (held > seen and seen > forgotten))) then
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
        forget: script(&format!(
            "{FORGET_CLAIM}
forget_claim(KEYS[1], KEYS[3])
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1"
        )),
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
        // KEYS[1] the key's record, KEYS[2] its owner's keys, KEYS[3] the keys by age, KEYS[4]
        // the highest claim forgotten; ARGV[1] the owner, ARGV[2] the key. A claim whose request
        // did not run, or must run again, is forgotten.
        release: script(&format!(
            "{FORGET_CLAIM}
local r = redis.call('HMGET', KEYS[1], 'owner', 'outcome')
if r[1] ~= ARGV[1] or r[2] then return 0 end
forget_claim(KEYS[1], KEYS[4])
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[2])
return 1"
        )),
        // KEYS[1] the running tasks, KEYS[2] the principal's, KEYS[3] the task, KEYS[4] the
        // owner's tasks; ARGV[1] most running in all, ARGV[2] most of the principal, ARGV[3] the
        // id, ARGV[4] the record, ARGV[5] the owner, ARGV[6] now. 1: created; -1: too many of
        // the principal; 0: too many in all.
        task_create: script(
            r"
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2]) then return -1 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
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
        // ARGV[9] the publish command, ARGV[10] its channel, ARGV[11...] the events, each its
        // data then its tag. Over the session's byte cap, ended
        // streams go first (their tombstones stay), then this stream's oldest events.
        append: script(&format!(
            "{CHECK_LIVE}{ENTRY_TAG}{BURY}{ENDED_NOW}
local s = redis.call('HMGET', KEYS[2], 'head', 'state')
if not s[1] then return redis.error_reply('UNKNOWN_STREAM') end
if s[2] ~= '0' then return redis.error_reply('STREAM_ENDED') end
local seq = tonumber(s[1])
local added = 0
for i = 11, #ARGV, 2 do
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
redis.call(ARGV[9], ARGV[10], ARGV[5] .. seq)
return seq"
        )),
        // KEYS[2] stream meta; ARGV[2] notification prefix, ARGV[3] the publish command, ARGV[4]
        // its channel.
        end_stream: script(&format!(
            "{CHECK_LIVE}{ENDED_NOW}
local s = redis.call('HMGET', KEYS[2], 'head', 'state')
if not s[1] then return redis.error_reply('UNKNOWN_STREAM') end
if s[2] == '0' then redis.call('HSET', KEYS[2], 'state', 1, 'ended', ended_now()) end
redis.call(ARGV[3], ARGV[4], ARGV[2] .. s[1])
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
        // KEYS[1] stream meta; ARGV[1] notification prefix, ARGV[2] the owner whose lease lapsed,
        // ARGV[3] the publish command, ARGV[4] its channel.
        // An owner's set may name a stream it never began (a re-sent request id found another's).
        abort: script(&format!(
            "{ENDED_NOW}
local s = redis.call('HMGET', KEYS[1], 'head', 'state', 'rk', 'owner')
if not s[1] or s[2] ~= '0' or s[3] == '' or s[4] ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'state', 2, 'ended', ended_now())
redis.call(ARGV[3], ARGV[4], ARGV[1] .. s[1])
return 1"
        )),
    })
}
