//! Idempotency records in the embedded store ([`KeyRecords`]).

use super::*;

/// Forgets idempotency records past their time, then the oldest finished ones past the count
/// bound, and the counter additions of forgotten keys.
pub(super) fn forget_keys(txn: &Connection, now: i64, retention: &Retention) -> Result<(), StoreError> {
    let forget = |condition: &str, arg: i64| -> Result<(), StoreError> {
        mark_forgotten(txn, condition, [arg])?;
        execute(txn, &format!("DELETE FROM counter_ops WHERE op IN (SELECT key FROM keys WHERE {condition})"), [arg])
            .map_err(backend)?;
        execute(txn, &format!("DELETE FROM keys WHERE key IN (SELECT key FROM keys WHERE {condition})"), [arg])
            .map_err(backend)?;
        Ok(())
    };
    forget("created_ms <= ?1", now - as_i64(retention.idempotency_ms))?;
    let count: i64 =
        query_row(txn, "SELECT CAST(value AS INTEGER) FROM meta WHERE name = 'keys_count'", [], |r| r.get(0))
            .map_err(backend)?;
    let excess = count - i64::try_from(retention.max_idempotency_records).unwrap_or(i64::MAX);
    if excess > 0 {
        forget("outcome IS NOT NULL ORDER BY created_ms LIMIT ?1", excess)?;
    }
    Ok(())
}

/// Raises the highest claim forgotten to the claims of the records `condition` selects (with
/// `params`), which are being forgotten: by retention, or released because their request did
/// not run or must run again.
fn mark_forgotten(txn: &Connection, condition: &str, params: impl rusqlite::Params) -> Result<(), StoreError> {
    execute(
        txn,
        &format!(
            "UPDATE meta SET value = MAX(CAST(value AS INTEGER), \
             COALESCE((SELECT MAX(at) FROM keys WHERE key IN (SELECT key FROM keys WHERE {condition})), 0)) \
             WHERE name = 'claims_forgotten'"
        ),
        params,
    )
    .map_err(backend)?;
    Ok(())
}

/// Reads an idempotency record: its digest and state. A running request is abandoned when its
/// owner is another process than `owner` (one process has the directory: the other is gone).
pub(super) fn key_record(txn: &Connection, key: &str, owner: &str) -> Result<Option<KeyRecord>, StoreError> {
    type Row = (String, Option<String>, Option<String>, Option<Vec<u8>>, String, i64);
    let row: Option<Row> =
        query_row(txn, "SELECT digest, session, stream, outcome, owner, at FROM keys WHERE key = ?1", [key], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
        })
        .optional()
        .map_err(backend)?;
    let Some((digest, session, stream, outcome, key_owner, at)) = row else { return Ok(None) };
    let state = match outcome {
        Some(outcome) => KeyState::Finished(Bytes::from(outcome)),
        None => {
            let stream = match (session, stream) {
                (Some(session), Some(stream)) => {
                    Some((SessionId::parse(&session).map_err(backend)?, StreamName::parse(&stream).map_err(backend)?))
                }
                _ => None,
            };
            KeyState::Running { stream, abandoned: key_owner != owner }
        }
    };
    Ok(Some(KeyRecord { digest, state, at: as_u64(at) }))
}

/// An idempotency record as read: its params digest, where its request stands, its claim's
/// position.
pub(super) struct KeyRecord {
    pub(super) digest: String,
    pub(super) state: KeyState,
    pub(super) at: u64,
}

/// A counter kept in `meta`.
pub(super) fn meta_count(txn: &Connection, name: &str) -> Result<u64, StoreError> {
    query_row(txn, "SELECT CAST(value AS INTEGER) FROM meta WHERE name = ?1", [name], |r| r.get::<_, i64>(0))
        .map(as_u64)
        .map_err(backend)
}

/// Claims an idempotency key for `owner`, unless it is recorded, or the claim the client was
/// acknowledged is no longer held as it was.
pub(super) fn claim_in(txn: &Connection, owner: &str, records: &str, claim: &KeyClaim) -> Result<Claim, StoreError> {
    let held = key_record(txn, &claim.key, owner)?;
    let claims = meta_count(txn, "claims")?;
    if let Some(acknowledged) = &claim.acknowledged {
        let forgotten = meta_count(txn, "claims_forgotten")?;
        if acknowledged.regressed(records, claims, forgotten, held.as_ref().map(|record| record.at)) {
            return Ok(Claim::Regressed);
        }
    }
    if let Some(KeyRecord { digest, state, at }) = held {
        let acknowledged = Acknowledged { records: records.to_owned(), position: at };
        return Ok(Claim::Existing { same_params: digest == claim.params_digest, state, acknowledged });
    }
    let position = claims + 1;
    execute(txn, "UPDATE meta SET value = ?1 WHERE name = 'claims'", [as_i64(position)]).map_err(backend)?;
    let (session, stream) = claim.columns();
    execute(
        txn,
        "INSERT INTO keys (key, digest, owner, session, stream, created_ms, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![claim.key, claim.params_digest, owner, session, stream, as_i64(claim.now_ms), as_i64(position)],
    )
    .map_err(backend)?;
    Ok(Claim::Claimed(Acknowledged { records: records.to_owned(), position }))
}

/// Records the outcome of `owner`'s running request for `key`.
pub(super) fn finish_in(txn: &Connection, owner: &str, key: &str, outcome: &[u8]) -> Result<(), StoreError> {
    execute(
        txn,
        "UPDATE keys SET outcome = ?3 WHERE key = ?1 AND owner = ?2 AND outcome IS NULL",
        params![key, owner, outcome],
    )
    .map_err(backend)?;
    Ok(())
}

impl KeyRecords for SqliteStore {
    fn records(&self) -> StoreFuture<'_, String> {
        Box::pin(std::future::ready(Ok(self.records_id.clone())))
    }

    fn claim_key(&self, claim: KeyClaim) -> StoreFuture<'_, Claim> {
        let (owner, records) = (self.owner.clone(), self.records_id.clone());
        self.run(move |txn| claim_in(txn, &owner, &records, &claim))
    }

    fn take_over_key(&self, claim: KeyClaim) -> StoreFuture<'_, bool> {
        let owner = self.owner.clone();
        self.run(move |txn| {
            let abandoned = matches!(
                key_record(txn, &claim.key, &owner)?,
                Some(KeyRecord { digest, state: KeyState::Running { abandoned: true, .. }, .. })
                    if digest == claim.params_digest
            );
            if !abandoned {
                return Ok(false);
            }
            let (session, stream) = claim.columns();
            execute(
                txn,
                "UPDATE keys SET owner = ?2, session = ?3, stream = ?4 WHERE key = ?1",
                params![claim.key, owner, session, stream],
            )
            .map_err(backend)?;
            Ok(true)
        })
    }

    fn key_state(&self, key: &str, _now_ms: u64) -> StoreFuture<'_, Option<KeyState>> {
        let (key, owner) = (key.to_owned(), self.owner.clone());
        self.query(move |txn| Ok(key_record(txn, &key, &owner)?.map(|record| record.state)))
    }

    fn finish_key(&self, key: &str, outcome: Bytes) -> StoreFuture<'_, ()> {
        let (key, owner) = (key.to_owned(), self.owner.clone());
        self.run(move |txn| finish_in(txn, &owner, &key, &outcome))
    }

    fn release_key(&self, key: &str) -> StoreFuture<'_, ()> {
        let (key, owner) = (key.to_owned(), self.owner.clone());
        self.run(move |txn| {
            let released = "key = ?1 AND owner = ?2 AND outcome IS NULL";
            mark_forgotten(txn, released, params![key, owner])?;
            execute(txn, &format!("DELETE FROM keys WHERE {released}"), params![key, owner]).map_err(backend)?;
            Ok(())
        })
    }
}
