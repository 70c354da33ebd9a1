//! What the embedded store keeps in memory so that reads never wait for SQLite: the status of
//! sessions, every stream of the live sessions as a durable [`Log`] (what their rows say once
//! durable), and the data of recently appended events.
//!
//! The directory belongs to one process, so every change passes through the store's writer
//! thread, which hands it to the mirror after each commit is durable, in commit order: the
//! mirror's log is always what a crash would leave. A session status read from SQLite is kept
//! only if no session changed meanwhile (the generation), so a read that raced a commit cannot
//! put back what the commit replaced. Event data not cached is read by row id.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;
use tether_core::lineage::{StreamRange, Tag};

use super::log::{Change, Log, Retained, Stream};
use crate::parted::PartedMap;
use crate::record::{SessionStatus, StoredEvent, StreamPage};

/// Sessions kept; past this, an arbitrary one is forgotten (idle sessions cost memory; busy
/// ones come back on their next read).
const MAX_SESSIONS: usize = 1_024;
/// Event data kept, in bytes: past this, the data appended first is forgotten (read again by
/// row id).
const MAX_CACHED: usize = 4 << 20;

/// The data of recently appended events, by row.
#[derive(Default)]
struct Cache {
    data: PartedMap<i64, Bytes>,
    /// Rows in the order they were cached, for the bound (may name forgotten ones).
    order: VecDeque<i64>,
    bytes: usize,
}

#[derive(Default)]
struct Sessions {
    generation: u64,
    map: HashMap<String, SessionStatus>,
}

/// The embedded store's in-memory mirror.
#[derive(Default)]
pub(crate) struct Mirror {
    sessions: Mutex<Sessions>,
    log: Mutex<Log>,
    cache: Mutex<Cache>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update leaves the maps consistent: still usable after a panic elsewhere.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Mirror {
    /// The session's status, if kept.
    pub fn session(&self, id: &str) -> Option<SessionStatus> {
        lock(&self.sessions).map.get(id).cloned()
    }

    /// Taken before reading a session from SQLite, for [`Mirror::offer_session`].
    pub fn session_generation(&self) -> u64 {
        lock(&self.sessions).generation
    }

    /// Keeps a session read from SQLite, unless a session changed since `generation`.
    pub fn offer_session(&self, id: &str, status: &SessionStatus, generation: u64) {
        let mut sessions = lock(&self.sessions);
        if sessions.generation == generation {
            insert_session(&mut sessions, id, status.clone());
        }
    }

    /// Writer: a session's status changed.
    pub fn set_session(&self, id: &str, status: SessionStatus) {
        let mut sessions = lock(&self.sessions);
        sessions.generation += 1;
        insert_session(&mut sessions, id, status);
    }

    /// Writer: a live session was renewed at `now_ms`.
    pub fn touched(&self, id: &str, now_ms: u64) {
        let mut sessions = lock(&self.sessions);
        sessions.generation += 1;
        if let Some(SessionStatus::Live(record)) = sessions.map.get_mut(id) {
            record.expires_at_ms = now_ms.saturating_add(record.idle_ttl_ms);
        }
    }

    /// Writer: the session expired; its status is read again from SQLite (its streams went
    /// with a [`Change::SessionRemoved`]).
    pub fn forget_session(&self, id: &str) {
        let mut sessions = lock(&self.sessions);
        sessions.generation += 1;
        sessions.map.remove(id);
    }

    /// Writer: the sweep deleted tombstones; forget every ended session (they are read again).
    pub fn forget_ended_sessions(&self) {
        let mut sessions = lock(&self.sessions);
        sessions.generation += 1;
        sessions.map.retain(|_, status| matches!(status, SessionStatus::Live(_)));
    }

    /// Starts from `log`, what the file holds at open.
    pub fn starting_from(log: Log) -> Mirror {
        Mirror { log: Mutex::new(log), ..Mirror::default() }
    }

    /// Writer: a commit holding `changes` is durable.
    pub fn apply(&self, changes: &[Change]) {
        lock(&self.log).apply_all(changes);
    }

    /// Writer: `rows` were appended with this data.
    pub fn cache(&self, rows: impl IntoIterator<Item = (i64, Bytes)>) {
        let mut cache = lock(&self.cache);
        for (row, data) in rows {
            cache.bytes += data.len();
            if let Some(replaced) = cache.data.insert(row, data) {
                cache.bytes -= replaced.len();
            }
            cache.order.push_back(row);
        }
        while cache.bytes > MAX_CACHED {
            let Some(oldest) = cache.order.pop_front() else { break };
            if let Some(forgotten) = cache.data.remove(&oldest) {
                cache.bytes -= forgotten.len();
            }
        }
    }

    /// The stream's range, if the stream is live.
    pub fn stream_range(&self, session: &str, stream: &str) -> Option<StreamRange> {
        lock(&self.log).stream(session, stream).map(Stream::range)
    }

    /// The key of the request the stream answers, if the stream is live.
    pub fn stream_request(&self, session: &str, stream: &str) -> Option<Option<String>> {
        lock(&self.log).stream(session, stream).map(|s| s.request_key.clone())
    }

    /// The bytes the live sessions retain.
    pub fn retained_bytes(&self) -> u64 {
        lock(&self.log).bytes()
    }

    /// [`EventLog::read_page`](crate::EventLog::read_page) of a live stream: the events whose
    /// data is not cached are given by row, to read from SQLite.
    pub fn read_page(&self, session: &str, stream: &str, after: u64, max: usize) -> Option<Page> {
        let log = lock(&self.log);
        let slot = log.stream(session, stream)?;
        let range = slot.range();
        let at_cursor = slot.tag_at(after);
        let before_retained = slot.before_retained;
        let retained: Vec<Retained> = slot.events_after(after, max).copied().collect();
        drop(log);
        let cache = lock(&self.cache);
        let events = retained
            .into_iter()
            .map(|e| {
                let data = match e.row {
                    None => Some(Bytes::new()),
                    Some(row) => cache.data.get(&row).cloned(),
                };
                (e, data)
            })
            .collect();
        Some(Page { range, at_cursor, before_retained, events })
    }
}

/// A stream's page as the mirror has it.
pub(crate) struct Page {
    pub range: StreamRange,
    pub at_cursor: Option<Tag>,
    pub before_retained: Option<Tag>,
    /// Each event with its data, if cached.
    pub events: Vec<(Retained, Option<Bytes>)>,
}

impl Page {
    /// The page, with the data not cached taken from `fetched` (by row); `None` if some is not
    /// there.
    pub fn filled(self, fetched: &HashMap<i64, Bytes>) -> Option<StreamPage> {
        let events = self
            .events
            .into_iter()
            .map(|(event, data)| {
                let data = data.or_else(|| fetched.get(&event.row?).cloned())?;
                Some(StoredEvent { seq: event.seq, tag: event.tag, data })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(StreamPage { range: self.range, at_cursor: self.at_cursor, before_retained: self.before_retained, events })
    }
}

fn insert_session(sessions: &mut Sessions, id: &str, status: SessionStatus) {
    if sessions.map.len() >= MAX_SESSIONS
        && !sessions.map.contains_key(id)
        && let Some(victim) = sessions.map.keys().next().cloned()
    {
        sessions.map.remove(&victim);
    }
    sessions.map.insert(id.to_owned(), status);
}
