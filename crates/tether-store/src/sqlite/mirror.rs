//! What the embedded store keeps in memory so that the reads of a request's life never reach
//! SQLite: the status of sessions, and the streams this process opened, with their events.
//!
//! The directory belongs to one process, so every change passes through the store's writer
//! thread, which updates the mirror after each commit, in commit order: an entry is always
//! what SQLite holds. A miss reads SQLite; forgetting an entry is always safe. A session read
//! from SQLite is kept only if no session changed meanwhile (the generation), so a read that
//! raced a commit cannot put back what the commit replaced.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;
use tether_core::lineage::{StreamName, StreamRange, StreamState, Tag};

use crate::record::{SessionStatus, StoredEvent, StreamPage};

/// Sessions kept; past this, an arbitrary one is forgotten (idle sessions cost memory; busy
/// ones come back on their next read).
const MAX_SESSIONS: usize = 1_024;
/// Streams kept; past this, the oldest opened is forgotten.
const MAX_STREAMS: usize = 1_024;
/// Events and bytes kept per stream; a longer stream is forgotten (its reads go to SQLite).
/// With [`MAX_STREAMS`], the mirror holds at most 32 MiB of events.
const MAX_EVENTS: usize = 1_024;
const MAX_BYTES: usize = 32 << 10;

type StreamKey = (String, String);

/// A stream as SQLite holds it. It is kept from its opening, and forgotten at its first gap or
/// trim, so it holds every event from seq 1 (event `i` has seq `i + 1`) and the sentinel is
/// still retained (`retained_from` 0).
struct Tail {
    /// The tag of the priming event (seq 0).
    primed: Tag,
    events: Vec<(Tag, Bytes)>,
    bytes: usize,
    state: StreamState,
}

impl Tail {
    fn head(&self) -> u64 {
        self.events.len() as u64
    }
}

#[derive(Default)]
struct Sessions {
    generation: u64,
    map: HashMap<String, SessionStatus>,
}

#[derive(Default)]
struct Streams {
    map: HashMap<StreamKey, Tail>,
    /// In the order they were opened, for the bound (may name forgotten streams).
    order: VecDeque<StreamKey>,
}

/// The embedded store's in-memory mirror.
#[derive(Default)]
pub(crate) struct Mirror {
    sessions: Mutex<Sessions>,
    streams: Mutex<Streams>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update leaves the maps consistent: still usable after a panic elsewhere.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn key(session: &str, stream: &str) -> StreamKey {
    (session.to_owned(), stream.to_owned())
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

    /// Writer: the session expired; it and its streams are read again from SQLite.
    pub fn forget_session(&self, id: &str) {
        let mut sessions = lock(&self.sessions);
        sessions.generation += 1;
        sessions.map.remove(id);
        drop(sessions);
        self.forget_streams_of(id);
    }

    /// Writer: the sweep deleted tombstones; forget every ended session (they are read again).
    pub fn forget_ended_sessions(&self) {
        let mut sessions = lock(&self.sessions);
        sessions.generation += 1;
        sessions.map.retain(|_, status| matches!(status, SessionStatus::Live(_)));
    }

    /// The stream's range, if kept.
    pub fn stream_range(&self, session: &str, stream: &str) -> Option<StreamRange> {
        let streams = lock(&self.streams);
        let tail = streams.map.get(&key(session, stream))?;
        Some(StreamRange { retained_from: 0, head: tail.head(), state: tail.state })
    }

    /// [`EventLog::read_page`](crate::EventLog::read_page), if the stream is kept.
    pub fn read_page(&self, session: &str, stream: &str, after: u64, max: usize) -> Option<StreamPage> {
        let streams = lock(&self.streams);
        let tail = streams.map.get(&key(session, stream))?;
        let range = StreamRange { retained_from: 0, head: tail.head(), state: tail.state };
        let at_cursor = match usize::try_from(after).ok()? {
            0 => Some(tail.primed),
            n => tail.events.get(n - 1).map(|(tag, _)| *tag),
        };
        let skip = usize::try_from(after).unwrap_or(usize::MAX);
        let events = tail.events.iter().zip(1..).skip(skip).take(max);
        let events = events.map(|((tag, data), seq)| StoredEvent { seq, tag: *tag, data: data.clone() }).collect();
        Some(StreamPage { range, at_cursor, before_retained: None, events })
    }

    /// Writer: a new stream (head 0, only the sentinel retained).
    pub fn stream_opened(&self, session: &str, stream: &StreamName) {
        let primed = Tag::priming(stream);
        let mut streams = lock(&self.streams);
        let key = key(session, stream.as_str());
        if streams.map.contains_key(&key) {
            return;
        }
        streams.map.insert(key.clone(), Tail { primed, events: Vec::new(), bytes: 0, state: StreamState::Live });
        streams.order.push_back(key);
        while streams.map.len() > MAX_STREAMS || streams.order.len() > 2 * MAX_STREAMS {
            let Some(oldest) = streams.order.pop_front() else { break };
            streams.map.remove(&oldest);
        }
    }

    /// Writer: `events` were appended after `head - events.len()`, ending the stream if `last`.
    pub fn appended(&self, session: &str, stream: &str, head: u64, events: &[(Tag, Bytes)], last: bool) {
        let mut streams = lock(&self.streams);
        let key = key(session, stream);
        let Some(tail) = streams.map.get_mut(&key) else { return };
        let bytes = tail.bytes + events.iter().map(|(_, data)| data.len()).sum::<usize>();
        let count = tail.events.len() + events.len();
        if count as u64 != head || count > MAX_EVENTS || bytes > MAX_BYTES {
            streams.map.remove(&key);
            return;
        }
        tail.bytes = bytes;
        tail.events.extend_from_slice(events);
        if last {
            tail.state = StreamState::Complete;
        }
    }

    /// Writer: a live stream ended without more events.
    pub fn stream_ended(&self, session: &str, stream: &str) {
        if let Some(tail) = lock(&self.streams).map.get_mut(&key(session, stream))
            && tail.state == StreamState::Live
        {
            tail.state = StreamState::Complete;
        }
    }

    /// Writer: the stream lost events to retention, or was deleted.
    pub fn forget_stream(&self, session: &str, stream: &str) {
        lock(&self.streams).map.remove(&key(session, stream));
    }

    /// Writer: the session's streams were deleted.
    pub fn forget_streams_of(&self, session: &str) {
        lock(&self.streams).map.retain(|(s, _), _| s != session);
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
