//! Streams and their events in the embedded store ([`EventLog`]): appends, reads, the start of a
//! request with its stream, and retention within a session's byte cap.

use super::*;

/// Inserts a stream unless it exists; whether it was new.
pub(super) fn insert_stream(
    txn: &Connection,
    session: &str,
    stream: &StreamName,
    owner: &str,
    key: Option<&str>,
) -> Result<bool, StoreError> {
    let inserted = execute(txn,
        "INSERT OR IGNORE INTO streams (session, stream, head, state, owner, request_key) VALUES (?1, ?2, 0, 0, ?3, ?4)",
        params![session, stream.as_str(), owner, key],
    )
    .map_err(backend)?;
    // An existing stream (a batch's, joined by another of its requests) keeps its events as they
    // are: its priming event may have been evicted long ago.
    if inserted > 0 {
        execute(
            txn,
            "INSERT INTO events (session, stream, seq, data, tag) VALUES (?1, ?2, 0, x'', ?3)",
            params![session, stream.as_str(), tag_column(Tag::priming(stream))],
        )
        .map_err(backend)?;
    }
    Ok(inserted > 0)
}

pub(super) fn session_bytes(txn: &Connection, session: &str) -> Result<u64, StoreError> {
    query_row(txn, "SELECT bytes FROM sessions WHERE id = ?1", [session], |r| r.get::<_, i64>(0))
        .map(as_u64)
        .map_err(backend)
}

pub(super) fn add_session_bytes(txn: &Connection, session: &str, delta: i64) -> Result<(), StoreError> {
    execute(txn, "UPDATE sessions SET bytes = bytes + ?2 WHERE id = ?1", params![session, delta]).map_err(backend)?;
    Ok(())
}

/// Deletes the events of `stream` with `seq <= upto` and takes their bytes off the stream,
/// which remembers the last one's tag.
pub(super) fn delete_events_upto(
    txn: &Connection,
    session: &str,
    stream: &str,
    upto: i64,
) -> Result<usize, StoreError> {
    execute(
        txn,
        "UPDATE streams SET before_retained = COALESCE((SELECT tag FROM events \
         WHERE session = ?1 AND stream = ?2 AND seq <= ?3 ORDER BY seq DESC LIMIT 1), before_retained) \
         WHERE session = ?1 AND stream = ?2",
        params![session, stream, upto],
    )
    .map_err(backend)?;
    let freed: i64 = query_row(
        txn,
        "SELECT COALESCE(SUM(LENGTH(data)), 0) FROM events WHERE session = ?1 AND stream = ?2 AND seq <= ?3",
        params![session, stream, upto],
        |r| r.get(0),
    )
    .map_err(backend)?;
    let deleted = execute(
        txn,
        "DELETE FROM events WHERE session = ?1 AND stream = ?2 AND seq <= ?3",
        params![session, stream, upto],
    )
    .map_err(backend)?;
    execute(
        txn,
        "UPDATE streams SET bytes = bytes - ?3 WHERE session = ?1 AND stream = ?2",
        params![session, stream, freed],
    )
    .map_err(backend)?;
    add_session_bytes(txn, session, -freed)?;
    Ok(deleted)
}

/// Deletes every event of the streams matching `condition`; each remembers its last one's tag.
pub(super) fn drop_events_where<P: rusqlite::Params + Copy>(
    txn: &Connection,
    condition: &str,
    params: P,
) -> Result<(), StoreError> {
    execute(
        txn,
        &format!(
            "UPDATE streams SET before_retained = COALESCE((SELECT tag FROM events e \
             WHERE e.session = streams.session AND e.stream = streams.stream ORDER BY seq DESC LIMIT 1), before_retained) \
             WHERE {condition}"
        ),
        params,
    )
    .map_err(backend)?;
    execute(
        txn,
        &format!(
            "DELETE FROM events WHERE (session, stream) IN (SELECT session, stream FROM streams WHERE {condition})"
        ),
        params,
    )
    .map_err(backend)?;
    Ok(())
}

/// Turns the streams matching `condition` (whose events are already deleted, see
/// [`drop_events_where`]) into tombstones; returns each one's session, name and the bytes it held.
pub(super) fn bury<P: rusqlite::Params + Copy>(
    txn: &Connection,
    condition: &str,
    params: P,
) -> Result<Vec<(String, String, i64)>, StoreError> {
    execute(
        txn,
        &format!(
            "INSERT OR REPLACE INTO tombstones (session, stream, head, state, request_key, before_retained) \
             SELECT session, stream, head, state, request_key, before_retained FROM streams WHERE {condition}"
        ),
        params,
    )
    .map_err(backend)?;
    let mut dropped = txn
        .prepare_cached(&format!("DELETE FROM streams WHERE {condition} RETURNING session, stream, bytes"))
        .map_err(backend)?;
    let dropped = dropped.query_map(params, |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).map_err(backend)?;
    dropped.collect::<Result<_, _>>().map_err(backend)
}

/// Keeps `stream` and its session within `retention`: ended streams of the session go first,
/// the earliest ended first, then the oldest events of `stream` (never its newest). Byte counts
/// are kept per stream and per session, and ended streams are indexed by their end's order, so
/// this costs a few indexed lookups, not a scan.
pub(super) fn evict(
    txn: &Connection,
    session: &str,
    stream: &str,
    head: i64,
    retention: &Retention,
) -> Result<Evicted, StoreError> {
    let mut evicted = Evicted::default();
    let max_events = i64::try_from(retention.max_events_per_stream.max(1)).unwrap_or(i64::MAX);
    if head >= max_events {
        evicted.trimmed |= delete_events_upto(txn, session, stream, head - max_events)? > 0;
    }
    let cap = u64::try_from(retention.max_bytes_per_session).unwrap_or(u64::MAX);
    while session_bytes(txn, session)? > cap {
        let ended: Option<String> = query_row(
            txn,
            "SELECT stream FROM streams WHERE session = ?1 AND stream != ?2 AND state != 0 ORDER BY ended_order LIMIT 1",
            params![session, stream],
            |r| r.get(0),
        )
        .optional()
        .map_err(backend)?;
        match ended {
            Some(ended) => {
                let bytes: i64 = query_row(
                    txn,
                    "SELECT bytes FROM streams WHERE session = ?1 AND stream = ?2",
                    params![session, ended],
                    |r| r.get(0),
                )
                .map_err(backend)?;
                drop_events_where(txn, "session = ?1 AND stream = ?2", params![session, ended])?;
                bury(txn, "session = ?1 AND stream = ?2", params![session, ended])?;
                add_session_bytes(txn, session, -bytes)?;
                evicted.dropped.push(ended);
            }
            None => {
                let oldest: Option<i64> = query_row(
                    txn,
                    "SELECT MIN(seq) FROM events WHERE session = ?1 AND stream = ?2",
                    params![session, stream],
                    |r| r.get(0),
                )
                .map_err(backend)?;
                match oldest {
                    Some(oldest) if oldest < head => {
                        evicted.trimmed |= delete_events_upto(txn, session, stream, oldest)? > 0;
                    }
                    _ => break,
                }
            }
        }
    }
    Ok(evicted)
}

/// What retention took while an append kept it.
#[derive(Debug, Default)]
pub(super) struct Evicted {
    /// The appended stream lost its oldest events.
    pub(super) trimmed: bool,
    /// Ended streams of the session deleted whole.
    pub(super) dropped: Vec<String>,
}

/// What an append changed, for the mirror.
#[derive(Debug)]
pub(super) struct Appended {
    pub(super) head: u64,
    pub(super) evicted: Evicted,
}

impl Appended {
    /// Brings the mirror up to date with the append of `events` to `stream`.
    pub(super) fn mirror(&self, mirror: &Mirror, session: &str, stream: &str, events: &[(Tag, Bytes)], last: bool) {
        if self.evicted.trimmed {
            mirror.forget_stream(session, stream);
        } else {
            mirror.appended(session, stream, self.head, events, last);
        }
        for dropped in &self.evicted.dropped {
            mirror.forget_stream(session, dropped);
        }
    }
}

/// The mirror's update after `begin`: a started request has a new stream.
/// A begun request, and whether its stream was opened by it (not joined: a batch's).
pub(super) type Begun = (BeginRequest, bool);

pub(super) fn opened_by_begin(
    session: &str,
    stream: &StreamName,
) -> impl FnOnce(&Mirror, &Begun) + Send + 'static + use<> {
    let (session, stream) = (session.to_owned(), stream.clone());
    move |mirror, (_, opened)| {
        if *opened {
            mirror.stream_opened(&session, &stream);
        }
    }
}

/// A request of a live session to record, as the writer takes it.
pub(super) struct NewRequest {
    pub(super) session: String,
    pub(super) epoch: String,
    pub(super) key: String,
    pub(super) digest: String,
    pub(super) stream: StreamName,
}

/// Records a request of a live session with its stream (opening it unless it exists), unless
/// its key is known.
pub(super) fn begin(txn: &Connection, owner: &str, request: &NewRequest) -> Result<Begun, StoreError> {
    let NewRequest { session, epoch, key, digest, stream } = request;
    let (session, key) = (session.as_str(), key.as_str());
    check_live(txn, session, epoch)?;
    let existing: Option<(String, String)> = query_row(
        txn,
        "SELECT digest, stream FROM requests WHERE session = ?1 AND key = ?2",
        params![session, key],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .optional()
    .map_err(backend)?;
    if let Some((existing_digest, existing_stream)) = existing {
        let stream = StreamName::parse(&existing_stream).map_err(backend)?;
        return Ok((BeginRequest::Existing { stream, same_params: existing_digest == *digest }, false));
    }
    execute(
        txn,
        "INSERT INTO requests (session, key, digest, stream) VALUES (?1, ?2, ?3, ?4)",
        params![session, key, digest, stream.as_str()],
    )
    .map_err(backend)?;
    let opened = insert_stream(txn, session, stream, owner, Some(key))?;
    Ok((BeginRequest::Started, opened))
}

/// Appends `events` (each with its tag) to a live stream (ending it after them, `ended` its end's
/// order, if that is given) and keeps retention.
pub(super) fn append_in(
    txn: &Connection,
    s: &str,
    e: &str,
    st: &str,
    events: &[(Tag, Bytes)],
    ended: Option<i64>,
    retention: &Retention,
) -> Result<Appended, StoreError> {
    check_live(txn, s, e)?;
    let row: Option<(i64, i64)> =
        query_row(txn, "SELECT head, state FROM streams WHERE session = ?1 AND stream = ?2", params![s, st], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()
        .map_err(backend)?;
    let Some((mut head, state)) = row else { return Err(StoreError::UnknownStream) };
    if state != LIVE {
        return Err(StoreError::StreamEnded);
    }
    let mut bytes = 0;
    for (tag, data) in events {
        head += 1;
        execute(
            txn,
            "INSERT INTO events (session, stream, seq, data, tag) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![s, st, head, &data[..], tag_column(*tag)],
        )
        .map_err(backend)?;
        bytes += as_i64(data.len() as u64);
    }
    execute(
        txn,
        concat!(
            "UPDATE streams SET head = ?3, state = ?4, bytes = bytes + ?5, ended_order = ?6, ended_at_ms = CASE WHEN ?4 != 0 THEN ",
            last_sweep!(),
            " END WHERE session = ?1 AND stream = ?2"
        ),
        params![s, st, head, if ended.is_some() { COMPLETE } else { LIVE }, bytes, ended],
    )
    .map_err(backend)?;
    add_session_bytes(txn, s, bytes)?;
    let evicted = evict(txn, s, st, head, retention)?;
    Ok(Appended { head: as_u64(head), evicted })
}

/// What is retained of a stream (or its tombstone), with the tag of the last event dropped.
pub(super) fn range_in(txn: &Connection, s: &str, st: &str) -> Result<Option<(StreamRange, Option<Tag>)>, StoreError> {
    let row: Option<(i64, i64, Option<i64>, Option<i64>)> = query_row(
        txn,
        "SELECT head, state, (SELECT MIN(seq) FROM events WHERE session = ?1 AND stream = ?2), before_retained \
             FROM streams WHERE session = ?1 AND stream = ?2 \
         UNION ALL SELECT head, state, NULL, before_retained FROM tombstones WHERE session = ?1 AND stream = ?2",
        params![s, st],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )
    .optional()
    .map_err(backend)?;
    Ok(row.map(|(head, state, first, before)| {
        let range = StreamRange {
            retained_from: first.map_or(as_u64(head) + 1, as_u64),
            head: as_u64(head),
            state: state_of(state),
        };
        (range, before.map(tag_of))
    }))
}

/// The tag of the retained event at `seq`.
pub(super) fn tag_in(txn: &Connection, s: &str, st: &str, seq: u64) -> Result<Option<Tag>, StoreError> {
    query_row(
        txn,
        "SELECT tag FROM events WHERE session = ?1 AND stream = ?2 AND seq = ?3",
        params![s, st, as_i64(seq)],
        |r| r.get(0),
    )
    .optional()
    .map(|tag| tag.map(tag_of))
    .map_err(backend)
}

/// Up to `max` retained events with `seq > after`, in order.
pub(super) fn events_in(
    txn: &Connection,
    s: &str,
    st: &str,
    after: u64,
    max: usize,
) -> Result<Vec<StoredEvent>, StoreError> {
    let limit = i64::try_from(max).unwrap_or(i64::MAX);
    let mut statement = txn
        .prepare_cached(
            "SELECT seq, data, tag FROM events WHERE session = ?1 AND stream = ?2 AND seq > ?3 ORDER BY seq LIMIT ?4",
        )
        .map_err(backend)?;
    let rows = statement
        .query_map(params![s, st, as_i64(after), limit], |r| {
            Ok(StoredEvent {
                seq: as_u64(r.get(0)?),
                data: Bytes::from(r.get::<_, Vec<u8>>(1)?),
                tag: tag_of(r.get(2)?),
            })
        })
        .map_err(backend)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(backend)
}

impl EventLog for SqliteStore {
    fn open_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let (session, epoch, stream, owner) =
            (session.as_str().to_owned(), epoch.to_string(), stream.clone(), self.owner.clone());
        let (s, st) = (session.clone(), stream.clone());
        let then = move |mirror: &Mirror, inserted: &bool| {
            if *inserted {
                mirror.stream_opened(&s, &st);
            }
        };
        let opened = self.run_with(
            move |txn| {
                check_live(txn, &session, &epoch)?;
                insert_stream(txn, &session, &stream, &owner, None)
            },
            then,
        );
        Box::pin(async move { opened.await.map(drop) })
    }

    fn begin_request(&self, request: RequestRecord<'_>) -> StoreFuture<'_, BeginRequest> {
        let (job, then) = self.begin_job(request);
        // Answered only once durable: a handler must never run for a request whose record a
        // crash could lose, or the same request id sent again would run it twice.
        let begun = self.run_with(job, then);
        Box::pin(async move { begun.await.map(|(begun, _)| begun) })
    }

    fn begin_request_pipelined(&self, request: RequestRecord<'_>) -> Option<StoreFuture<'static, BeginRequest>> {
        let (job, then) = self.begin_job(request);
        // Queued now, and run by the one writer in queue order: every later write comes after
        // it, in its batch or a later one, and the flush thread makes commits durable in
        // commit order, so what the caller writes next is durable only after the record.
        let begun = self.run_answered_at_commit(job, then);
        Some(Box::pin(async move { begun.await.map(|(begun, _)| begun) }))
    }

    fn begin_keyed_request(
        &self,
        request: RequestRecord<'_>,
        claim: KeyClaim,
    ) -> StoreFuture<'_, (BeginRequest, Option<Claim>)> {
        let (begin, then) = self.begin_job(request);
        let (owner, records) = (self.owner.clone(), self.records_id.clone());
        let job = move |txn: &Connection| {
            let begun = begin(txn)?;
            let claimed = match begun.0 {
                BeginRequest::Started => Some(claim_in(txn, &owner, &records, &claim)?),
                BeginRequest::Existing { .. } => None,
            };
            Ok((begun, claimed))
        };
        let begun = self.run_with(job, move |mirror, (begun, _)| then(mirror, begun));
        Box::pin(async move { begun.await.map(|((begun, _), claimed)| (begun, claimed)) })
    }

    fn append_batch(
        &self,
        session: &SessionId,
        epoch: &Epoch,
        stream: &StreamName,
        events: Vec<Bytes>,
        last: bool,
    ) -> StoreFuture<'_, u64> {
        self.append_events(session.as_str(), epoch, stream, events, last, None)
    }

    fn append_final(
        &self,
        session: &SessionId,
        epoch: &Epoch,
        stream: &StreamName,
        events: Vec<Bytes>,
        last: bool,
        key: &str,
    ) -> StoreFuture<'_, u64> {
        self.append_events(session.as_str(), epoch, stream, events, last, Some(key.to_owned()))
    }

    fn end_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let (s, e, st) = (session.as_str().to_owned(), epoch.to_string(), stream.to_string());
        let (session_, stream_) = (s.clone(), st.clone());
        let then = move |mirror: &Mirror, _: &u64| mirror.stream_ended(&session_, &stream_);
        let ends = self.ends.clone();
        let ended = self.run_with(
            move |txn| {
                check_live(txn, &s, &e)?;
                let head: Option<i64> = query_row(
                    txn,
                    "SELECT head FROM streams WHERE session = ?1 AND stream = ?2",
                    params![s, st],
                    |r| r.get(0),
                )
                .optional()
                .map_err(backend)?;
                let head = head.ok_or(StoreError::UnknownStream)?;
                execute(
                    txn,
                    concat!(
                        "UPDATE streams SET state = ?3, ended_order = ?4, ended_at_ms = ",
                        last_sweep!(),
                        " WHERE session = ?1 AND stream = ?2 AND state = 0"
                    ),
                    params![s, st, COMPLETE, ends.next()],
                )
                .map_err(backend)?;
                Ok(as_u64(head))
            },
            then,
        );
        let (session, stream) = (session.as_str().to_owned(), stream.clone());
        Box::pin(async move {
            let head = ended.await?;
            self.heads.notify(&session, &stream, head);
            Ok(())
        })
    }

    fn abort_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let (s, e, st) = (session.as_str().to_owned(), epoch.to_string(), stream.to_string());
        let (session_, stream_) = (s.clone(), st.clone());
        let then = move |mirror: &Mirror, _: &Option<u64>| mirror.forget_stream(&session_, &stream_);
        let ends = self.ends.clone();
        let aborted = self.run_with(
            move |txn| {
                check_live(txn, &s, &e)?;
                query_row(
                    txn,
                    concat!(
                        "UPDATE streams SET state = ?3, ended_order = ?4, ended_at_ms = ",
                        last_sweep!(),
                        " WHERE session = ?1 AND stream = ?2 AND state = 0 RETURNING head"
                    ),
                    params![s, st, ABORTED, ends.next()],
                    |r| r.get::<_, i64>(0),
                )
                .optional()
                .map(|head| head.map(as_u64))
                .map_err(backend)
            },
            then,
        );
        let (session, stream) = (session.as_str().to_owned(), stream.clone());
        Box::pin(async move {
            if let Some(head) = aborted.await? {
                self.heads.notify(&session, &stream, head);
            }
            Ok(())
        })
    }

    fn stream_range(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, Option<StreamRange>> {
        if let Some(range) = self.mirror.stream_range(session.as_str(), stream.as_str()) {
            return Box::pin(std::future::ready(Ok(Some(range))));
        }
        let (s, st) = (session.as_str().to_owned(), stream.to_string());
        self.query(move |txn| Ok(range_in(txn, &s, &st)?.map(|(range, _)| range)))
    }

    fn stream_request(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, Option<RequestKey>> {
        let (s, st) = (session.as_str().to_owned(), stream.to_string());
        self.query(move |txn| {
            query_row(
                txn,
                "SELECT request_key FROM streams WHERE session = ?1 AND stream = ?2 \
                 UNION ALL SELECT request_key FROM tombstones WHERE session = ?1 AND stream = ?2",
                params![s, st],
                |r| r.get::<_, Option<String>>(0),
            )
            .optional()
            .map_err(backend)?
            .flatten()
            .map(|key| RequestKey::parse(&key))
            .transpose()
            .map_err(backend)
        })
    }

    fn read(
        &self,
        session: &SessionId,
        stream: &StreamName,
        after: u64,
        max: usize,
    ) -> StoreFuture<'_, Vec<StoredEvent>> {
        if let Some(page) = self.mirror.read_page(session.as_str(), stream.as_str(), after, max) {
            return Box::pin(std::future::ready(Ok(page.events)));
        }
        let (s, st) = (session.as_str().to_owned(), stream.to_string());
        self.query(move |txn| events_in(txn, &s, &st, after, max))
    }

    fn read_page(
        &self,
        session: &SessionId,
        stream: &StreamName,
        after: u64,
        max: usize,
    ) -> StoreFuture<'_, Option<StreamPage>> {
        if let Some(page) = self.mirror.read_page(session.as_str(), stream.as_str(), after, max) {
            return Box::pin(std::future::ready(Ok(Some(page))));
        }
        let (s, st) = (session.as_str().to_owned(), stream.to_string());
        self.query(move |connection| {
            // One read transaction: the range, the tags and the events of one commit.
            let txn = connection.unchecked_transaction().map_err(backend)?;
            let Some((range, before_retained)) = range_in(&txn, &s, &st)? else { return Ok(None) };
            let at_cursor = if after.checked_add(1) == Some(range.retained_from) {
                before_retained
            } else if (range.retained_from..=range.head).contains(&after) {
                tag_in(&txn, &s, &st, after)?
            } else {
                None
            };
            let events = events_in(&txn, &s, &st, after, max)?;
            Ok(Some(StreamPage { range, at_cursor, before_retained, events }))
        })
    }

    fn watch(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, HeadWatch> {
        let range = self.stream_range(session, stream);
        let key = (session.as_str().to_owned(), stream.clone());
        Box::pin(async move {
            let range = range.await?.ok_or(StoreError::UnknownStream)?;
            Ok(self.heads.subscribe(&key.0, &key.1, range.head))
        })
    }

    fn retained_bytes(&self) -> StoreFuture<'_, Option<u64>> {
        self.query(|txn| {
            query_row(txn, "SELECT COALESCE(SUM(bytes), 0) FROM sessions WHERE ended IS NULL", [], |r| {
                r.get::<_, i64>(0)
            })
            .map(|bytes| Some(as_u64(bytes)))
            .map_err(backend)
        })
    }
}
