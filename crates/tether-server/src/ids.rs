//! Identifiers the server mints: session ids, epochs and stream names, all from the OS CSPRNG.

use tether_core::input_required::StateKey;
use tether_core::lineage::{Epoch, SessionId, StreamName, base64url, push_base64url};
use tether_core::tasks::TaskId;

/// The OS random source failed; nothing safe can be minted.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the OS random number generator failed: {0}")]
pub struct RandomError(String);

fn random<const N: usize>() -> Result<[u8; N], RandomError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| RandomError(e.to_string()))?;
    Ok(bytes)
}

/// A session id: 192 random bits as 32 base64url characters (visible ASCII, never reused).
pub fn session_id() -> Result<SessionId, RandomError> {
    // base64url is visible ASCII, and 32 characters are within the length bound.
    SessionId::parse(&base64url(&random::<24>()?)).map_err(|e| RandomError(e.to_string()))
}

/// A fresh replay epoch (128 random bits).
pub fn epoch() -> Result<Epoch, RandomError> {
    Ok(Epoch::from_entropy(random::<16>()?))
}

/// A stream name: `prefix` and 64 bits, unique within a session without coordination between
/// replicas or across restarts. Each process counts up from a random 64-bit start, so names
/// cost no system call (a stream per request) and two processes' names coincide only if their
/// starts fall within a few million of each other: odds of about 2^-40. Stream names are not
/// secrets; the session id is.
pub fn stream_name(prefix: char) -> Result<StreamName, RandomError> {
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let start = match START.get() {
        Some(start) => *start,
        None => {
            // A failed draw leaves START unset, so the next call draws again.
            let drawn = u64::from_le_bytes(random::<8>()?);
            *START.get_or_init(|| drawn)
        }
    };
    let n = start.wrapping_add(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let mut name = String::with_capacity(12);
    name.push(prefix);
    push_base64url(&mut name, &n.to_be_bytes());
    // The prefix is one of the server's own ASCII letters and base64url stays in the token alphabet.
    StreamName::parse(&name).map_err(|e| RandomError(e.to_string()))
}

/// A fresh key for sealing request states (256 random bits).
pub fn state_key() -> Result<StateKey, RandomError> {
    Ok(StateKey::new(random::<32>()?))
}

/// A process-unique token for ids of server-to-client requests.
pub fn token() -> Result<String, RandomError> {
    Ok(base64url(&random::<9>()?))
}

/// A fresh task id: a [`token`], which is always a valid one.
pub fn task_id() -> Result<TaskId, RandomError> {
    TaskId::parse(&token()?).map_err(|e| RandomError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_long_visible_ascii_and_distinct() {
        let a = session_id().expect("random");
        let b = session_id().expect("random");
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| (0x21..=0x7e).contains(&c)));
    }

    #[test]
    fn stream_names_and_epochs_are_valid_lineage_parts() {
        assert!(stream_name('r').expect("random").as_str().starts_with('r'));
        let names: std::collections::HashSet<_> = (0..1000).map(|_| stream_name('r').expect("random")).collect();
        assert_eq!(names.len(), 1000, "stream names are distinct");
        assert_eq!(epoch().expect("random").as_str().len(), 22);
    }
}
