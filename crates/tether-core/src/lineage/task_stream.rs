//! The client's verdict on a task's event stream (`tasks/stream`, SEP-2694, with tether's digest
//! chain), event by event: the stream it follows is the task's one history, or it says how it
//! broke. A broken stream is never followed further: the task's canonical state (`tasks/get`)
//! decides instead.

use serde::{Deserialize, Serialize};

use super::Digest;
use crate::tasks::{TaskEvent, TaskStatus};

/// Where a follower is in a task's event stream: the last event it checked and handed on, and
/// its digest, which the next event must chain to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskCursor {
    /// The event's `seq`: the stream resumes `after` it.
    pub seq: u64,
    /// The event's digest (as text: lowercase hex).
    #[serde(with = "digest_text")]
    pub digest: Digest,
}

/// How a task's event stream broke.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TaskStreamBreak {
    /// The server no longer keeps the events after the cursor (`events_gone`).
    EventsGone {
        /// The cursor (`None`: from the start).
        after: Option<u64>,
        /// The oldest event it keeps, if it said.
        earliest: Option<u64>,
    },
    /// An event came out of order.
    Gap {
        /// The seq that had to come next.
        expected: u64,
        /// The seq that came.
        got: u64,
    },
    /// An event's digest does not chain to the previous event's: another history.
    Digest {
        /// The event's seq.
        seq: u64,
    },
    /// The stream's response came before the task's final status event: the server's history
    /// ends where the follower's did not.
    EndedEarly {
        /// The cursor (`None`: no event came).
        after: Option<u64>,
    },
}

/// Checks one task's event stream across its connections.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaskStreamValidator {
    task: String,
    cursor: Option<TaskCursor>,
    finished: bool,
}

impl TaskStreamValidator {
    /// A follower of task `task` from `cursor` (`None`: from its first event).
    pub fn new(task: impl Into<String>, cursor: Option<TaskCursor>) -> TaskStreamValidator {
        TaskStreamValidator {
            task: task.into(),
            cursor,
            finished: false,
        }
    }

    /// The last event checked.
    pub fn cursor(&self) -> Option<TaskCursor> {
        self.cursor
    }

    /// The `after` of the next connection: the last event checked.
    pub fn after(&self) -> Option<u64> {
        self.cursor.map(|cursor| cursor.seq)
    }

    /// Whether the task's final status event was checked.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Takes `event` in: it must be the next one and chain to the last checked. Once it fails,
    /// the stream is broken and nothing of it is to be trusted after the cursor.
    pub fn accept(&mut self, event: &TaskEvent) -> Result<(), TaskStreamBreak> {
        let expected = self.cursor.map_or(0, |cursor| cursor.seq + 1);
        if event.seq != expected {
            return Err(TaskStreamBreak::Gap {
                expected,
                got: event.seq,
            });
        }
        let previous = self.cursor.map(|cursor| cursor.digest);
        let chained = TaskEvent::digest_of(
            &self.task,
            previous.as_ref(),
            event.seq,
            &event.kind,
            &event.payload,
        );
        if event.digest != chained {
            return Err(TaskStreamBreak::Digest { seq: event.seq });
        }
        self.cursor = Some(TaskCursor {
            seq: event.seq,
            digest: event.digest,
        });
        self.finished = event.status().is_some_and(TaskStatus::is_final);
        Ok(())
    }

    /// The stream was refused with `events_gone` (the oldest event kept: `earliest`).
    pub fn gone(&self, earliest: Option<u64>) -> TaskStreamBreak {
        TaskStreamBreak::EventsGone {
            after: self.after(),
            earliest,
        }
    }

    /// The server ended the stream: with its response, or by refusing the cursor as past its
    /// history (`cursor_ahead`). The end of a stream whose final status event was checked; else
    /// a history that ends where the follower's does not.
    pub fn ended(&self) -> Result<(), TaskStreamBreak> {
        if self.finished {
            Ok(())
        } else {
            Err(TaskStreamBreak::EndedEarly {
                after: self.after(),
            })
        }
    }
}

/// A digest as text in a serialized [`TaskCursor`], as on the wire.
mod digest_text {
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    use super::Digest;

    pub fn serialize<S: Serializer>(digest: &Digest, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(digest)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Digest, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::tasks::{NOTIFICATION_EVENT, STATUS_EVENT};

    fn history(task: &str) -> Vec<TaskEvent> {
        let payloads = [
            (STATUS_EVENT, json!({"status": "working"})),
            (
                NOTIFICATION_EVENT,
                json!({"method": "notifications/message"}),
            ),
            (STATUS_EVENT, json!({"status": "completed"})),
        ];
        TaskEvent::chain(task, payloads)
    }

    #[test]
    fn the_task_s_own_history_is_accepted_to_its_end() {
        let mut validator = TaskStreamValidator::new("t", None);
        for event in history("t") {
            assert_eq!(
                validator.ended(),
                Err(TaskStreamBreak::EndedEarly {
                    after: validator.after()
                })
            );
            validator.accept(&event).expect("its own history");
        }
        assert!(validator.finished());
        assert_eq!(validator.after(), Some(2));
        assert_eq!(validator.ended(), Ok(()));
    }

    #[test]
    fn a_gap_a_foreign_chain_or_another_task_s_events_break_the_stream() {
        let events = history("t");
        let mut validator = TaskStreamValidator::new("t", None);
        assert_eq!(
            validator.accept(&events[1]),
            Err(TaskStreamBreak::Gap {
                expected: 0,
                got: 1
            })
        );
        validator.accept(&events[0]).expect("first");
        let mut forged = events[1].clone();
        forged.payload = json!({"method": "notifications/other"});
        assert_eq!(
            validator.accept(&forged),
            Err(TaskStreamBreak::Digest { seq: 1 })
        );
        assert_eq!(validator.after(), Some(0), "a broken event moves nothing");
        let mut other_task = TaskStreamValidator::new("u", None);
        assert_eq!(
            other_task.accept(&events[0]),
            Err(TaskStreamBreak::Digest { seq: 0 })
        );
    }

    #[test]
    fn a_resumed_follower_chains_from_its_cursor() {
        let events = history("t");
        let cursor = TaskCursor {
            seq: 0,
            digest: events[0].digest,
        };
        let mut validator = TaskStreamValidator::new("t", Some(cursor));
        validator.accept(&events[1]).expect("the next event");
        assert_eq!(
            validator.cursor(),
            Some(TaskCursor {
                seq: 1,
                digest: events[1].digest
            })
        );
        assert_eq!(
            validator.gone(Some(5)),
            TaskStreamBreak::EventsGone {
                after: Some(1),
                earliest: Some(5)
            }
        );
        assert!(!validator.finished());
    }

    #[test]
    fn a_cursor_reads_back_as_it_was_written() {
        let cursor = TaskCursor {
            seq: 3,
            digest: history("t")[0].digest,
        };
        let text = serde_json::to_string(&cursor).expect("serializes");
        assert!(text.contains(&cursor.digest.to_string()), "{text}");
        assert_eq!(
            serde_json::from_str::<TaskCursor>(&text).expect("parses"),
            cursor
        );
    }
}
