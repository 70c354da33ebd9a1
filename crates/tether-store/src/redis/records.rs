//! Idempotency records in Redis ([`KeyRecords`]).

use super::*;

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
            // The heartbeat and the index entry (NX: a known key keeps its age), sent at once
            // (they may lie on two shards) and before the claim: a claim never exists without
            // both, so no replica takes it for abandoned and no record escapes expiry.
            let mut indexed = conn.clone();
            let mut index = redis::cmd("ZADD");
            index.arg(KEYS).arg("NX").arg(claim.now_ms).arg(&claim.key);
            let (heartbeat, index) = tokio::join!(
                conn.hset::<_, _, _, i64>(OWNERS, &self.owner, claim.now_ms),
                index.query_async::<i64>(&mut indexed)
            );
            heartbeat.and(index).map_err(backend)?;
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
            if let Err(err) = self.fenced(&mut conn, &[RECORDS]).await {
                // Not acknowledged, so the request will not run: a claim left behind would keep
                // every re-send of the key waiting on a request nobody runs.
                // On a connection of its own: the fence's may be the one that failed.
                if claimed {
                    self.unclaim(&mut self.conn(), &claim.key).await;
                }
                return Err(err);
            }
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
            if taken && let Err(err) = self.fenced(&mut conn, &[RECORDS]).await {
                // Not acknowledged, so this process will not run it: it is nobody's again, and
                // the next re-send may take it over.
                self.disown_key(&mut self.conn(), &claim.key).await;
                return Err(err);
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
            let _: i64 = self.release_script(&key).invoke_async(&mut conn).await.map_err(backend)?;
            self.fenced(&mut conn, &[RECORDS]).await?;
            // Held until fenced: a Redis that lost the release (a failover to a replica that
            // lacks it) gives the claim back to this process, whose next try releases it; not
            // held, it would be given up as abandoned first.
            self.held().keys.remove(&key);
            Ok(())
        })
    }

    fn finish_key(&self, key: &str, outcome: Bytes) -> StoreFuture<'_, ()> {
        let key = key.to_owned();
        Box::pin(async move {
            let mut conn = self.conn();
            let mut finish = scripts().finish.key(key_record(&key));
            finish.key(owned_keys_key(&self.owner)).arg(&self.owner).arg(&outcome[..]).arg(&key);
            let _: i64 = finish.invoke_async(&mut conn).await.map_err(backend)?;
            // Held until fenced, as a release is.
            self.fenced(&mut conn, &[RECORDS]).await?;
            self.held().keys.remove(&key);
            Ok(())
        })
    }
}

/// The fields of an idempotency record, in the order the claim script returns them.
pub(super) async fn key_fields(conn: &mut Connection, key: &str) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
    redis::cmd("HMGET")
        .arg(key_record(key))
        .arg(&["digest", "owner", "session", "stream", "outcome"])
        .query_async(conn)
        .await
        .map_err(backend)
}

impl RedisStore {
    /// The script that forgets this process's claim of `key`, whose request did not run or must
    /// run again.
    fn release_script(&self, key: &str) -> redis::ScriptInvocation<'static> {
        let mut release = scripts().release.key(key_record(key));
        release.key(owned_keys_key(&self.owner)).key(KEYS).key(CLAIMS_FORGOTTEN).arg(&self.owner).arg(key);
        release
    }

    /// Takes back a claim whose acknowledgement failed (its request never ran); best effort: a
    /// claim left behind is no longer held, so it is given up once Redis is seen to fail over.
    async fn unclaim(&self, conn: &mut Connection, key: &str) {
        self.held().keys.remove(key);
        if let Err(err) = self.release_script(key).invoke_async::<i64>(conn).await {
            tracing::warn!(%err, key, "could not take back a claim that was not acknowledged");
        }
    }

    /// Leaves a key this process took over but will not run to nobody (abandoned); best effort,
    /// as [`RedisStore::unclaim`].
    async fn disown_key(&self, conn: &mut Connection, key: &str) {
        self.held().keys.remove(key);
        let disown = self.disown_script(&key_record(key), &owned_keys_key(&self.owner), key);
        if let Err(err) = disown.invoke_async::<i64>(conn).await {
            tracing::warn!(%err, key, "could not give up a key that was not acknowledged");
        }
    }

    /// Forgets idempotency records past their time, then the oldest finished ones past the
    /// count bound. (Additions made once expire on their own.)
    /// Forgets one idempotency record, keeping the highest position of a claim forgotten.
    pub(super) async fn forget_key(&self, conn: &mut Connection, key: &str) -> Result<(), StoreError> {
        let mut forget = scripts().forget.key(key_record(key));
        forget.key(KEYS).key(CLAIMS_FORGOTTEN).arg(key);
        let _: i64 = forget.invoke_async(conn).await.map_err(backend)?;
        Ok(())
    }

    pub(super) async fn forget_keys(&self, conn: &mut Connection, now_ms: u64) -> Result<(), StoreError> {
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
