//! The clock every expiry is measured on.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch: the clock every expiry is measured on.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
