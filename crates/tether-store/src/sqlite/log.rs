//! The streams, events and request records of live sessions, as the embedded store holds them in
//! memory: SQLite keeps them as rows of one append-only table (`log`), and this state is what
//! those rows say, rebuilt from them when the store opens.
//!
//! The writer thread holds one [`Log`]: every check a write makes (is the session live, does the
//! stream exist, is the key known, how many bytes does the session hold) reads it, so a write
//! only inserts rows. A job changes it through [`Change`]s, once its rows are written; the mirror
//! applies the same changes to its own copy once the commit is durable, in commit order, so
//! readers see exactly what a crash would leave. Row ids are SQLite's, so a stream's retained
//! events are found and dropped without an index.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use rusqlite::{Connection, params};
use tether_core::lineage::{StreamName, StreamRange, StreamState, Tag};

use super::{StoreError, backend, execute, tag_column, tag_of};
use crate::parted::PartedMap;
use crate::record::Retention;

/// A row's kind: the record of a request (its key, its params' digest, its stream).
pub(super) const REQUEST: i64 = 0;
/// A row's kind: a stream opened (by the request whose key it holds, or none), with its owner.
/// It stands for the stream's priming event (seq 0) too.
pub(super) const OPENED: i64 = 1;
/// A row's kind: an event of a stream.
pub(super) const EVENT: i64 = 2;
/// A row's kind: a stream's end (its state, its end's order, when its retention counts from).
pub(super) const ENDED: i64 = 3;
/// A row's kind: retention dropped a stream's oldest events (the first retained, and the tag of
/// the last dropped). Only a stream's latest is kept.
pub(super) const TRIMMED: i64 = 4;

// Statements name these kinds by number (the `log_request_keys` index, the reads of a request's
// record and of an event's data).
const _: () = assert!(REQUEST == 0 && EVENT == 2);

/// A stream of a session: the session's id and the stream's name.
pub(super) type StreamKey = (String, String);

/// A stream's end as its row holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct End {
    /// The end's row.
    pub(super) row: i64,
    /// The order streams ended in, for eviction: earliest first. `None` for a stream a previous
    /// process left running, aborted at open, which counts as ended before any other.
    pub(super) order: Option<i64>,
    /// When the stream's retention counts from: the last sweep before it ended, or the first
    /// after (`None` until that sweep).
    pub(super) at: Option<i64>,
}

/// A retained event: where its row is and what the state needs of it (its data stays in SQLite).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Retained {
    /// Its row; `None` for the priming event, which the stream's opening row stands for.
    pub(super) row: Option<i64>,
    pub(super) seq: u64,
    pub(super) tag: Tag,
    /// The bytes of its data.
    pub(super) len: u64,
}

/// A stream of a live session.
#[derive(Debug, Clone)]
pub(super) struct Stream {
    /// The row that opened it.
    opened: i64,
    /// The process that opened it: a request stream another process left live is aborted at open.
    owner: Arc<str>,
    /// The key of the request it answers, if any.
    pub(super) request_key: Option<String>,
    pub(super) head: u64,
    pub(super) state: StreamState,
    /// The retained events, in order and contiguous (the priming event first while retained).
    events: VecDeque<Retained>,
    /// The tag of the last event retention dropped, once one was.
    pub(super) before_retained: Option<Tag>,
    /// The latest [`TRIMMED`] row.
    trimmed: Option<i64>,
    /// The bytes of the retained events' data.
    bytes: u64,
    end: Option<End>,
}

impl Stream {
    /// What is retained of it.
    pub(super) fn range(&self) -> StreamRange {
        StreamRange {
            retained_from: self.events.front().map_or(self.head + 1, |e| e.seq),
            head: self.head,
            state: self.state,
        }
    }

    /// The tag of the event at `seq`, if it is retained or is the last one dropped.
    pub(super) fn tag_at(&self, seq: u64) -> Option<Tag> {
        let first = self.range().retained_from;
        if seq.checked_add(1) == Some(first) {
            return self.before_retained;
        }
        let index = usize::try_from(seq.checked_sub(first)?).ok()?;
        self.events.get(index).map(|e| e.tag)
    }

    /// Up to `max` retained events with `seq > after`, in order.
    pub(super) fn events_after(&self, after: u64, max: usize) -> impl Iterator<Item = &Retained> {
        let first = self.range().retained_from;
        // Sequence numbers are contiguous, so the position of `after + 1` is computed.
        let skip = usize::try_from(after.saturating_add(1).saturating_sub(first)).unwrap_or(usize::MAX);
        self.events.iter().skip(skip).take(max)
    }

    /// Every row it has: its opening, its events, its end, its trim.
    fn rows(&self) -> impl Iterator<Item = i64> + '_ {
        let events = self.events.iter().filter_map(|e| e.row);
        std::iter::once(self.opened).chain(events).chain(self.end.map(|e| e.row)).chain(self.trimmed)
    }

    /// Its end, once it ended.
    pub(super) fn end(&self) -> Option<End> {
        self.end
    }

    /// The tag its tombstone keeps: its last event's, or the last dropped if none is retained.
    pub(super) fn last_tag(&self) -> Option<Tag> {
        self.events.back().map(|e| e.tag).or(self.before_retained)
    }
}

/// A live session's streams. Its request records stay in SQLite, found by the `log_request_keys`
/// index: a session keeps every request id for its life, more than memory should hold.
#[derive(Debug, Clone)]
pub(super) struct Session {
    pub(super) epoch: String,
    /// The bytes of its streams' retained events.
    pub(super) bytes: u64,
    pub(super) streams: PartedMap<String, Stream>,
    /// Its ended streams, in the order they ended (unordered ones first).
    ended: BTreeSet<(Option<i64>, String)>,
}

impl Session {
    /// Every row of its streams.
    pub(super) fn rows(&self) -> impl Iterator<Item = i64> + '_ {
        self.streams.values().flat_map(Stream::rows)
    }
}

/// A change to a [`Log`], made once its rows are written (by the writer) or durable (by the
/// mirror).
#[derive(Debug, Clone)]
pub(super) enum Change {
    SessionCreated {
        session: String,
        epoch: String,
    },
    SessionRemoved {
        session: String,
    },
    Opened {
        session: String,
        stream: StreamName,
        row: i64,
        owner: Arc<str>,
        request_key: Option<String>,
    },
    Appended {
        session: String,
        stream: String,
        events: Vec<Retained>,
    },
    Ended {
        session: String,
        stream: String,
        state: StreamState,
        end: End,
    },
    /// Events before `retained_from` were dropped; `row` says so.
    Trimmed {
        session: String,
        stream: String,
        row: i64,
        retained_from: u64,
        before_retained: Option<Tag>,
    },
    /// The stream was dropped whole (its tombstone is in SQLite).
    Buried {
        session: String,
        stream: String,
    },
    /// Its retention counts from `at`.
    Stamped {
        session: String,
        stream: String,
        at: i64,
    },
}

/// What retention drops to keep an append within bounds.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Eviction {
    /// Ended streams of the session dropped whole, earliest ended first.
    pub(super) buried: Vec<String>,
    /// The appended stream's first retained event afterwards, if it lost any.
    pub(super) retained_from: Option<u64>,
}

/// Who holds a [`Log`], which says what it keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Role {
    /// The writer: everything, with the indexes its eviction and sweep use (ended streams by
    /// order and by stamp).
    #[default]
    Writer,
    /// The mirror: what reads use, the streams and their events.
    Readers,
}

/// The live sessions' streams, events and requests.
#[derive(Debug, Clone, Default)]
pub(super) struct Log {
    role: Role,
    sessions: PartedMap<String, Session>,
    /// Every ended stream by when its retention counts from (unstamped first), then its end's
    /// row: the sweep visits only those it stamps or drops.
    by_stamp: BTreeSet<(Option<i64>, i64, String, String)>,
    /// The order of the latest end.
    last_end: i64,
    /// The last sweep's time, which a stream ending now is stamped with.
    swept_at: Option<i64>,
    /// Changes applied so far: a job that fails after applying some leaves the state ahead of
    /// its rolled-back rows, and the writer then rebuilds it ([`Log::dirty`]).
    applied: u64,
    dirty: bool,
}

impl Log {
    /// The state the rows of `connection` hold.
    pub(super) fn load(connection: &Connection) -> Result<Log, StoreError> {
        let mut log = Log::default();
        let mut sessions = connection.prepare("SELECT id, epoch FROM sessions WHERE ended IS NULL").map_err(backend)?;
        let sessions = sessions
            .query_map([], |r| Ok(Change::SessionCreated { session: r.get(0)?, epoch: r.get(1)? }))
            .map_err(backend)?;
        for created in sessions {
            log.apply(&created.map_err(backend)?);
        }
        let mut rows = connection
            .prepare("SELECT id, kind, session, stream, seq, tag, LENGTH(data), key, detail, at FROM log ORDER BY id")
            .map_err(backend)?;
        let mut rows = rows.query([]).map_err(backend)?;
        // Every stream a process opened has the same owner: one copy of each.
        let mut owners: HashMap<String, Arc<str>> = HashMap::new();
        while let Some(r) = rows.next().map_err(backend)? {
            let (row, kind, session, stream): (i64, i64, String, String) = (
                r.get(0).map_err(backend)?,
                r.get(1).map_err(backend)?,
                r.get(2).map_err(backend)?,
                r.get(3).map_err(backend)?,
            );
            let seq: Option<i64> = r.get(4).map_err(backend)?;
            let tag: Option<i64> = r.get(5).map_err(backend)?;
            let len: Option<i64> = r.get(6).map_err(backend)?;
            let key: Option<String> = r.get(7).map_err(backend)?;
            let detail: Option<String> = r.get(8).map_err(backend)?;
            let at: Option<i64> = r.get(9).map_err(backend)?;
            let seq = seq.map_or(0, super::as_u64);
            let name = || StreamName::parse(&stream).map_err(backend);
            let change = match kind {
                // Request records are read from SQLite when needed.
                REQUEST => continue,
                OPENED => Change::Opened {
                    stream: name()?,
                    session,
                    row,
                    owner: Arc::clone(
                        owners.entry(detail.unwrap_or_default()).or_insert_with_key(|o| Arc::from(o.as_str())),
                    ),
                    request_key: key,
                },
                EVENT => Change::Appended {
                    session,
                    stream,
                    events: vec![Retained {
                        row: Some(row),
                        seq,
                        tag: tag_of(tag.unwrap_or(0)),
                        len: len.map_or(0, super::as_u64),
                    }],
                },
                ENDED => Change::Ended {
                    session,
                    stream,
                    state: super::state_of(super::as_i64(seq)),
                    end: End { row, order: tag, at },
                },
                TRIMMED => {
                    Change::Trimmed { session, stream, row, retained_from: seq, before_retained: tag.map(tag_of) }
                }
                other => return Err(backend(format!("a log row of unknown kind {other}"))),
            };
            log.apply(&change);
        }
        Ok(log)
    }

    /// The live session `session` of incarnation `epoch`.
    pub(super) fn live(&self, session: &str, epoch: &str) -> Result<&Session, StoreError> {
        match self.sessions.get(session) {
            Some(live) if live.epoch == epoch => Ok(live),
            _ => Err(StoreError::SessionGone),
        }
    }

    /// The live session `session`, of any incarnation.
    pub(super) fn session(&self, session: &str) -> Option<&Session> {
        self.sessions.get(session)
    }

    /// The stream `stream` of the live session `session`.
    pub(super) fn stream(&self, session: &str, stream: &str) -> Option<&Stream> {
        self.sessions.get(session)?.streams.get(stream)
    }

    /// The order the next stream to end takes.
    pub(super) fn next_end_order(&self) -> i64 {
        self.last_end + 1
    }

    /// The time a stream ending now counts its retention from.
    pub(super) fn swept_at(&self) -> Option<i64> {
        self.swept_at
    }

    /// This log as the mirror keeps it: without what only the writer uses.
    pub(super) fn for_readers(mut self) -> Log {
        self.role = Role::Readers;
        self.by_stamp.clear();
        for (_, session) in self.sessions.iter_mut() {
            session.ended.clear();
        }
        self
    }

    /// This log, rebuilt from the file, with the last sweep's time `before` knew.
    pub(super) fn swept_as(mut self, before: &Log) -> Log {
        self.swept_at = before.swept_at;
        self
    }

    /// A sweep ran at `at`.
    pub(super) fn swept(&mut self, at: i64) {
        self.swept_at = Some(at);
    }

    /// Whether a job left the state ahead of what was written: the writer then rebuilds it.
    pub(super) fn dirty(&self) -> bool {
        self.dirty
    }

    /// How many changes were applied: compared around a job that failed.
    pub(super) fn applied(&self) -> u64 {
        self.applied
    }

    /// A job failed after changing the state.
    pub(super) fn mark_dirty(&mut self) {
        self.dirty = true;
    }

    /// The bytes retained by every live session.
    pub(super) fn bytes(&self) -> u64 {
        self.sessions.values().map(|s| s.bytes).sum()
    }

    /// Applies `changes` in order.
    pub(super) fn apply_all(&mut self, changes: &[Change]) {
        for change in changes {
            self.apply(change);
        }
    }

    /// Applies `change`. A change naming a session or stream that is not there changes nothing.
    pub(super) fn apply(&mut self, change: &Change) {
        self.applied += 1;
        match change {
            Change::SessionCreated { session, epoch } => {
                let new =
                    Session { epoch: epoch.clone(), bytes: 0, streams: PartedMap::default(), ended: BTreeSet::new() };
                self.sessions.insert(session.clone(), new);
            }
            Change::SessionRemoved { session } => {
                if let Some(removed) = self.sessions.remove(session)
                    && self.role == Role::Writer
                {
                    for (name, slot) in removed.streams {
                        if let Some(end) = slot.end {
                            self.by_stamp.remove(&(end.at, end.row, session.clone(), name));
                        }
                    }
                }
            }
            Change::Opened { session, stream, row, owner, request_key } => {
                let Some(live) = self.sessions.get_mut(session) else { return };
                live.streams.insert_if_absent(stream.as_str().to_owned(), || Stream {
                    opened: *row,
                    owner: Arc::clone(owner),
                    request_key: request_key.clone(),
                    head: 0,
                    state: StreamState::Live,
                    events: VecDeque::from([Retained { row: None, seq: 0, tag: Tag::priming(stream), len: 0 }]),
                    before_retained: None,
                    trimmed: None,
                    bytes: 0,
                    end: None,
                });
            }
            Change::Appended { session, stream, events } => {
                let Some(live) = self.sessions.get_mut(session) else { return };
                let Some(slot) = live.streams.get_mut(stream) else { return };
                for event in events {
                    slot.head = slot.head.max(event.seq);
                    slot.bytes += event.len;
                    live.bytes += event.len;
                    slot.events.push_back(*event);
                }
            }
            Change::Ended { session, stream, state, end } => {
                let Some(live) = self.sessions.get_mut(session) else { return };
                let Some(slot) = live.streams.get_mut(stream) else { return };
                slot.state = *state;
                let old = slot.end.replace(*end);
                if self.role == Role::Writer {
                    if let Some(old) = old {
                        live.ended.remove(&(old.order, stream.clone()));
                        self.by_stamp.remove(&(old.at, old.row, session.clone(), stream.clone()));
                    }
                    live.ended.insert((end.order, stream.clone()));
                    self.by_stamp.insert((end.at, end.row, session.clone(), stream.clone()));
                }
                self.last_end = self.last_end.max(end.order.unwrap_or(0));
            }
            Change::Trimmed { session, stream, row, retained_from, before_retained } => {
                let Some(live) = self.sessions.get_mut(session) else { return };
                let Some(slot) = live.streams.get_mut(stream) else { return };
                while slot.events.front().is_some_and(|e| e.seq < *retained_from) {
                    if let Some(dropped) = slot.events.pop_front() {
                        slot.bytes -= dropped.len;
                        live.bytes -= dropped.len;
                    }
                }
                // A stream loaded from a file whose newest events were all dropped.
                slot.head = slot.head.max(retained_from.saturating_sub(1));
                slot.before_retained = *before_retained;
                slot.trimmed = Some(*row);
            }
            Change::Buried { session, stream } => {
                let Some(live) = self.sessions.get_mut(session) else { return };
                if let Some(slot) = live.streams.remove(stream) {
                    live.bytes -= slot.bytes;
                    if let Some(end) = slot.end.filter(|_| self.role == Role::Writer) {
                        live.ended.remove(&(end.order, stream.clone()));
                        self.by_stamp.remove(&(end.at, end.row, session.clone(), stream.clone()));
                    }
                }
            }
            Change::Stamped { session, stream, at } => {
                if self.role == Role::Writer
                    && let Some(end) = self
                        .sessions
                        .get_mut(session)
                        .and_then(|s| s.streams.get_mut(stream))
                        .and_then(|s| s.end.as_mut())
                {
                    self.by_stamp.remove(&(end.at, end.row, session.clone(), stream.clone()));
                    end.at = Some(*at);
                    self.by_stamp.insert((end.at, end.row, session.clone(), stream.clone()));
                }
            }
        }
    }

    /// What retention drops after an append to `stream` of `session` (already applied): first
    /// the stream's events past `max_events_per_stream`; then, while the session holds more than
    /// `max_bytes_per_session`, its other ended streams, the earliest ended first; then the
    /// stream's oldest events, never its newest.
    pub(super) fn eviction(&self, session: &str, stream: &str, retention: &Retention) -> Eviction {
        let mut eviction = Eviction::default();
        let Some(live) = self.sessions.get(session) else { return eviction };
        let Some(slot) = live.streams.get(stream) else { return eviction };
        let cap = u64::try_from(retention.max_bytes_per_session).unwrap_or(u64::MAX);
        let max_events = u64::try_from(retention.max_events_per_stream.max(1)).unwrap_or(u64::MAX);
        let mut bytes = live.bytes;
        let mut kept = slot.events.iter().peekable();
        while let Some(event) = kept.next_if(|e| e.seq + max_events <= slot.head) {
            bytes -= event.len;
            eviction.retained_from = Some(event.seq + 1);
        }
        for (_, ended) in &live.ended {
            if bytes <= cap {
                break;
            }
            if ended != stream
                && let Some(other) = live.streams.get(ended)
            {
                bytes -= other.bytes;
                eviction.buried.push(ended.clone());
            }
        }
        while bytes > cap
            && let Some(event) = kept.next_if(|e| e.seq < slot.head)
        {
            bytes -= event.len;
            eviction.retained_from = Some(event.seq + 1);
        }
        eviction
    }

    /// The streams a previous owner left live with a request: their requests can never end.
    pub(super) fn abandoned(&self, owner: &str) -> Vec<StreamKey> {
        let mut abandoned = Vec::new();
        for (id, session) in self.sessions.iter() {
            for (name, stream) in session.streams.iter() {
                if stream.state == StreamState::Live && stream.request_key.is_some() && *stream.owner != *owner {
                    abandoned.push((id.clone(), name.clone()));
                }
            }
        }
        abandoned
    }

    /// The ended streams not stamped yet.
    pub(super) fn unstamped(&self) -> Vec<StreamKey> {
        let unstamped = self.by_stamp.range(..(Some(i64::MIN), i64::MIN, String::new(), String::new()));
        unstamped.map(|(_, _, session, stream)| (session.clone(), stream.clone())).collect()
    }

    /// Up to `max` of the ended streams stamped at or before `cutoff`, the earliest first.
    pub(super) fn due(&self, cutoff: i64, max: usize) -> Vec<StreamKey> {
        let Some(after) = cutoff.checked_add(1) else { return Vec::new() };
        let due = self.by_stamp.range(
            (Some(i64::MIN), i64::MIN, String::new(), String::new())
                ..(Some(after), i64::MIN, String::new(), String::new()),
        );
        due.take(max).map(|(_, _, session, stream)| (session.clone(), stream.clone())).collect()
    }
}

/// A row of the log to insert: the columns its kind leaves empty are `None` (see the schema).
pub(super) struct Row<'a> {
    pub(super) kind: i64,
    pub(super) session: &'a str,
    pub(super) stream: &'a str,
    pub(super) seq: Option<i64>,
    pub(super) tag: Option<i64>,
    pub(super) data: Option<&'a [u8]>,
    pub(super) key: Option<&'a str>,
    pub(super) detail: Option<&'a str>,
    pub(super) at: Option<i64>,
}

/// The columns of a [`Row`]'s insert, after its verb.
macro_rules! insert_row {
    () => {
        " INTO log (kind, session, stream, seq, tag, data, key, detail, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
    };
}

impl<'a> Row<'a> {
    /// A row of `kind` for `stream` of `session`, its other columns empty.
    pub(super) fn of(kind: i64, session: &'a str, stream: &'a str) -> Row<'a> {
        Row { kind, session, stream, seq: None, tag: None, data: None, key: None, detail: None, at: None }
    }

    /// Inserts it; returns its id.
    pub(super) fn insert(&self, txn: &Connection) -> Result<i64, StoreError> {
        self.execute(txn, concat!("INSERT", insert_row!()))?;
        Ok(txn.last_insert_rowid())
    }

    /// Inserts it unless a unique index holds its key (a request's record: `log_request_keys`;
    /// no other constraint can refuse a row whose kind, session and stream are given). Whether
    /// it was inserted.
    pub(super) fn insert_unless_known(&self, txn: &Connection) -> Result<bool, StoreError> {
        Ok(self.execute(txn, concat!("INSERT OR IGNORE", insert_row!()))? == 1)
    }

    fn execute(&self, txn: &Connection, sql: &str) -> Result<usize, StoreError> {
        let Row { kind, session, stream, seq, tag, data, key, detail, at } = self;
        execute(txn, sql, params![kind, session, stream, seq, tag, data, key, detail, at]).map_err(backend)
    }
}

/// Deletes the rows `rows`.
pub(super) fn delete(txn: &Connection, rows: impl IntoIterator<Item = i64>) -> Result<(), StoreError> {
    for row in rows {
        execute(txn, "DELETE FROM log WHERE id = ?1", [row]).map_err(backend)?;
    }
    Ok(())
}

/// Writes `eviction` of `stream` (after an append to it): the dropped events' rows go, the
/// stream's trim is recorded, and the buried streams become tombstones. Returns the changes.
pub(super) fn evict(
    txn: &Connection,
    log: &Log,
    session: &str,
    stream: &str,
    eviction: &Eviction,
) -> Result<Vec<Change>, StoreError> {
    let mut changes = Vec::new();
    for buried in &eviction.buried {
        changes.extend(bury(txn, log, session, buried)?);
    }
    if let (Some(retained_from), Some(slot)) = (eviction.retained_from, log.stream(session, stream)) {
        changes.push(trim(txn, session, stream, slot, retained_from)?);
    }
    Ok(changes)
}

/// Drops the events of `slot` before `retained_from`; the change that says so.
fn trim(
    txn: &Connection,
    session: &str,
    stream: &str,
    slot: &Stream,
    retained_from: u64,
) -> Result<Change, StoreError> {
    let dropped: Vec<&Retained> = slot.events.iter().take_while(|e| e.seq < retained_from).collect();
    let before_retained = dropped.last().map(|e| e.tag).or(slot.before_retained);
    delete(txn, dropped.iter().filter_map(|e| e.row).chain(slot.trimmed))?;
    let row = Row {
        seq: Some(super::as_i64(retained_from)),
        tag: before_retained.map(tag_column),
        ..Row::of(TRIMMED, session, stream)
    }
    .insert(txn)?;
    Ok(Change::Trimmed { session: session.to_owned(), stream: stream.to_owned(), row, retained_from, before_retained })
}

/// Turns `stream` of `session` into a tombstone (how far it got and how it ended) and deletes
/// its rows; the change that says so, if the stream is there.
pub(super) fn bury(txn: &Connection, log: &Log, session: &str, stream: &str) -> Result<Option<Change>, StoreError> {
    let Some(slot) = log.stream(session, stream) else { return Ok(None) };
    let state = super::state_code(slot.state);
    execute(
        txn,
        "INSERT OR REPLACE INTO tombstones (session, stream, head, state, request_key, before_retained) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![session, stream, super::as_i64(slot.head), state, slot.request_key, slot.last_tag().map(tag_column)],
    )
    .map_err(backend)?;
    delete(txn, slot.rows())?;
    Ok(Some(Change::Buried { session: session.to_owned(), stream: stream.to_owned() }))
}

/// Ends, as aborted, the request streams a previous owner left live (their requests can never
/// end); returns `log` with those ends.
pub(super) fn abort_abandoned(connection: &mut Connection, mut log: Log, owner: &str) -> Result<Log, StoreError> {
    let abandoned = log.abandoned(owner);
    if abandoned.is_empty() {
        return Ok(log);
    }
    let txn = connection.transaction().map_err(backend)?;
    let mut changes = Vec::with_capacity(abandoned.len());
    for (session, stream) in abandoned {
        let ended = Row { seq: Some(super::state_code(StreamState::Aborted)), ..Row::of(ENDED, &session, &stream) };
        let row = ended.insert(&txn)?;
        let end = End { row, order: None, at: None };
        changes.push(Change::Ended { session, stream, state: StreamState::Aborted, end });
    }
    txn.commit().map_err(backend)?;
    log.apply_all(&changes);
    Ok(log)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(name: &str) -> StreamName {
        StreamName::parse(name).expect("a stream name")
    }

    fn retention(max_events: usize, max_bytes: usize) -> Retention {
        Retention { max_events_per_stream: max_events, max_bytes_per_session: max_bytes, ..Retention::default() }
    }

    /// A session `s` with streams `a` (ended, 10 bytes) and `b` (live, events of 5 bytes each).
    fn log_with(b_events: u64) -> Log {
        let mut log = Log::default();
        let s = || "s".to_owned();
        log.apply(&Change::SessionCreated { session: s(), epoch: "e".into() });
        for (row, name) in [(1, "a"), (2, "b")] {
            log.apply(&Change::Opened {
                session: s(),
                stream: stream(name),
                row,
                owner: "o".into(),
                request_key: None,
            });
        }
        let event = |row, seq, len| Retained { row: Some(row), seq, tag: Tag::from_bits(row as u64), len };
        log.apply(&Change::Appended { session: s(), stream: "a".into(), events: vec![event(3, 1, 10)] });
        let end = End { row: 4, order: Some(1), at: None };
        log.apply(&Change::Ended { session: s(), stream: "a".into(), state: StreamState::Complete, end });
        let events = (1..=b_events).map(|seq| event(10 + seq as i64, seq, 5)).collect();
        log.apply(&Change::Appended { session: s(), stream: "b".into(), events });
        log
    }

    #[test]
    fn an_append_within_bounds_evicts_nothing() {
        let log = log_with(2);
        assert_eq!(log.eviction("s", "b", &retention(10, 20)), Eviction::default());
    }

    #[test]
    fn events_past_the_count_are_dropped_oldest_first_with_the_priming_event() {
        let log = log_with(4);
        let eviction = log.eviction("s", "b", &retention(2, 1_000));
        assert_eq!(eviction, Eviction { buried: vec![], retained_from: Some(3) });
    }

    #[test]
    fn over_the_byte_cap_ended_streams_go_before_the_appended_streams_events() {
        let log = log_with(3);
        // 10 + 15 bytes: burying `a` is enough.
        assert_eq!(
            log.eviction("s", "b", &retention(10, 20)),
            Eviction { buried: vec!["a".into()], retained_from: None }
        );
        // Under 15 bytes, `b` loses its oldest events too, never its newest.
        let eviction = log.eviction("s", "b", &retention(10, 1));
        assert_eq!(eviction, Eviction { buried: vec!["a".into()], retained_from: Some(3) });
    }

    #[test]
    fn a_trim_and_a_burial_take_their_bytes_off_the_session() {
        let mut log = log_with(3);
        let s = || "s".to_owned();
        log.apply(&Change::Buried { session: s(), stream: "a".into() });
        log.apply(&Change::Trimmed {
            session: s(),
            stream: "b".into(),
            row: 99,
            retained_from: 3,
            before_retained: None,
        });
        assert_eq!(log.bytes(), 5);
        let b = log.stream("s", "b").expect("b");
        assert_eq!(b.range(), StreamRange { retained_from: 3, head: 3, state: StreamState::Live });
        assert!(log.stream("s", "a").is_none());
    }

    #[test]
    fn the_sweep_finds_ended_streams_by_their_stamp() {
        let mut log = log_with(1);
        let a = || vec![("s".to_owned(), "a".to_owned())];
        assert_eq!((log.unstamped(), log.due(i64::MAX - 1, 10)), (a(), vec![]), "not due before it is stamped");
        log.apply(&Change::Stamped { session: "s".into(), stream: "a".into(), at: 100 });
        assert_eq!((log.unstamped(), log.due(99, 10), log.due(100, 10)), (vec![], vec![], a()));
        log.apply(&Change::Buried { session: "s".into(), stream: "a".into() });
        assert_eq!(log.due(100, 10), vec![], "a buried stream is not due again");
    }
}
