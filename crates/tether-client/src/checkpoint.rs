//! What the client must remember to prove continuity: the session, its replay epoch, and per
//! stream the last processed event id and its digest. Kept in memory and, when configured, in a
//! file replaced atomically and fsynced, so a restarted client checks continuity too.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tether_core::lineage::{Checkpoint, Digest, ObservedId};

/// The cursor of one stream, parsed once (when the event arrived, or when the file was read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamCursor {
    /// The last processed event's id: the `Last-Event-ID` of a resume.
    #[serde(with = "as_text")]
    pub last_id: ObservedId,
    /// Its digest (in the file: lowercase hex SHA-256 of `"{id}:"` + data).
    #[serde(with = "as_text")]
    pub digest: Digest,
}

pub use tether_core::lineage::TaskCursor;

/// Ids and digests are text in the file, as on the wire.
mod as_text {
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    pub fn serialize<T: Display, S: Serializer>(value: &T, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(value)
    }

    pub fn deserialize<'de, T, D>(deserializer: D) -> Result<T, D::Error>
    where
        T: FromStr<Err: Display>,
        D: Deserializer<'de>,
    {
        String::deserialize(deserializer)?.parse().map_err(D::Error::custom)
    }
}

/// The persisted state of a client: what its checkpoint file holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointFile {
    /// The session id, once initialized.
    pub session_id: Option<String>,
    /// The replay epoch the server advertised, if any.
    pub epoch: Option<String>,
    /// The negotiated protocol version.
    pub protocol_version: Option<String>,
    /// Cursors by stream key (`get` for the standalone stream, `request:<id>` for a request's).
    pub streams: BTreeMap<String, StreamCursor>,
    /// Requests sent but not answered, by id, with their method.
    pub pending: BTreeMap<String, String>,
    /// Tasks being followed, by id: where each one's event stream resumes. Tasks outlive
    /// sessions, so a new session keeps them.
    #[serde(default)]
    pub tasks: BTreeMap<String, TaskCursor>,
}

/// Why a checkpoint file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file system failed.
    #[error("checkpoint file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// The file is not a checkpoint.
    #[error("checkpoint file {path} is not valid: {source}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: serde_json::Error,
    },
}

impl CheckpointFile {
    /// Loads a checkpoint file; a missing file is an empty checkpoint.
    pub fn load(path: &Path) -> Result<CheckpointFile, CheckpointError> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|source| CheckpointError::Invalid { path: path.to_owned(), source }),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(CheckpointFile::default()),
            Err(source) => Err(CheckpointError::Io { path: path.to_owned(), source }),
        }
    }

    /// Replaces the file atomically: write a sibling, fsync it, rename it over, fsync the
    /// directory. A crash leaves either the old or the new checkpoint, never a torn one.
    pub fn save(&self, path: &Path) -> Result<(), CheckpointError> {
        let io = |source| CheckpointError::Io { path: path.to_owned(), source };
        let tmp = path.with_extension("tmp");
        let bytes = serde_json::to_vec_pretty(self)
            .map_err(|source| CheckpointError::Invalid { path: path.to_owned(), source })?;
        let mut file = std::fs::File::create(&tmp).map_err(io)?;
        file.write_all(&bytes).map_err(io)?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)?;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        Ok(())
    }

    /// The lineage checkpoint of a stream, for the continuity verdict.
    pub fn lineage(&self, stream: &str) -> Option<Checkpoint> {
        let cursor = self.streams.get(stream)?;
        Some(Checkpoint {
            session_id: self.session_id.clone()?,
            epoch: self.epoch.clone(),
            last_id: cursor.last_id.clone(),
            last_digest: cursor.digest,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_and_load_round_trip() {
        let dir = std::env::temp_dir().join(format!("tether-checkpoint-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("cp.json");
        assert_eq!(CheckpointFile::load(&path).expect("missing is empty"), CheckpointFile::default());
        let mut cp =
            CheckpointFile { session_id: Some("s".into()), epoch: Some("e".into()), ..CheckpointFile::default() };
        cp.streams.insert(
            "get".into(),
            StreamCursor { last_id: ObservedId::parse("e:g:3"), digest: Digest::of("e:g:3", b"x") },
        );
        cp.save(&path).expect("save");
        assert_eq!(CheckpointFile::load(&path).expect("load"), cp);
        assert!(!path.with_extension("tmp").exists());
        let lineage = cp.lineage("get").expect("cursor");
        assert_eq!(lineage.last_digest, Digest::of("e:g:3", b"x"));
        let text: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
        assert_eq!(text["streams"]["get"]["last_id"], "e:g:3", "ids are text in the file");
        assert_eq!(text["streams"]["get"]["digest"], Digest::of("e:g:3", b"x").to_string());
        std::fs::write(&path, b"{").expect("write");
        assert!(matches!(CheckpointFile::load(&path), Err(CheckpointError::Invalid { .. })));
        let bad_digest = r#"{"session_id":"s","epoch":null,"protocol_version":null,"pending":{},
            "streams":{"get":{"last_id":"e:g:3","digest":"not hex"}}}"#;
        std::fs::write(&path, bad_digest).expect("write");
        assert!(
            matches!(CheckpointFile::load(&path), Err(CheckpointError::Invalid { .. })),
            "a digest is checked when read"
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    /// A checkpoint whose cursors all carry `tag`, large enough that writing it takes many
    /// system calls.
    fn large(tag: &str) -> CheckpointFile {
        let mut cp = CheckpointFile { session_id: Some(tag.into()), ..CheckpointFile::default() };
        for n in 0..2_000 {
            let id = format!("{tag}:g{n}:{n}");
            cp.streams.insert(
                format!("request:{n}"),
                StreamCursor { digest: Digest::of(&id, b"x"), last_id: ObservedId::parse(&id) },
            );
        }
        cp
    }

    #[test]
    fn a_reader_never_sees_a_torn_checkpoint_and_a_crashed_save_changes_nothing() {
        let dir = std::env::temp_dir().join(format!("tether-checkpoint-torn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("cp.json");
        let (a, b) = (large("a"), large("b"));
        a.save(&path).expect("save");
        let stop = std::sync::atomic::AtomicBool::new(false);
        let reads = std::thread::scope(|scope| {
            let reader = scope.spawn(|| {
                let mut reads = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let read = CheckpointFile::load(&path).expect("never a torn file");
                    assert!(read == a || read == b, "a checkpoint that was saved");
                    reads += 1;
                }
                reads
            });
            for n in 0..100 {
                if n % 2 == 0 { &b } else { &a }.save(&path).expect("save");
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            reader.join().expect("reader")
        });
        assert!(reads > 0);
        // A save that died before its rename left a partial sibling: the checkpoint is the last
        // one saved.
        std::fs::write(path.with_extension("tmp"), br#"{"session_id": "torn"#).expect("write");
        assert_eq!(CheckpointFile::load(&path).expect("load"), a);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
