//! What tether asks of the Redis it stores in: its configuration, checked when the store opens
//! (nothing tether keeps may be evicted, and what it is told is written must survive what the
//! operator chose to guard against), each acknowledged write fenced (`WAIT`, `WAITAOF`), and a
//! restart or failover of Redis noticed by its run id.
//!
//! On a cluster, the configuration is asked of every primary, and each must be configured as
//! asked; an acknowledged write waits on the primary of each slot it wrote in (so a failover of
//! one shard does not hold the writes of the others); a failover of any primary is a new run id.
//! A fence counts the writes of the connection it is sent on. On one server or behind Sentinels
//! that is the connection the operation's writes went over ([`Connection::pinned`]); a cluster's
//! connections are the redis crate's, which connects to a slot's new primary by itself, so there
//! a fence sent just after a failover may count none of the writes before it.

use std::collections::HashMap;

use super::backend;
use super::connection::Connection;
use crate::StoreError;

/// What an acknowledged write must survive, and so what tether asks of Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisDurability {
    /// A restart of Redis: every write is on the primary's disk before tether acknowledges it.
    /// Redis must run with `appendonly yes` and `appendfsync always`; from Redis 7.2, with
    /// `appendonly yes` alone, tether waits for each write's fsync (`WAITAOF 1 0`). A failover to
    /// a replica that had not received the write still loses it.
    Fsync,
    /// A failover to a replica: every write is on `replicas` replicas (`WAIT`) before tether
    /// acknowledges it, within `timeout_ms` or the write fails. Losing every replica that took a
    /// write still loses it, and `WAIT` is not a consensus: a failover may still promote a
    /// replica that missed it.
    Replicated {
        /// How many replicas must hold each write.
        replicas: u32,
        /// How long a write may wait for them.
        timeout_ms: u64,
    },
    /// Nothing is asked: a restart or a failover may lose acknowledged writes. Clients are told
    /// (`history_rewritten`, `records_regressed`) rather than misled, but what was lost is lost.
    Unchecked,
}

/// How long a write may wait for Redis's fsync before it fails (a disk that stopped answering).
const FSYNC_TIMEOUT_MS: u64 = 5_000;

/// Why Redis cannot give the guarantee asked of it.
fn refused(why: String) -> StoreError {
    StoreError::Backend(why)
}

/// What tether does after each write it acknowledges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fence {
    /// Nothing: Redis's own configuration is the guarantee.
    None,
    /// `WAITAOF local replicas timeout`: the write is fsynced by the primary (`local` 1) and by
    /// `replicas` replicas.
    WaitAof { local: u32, replicas: u32, timeout_ms: u64 },
    /// `WAIT replicas timeout`: the write reached `replicas` replicas.
    Wait { replicas: u32, timeout_ms: u64 },
}

impl Fence {
    /// Waits until the writes made on `conn` so far, in the slots of `keys`, are as durable as
    /// the fence asks; fails if they are not within its timeout (the write happened, but is not
    /// acknowledged).
    pub(super) async fn after_write(self, conn: &mut Connection, keys: &[&str]) -> Result<(), StoreError> {
        match self {
            Fence::None => Ok(()),
            Fence::Wait { replicas, timeout_ms } => {
                let mut wait = redis::cmd("WAIT");
                wait.arg(replicas).arg(timeout_ms);
                let acked = conn.on_primaries_of::<u32>(keys, &wait).await?.into_iter().min().unwrap_or(0);
                if acked < replicas {
                    return Err(refused(format!(
                        "a write reached {acked} of the {replicas} Redis replicas it must reach within {timeout_ms} ms"
                    )));
                }
                Ok(())
            }
            Fence::WaitAof { local, replicas, timeout_ms } => {
                let mut wait = redis::cmd("WAITAOF");
                wait.arg(local).arg(replicas).arg(timeout_ms);
                let answers = conn.on_primaries_of::<(u32, u32)>(keys, &wait).await?;
                let fsynced = answers.iter().map(|(fsynced, _)| *fsynced).min().unwrap_or(0);
                let on_replicas = answers.iter().map(|(_, on_replicas)| *on_replicas).min().unwrap_or(0);
                if fsynced < local || on_replicas < replicas {
                    return Err(refused(format!(
                        "a write was not fsynced by Redis ({fsynced} of {local} locally, {on_replicas} of {replicas} \
                         replicas) within {timeout_ms} ms"
                    )));
                }
                Ok(())
            }
        }
    }
}

impl RedisDurability {
    /// How long a command may take to be answered: longer than the fence may wait, since a
    /// fenced write's `WAIT` holds the connection meanwhile.
    pub(super) fn response_timeout(self) -> std::time::Duration {
        let fence = match self {
            RedisDurability::Fsync => FSYNC_TIMEOUT_MS,
            RedisDurability::Replicated { timeout_ms, .. } => timeout_ms,
            RedisDurability::Unchecked => 0,
        };
        std::time::Duration::from_millis(fence.saturating_add(2_000))
    }
}

/// What `INFO` says on each primary, as `name:value` lines.
async fn info(conn: &mut Connection, section: &str) -> Result<Vec<HashMap<String, String>>, StoreError> {
    let texts = conn.on_every_primary::<String>(redis::cmd("INFO").arg(section)).await?;
    Ok(texts
        .iter()
        .map(|text| {
            text.lines()
                .filter_map(|line| line.split_once(':'))
                .map(|(name, value)| (name.trim().to_owned(), value.trim().to_owned()))
                .collect()
        })
        .collect())
}

/// The run ids of the Redis processes `conn` reaches as primaries: others after a restart or a
/// failover of any of them.
pub(super) async fn run_id(conn: &mut Connection) -> Result<String, StoreError> {
    let mut ids = info(conn, "server")
        .await?
        .into_iter()
        .map(|mut info| info.remove("run_id").ok_or_else(|| backend("INFO server has no run_id")))
        .collect::<Result<Vec<_>, _>>()?;
    ids.sort();
    Ok(ids.join(","))
}

/// The major and minor of Redis `version` (`major.minor.patch`); 0 for what is not a number.
fn version_of(version: &str) -> (u32, u32) {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Whether Redis `version` (`major.minor.patch`) is at least `major.minor`.
fn at_least(version: &str, major: u32, minor: u32) -> bool {
    version_of(version) >= (major, minor)
}

/// A configuration value, if Redis lets tether read it: on a cluster, the value every primary
/// has (primaries that disagree are refused: one of them is not configured as the others).
async fn config(conn: &mut Connection, name: &str) -> Result<String, StoreError> {
    let answers = conn
        .on_every_primary::<HashMap<String, String>>(redis::cmd("CONFIG").arg("GET").arg(name))
        .await
        .map_err(|err| {
            refused(format!(
                "could not read Redis's configuration ({name}: {err}), which tells what it keeps; \
                     pass --redis-durability none to run without that guarantee"
            ))
        })?;
    let mut values: Vec<Option<String>> = answers.into_iter().map(|mut pairs| pairs.remove(name)).collect();
    values.dedup();
    match &values[..] {
        [Some(value)] => Ok(value.clone()),
        [None] | [] => Err(refused(format!("Redis has no configuration value {name}"))),
        _ => Err(refused(format!("Redis's primaries disagree on {name} ({values:?}); configure every one the same"))),
    }
}

/// Checks that Redis can give what `durability` asks, and returns the fence each acknowledged
/// write needs and a sentence saying what an acknowledged write survives.
pub(super) async fn check(conn: &mut Connection, durability: RedisDurability) -> Result<(Fence, String), StoreError> {
    if durability == RedisDurability::Unchecked {
        return Ok((
            Fence::None,
            "unchecked: a Redis restart or failover may lose acknowledged writes; clients are told \
             (history_rewritten, records_regressed), never misled"
                .into(),
        ));
    }
    let policy = config(conn, "maxmemory-policy").await?;
    if policy != "noeviction" {
        return Err(refused(format!(
            "Redis may evict tether's sessions, events and idempotency records (maxmemory-policy {policy}); \
             set maxmemory-policy noeviction, or pass --redis-durability none"
        )));
    }
    // The oldest primary's version: what every one of them can do.
    let version = info(conn, "server")
        .await?
        .into_iter()
        .map(|mut info| info.remove("redis_version").unwrap_or_default())
        .min_by_key(|version| version_of(version))
        .unwrap_or_default();
    let waitaof = at_least(&version, 7, 2);
    let appendonly = config(conn, "appendonly").await? == "yes";
    if let RedisDurability::Replicated { replicas, timeout_ms } = durability {
        // A replica still loading the primary's data (`state=wait_bgsave`) acknowledges nothing.
        let online = info(conn, "replication")
            .await?
            .iter()
            .map(|replication| {
                replication
                    .iter()
                    .filter(|(name, value)| name.starts_with("slave") && value.contains("state=online"))
                    .count()
            })
            .min()
            .unwrap_or(0);
        let online = u32::try_from(online).unwrap_or(u32::MAX);
        if online < replicas {
            return Err(refused(format!("Redis has {online} replicas online; every write must reach {replicas}")));
        }
        let fence = if waitaof && appendonly {
            Fence::WaitAof { local: 0, replicas, timeout_ms }
        } else {
            Fence::Wait { replicas, timeout_ms }
        };
        return Ok((
            fence,
            format!(
                "replicated: every acknowledged write reached {replicas} replicas of Redis {version}; a failover \
                 to one of them loses none of them"
            ),
        ));
    }
    let appendfsync = config(conn, "appendfsync").await?;
    let fence = match (appendonly, appendfsync.as_str()) {
        (true, "always") => Fence::None,
        (true, _) if waitaof => Fence::WaitAof { local: 1, replicas: 0, timeout_ms: FSYNC_TIMEOUT_MS },
        _ => {
            return Err(refused(format!(
                "Redis {version} does not put every write on its disk before answering (appendonly {}, \
                 appendfsync {appendfsync}): a restart would lose acknowledged events and idempotency records; \
                 set appendonly yes and appendfsync always, or pass --redis-durability none",
                if appendonly { "yes" } else { "no" }
            )));
        }
    };
    Ok((
        fence,
        format!(
            "fsync: every acknowledged write is on Redis {version}'s disk; a restart loses none of them, a failover \
             to a replica may"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_by_major_then_minor() {
        assert!(at_least("7.2.0", 7, 2));
        assert!(at_least("7.10.1", 7, 2));
        assert!(at_least("8.0.0", 7, 2));
        assert!(!at_least("7.0.15", 7, 2));
        assert!(!at_least("", 7, 2));
    }
}
