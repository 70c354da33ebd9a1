//! The request lifecycle as a model: one keyed `tools/call`, from the client's first attempt to
//! what it says of the request, through the races of its life: the handler returning as it is
//! cancelled, a store write that fails, a start that fails after the key was claimed, the store
//! failing under the handler (which answers `store_unavailable`), and the server restarting on
//! its memory store (session, stream and key gone with it). Each attempt shows the claim the
//! client was acknowledged, which the records check ([`tether_core::idempotency::Acknowledged::regressed`])
//! against the claims they count, hold and forgot (a released claim counts as forgotten, as the
//! stores release it). In a session a client waits on its
//! attempt until the server ends it (connection cuts there are the resumption model's,
//! [`crate::protocol`]); in 2026-07-28 (`Config::awaits`) its connection may close while the
//! request runs on, and a re-send then waits for the key's record, having no stream to follow.
//!
//! The server decides with [`tether_core::lifecycle::emit`],
//! [`tether_core::lifecycle::after_response`], [`tether_core::lifecycle::settle`] and
//! [`tether_core::lifecycle::record_gone`], and the client says what it may of the request with
//! [`tether_core::lifecycle::Attempts`]: the decisions that ship. The properties:
//! - liveness (the checker's own): from every state, a state is reachable without another
//!   fault where the client has said how the request ended, the request's stream has ended, and
//!   no key is held by a live process that will never finish it, and a request whose handler
//!   keys its own effects (`resumable`) and met no fault but its store failing under it (and its
//!   connection closing) is answered with its result;
//! - `not_run_means_not_run`: the client never says "not executed" of a request that ran.

use tether_core::idempotency::Acknowledged;
use tether_core::lifecycle::{self, AfterResponse, Attempt, Attempts, Emit, RecordGone, Said, Settle};

use crate::checker::{Invariant, Model};

/// The server's lifecycle decisions: the real ones, or a broken variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServerVariant {
    /// tether's.
    Real,
    /// (1) A response is refused once the request is cancelled (a handler that returned as it
    /// was cancelled), and nothing ends the stream.
    RefusesResponseAfterCancel,
    /// (3) A key claimed for a request that then cannot start is left running.
    KeepsUnstartedClaim,
    /// A resumable request's `store_unavailable` answer is recorded as its key's outcome.
    RecordsUnavailable,
    /// A waiter whose key's record went is told the request may have run, even when its
    /// handler keys its own effects.
    NeverTakesOver,
    /// A released claim is not counted as forgotten: a re-send showing it reads as records
    /// gone back in time.
    ReleaseForgetsNothing,
}

/// The client's verdict: the real one, or a broken variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientVariant {
    /// tether's.
    Real,
    /// (5) What the last attempt was told is said of the request.
    TrustsLastAttempt,
}

/// The faults that may happen, once each at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Faults {
    /// The client cancels the request.
    pub cancel: bool,
    /// One store write (the response's) fails.
    pub write_failure: bool,
    /// The request fails to start once its key is claimed (its session ended meanwhile).
    pub start_failure: bool,
    /// The server restarts on its memory store.
    pub restart: bool,
    /// The store fails under the handler, which answers `store_unavailable`.
    pub store_unavailable: bool,
    /// The client's connection closes while its 2026-07-28 attempt runs (with `Config::awaits`).
    pub cut: bool,
}

impl Faults {
    /// Whether a fault other than the store failing under the handler (or a connection closing,
    /// which a keyed request runs on through) was spent in `now`.
    fn other_than_unavailable_spent(self, now: Faults) -> bool {
        (self.cancel && !now.cancel)
            || (self.write_failure && !now.write_failure)
            || (self.start_failure && !now.start_failure)
            || (self.restart && !now.restart)
    }
}

/// A model configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Config {
    /// The server's decisions.
    pub server: ServerVariant,
    /// The client's verdict.
    pub client: ClientVariant,
    /// The faults that may happen.
    pub faults: Faults,
    /// How many attempts the client sends at most.
    pub attempts: u8,
    /// The handler keys its own effects: running it again applies nothing twice.
    pub resumable: bool,
    /// 2026-07-28: a re-send finding the original running has no stream to follow, and waits
    /// for the key's record.
    pub awaits: bool,
}

impl Config {
    /// tether's decisions, every fault, three attempts.
    pub fn real() -> Config {
        Config {
            server: ServerVariant::Real,
            client: ClientVariant::Real,
            faults: Faults {
                cancel: true,
                write_failure: true,
                start_failure: true,
                restart: true,
                store_unavailable: true,
                cut: true,
            },
            attempts: 3,
            resumable: true,
            awaits: false,
        }
    }

    /// [`Config::real`] in 2026-07-28: re-sends wait for the key's record.
    pub fn stateless() -> Config {
        Config { awaits: true, ..Config::real() }
    }
}

/// The request's handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Handler {
    /// Not started.
    Idle,
    /// Running: it may return, or be cancelled.
    Running,
    /// It returned; its response is not written yet.
    Returned,
    /// Over: answered, dropped after its cancellation, or gone with its process.
    Over,
}

/// The key's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Key {
    /// No record: never claimed, released, or lost with the memory store.
    Free,
    /// Claimed by the live server, its request started or about to.
    Running,
    /// Finished with an outcome.
    Finished,
}

/// The original request's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    /// None yet, or lost with the memory store.
    Absent,
    /// Open: readers wait for more.
    Live,
    /// Ended with the response.
    Responded,
    /// Ended as aborted (`request_aborted`).
    Aborted,
}

/// The client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Client {
    /// About to send an attempt.
    Sending,
    /// Waiting on the attempt that runs the request (its stream).
    Running,
    /// Waiting on an attempt that follows the running original (its stream and its record).
    Following,
    /// Waiting on an attempt that waits for the running original's record (2026-07-28).
    Awaiting,
    /// Done: what it said of the request.
    Said(Said),
}

/// One state of the lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct State {
    /// The session the client's attempts go to is live.
    pub session: bool,
    /// The server restarted on its memory store: another set of records.
    pub records_changed: bool,
    /// The request's idempotency key.
    pub key: Key,
    /// How many claims the records made.
    pub claims: u8,
    /// The highest claim the records forgot (released).
    pub forgotten: u8,
    /// The position of the key's claim while it has a record.
    pub at: u8,
    /// The claim the client was acknowledged, which its attempts show.
    pub shown: Option<u8>,
    /// The key was claimed for a request that has not started.
    pub unstarted: bool,
    /// The request's handler.
    pub handler: Handler,
    /// The handler started: its side effects may have happened.
    pub ran: bool,
    /// The handler's answer (or the key's recorded outcome) is `store_unavailable`.
    pub unavailable: bool,
    /// The client cancelled the request.
    pub cancelled: bool,
    /// The original request's stream.
    pub stream: Stream,
    /// The next store write fails.
    pub failing_write: bool,
    /// The client.
    pub client: Client,
    /// How the client's attempts ended so far.
    pub attempts: Attempts,
    /// How many attempts the client sent.
    pub sent: u8,
    /// The faults not yet spent.
    pub faults: Faults,
}

/// What happens next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The client sends an attempt, and the server takes it in.
    Send,
    /// The claimed request starts.
    Start,
    /// It cannot start (its session ended meanwhile); its POST is answered 404.
    StartFails,
    /// The client cancels the request.
    Cancel,
    /// The handler returns.
    Return,
    /// The store fails under the handler, which returns `store_unavailable`.
    ReturnUnavailable,
    /// The dispatcher answers the request: what the handler returned, or, cancelled first,
    /// the `request_cancelled` error.
    Respond,
    /// The next store write will fail.
    FailNextWrite,
    /// The server restarts on its memory store.
    Restart,
    /// The client's connection closes while its 2026-07-28 attempt runs, which runs on.
    Cut,
    /// A waiter whose key's record went claims the key and runs the request itself.
    TakeOver,
    /// The client learns how its attempt ended.
    Conclude,
}

/// The name of the records the server keeps keys in until it restarts.
const FIRST_RECORDS: &str = "first";

/// The lifecycle model under one configuration.
pub struct Lifecycle {
    config: Config,
}

impl Lifecycle {
    /// The model of `config`.
    pub fn new(config: Config) -> Lifecycle {
        Lifecycle { config }
    }

    /// How the client's current attempt ended, if it did.
    fn attempt_end(&self, state: &State) -> Option<Attempt> {
        // The client sends a request answered `store_unavailable` again.
        let answered = if state.unavailable { Attempt::MayHaveRun } else { Attempt::Answered };
        match state.client {
            Client::Running => match state.stream {
                Stream::Responded => Some(answered),
                Stream::Aborted => Some(Attempt::MayHaveRun),
                // Its connection went with the restarted server.
                Stream::Absent => Some(Attempt::MayHaveRun),
                Stream::Live => None,
            },
            Client::Following => match (state.key, state.stream) {
                (Key::Finished, _) | (_, Stream::Responded) => Some(answered),
                (_, Stream::Aborted | Stream::Absent) => Some(Attempt::MayHaveRun),
                _ => None,
            },
            Client::Awaiting => match state.key {
                _ if state.records_changed => Some(Attempt::MayHaveRun),
                Key::Finished => Some(answered),
                Key::Free if !self.waiter_runs() => Some(Attempt::MayHaveRun),
                Key::Free | Key::Running => None,
            },
            Client::Sending | Client::Said(_) => None,
        }
    }

    /// Whether a waiter whose key's record went runs the request itself.
    fn waiter_runs(&self) -> bool {
        match self.config.server {
            ServerVariant::NeverTakesOver => false,
            _ => lifecycle::record_gone(self.config.resumable) == RecordGone::Run,
        }
    }

    /// The name of the records the server keeps keys in: others once it restarted.
    fn records(state: &State) -> &'static str {
        if state.records_changed { "after-restart" } else { FIRST_RECORDS }
    }

    /// Whether the records refuse the claim the client shows as no longer held as acknowledged.
    fn regressed(state: &State) -> bool {
        let Some(position) = state.shown else { return false };
        // Acknowledged before the restart: the client sends nothing after one.
        let shown = Acknowledged { records: FIRST_RECORDS.into(), position: u64::from(position) };
        let held = (state.key != Key::Free).then_some(u64::from(state.at));
        shown.regressed(Self::records(state), u64::from(state.claims), u64::from(state.forgotten), held)
    }

    /// The key claimed anew: the records count one more claim.
    fn claim(state: &mut State) {
        state.claims += 1;
        state.at = state.claims;
        state.key = Key::Running;
    }

    /// The key's claim released (its request did not run, or must run again), as the stores
    /// release it.
    fn release(&self, state: &mut State) {
        state.key = Key::Free;
        if self.config.server != ServerVariant::ReleaseForgetsNothing {
            state.forgotten = state.forgotten.max(state.at);
        }
    }

    /// The key's record went while the client's attempt waited for it (with the same records).
    fn record_went(state: &State) -> bool {
        state.client == Client::Awaiting && state.key == Key::Free && !state.records_changed
    }

    /// The waiter's record went, and it ends "may have run": the client says so at once,
    /// without sending the request again (a re-send could run it twice).
    fn waiter_lost(&self, state: &State) -> bool {
        Self::record_went(state) && !self.waiter_runs()
    }

    /// The client after an attempt ended as `ended`: it sends again while it may, or says.
    fn after_attempt(&self, mut state: State, ended: Attempt) -> State {
        state.attempts.record(ended);
        let again = ended != Attempt::Answered && state.sent < self.config.attempts && !state.records_changed;
        state.client = if again {
            Client::Sending
        } else {
            Client::Said(match self.config.client {
                ClientVariant::Real => state.attempts.verdict(ended),
                ClientVariant::TrustsLastAttempt => match ended {
                    Attempt::Answered => Said::Answered,
                    Attempt::NotExecuted => Said::NotExecuted,
                    Attempt::MayHaveRun => Said::OutcomeUnknown,
                },
            })
        };
        state
    }

    /// The dispatcher's answer to the request, with the real decisions or the broken ones.
    fn respond(&self, mut state: State) -> State {
        state.handler = Handler::Over;
        let refused = match self.config.server {
            ServerVariant::RefusesResponseAfterCancel => state.cancelled,
            _ => lifecycle::emit(state.cancelled, true) == Emit::Refuse,
        };
        let written = !refused && !std::mem::take(&mut state.failing_write);
        // The key's outcome is recorded either way (with the response, or on its own), or the
        // claim released.
        let settle = match self.config.server {
            ServerVariant::RecordsUnavailable => Settle::Record,
            _ => lifecycle::settle(state.unavailable, self.config.resumable),
        };
        match settle {
            Settle::Record => state.key = Key::Finished,
            Settle::Release => self.release(&mut state),
        }
        if refused && self.config.server == ServerVariant::RefusesResponseAfterCancel {
            return state;
        }
        state.stream = match lifecycle::after_response(written) {
            AfterResponse::Ended => Stream::Responded,
            AfterResponse::AbortStream => Stream::Aborted,
        };
        state
    }
}

impl Model for Lifecycle {
    type State = State;
    type Action = Action;

    fn init(&self) -> State {
        State {
            session: true,
            records_changed: false,
            key: Key::Free,
            claims: 0,
            forgotten: 0,
            at: 0,
            shown: None,
            unstarted: false,
            handler: Handler::Idle,
            ran: false,
            unavailable: false,
            cancelled: false,
            stream: Stream::Absent,
            failing_write: false,
            client: Client::Sending,
            attempts: Attempts::default(),
            sent: 0,
            faults: self.config.faults,
        }
    }

    fn actions(&self, state: &State) -> Vec<Action> {
        let mut actions = Vec::new();
        if state.client == Client::Sending {
            actions.push(Action::Send);
        }
        if state.unstarted {
            actions.push(Action::Start);
            if state.faults.start_failure {
                actions.push(Action::StartFails);
            }
        }
        if state.handler == Handler::Running {
            actions.push(Action::Return);
            if state.faults.store_unavailable {
                actions.push(Action::ReturnUnavailable);
            }
            if state.faults.cancel && !state.cancelled {
                actions.push(Action::Cancel);
            }
        }
        // Answered once it returned, or (cancelled) when the dispatcher sees the cancellation.
        if state.handler == Handler::Returned || (state.handler == Handler::Running && state.cancelled) {
            actions.push(Action::Respond);
        }
        if state.faults.write_failure && !state.failing_write && state.handler != Handler::Over {
            actions.push(Action::FailNextWrite);
        }
        if state.faults.restart && state.session && !matches!(state.client, Client::Said(_)) {
            actions.push(Action::Restart);
        }
        if self.config.awaits && state.faults.cut && state.client == Client::Running && state.stream == Stream::Live {
            actions.push(Action::Cut);
        }
        if Self::record_went(state) && self.waiter_runs() {
            actions.push(Action::TakeOver);
        }
        if self.attempt_end(state).is_some() {
            actions.push(Action::Conclude);
        }
        actions
    }

    fn next(&self, state: &State, action: &Action) -> State {
        let mut next = *state;
        match action {
            Action::Send => {
                next.sent += 1;
                if !state.session {
                    // 404: this attempt never reached a session.
                    return self.after_attempt(next, Attempt::NotExecuted);
                }
                if Self::regressed(state) {
                    // `records_regressed`: the client says at once that the outcome is unknown.
                    next.attempts.record(Attempt::MayHaveRun);
                    next.client = Client::Said(Said::OutcomeUnknown);
                    return next;
                }
                if state.key != Key::Free {
                    // The response head acknowledges the claim found.
                    next.shown = Some(state.at);
                }
                next.client = match state.key {
                    Key::Free => {
                        Self::claim(&mut next);
                        next.unstarted = true;
                        next.unavailable = false;
                        next.stream = Stream::Live;
                        Client::Running
                    }
                    Key::Running if self.config.awaits => Client::Awaiting,
                    Key::Running => Client::Following,
                    Key::Finished => {
                        let replayed = if state.unavailable { Attempt::MayHaveRun } else { Attempt::Answered };
                        return self.after_attempt(next, replayed);
                    }
                };
            }
            Action::Start => {
                // The response head acknowledges the claim.
                next.shown = Some(state.at);
                next.unstarted = false;
                next.handler = Handler::Running;
                next.ran = true;
            }
            Action::StartFails => {
                next.faults.start_failure = false;
                next.unstarted = false;
                if self.config.server != ServerVariant::KeepsUnstartedClaim {
                    self.release(&mut next);
                }
                // Its stream ended with its session, and its POST was answered 404: the client
                // begins a new session on the same records.
                next.stream = Stream::Aborted;
                next.client = Client::Sending;
                next.attempts.record(Attempt::NotExecuted);
            }
            Action::Cancel => {
                next.faults.cancel = false;
                next.cancelled = true;
            }
            Action::Return => next.handler = Handler::Returned,
            Action::ReturnUnavailable => {
                next.faults.store_unavailable = false;
                next.handler = Handler::Returned;
                next.unavailable = true;
            }
            Action::Respond => next = self.respond(next),
            Action::FailNextWrite => {
                next.faults.write_failure = false;
                next.failing_write = true;
            }
            Action::Restart => {
                next.faults.restart = false;
                next.session = false;
                next.records_changed = true;
                next.key = Key::Free;
                (next.claims, next.forgotten, next.at) = (0, 0, 0);
                next.unstarted = false;
                next.handler = if state.handler == Handler::Idle { Handler::Idle } else { Handler::Over };
                next.stream = Stream::Absent;
                next.failing_write = false;
            }
            Action::Cut => {
                next.faults.cut = false;
                next = self.after_attempt(next, Attempt::MayHaveRun);
            }
            Action::TakeOver => {
                Self::claim(&mut next);
                next.handler = Handler::Running;
                next.ran = true;
                next.unavailable = false;
                next.stream = Stream::Live;
                next.client = Client::Running;
            }
            Action::Conclude if self.waiter_lost(state) => {
                next.attempts.record(Attempt::MayHaveRun);
                next.client = Client::Said(next.attempts.verdict(Attempt::MayHaveRun));
            }
            Action::Conclude => {
                let ended = self.attempt_end(state).expect("offered only when the attempt ended");
                next = self.after_attempt(next, ended);
            }
        }
        next
    }

    fn invariants(&self) -> Vec<Invariant<State>> {
        vec![Invariant {
            name: "not_run_means_not_run",
            check: |state| match state.client {
                Client::Said(Said::NotExecuted) if state.ran => {
                    Err("the client said the request did not run, and it ran".into())
                }
                _ => Ok(()),
            },
        }]
    }

    fn is_fault(&self, action: &Action) -> bool {
        matches!(
            action,
            Action::StartFails
                | Action::Cancel
                | Action::FailNextWrite
                | Action::Restart
                | Action::ReturnUnavailable
                | Action::Cut
        )
    }

    fn goal(&self, state: &State) -> bool {
        let said = matches!(state.client, Client::Said(_));
        let stream_ended = state.stream != Stream::Live;
        // A key held by the live server for a request that will never finish it.
        let held_forever = state.key == Key::Running && state.handler != Handler::Running && !state.unstarted;
        let owed_its_result = self.config.resumable && !self.config.faults.other_than_unavailable_spent(state.faults);
        let answered = state.client == Client::Said(Said::Answered);
        said && stream_ended && !held_forever && (answered || !owed_its_result)
    }
}
