//! The name of one replica: one process among those sharing a store, which relays requests,
//! answers and messages to the others by it.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// A replica's name: visible ASCII (no spaces, no separators), parsed once where it enters (the
/// command line, a store record, a message between replicas). Shared, not copied, when cloned.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaId(Arc<str>);

/// A replica name that is empty, too long, or not visible ASCII.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a replica name is 1 to {} visible ASCII characters", ReplicaId::MAX_LEN)]
pub struct InvalidReplicaId;

impl ReplicaId {
    /// Longest name accepted.
    pub const MAX_LEN: usize = 128;

    /// Parses a replica name.
    pub fn parse(s: &str) -> Result<ReplicaId, InvalidReplicaId> {
        if (1..=Self::MAX_LEN).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic()) {
            Ok(ReplicaId(Arc::from(s)))
        } else {
            Err(InvalidReplicaId)
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for ReplicaId {
    type Err = InvalidReplicaId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ReplicaId::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_name_is_visible_ascii_of_bounded_length() {
        assert_eq!(ReplicaId::parse("replica-a:1").map(|id| id.to_string()), Ok("replica-a:1".to_owned()));
        assert_eq!("r".parse::<ReplicaId>().map(|id| id.as_str().to_owned()), Ok("r".to_owned()));
        for bad in ["", "a b", "a\u{1f}b", "é", &"r".repeat(ReplicaId::MAX_LEN + 1)] {
            assert_eq!(ReplicaId::parse(bad), Err(InvalidReplicaId), "{bad:?}");
        }
        assert!(ReplicaId::parse(&"r".repeat(ReplicaId::MAX_LEN)).is_ok());
    }
}
