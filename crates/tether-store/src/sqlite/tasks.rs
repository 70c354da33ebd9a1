//! Tasks in the embedded store ([`TaskStore`]), admitted against their caps in the step that
//! creates them.

use super::*;

/// Reads task `id`: abandoned if another process runs it (one process has the directory: the
/// other is gone).
pub(super) fn task_in(txn: &Connection, id: &str, owner: &str) -> Result<Option<StoredTask>, StoreError> {
    let row: Option<(String, String)> =
        query_row(txn, "SELECT record, owner FROM tasks WHERE id = ?1", [id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
            .map_err(backend)?;
    let Some((record, task_owner)) = row else { return Ok(None) };
    let value: serde_json::Value = serde_json::from_str(&record).map_err(backend)?;
    let record = TaskRecord::from_json(&value).map_err(backend)?;
    Ok(Some(StoredTask { record, abandoned: task_owner != owner }))
}

/// Writes a task's record, owned by `owner`.
pub(super) fn put_task(txn: &Connection, record: &TaskRecord, owner: &str) -> Result<(), StoreError> {
    execute(
        txn,
        "INSERT INTO tasks (id, owner, record, forget_at_ms, running_principal) VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (id) DO UPDATE SET record = excluded.record, forget_at_ms = excluded.forget_at_ms, \
         running_principal = excluded.running_principal",
        params![
            record.task.id.as_str(),
            owner,
            record.to_json().to_string(),
            record.forget_at_ms().map(as_i64),
            running_principal(record)
        ],
    )
    .map_err(backend)?;
    Ok(())
}

/// The `running_principal` column of a task: its principal while it runs (`-` for none, `+` and
/// the name for one), NULL once final.
pub(super) fn running_principal(record: &TaskRecord) -> Option<String> {
    (!record.task.status.is_final()).then(|| principal_column(record.principal.as_deref()))
}

pub(super) fn principal_column(principal: Option<&str>) -> String {
    principal.map_or_else(|| "-".to_owned(), |name| format!("+{name}"))
}

/// Fails with [`StoreError::TooManyTasks`] if `limits` tasks of this process run already.
pub(super) fn admit_task(
    txn: &Connection,
    owner: &str,
    principal: Option<&str>,
    limits: TaskLimits,
) -> Result<(), StoreError> {
    let over = |count: i64, limit: usize| as_u64(count) >= u64::try_from(limit).unwrap_or(u64::MAX);
    let theirs: i64 = txn
        .query_row(
            "SELECT COUNT(*) FROM tasks WHERE owner = ?1 AND running_principal = ?2",
            params![owner, principal_column(principal)],
            |r| r.get(0),
        )
        .map_err(backend)?;
    if over(theirs, limits.per_principal) {
        return Err(StoreError::TooManyTasks { principal: true });
    }
    let all: i64 = txn
        .query_row(
            "SELECT COUNT(*) FROM tasks WHERE owner = ?1 AND running_principal IS NOT NULL",
            params![owner],
            |r| r.get(0),
        )
        .map_err(backend)?;
    if over(all, limits.total) {
        return Err(StoreError::TooManyTasks { principal: false });
    }
    Ok(())
}

impl TaskStore for SqliteStore {
    fn create_task(&self, record: TaskRecord, key: Option<(String, Bytes)>, limits: TaskLimits) -> StoreFuture<'_, ()> {
        let owner = self.owner.clone();
        self.run(move |txn| {
            admit_task(txn, &owner, record.principal.as_deref(), limits)?;
            put_task(txn, &record, &owner)?;
            match key {
                Some((key, outcome)) => finish_in(txn, &owner, &key, &outcome),
                None => Ok(()),
            }
        })
    }

    fn task(&self, id: &TaskId, _now_ms: u64) -> StoreFuture<'_, Option<StoredTask>> {
        let (id, owner) = (id.as_str().to_owned(), self.owner.clone());
        self.query(move |txn| task_in(txn, &id, &owner))
    }

    fn update_task(&self, id: &TaskId, change: TaskChange, now_ms: u64) -> StoreFuture<'_, Option<(StoredTask, bool)>> {
        let (id, owner) = (id.as_str().to_owned(), self.owner.clone());
        self.run(move |txn| {
            let Some(mut stored) = task_in(txn, &id, &owner)? else { return Ok(None) };
            let changed = stored.record.apply(change, now_ms);
            if changed {
                // The owner stays: a task another process left is still abandoned.
                execute(
                    txn,
                    "UPDATE tasks SET record = ?2, forget_at_ms = ?3, running_principal = ?4 WHERE id = ?1",
                    params![
                        id,
                        stored.record.to_json().to_string(),
                        stored.record.forget_at_ms().map(as_i64),
                        running_principal(&stored.record)
                    ],
                )
                .map_err(backend)?;
            }
            Ok(Some((stored, changed)))
        })
    }
}
