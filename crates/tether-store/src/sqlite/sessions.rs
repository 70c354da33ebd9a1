//! Sessions in the embedded store ([`SessionStore`]).

use super::log::{self, Change};
use super::*;

/// Ends session `id` in the tables and deletes its history: its rows of the log (all of
/// which `log` knows) and its tombstones. The change that says so.
fn remove_session(txn: &Connection, log: &Log, id: &str) -> Result<Change, StoreError> {
    if let Some(session) = log.session(id) {
        log::delete(txn, session.rows())?;
    }
    execute(txn, "DELETE FROM log WHERE session = ?1 AND kind = 0", [id]).map_err(backend)?;
    execute(txn, "DELETE FROM tombstones WHERE session = ?1", [id]).map_err(backend)?;
    Ok(Change::SessionRemoved { session: id.to_owned() })
}

/// Streams dropped whole in one job of the sweep.
const BURY_BATCH: usize = 256;

/// Drops up to [`BURY_BATCH`] ended streams stamped at or before `cutoff` into tombstones; the
/// changes, and whether more are due.
fn bury_due(txn: &Connection, log: &mut Log, cutoff: i64) -> Result<(Vec<Change>, bool), StoreError> {
    let due = log.due(cutoff, BURY_BATCH + 1);
    let more = due.len() > BURY_BATCH;
    let mut changes = Vec::with_capacity(BURY_BATCH);
    for (session, stream) in due.into_iter().take(BURY_BATCH) {
        if let Some(buried) = log::bury(txn, log, &session, &stream)? {
            log.apply(&buried);
            changes.push(buried);
        }
    }
    Ok((changes, more))
}

impl SessionStore for SqliteStore {
    fn create_session(&self, record: SessionRecord, max_live: usize) -> StoreFuture<'_, ()> {
        let created = record.clone();
        let then = move |mirror: &Mirror, change: &Change| {
            let id = created.id.clone();
            mirror.set_session(id.as_str(), SessionStatus::Live(created));
            mirror.apply(std::slice::from_ref(change));
        };
        let created = self.run_logged(move |txn, log| {
            let live: i64 =
                query_row(txn, "SELECT CAST(value AS INTEGER) FROM meta WHERE name = 'live_sessions'", [], |r| r.get(0))
                    .map_err(backend)?;
            if as_u64(live) >= u64::try_from(max_live).unwrap_or(u64::MAX) {
                return Err(StoreError::TooManySessions);
            }
            let client = record.client.to_string();
            let inserted = execute(txn,
                    "INSERT OR IGNORE INTO sessions (id, epoch, principal, protocol_version, client, idle_ttl_ms, expires_at_ms) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    params![
                        record.id.as_str(),
                        record.epoch.as_str(),
                        record.principal,
                        record.protocol_version.as_str(),
                        client,
                        as_i64(record.idle_ttl_ms),
                        as_i64(record.expires_at_ms)
                    ],
                )
                .map_err(backend)?;
            if inserted == 0 {
                return Err(StoreError::DuplicateSession);
            }
            let created = Change::SessionCreated { session: record.id.as_str().to_owned(), epoch: record.epoch.to_string() };
            log.apply(&created);
            Ok(created)
        }, then);
        Box::pin(async move { created.await.map(drop) })
    }

    fn session(&self, id: &SessionId, _now_ms: u64) -> StoreFuture<'_, SessionStatus> {
        if let Some(status) = self.mirror.session(id.as_str()) {
            return Box::pin(std::future::ready(Ok(status)));
        }
        let generation = self.mirror.session_generation();
        let (key, id) = (id.as_str().to_owned(), id.clone());
        let read = self.query(move |txn| {
            let row = query_row(txn,
                    "SELECT epoch, principal, protocol_version, client, idle_ttl_ms, expires_at_ms, ended FROM sessions WHERE id = ?1",
                    [id.as_str()],
                    |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            r.get::<_, Option<String>>(1)?,
                            r.get::<_, String>(2)?,
                            r.get::<_, String>(3)?,
                            r.get::<_, i64>(4)?,
                            r.get::<_, i64>(5)?,
                            r.get::<_, Option<i64>>(6)?,
                        ))
                    },
                )
                .optional()
                .map_err(backend)?;
            let Some((epoch, principal, version, client, ttl, expires, ended)) = row else {
                return Ok(SessionStatus::Unknown);
            };
            Ok(match ended {
                Some(TERMINATED) => SessionStatus::Ended(SessionEnd::Terminated),
                Some(UPSTREAM_LOST) => SessionStatus::Ended(SessionEnd::UpstreamLost),
                Some(HISTORY_REWRITTEN) => SessionStatus::Ended(SessionEnd::HistoryRewritten),
                Some(_) => SessionStatus::Ended(SessionEnd::Expired),
                None => SessionStatus::Live(SessionRecord {
                    id,
                    epoch: Epoch::parse(&epoch).map_err(backend)?,
                    principal,
                    protocol_version: version.parse::<ProtocolVersion>().map_err(backend)?,
                    client: Arc::new(serde_json::from_str(&client).map_err(backend)?),
                    idle_ttl_ms: as_u64(ttl),
                    expires_at_ms: as_u64(expires),
                }),
            })
        });
        Box::pin(async move {
            let status = read.await?;
            // Unknown ids are not kept: anyone can make up as many as they like.
            if status != SessionStatus::Unknown {
                self.mirror.offer_session(&key, &status, generation);
            }
            Ok(status)
        })
    }

    fn touch_session(&self, id: &SessionId, epoch: &Epoch, now_ms: u64) -> StoreFuture<'_, ()> {
        let (id, epoch) = (id.as_str().to_owned(), epoch.to_string());
        let renewed_id = id.clone();
        let then = move |mirror: &Mirror, (): &()| mirror.touched(&renewed_id, now_ms);
        self.run_with(
            move |txn| {
                let renewed = execute(
                    txn,
                    "UPDATE sessions SET expires_at_ms = ?3 + idle_ttl_ms \
                     WHERE id = ?1 AND epoch = ?2 AND ended IS NULL AND expires_at_ms > ?3",
                    params![id, epoch, as_i64(now_ms)],
                )
                .map_err(backend)?;
                if renewed == 0 { Err(StoreError::SessionGone) } else { Ok(()) }
            },
            then,
        )
    }

    fn end_session(&self, id: &SessionId, epoch: &Epoch, end: SessionEnd) -> StoreFuture<'_, ()> {
        let (session, epoch) = (id.as_str().to_owned(), epoch.to_string());
        let code = match end {
            SessionEnd::Terminated => TERMINATED,
            SessionEnd::Expired => EXPIRED,
            SessionEnd::UpstreamLost => UPSTREAM_LOST,
            SessionEnd::HistoryRewritten => HISTORY_REWRITTEN,
        };
        let id_ = id.as_str().to_owned();
        let then = move |mirror: &Mirror, removed: &Change| {
            mirror.set_session(&id_, SessionStatus::Ended(end));
            mirror.apply(std::slice::from_ref(removed));
        };
        let ended = self.run_logged(
            move |txn, log| {
                log.live(&session, &epoch)?;
                execute(txn, "UPDATE sessions SET ended = ?2 WHERE id = ?1", params![session, code])
                    .map_err(backend)?;
                let removed = remove_session(txn, log, &session)?;
                log.apply(&removed);
                Ok(removed)
            },
            then,
        );
        let session = id.as_str().to_owned();
        Box::pin(async move {
            ended.await?;
            self.heads.forget_session(&session);
            Ok(())
        })
    }

    fn set_standalone_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let (session, epoch, stream) = (session.as_str().to_owned(), epoch.to_string(), stream.to_string());
        self.run_logged(
            move |txn, log| {
                log.live(&session, &epoch)?;
                execute(txn, "UPDATE sessions SET standalone = ?2 WHERE id = ?1", params![session, stream])
                    .map_err(backend)?;
                Ok(())
            },
            |_, _| {},
        )
    }

    fn standalone_stream(&self, session: &SessionId) -> StoreFuture<'_, Option<StreamName>> {
        let session = session.as_str().to_owned();
        self.query(move |txn| {
            let name: Option<Option<String>> =
                query_row(txn, "SELECT standalone FROM sessions WHERE id = ?1 AND ended IS NULL", [session], |r| {
                    r.get(0)
                })
                .optional()
                .map_err(backend)?;
            name.flatten().map(|n| StreamName::parse(&n).map_err(backend)).transpose()
        })
    }

    fn reachable(&self) -> StoreFuture<'_, ()> {
        self.query(|txn| query_row(txn, "SELECT 1", [], |r| r.get::<_, i64>(0)).map(drop).map_err(backend))
    }

    fn sweep(&self, now_ms: u64) -> StoreFuture<'_, Vec<SessionId>> {
        let retention = self.retention;
        let swept = self.run_logged(move |txn, log| {
            let now = as_i64(now_ms);
            let mut expired = txn
                .prepare_cached("UPDATE sessions SET ended = 2, ended_at_ms = ?1 WHERE ended IS NULL AND expires_at_ms <= ?1 RETURNING id")
                .map_err(backend)?;
            let expired: Vec<String> =
                expired.query_map([now], |r| r.get(0)).map_err(backend)?.collect::<Result<_, _>>().map_err(backend)?;
            let mut changes = Vec::new();
            for id in &expired {
                let removed = remove_session(txn, log, id)?;
                log.apply(&removed);
                changes.push(removed);
            }
            execute(txn, "UPDATE sessions SET ended_at_ms = ?1 WHERE ended IS NOT NULL AND ended_at_ms IS NULL", [now])
                .map_err(backend)?;
            let tombstones = execute(txn, "DELETE FROM sessions WHERE ended IS NOT NULL AND ended_at_ms <= ?1", [now - as_i64(retention.tombstone_ms)])
                .map_err(backend)?;
            // Streams that ended before this process's first sweep count their retention from
            // now (later ones are stamped with the last sweep's time as they end).
            for (session, stream) in log.unstamped() {
                if let Some(end) = log.stream(&session, &stream).and_then(|s| s.end()) {
                    execute(txn, "UPDATE log SET at = ?2 WHERE id = ?1", params![end.row, now]).map_err(backend)?;
                    let stamped = Change::Stamped { session, stream, at: now };
                    log.apply(&stamped);
                    changes.push(stamped);
                }
            }
            log.swept(now);
            forget_keys(txn, now, &retention)?;
            execute(txn, "DELETE FROM tasks WHERE forget_at_ms <= ?1", [now]).map_err(backend)?;
            // Past the bound, the finished tasks due first.
            execute(
                txn,
                "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks WHERE forget_at_ms IS NOT NULL \
                 ORDER BY forget_at_ms DESC LIMIT -1 OFFSET ?1)",
                [as_i64(u64::try_from(retention.max_finished_tasks).unwrap_or(u64::MAX))],
            )
            .map_err(backend)?;
            Ok((expired, changes, tombstones > 0))
        }, |mirror: &Mirror, (expired, changes, tombstones): &(Vec<String>, Vec<Change>, bool)| {
            for id in expired {
                mirror.forget_session(id);
            }
            mirror.apply(changes);
            if *tombstones {
                // Tombstones past their time are gone from the table.
                mirror.forget_ended_sessions();
            }
        });
        Box::pin(async move {
            let (expired, ..) = swept.await?;
            // Streams past their retention are dropped a batch a job, so that requests queued
            // meanwhile do not wait behind all of them (a second's worth of calls under load).
            // None becomes due at this cutoff meanwhile: this ends.
            let cutoff = as_i64(now_ms) - as_i64(retention.ended_stream_ms);
            while self
                .run_logged(move |txn, log| bury_due(txn, log, cutoff), |mirror, (changes, _)| mirror.apply(changes))
                .await?
                .1
            {}
            for id in &expired {
                self.heads.forget_session(id);
            }
            // Watches of streams that retention dropped end with the stream.
            for (session, stream) in self.heads.followed() {
                let Ok(id) = SessionId::parse(&session) else { continue };
                if matches!(self.stream_range(&id, &stream).await, Ok(None)) {
                    self.heads.forget(&session, &stream);
                }
            }
            expired.iter().map(|id| SessionId::parse(id).map_err(backend)).collect()
        })
    }
}
