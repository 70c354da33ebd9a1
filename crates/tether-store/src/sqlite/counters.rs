//! Counters in the embedded store ([`CounterStore`]): applied once per operation id.

use super::*;

impl CounterStore for SqliteStore {
    fn counter_add(&self, key: &str, amount: i64, once: Option<&str>) -> StoreFuture<'_, i64> {
        let (key, once) = (key.to_owned(), once.map(str::to_owned));
        self.run(move |txn| {
            if let Some(op) = &once {
                let done: Option<i64> =
                    query_row(txn, "SELECT value FROM counter_ops WHERE op = ?1", [op], |r| r.get(0))
                        .optional()
                        .map_err(backend)?;
                if let Some(value) = done {
                    return Ok(value);
                }
            }
            let value: i64 = query_row(
                txn,
                "INSERT INTO counters (key, value) VALUES (?1, ?2) \
                 ON CONFLICT(key) DO UPDATE SET value = value + excluded.value RETURNING value",
                params![key, amount],
                |r| r.get(0),
            )
            .map_err(backend)?;
            if let Some(op) = &once {
                execute(txn, "INSERT INTO counter_ops (op, value) VALUES (?1, ?2)", params![op, value])
                    .map_err(backend)?;
            }
            Ok(value)
        })
    }

    fn counter_get(&self, key: &str) -> StoreFuture<'_, i64> {
        let key = key.to_owned();
        self.query(move |txn| {
            query_row(txn, "SELECT value FROM counters WHERE key = ?1", [key], |r| r.get(0))
                .optional()
                .map(Option::unwrap_or_default)
                .map_err(backend)
        })
    }
}
