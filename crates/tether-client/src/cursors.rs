//! What the client remembers of its session's streams, kept in one place with the invariant the
//! checkpoint file relies on: where each stream resumes from (what arrived), what the
//! application processed (what the file keeps), and the requests still pending.

use std::collections::BTreeMap;

use tether_core::jsonrpc::RequestId;
use tether_core::lineage::Checkpoint;

use crate::checkpoint::{CheckpointFile, StreamCursor, TaskCursor};

/// The key of the standalone stream.
pub(crate) const STANDALONE: &str = "get";

/// The key of a request's stream.
pub(crate) fn stream_key(id: &RequestId) -> String {
    format!("request:{id}")
}

/// The session's cursors. Changed only through these methods, under the client's lock: a cursor
/// is committed only for a stream still followed (a finished request's stream, or one of a
/// replaced session, commits nothing), so the file never names a stream nobody follows.
#[derive(Debug, Default)]
pub(crate) struct Cursors {
    /// The session, its epoch and version, the cursor of what arrived on each stream, and the
    /// requests pending.
    arrived: CheckpointFile,
    /// The cursor of what the application processed on each stream: what the file keeps, so a
    /// restarted client gets again what arrived but was never processed.
    committed: BTreeMap<String, StreamCursor>,
}

impl Cursors {
    /// The cursors of a checkpoint file: its session and its standalone stream. Requests a
    /// previous process sent cannot be waited for by anyone now, so their streams are dropped.
    pub fn from_file(mut file: CheckpointFile) -> Cursors {
        file.streams.retain(|key, _| key == STANDALONE);
        file.pending.clear();
        Cursors { committed: file.streams.clone(), arrived: file }
    }

    /// The session the cursors belong to.
    pub fn session_id(&self) -> Option<&str> {
        self.arrived.session_id.as_deref()
    }

    /// The session's negotiated protocol version.
    pub fn protocol_version(&self) -> Option<&str> {
        self.arrived.protocol_version.as_deref()
    }

    /// A session was initialized: the cursors belong to it from now on.
    pub fn initialized(&mut self, session_id: Option<String>, epoch: Option<String>, protocol_version: String) {
        self.arrived.session_id = session_id;
        self.arrived.epoch = epoch;
        self.arrived.protocol_version = Some(protocol_version);
    }

    /// The session was replaced: nothing of it is resumed. Tasks are no session's: their cursors
    /// stay.
    pub fn clear(&mut self) {
        let tasks = std::mem::take(&mut self.arrived.tasks);
        *self = Cursors::default();
        self.arrived.tasks = tasks;
    }

    /// Where task `id`'s event stream resumes, if it is being followed.
    pub fn task(&self, id: &str) -> Option<TaskCursor> {
        self.arrived.tasks.get(id).copied()
    }

    /// An event of task `id` was checked and handed on: the stream resumes after it.
    pub fn task_arrived(&mut self, id: &str, cursor: TaskCursor) {
        self.arrived.tasks.insert(id.to_owned(), cursor);
    }

    /// Task `id` finished: nothing of it is followed any more.
    pub fn task_finished(&mut self, id: &str) {
        self.arrived.tasks.remove(id);
    }

    /// Request `id` was sent.
    pub fn sent(&mut self, id: &RequestId, method: &str) {
        self.arrived.pending.insert(id.to_string(), method.to_owned());
    }

    /// An event arrived on stream `key`: a reconnect resumes after it.
    pub fn arrived(&mut self, key: &str, cursor: StreamCursor) {
        self.arrived.streams.insert(key.to_owned(), cursor);
    }

    /// The application processed stream `key` up to `cursor`. `false`, and nothing changes, if
    /// the stream is no longer followed.
    pub fn commit(&mut self, key: &str, cursor: StreamCursor) -> bool {
        if !self.arrived.streams.contains_key(key) {
            return false;
        }
        self.committed.insert(key.to_owned(), cursor);
        true
    }

    /// Request `id` ended: its stream has nothing left to resume.
    pub fn finished(&mut self, id: &RequestId) {
        let key = stream_key(id);
        self.arrived.pending.remove(&id.to_string());
        self.arrived.streams.remove(&key);
        self.committed.remove(&key);
    }

    /// The id stream `key` resumes after: its `Last-Event-ID`.
    pub fn last_id(&self, key: &str) -> Option<String> {
        self.arrived.streams.get(key).map(|cursor| cursor.last_id.to_string())
    }

    /// What a resume of stream `key` is judged against.
    pub fn lineage(&self, key: &str) -> Option<Checkpoint> {
        self.arrived.lineage(key)
    }

    /// What the file keeps: the session and the committed cursors.
    pub fn file(&self) -> CheckpointFile {
        CheckpointFile { streams: self.committed.clone(), ..self.arrived.clone() }
    }
}

#[cfg(test)]
mod tests {
    use tether_core::lineage::{Digest, ObservedId};

    use super::*;

    fn cursor(id: &str) -> StreamCursor {
        StreamCursor { last_id: ObservedId::parse(id), digest: Digest::of(id, b"x") }
    }

    #[test]
    fn the_file_keeps_what_was_processed_not_what_arrived() {
        let mut cursors = Cursors::default();
        cursors.initialized(Some("s".into()), Some("e".into()), "2025-11-25".into());
        cursors.arrived(STANDALONE, cursor("e:g:1"));
        cursors.arrived(STANDALONE, cursor("e:g:2"));
        assert!(cursors.commit(STANDALONE, cursor("e:g:1")));
        assert_eq!(cursors.last_id(STANDALONE).as_deref(), Some("e:g:2"));
        assert_eq!(cursors.file().streams.get(STANDALONE), Some(&cursor("e:g:1")));
        assert_eq!(cursors.file().session_id.as_deref(), Some("s"));
    }

    #[test]
    fn a_finished_requests_stream_commits_nothing() {
        let mut cursors = Cursors::default();
        let id = RequestId::Number(1);
        cursors.sent(&id, "tools/call");
        cursors.arrived(&stream_key(&id), cursor("e:r:1"));
        cursors.finished(&id);
        assert!(!cursors.commit(&stream_key(&id), cursor("e:r:1")), "a finished stream took a commit");
        let file = cursors.file();
        assert!(file.streams.is_empty() && file.pending.is_empty(), "{file:?}");
        assert_eq!(cursors.last_id(&stream_key(&id)), None);
    }

    #[test]
    fn a_restarted_client_resumes_only_the_standalone_stream() {
        let mut file = CheckpointFile { session_id: Some("s".into()), ..CheckpointFile::default() };
        file.streams.insert(STANDALONE.into(), cursor("e:g:4"));
        file.streams.insert(stream_key(&RequestId::Number(2)), cursor("e:r:2"));
        file.pending.insert("2".into(), "tools/call".into());
        let cursors = Cursors::from_file(file);
        assert_eq!(cursors.last_id(STANDALONE).as_deref(), Some("e:g:4"));
        assert_eq!(cursors.last_id(&stream_key(&RequestId::Number(2))), None);
        assert!(cursors.file().pending.is_empty());
        assert_eq!(cursors.session_id(), Some("s"));
    }
}
