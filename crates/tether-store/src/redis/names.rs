//! The names of tether's keys in Redis, per session, stream, request, replica and task.
//!
//! What one script or transaction touches shares a hash tag, so it lies in one slot of a
//! cluster: a session's keys `{session}`, the idempotency records `{records}`, the tasks
//! `{tasks}`, the counters `{counters}`. The rest are single keys, each touched by commands of
//! their own.

use super::*;

pub(super) fn meta(session: &str) -> String {
    format!("tether:{{{session}}}:m")
}
pub(super) fn stream_key(session: &str, stream: &str) -> String {
    format!("tether:{{{session}}}:s:{stream}")
}
pub(super) fn events_key(session: &str, stream: &str) -> String {
    format!("tether:{{{session}}}:e:{stream}")
}
pub(super) fn requests_key(session: &str) -> String {
    format!("tether:{{{session}}}:r")
}
/// The keys of [`requests_key`]'s hash, oldest first, for its bound.
pub(super) fn request_order_key(session: &str) -> String {
    format!("tether:{{{session}}}:ro")
}
pub(super) fn streams_key(session: &str) -> String {
    format!("tether:{{{session}}}:streams")
}
pub(super) fn owned_key(owner: &str) -> String {
    format!("tether:owned:{owner}")
}
/// The idempotency keys `owner` claimed and has not finished.
pub(super) fn owned_keys_key(owner: &str) -> String {
    format!("{RECORDS}:owned-keys:{owner}")
}
/// The tasks `owner` runs and has not finished.
pub(super) fn owned_tasks_key(owner: &str) -> String {
    format!("{TASKS}:owned:{owner}")
}
/// The tasks of every principal that run, by creation time: counted against `--max-tasks`.
pub(super) const RUNNING_TASKS: &str = "tether:{tasks}:running";
/// The tasks of `principal` that run (`-` for none, `+` and the name for one).
pub(super) fn running_tasks_key(principal: Option<&str>) -> String {
    match principal {
        None => format!("{RUNNING_TASKS}:-"),
        Some(name) => format!("{RUNNING_TASKS}:+{name}"),
    }
}

/// A request's stream as a member of its owner's set (the sweep splits it at `SEP`).
pub(super) fn owned_member(session: &str, stream: &str) -> String {
    format!("{session}{SEP}{stream}")
}
pub(super) fn key_record(key: &str) -> String {
    format!("{RECORDS}:k:{key}")
}
pub(super) fn task_key(id: &str) -> String {
    format!("{TASKS}:task:{id}")
}
/// The channel a session's appends and stream ends are announced on in a cluster: sharded, in
/// the session's slot, so the script that appends publishes it.
pub(super) fn notify_channel(session: &str) -> String {
    format!("tether:{{{session}}}:n")
}
/// The session whose [`notify_channel`] `channel` is.
pub(super) fn notified_session(channel: &str) -> Option<&str> {
    channel.strip_prefix("tether:{")?.strip_suffix("}:n")
}

pub(super) fn counter_op_key(op: &str) -> String {
    format!("{COUNTERS}:once:{op}")
}

pub(super) fn retiring_session(session: &str) -> String {
    format!("m{SEP}{session}")
}

pub(super) fn retiring_stream(session: &str, stream: &str) -> String {
    format!("s{SEP}{session}{SEP}{stream}")
}

pub(super) fn notification_prefix(session: &str, stream: &str) -> String {
    format!("{session}{SEP}{stream}{SEP}")
}
