//! A task's event stream as a model: a task whose events a store keeps (the newest
//! [`RETAINED`]), the store going back in time once (a restored backup, a failover to a lagging
//! replica) after which the task's run goes on from what the store holds, a network that cuts
//! the client's connections, and a client that follows the stream across them. The server sends
//! as `tasks/stream` does; the client judges every event, refusal and end of stream with
//! [`TaskStreamValidator`]: the verdict that ships.
//!
//! The properties:
//! - `one_history`: what the client accepted is a prefix of one history the store held, never
//!   a splice of two;
//! - `no_false_alarm`: the client says the stream broke (a gap, a digest that does not chain, or
//!   an end before the final status) only if the store went back in time;
//! - liveness (the checker's own): from every state, without another fault, the client can
//!   reach the task's final status on the stream or a verdict that sends it to the task's
//!   canonical state.

use serde_json::json;
use tether_core::lineage::{TaskCursor, TaskStreamBreak, TaskStreamValidator};
use tether_core::tasks::{STATUS_EVENT, TaskEvent};

use crate::checker::{Invariant, Model};

/// The task's id, which its digest chain starts from.
const TASK: &str = "t";
/// How many events a history holds at most.
const MAX_EVENTS: usize = 3;
/// How many of the newest events the store keeps.
pub const RETAINED: usize = 2;

/// The client's verdict: the real one, or a broken variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientVariant {
    /// tether's.
    Real,
    /// Takes an event whose `seq` is the next one, whatever its digest.
    SeqOnly,
    /// Takes the stream's response for a cut and resumes (tether's client before the verdict
    /// judged a stream's end).
    ResumesAfterResponse,
}

/// One event as the model tells events apart: the write that made it, and whether it is the
/// task's final status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Event {
    /// Which run of the task wrote it: 0, then one more after the store went back.
    pub run: u8,
    /// It is the final status (`completed`).
    pub last: bool,
}

/// Where the client is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Client {
    /// About to open the stream after its cursor.
    Connecting,
    /// Reading an open stream, whose next event is `next`.
    Reading {
        /// The seq the server sends next on this connection.
        next: u64,
    },
    /// It checked the task's final status.
    Finished,
    /// The stream broke: the task's canonical state decides.
    Broke(TaskStreamBreak),
}

/// One state of the model.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// Every history the store has held, the current one last.
    pub histories: Vec<Vec<Event>>,
    /// The store went back in time.
    pub rolled_back: bool,
    /// The client's verdict so far.
    pub validator: TaskStreamValidator,
    /// The events the client accepted, in order.
    pub accepted: Vec<Event>,
    /// The client.
    pub client: Client,
}

impl State {
    fn history(&self) -> &[Event] {
        self.histories.last().map_or(&[], Vec::as_slice)
    }

    fn finished(&self) -> bool {
        self.history().last().is_some_and(|event| event.last)
    }
}

/// What happens next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The task's run appends an event (`last`: its final status).
    Append {
        /// The event is the final status.
        last: bool,
    },
    /// The store goes back to its first `to` events; the task's run goes on from there.
    Rollback {
        /// How many events the store holds afterwards.
        to: usize,
    },
    /// The client opens the stream after its cursor.
    Connect,
    /// The server sends what comes next on the open stream: an event, or its end.
    Deliver,
    /// The network cuts the open stream.
    Cut,
}

/// The model under one client variant.
pub struct TaskStream {
    client: ClientVariant,
}

impl TaskStream {
    /// The model of `client`.
    pub fn new(client: ClientVariant) -> TaskStream {
        TaskStream { client }
    }

    /// What the server sends on a stream whose next event is `next`, as `tasks/stream` decides:
    /// `None` while there is nothing to send yet.
    fn reply(history: &[Event], next: u64) -> Option<Reply> {
        let len = history.len() as u64;
        let earliest = len.saturating_sub(RETAINED as u64);
        if next < earliest {
            return Some(Reply::Gone { earliest });
        }
        if next > len {
            return Some(Reply::Ahead);
        }
        if next < len {
            return Some(Reply::Event(chain(history)[next as usize].clone()));
        }
        history.last().is_some_and(|event| event.last).then_some(Reply::Complete)
    }

    /// The client takes `event` in.
    fn accept(&self, mut state: State, event: &TaskEvent, next: u64, content: Event) -> State {
        let taken = match self.client {
            ClientVariant::SeqOnly if event.seq == state.validator.after().map_or(0, |seq| seq + 1) => {
                let cursor = TaskCursor { seq: event.seq, digest: event.digest };
                state.validator = TaskStreamValidator::new(TASK, Some(cursor));
                Ok(())
            }
            _ => state.validator.accept(event),
        };
        state.client = match taken {
            Ok(()) => {
                state.accepted.push(content);
                if content.last { Client::Finished } else { Client::Reading { next: next + 1 } }
            }
            Err(broke) => Client::Broke(broke),
        };
        state
    }

    /// The client reads the stream's end: its response, or an error that ends it.
    fn end(&self, mut state: State, reply: Reply) -> State {
        state.client = match reply {
            Reply::Gone { earliest } => Client::Broke(state.validator.gone(Some(earliest))),
            Reply::Complete if self.client == ClientVariant::ResumesAfterResponse => Client::Connecting,
            _ => match state.validator.ended() {
                Ok(()) => Client::Finished,
                Err(broke) => Client::Broke(broke),
            },
        };
        state
    }
}

/// What the server sends next on a stream.
#[derive(Debug, Clone, PartialEq)]
enum Reply {
    /// The next event.
    Event(TaskEvent),
    /// The response: the task finished and its last event went out.
    Complete,
    /// `events_gone`: the events after the cursor are no longer kept.
    Gone { earliest: u64 },
    /// `cursor_ahead`: the cursor names an event the history does not hold.
    Ahead,
}

/// The events of `history`, each chained to the one before as the server chains them.
fn chain(history: &[Event]) -> Vec<TaskEvent> {
    let payloads = history.iter().map(|event| {
        let status = if event.last { "completed" } else { "working" };
        (STATUS_EVENT, json!({"status": status, "run": event.run}))
    });
    TaskEvent::chain(TASK, payloads)
}

impl Model for TaskStream {
    type State = State;
    type Action = Action;

    fn init(&self) -> State {
        State {
            histories: vec![Vec::new()],
            rolled_back: false,
            validator: TaskStreamValidator::new(TASK, None),
            accepted: Vec::new(),
            client: Client::Connecting,
        }
    }

    fn actions(&self, state: &State) -> Vec<Action> {
        let mut actions = Vec::new();
        let len = state.history().len();
        if !state.finished() && len < MAX_EVENTS {
            if len + 1 < MAX_EVENTS {
                actions.push(Action::Append { last: false });
            }
            actions.push(Action::Append { last: true });
        }
        if !state.rolled_back {
            actions.extend((0..len).map(|to| Action::Rollback { to }));
        }
        match state.client {
            Client::Connecting => actions.push(Action::Connect),
            Client::Reading { next } => {
                if TaskStream::reply(state.history(), next).is_some() {
                    actions.push(Action::Deliver);
                }
                actions.push(Action::Cut);
            }
            Client::Finished | Client::Broke(_) => {}
        }
        actions
    }

    fn next(&self, state: &State, action: &Action) -> State {
        let mut next = state.clone();
        match *action {
            Action::Append { last } => {
                let run = u8::from(state.rolled_back);
                if let Some(history) = next.histories.last_mut() {
                    history.push(Event { run, last });
                }
            }
            Action::Rollback { to } => {
                next.rolled_back = true;
                next.histories.push(state.history()[..to].to_vec());
            }
            Action::Connect => {
                let after = state.validator.after().map_or(0, |seq| seq + 1);
                // A stream the server refuses at its start ends as one it ended.
                next.client = Client::Reading { next: after };
                return match TaskStream::reply(state.history(), after) {
                    Some(reply @ (Reply::Gone { .. } | Reply::Ahead)) => self.end(next, reply),
                    _ => next,
                };
            }
            Action::Deliver => {
                let Client::Reading { next: seq } = state.client else { return next };
                match TaskStream::reply(state.history(), seq) {
                    Some(Reply::Event(event)) => {
                        let content = state.history()[seq as usize];
                        return self.accept(next, &event, seq, content);
                    }
                    Some(reply) => return self.end(next, reply),
                    None => {}
                }
            }
            Action::Cut => next.client = Client::Connecting,
        }
        next
    }

    fn invariants(&self) -> Vec<Invariant<State>> {
        vec![
            Invariant {
                name: "one_history",
                check: |state| {
                    let prefix = |history: &Vec<Event>| history.starts_with(&state.accepted);
                    if state.histories.iter().any(prefix) {
                        Ok(())
                    } else {
                        Err(format!("the client accepted {:?}, which no history began with", state.accepted))
                    }
                },
            },
            Invariant {
                name: "no_false_alarm",
                check: |state| match &state.client {
                    Client::Broke(broke)
                        if !state.rolled_back && !matches!(broke, TaskStreamBreak::EventsGone { .. }) =>
                    {
                        Err(format!("the stream broke ({broke:?}) though the store never went back"))
                    }
                    _ => Ok(()),
                },
            },
        ]
    }

    fn is_fault(&self, action: &Action) -> bool {
        matches!(action, Action::Rollback { .. } | Action::Cut)
    }

    fn goal(&self, state: &State) -> bool {
        matches!(state.client, Client::Finished | Client::Broke(_))
    }
}
