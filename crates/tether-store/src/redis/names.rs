//! The names of tether's keys in Redis, per session, stream, request, replica and task.

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
    format!("tether:owned-keys:{owner}")
}
/// The tasks `owner` runs and has not finished.
pub(super) fn owned_tasks_key(owner: &str) -> String {
    format!("tether:owned-tasks:{owner}")
}
/// The tasks of every principal that run, by creation time: counted against `--max-tasks`.
pub(super) const RUNNING_TASKS: &str = "tether:tasks-running";
/// The tasks of `principal` that run (`-` for none, `+` and the name for one).
pub(super) fn running_tasks_key(principal: Option<&str>) -> String {
    match principal {
        None => "tether:tasks-running:-".to_owned(),
        Some(name) => format!("tether:tasks-running:+{name}"),
    }
}

/// A request's stream as a member of its owner's set (the sweep splits it at `SEP`).
pub(super) fn owned_member(session: &str, stream: &str) -> String {
    format!("{session}{SEP}{stream}")
}
pub(super) fn key_record(key: &str) -> String {
    format!("tether:k:{{{key}}}")
}
pub(super) fn task_key(id: &str) -> String {
    format!("tether:task:{id}")
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
