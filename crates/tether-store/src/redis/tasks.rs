//! Tasks in Redis ([`TaskStore`]): each a record changed by compare-and-swap, counted against
//! its caps in the step that creates it.

use super::*;

/// How often a task's change is retried when another replica changed it between the read and the
/// swap: each retry means another change won, so this bounds contention, not progress.
pub(super) const TASK_SWAPS: usize = 64;

impl RedisStore {
    /// Reads a task: its record as stored (for the swap) and as read, and whether its owner's
    /// heartbeat lapsed.
    pub(super) async fn read_task(
        &self,
        conn: &mut Connection,
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
    pub(super) async fn stop_counting(&self, conn: &mut Connection, id: &str) -> Result<(), StoreError> {
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
            // The heartbeat first: the task is never without a live owner.
            // Held before it is created: a task is never owned here without being held.
            let id = record.task.id.as_str().to_owned();
            let _: i64 = conn.hset(OWNERS, &self.owner, record.task.created_at_ms).await.map_err(backend)?;
            self.held().tasks.insert(id.clone());
            let mut create = scripts().task_create.key(RUNNING_TASKS);
            create
                .key(running_tasks_key(record.principal.as_deref()))
                .key(task_key(&id))
                .key(owned_tasks_key(&self.owner))
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
            if let Err(err) = self.fenced(&mut conn, &[TASKS]).await {
                // Not acknowledged, so it will not run: nobody's, and no longer counted (on a
                // connection of its own: the fence's may be the one that failed).
                self.held().tasks.remove(&id);
                let mut conn = self.conn();
                let disown = self.disown_script(&task_key(&id), &owned_tasks_key(&self.owner), &id);
                if let Err(err) = disown.invoke_async::<i64>(&mut conn).await {
                    tracing::warn!(%err, task = id, "could not give up a task that was not acknowledged");
                }
                if let Err(err) = self.stop_counting(&mut conn, &id).await {
                    tracing::warn!(%err, task = id, "could not stop counting a task that was not acknowledged");
                }
                return Err(err);
            }
            if let Some((key, outcome)) = key {
                self.finish_key(&key, outcome).await?;
            }
            Ok(())
        })
    }

    fn task(&self, id: &TaskId, now_ms: u64) -> StoreFuture<'_, Option<StoredTask>> {
        let id = id.as_str().to_owned();
        Box::pin(async move { Ok(self.read_task(&mut self.conn(), &id, now_ms).await?.map(|(_, task)| task)) })
    }

    fn task_changes(&self) -> Option<tokio::sync::broadcast::Receiver<TaskId>> {
        Some(self.task_changes.subscribe())
    }

    fn update_task(&self, id: &TaskId, change: TaskChange, now_ms: u64) -> StoreFuture<'_, Option<(StoredTask, bool)>> {
        let id = id.as_str().to_owned();
        Box::pin(async move {
            let mut conn = self.conn();
            for _ in 0..TASK_SWAPS {
                let Some((read, mut stored)) = self.read_task(&mut conn, &id, now_ms).await? else { return Ok(None) };
                if !stored.record.apply(change.clone(), now_ms) {
                    // Nothing to change, perhaps because an earlier try changed it and then
                    // failed its fence: what is read is acknowledged only once fenced.
                    self.fenced(&mut conn, &[TASKS]).await?;
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
                    self.fenced(&mut conn, &[TASKS]).await?;
                    // A hint for the replicas waiting on it; they poll anyway.
                    if let Err(err) = self.publish(TASK_CHANGES, id.clone().into_bytes()).await {
                        tracing::debug!(%err, "could not announce a task change");
                    }
                    return Ok(Some((stored, true)));
                }
            }
            Err(StoreError::Backend(format!("task {id} kept changing under {TASK_SWAPS} attempts to change it")))
        })
    }
}
