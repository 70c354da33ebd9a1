//! Sessions in Redis ([`SessionStore`]).

use super::*;

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
            self.fenced(&mut conn, &[&meta(record.id.as_str()), SESSIONS]).await
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
            self.fenced(&mut conn, &[&meta(&id), SESSIONS]).await
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
            self.fenced(&mut conn, &[&meta(&session)]).await
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

    fn leave(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            self.left.store(true, std::sync::atomic::Ordering::SeqCst);
            let mut conn = self.conn();
            self.give_up(&mut conn, GiveUp::All).await?;
            // Lapsed rather than removed: anything this process began after giving up is still
            // found, and aborted, by the other replicas' sweeps.
            let _: i64 = conn.hset(OWNERS, &self.owner, 0).await.map_err(backend)?;
            Ok(())
        })
    }

    fn reachable(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let _: String = redis::cmd("PING").query_async(&mut self.conn()).await.map_err(backend)?;
            Ok(())
        })
    }

    fn sweep(&self, now_ms: u64) -> StoreFuture<'_, Vec<SessionId>> {
        Box::pin(async move {
            let mut conn = self.conn();
            self.notice_restart(&mut conn).await?;
            if self.left.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(Vec::new());
            }
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
                    let aborted: i64 =
                        self.abort_script(session, stream, &owner).invoke_async(&mut conn).await.map_err(backend)?;
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
                // One at a time: on a cluster, each lies in a slot of its own.
                for set in [owned_key(&owner), owned_keys_key(&owner), owned_tasks_key(&owner)] {
                    let _: i64 = conn.del(set).await.map_err(backend)?;
                }
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
            let followed = self.heads.followed();
            for (session, stream) in &followed {
                let exists: bool = conn.exists(stream_key(session, stream.as_str())).await.map_err(backend)?;
                if !exists {
                    self.heads.forget(session, stream);
                }
            }
            self.stop_hearing(&followed).await;
            Ok(expired)
        })
    }
}
