//! Streams and their events in the embedded store ([`EventLog`]): appends, reads, the start of a
//! request with its stream, and retention within a session's byte cap. Each write checks the
//! writer's [`Log`] and inserts rows into the `log` table (`log.rs`); reads are the mirror's.

use super::log::{self as rows, Change, End, Retained, Row};
use super::*;

/// What an append changed, for the mirror.
#[derive(Debug)]
pub(super) struct Appended {
    pub(super) head: u64,
    pub(super) changes: Vec<Change>,
    /// The appended events' rows with their data, for the mirror's cache.
    pub(super) rows: Vec<(i64, Bytes)>,
}

/// A begun request, and the changes its record made.
pub(super) type Begun = (BeginRequest, Vec<Change>);

/// A request of a live session to record, as the writer takes it.
pub(super) struct NewRequest {
    pub(super) session: String,
    pub(super) epoch: String,
    pub(super) key: String,
    pub(super) digest: String,
    pub(super) stream: StreamName,
}

/// What the mirror learns of a begun request once it is durable.
pub(super) fn mirror_begun(mirror: &Mirror, (_, changes): &Begun) {
    mirror.apply(changes);
}

/// The row that opens `stream` of `session`, unless the session has it; the change it makes.
fn open_in(
    txn: &Connection,
    log: &Log,
    session: &str,
    stream: &StreamName,
    owner: &Arc<str>,
    key: Option<&str>,
) -> Result<Option<Change>, StoreError> {
    // An existing stream (a batch's, joined by another of its requests) keeps its events as they
    // are: its priming event may have been evicted long ago.
    if log.stream(session, stream.as_str()).is_some() {
        return Ok(None);
    }
    let row = Row { key, detail: Some(owner), ..Row::of(rows::OPENED, session, stream.as_str()) }.insert(txn)?;
    Ok(Some(Change::Opened {
        session: session.to_owned(),
        stream: stream.clone(),
        row,
        owner: Arc::clone(owner),
        request_key: key.map(str::to_owned),
    }))
}

/// Records a request of a live session with its stream (opening it unless it exists), unless
/// its key is known.
pub(super) fn begin(
    txn: &Connection,
    log: &mut Log,
    owner: &Arc<str>,
    request: &NewRequest,
) -> Result<Begun, StoreError> {
    let NewRequest { session, epoch, key, digest, stream } = request;
    log.live(session, epoch)?;
    let record = Row { key: Some(key), detail: Some(digest), ..Row::of(rows::REQUEST, session, stream.as_str()) };
    if !record.insert_unless_known(txn)? {
        let (existing_digest, existing_stream): (String, String) = query_row(
            txn,
            "SELECT detail, stream FROM log WHERE session = ?1 AND key = ?2 AND kind = 0",
            params![session, key],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(backend)?;
        let stream = StreamName::parse(&existing_stream).map_err(backend)?;
        return Ok((BeginRequest::Existing { stream, same_params: existing_digest == *digest }, Vec::new()));
    }
    let changes: Vec<Change> = open_in(txn, log, session, stream, owner, Some(key))?.into_iter().collect();
    log.apply_all(&changes);
    Ok((BeginRequest::Started, changes))
}

/// The live stream `st` of session `s` in incarnation `e`.
fn live_stream<'a>(log: &'a Log, s: &str, e: &str, st: &str) -> Result<&'a log::Stream, StoreError> {
    let stream = log.live(s, e)?.streams.get(st).ok_or(StoreError::UnknownStream)?;
    Ok(stream)
}

/// The row ending `stream` in `state`; the change it makes.
fn end_in(txn: &Connection, log: &Log, session: &str, stream: &str, state: StreamState) -> Result<Change, StoreError> {
    let (order, at) = (log.next_end_order(), log.swept_at());
    let row = Row { seq: Some(state_code(state)), tag: Some(order), at, ..Row::of(rows::ENDED, session, stream) }
        .insert(txn)?;
    let end = End { row, order: Some(order), at };
    Ok(Change::Ended { session: session.to_owned(), stream: stream.to_owned(), state, end })
}

/// Appends `events` (each with its tag) to a live stream (ending it after them if `last`) and
/// keeps retention.
#[allow(clippy::too_many_arguments)]
pub(super) fn append_in(
    txn: &Connection,
    log: &mut Log,
    s: &str,
    e: &str,
    st: &str,
    events: &[(Tag, Bytes)],
    last: bool,
    retention: &Retention,
) -> Result<Appended, StoreError> {
    let stream = live_stream(log, s, e, st)?;
    if stream.state != StreamState::Live {
        return Err(StoreError::StreamEnded);
    }
    let mut head = stream.head;
    let mut appended = Vec::with_capacity(events.len());
    let mut written = Vec::with_capacity(events.len());
    for (tag, data) in events {
        head += 1;
        let row = Row {
            seq: Some(as_i64(head)),
            tag: Some(tag_column(*tag)),
            data: Some(data),
            ..Row::of(rows::EVENT, s, st)
        }
        .insert(txn)?;
        appended.push(Retained { row: Some(row), seq: head, tag: *tag, len: data.len() as u64 });
        written.push((row, data.clone()));
    }
    let mut changes = vec![Change::Appended { session: s.to_owned(), stream: st.to_owned(), events: appended }];
    if last {
        changes.push(end_in(txn, log, s, st, StreamState::Complete)?);
    }
    log.apply_all(&changes);
    let evicted = rows::evict(txn, log, s, st, &log.eviction(s, st, retention))?;
    log.apply_all(&evicted);
    changes.extend(evicted);
    Ok(Appended { head, changes, rows: written })
}

/// Times a page is read again when retention dropped one of its events while it was read.
const MAX_PAGE_TRIES: usize = 1_000;

/// A stream retention dropped whole, as its tombstone keeps it.
pub(super) struct Tombstone {
    range: StreamRange,
    request_key: Option<String>,
    /// The tag of its last event.
    last_tag: Option<Tag>,
}

impl Tombstone {
    /// Its page at `after`: no events, and the last one's tag if `after` is its head.
    fn page(self, after: u64) -> StreamPage {
        let at_cursor = if after == self.range.head { self.last_tag } else { None };
        StreamPage { range: self.range, at_cursor, before_retained: self.last_tag, events: Vec::new() }
    }
}

/// The tombstone of `st`, if it has one.
pub(super) fn tombstone_in(txn: &Connection, s: &str, st: &str) -> Result<Option<Tombstone>, StoreError> {
    query_row(
        txn,
        "SELECT head, state, request_key, before_retained FROM tombstones WHERE session = ?1 AND stream = ?2",
        params![s, st],
        |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, Option<String>>(2)?, r.get::<_, Option<i64>>(3)?)),
    )
    .optional()
    .map_err(backend)
    .map(|row| {
        row.map(|(head, state, request_key, last_tag)| Tombstone {
            range: StreamRange { retained_from: as_u64(head) + 1, head: as_u64(head), state: state_of(state) },
            request_key,
            last_tag: last_tag.map(tag_of),
        })
    })
}

/// The data of the events `rows` (each with its seq) of `st`, by row; a row that is gone (or
/// holds another event, its id taken again) is left out.
fn event_data_in(txn: &Connection, s: &str, st: &str, rows: &[(i64, u64)]) -> Result<HashMap<i64, Bytes>, StoreError> {
    let mut found = HashMap::with_capacity(rows.len());
    for &(row, seq) in rows {
        let data: Option<Vec<u8>> = query_row(
            txn,
            "SELECT data FROM log WHERE id = ?1 AND kind = 2 AND session = ?2 AND stream = ?3 AND seq = ?4",
            params![row, s, st, as_i64(seq)],
            |r| r.get(0),
        )
        .optional()
        .map_err(backend)?;
        if let Some(data) = data {
            found.insert(row, Bytes::from(data));
        }
    }
    Ok(found)
}

impl EventLog for SqliteStore {
    fn open_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let (session, epoch, stream, owner) =
            (session.as_str().to_owned(), epoch.to_string(), stream.clone(), self.owner.clone());
        let then = |mirror: &Mirror, opened: &Option<Change>| mirror.apply(opened.as_slice());
        let opened = self.run_logged(
            move |txn, log| {
                log.live(&session, &epoch)?;
                let opened = open_in(txn, log, &session, &stream, &owner, None)?;
                log.apply_all(opened.as_slice());
                Ok(opened)
            },
            then,
        );
        Box::pin(async move { opened.await.map(drop) })
    }

    fn begin_request(&self, request: RequestRecord<'_>) -> StoreFuture<'_, BeginRequest> {
        let job = self.begin_job(request);
        // Answered only once durable: a handler must never run for a request whose record a
        // crash could lose, or the same request id sent again would run it twice.
        let begun = self.run_logged(job, mirror_begun);
        Box::pin(async move { begun.await.map(|(begun, _)| begun) })
    }

    fn begin_request_pipelined(&self, request: RequestRecord<'_>) -> Option<StoreFuture<'static, BeginRequest>> {
        let job = self.begin_job(request);
        // Queued now, and run by the one writer in queue order: every later write comes after
        // it, in its batch or a later one, and the flush thread makes commits durable in
        // commit order, so what the caller writes next is durable only after the record.
        let begun = self.run_answered_at_commit(job, mirror_begun);
        Some(Box::pin(async move { begun.await.map(|(begun, _)| begun) }))
    }

    fn begin_keyed_request(
        &self,
        request: RequestRecord<'_>,
        claim: KeyClaim,
    ) -> StoreFuture<'_, (BeginRequest, Option<Claim>)> {
        let begin = self.begin_job(request);
        let (owner, records) = (self.owner.clone(), self.records_id.clone());
        let job = move |txn: &Connection, log: &mut Log| {
            let begun = begin(txn, log)?;
            let claimed = match begun.0 {
                BeginRequest::Started => Some(claim_in(txn, &owner, &records, &claim)?),
                BeginRequest::Existing { .. } => None,
            };
            Ok((begun, claimed))
        };
        let begun = self.run_logged(job, |mirror, (begun, _)| mirror_begun(mirror, begun));
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
        let then = |mirror: &Mirror, (_, ended): &(u64, Option<Change>)| mirror.apply(ended.as_slice());
        let ended = self.run_logged(
            move |txn, log| {
                let stream = live_stream(log, &s, &e, &st)?;
                let head = stream.head;
                if stream.state != StreamState::Live {
                    return Ok((head, None));
                }
                let ended = end_in(txn, log, &s, &st, StreamState::Complete)?;
                log.apply(&ended);
                Ok((head, Some(ended)))
            },
            then,
        );
        let (session, stream) = (session.as_str().to_owned(), stream.clone());
        Box::pin(async move {
            let (head, _) = ended.await?;
            self.heads.notify(&session, &stream, head);
            Ok(())
        })
    }

    fn abort_stream(&self, session: &SessionId, epoch: &Epoch, stream: &StreamName) -> StoreFuture<'_, ()> {
        let (s, e, st) = (session.as_str().to_owned(), epoch.to_string(), stream.to_string());
        let then = |mirror: &Mirror, aborted: &Option<(u64, Change)>| {
            if let Some((_, ended)) = aborted {
                mirror.apply(std::slice::from_ref(ended));
            }
        };
        let aborted = self.run_logged(
            move |txn, log| {
                log.live(&s, &e)?;
                let Some(stream) = log.stream(&s, &st).filter(|stream| stream.state == StreamState::Live) else {
                    return Ok(None);
                };
                let head = stream.head;
                let ended = end_in(txn, log, &s, &st, StreamState::Aborted)?;
                log.apply(&ended);
                Ok(Some((head, ended)))
            },
            then,
        );
        let (session, stream) = (session.as_str().to_owned(), stream.clone());
        Box::pin(async move {
            if let Some((head, _)) = aborted.await? {
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
        self.query(move |txn| Ok(tombstone_in(txn, &s, &st)?.map(|t| t.range)))
    }

    fn stream_request(&self, session: &SessionId, stream: &StreamName) -> StoreFuture<'_, Option<RequestKey>> {
        let parse = |key: Option<String>| key.map(|key| RequestKey::parse(&key)).transpose().map_err(backend);
        if let Some(key) = self.mirror.stream_request(session.as_str(), stream.as_str()) {
            return Box::pin(std::future::ready(parse(key)));
        }
        let (s, st) = (session.as_str().to_owned(), stream.to_string());
        self.query(move |txn| parse(tombstone_in(txn, &s, &st)?.and_then(|t| t.request_key)))
    }

    fn read(
        &self,
        session: &SessionId,
        stream: &StreamName,
        after: u64,
        max: usize,
    ) -> StoreFuture<'_, Vec<StoredEvent>> {
        let page = self.read_page(session, stream, after, max);
        Box::pin(async move { Ok(page.await?.map(|page| page.events).unwrap_or_default()) })
    }

    fn read_page(
        &self,
        session: &SessionId,
        stream: &StreamName,
        after: u64,
        max: usize,
    ) -> StoreFuture<'_, Option<StreamPage>> {
        let (s, st) = (session.as_str().to_owned(), stream.to_string());
        Box::pin(async move {
            for _ in 0..MAX_PAGE_TRIES {
                let Some(page) = self.mirror.read_page(&s, &st, after, max) else {
                    let (s, st) = (s.clone(), st.clone());
                    let tombstone = self.query(move |txn| tombstone_in(txn, &s, &st)).await?;
                    return Ok(tombstone.map(|t| t.page(after)));
                };
                let missing: Vec<(i64, u64)> = page
                    .events
                    .iter()
                    .filter(|(_, data)| data.is_none())
                    .filter_map(|(event, _)| Some((event.row?, event.seq)))
                    .collect();
                let fetched = if missing.is_empty() {
                    HashMap::new()
                } else {
                    let (s, st) = (s.clone(), st.clone());
                    self.query(move |txn| event_data_in(txn, &s, &st, &missing)).await?
                };
                if let Some(page) = page.filled(&fetched) {
                    return Ok(Some(page));
                }
                // Retention dropped an event between the mirror's answer and the read of its
                // row: the mirror learns of it as soon as that commit is durable.
                tokio::task::yield_now().await;
            }
            Err(StoreError::Backend("the stream's events kept being dropped while they were read".into()))
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
        Box::pin(std::future::ready(Ok(Some(self.mirror.retained_bytes()))))
    }
}
