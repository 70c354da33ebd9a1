//! Counters in Redis ([`CounterStore`]): applied once per operation id.

use super::*;

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
            self.fenced(&mut conn, &[COUNTERS]).await?;
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
