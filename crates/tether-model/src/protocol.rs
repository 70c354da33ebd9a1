//! The resumption protocol as a model: actors, the faults they suffer, and the properties.
//!
//! One client follows the stream of one `tools/call` (a priming event, `events`
//! notifications, then the response). Replica 0 runs the tool; both replicas can answer a
//! resume, over one shared store (the Redis deployment) or each from its own memory. The network may cut the connection
//! at any point, losing what was in flight; replicas may crash (their connection is cut, the
//! tool they ran is aborted when its lease lapses); the session may expire while no connection
//! is open; the store may evict the oldest retained event. Each fault has a budget, so the
//! state space is finite. Within one HTTP response TCP keeps order and delivers once, so
//! duplication and reordering can only come from a replay overlapping what was already
//! delivered, which the model covers by resuming from every point, in flight or not.
//!
//! With [`ClientVariant::Keyed`] the request carries an idempotency key: the store keeps its
//! record (running, finished, or abandoned when its replica crashed), and a client whose stream
//! diverged re-initializes through either replica and re-sends the request under the key, but
//! only to the records it was first sent under. The re-sent request is answered from the record
//! (attached while the original runs); it never runs the tool again.
//!
//! With a rollback budget the shared store may go back in time (Redis restarted from an older
//! snapshot, a failover to a replica that lagged, a directory restored from a backup): to a
//! snapshot taken mid-stream, or to a backup from before the call (no stream, no key). The
//! tool, still running, then stores other events at positions it had already handed out. Every
//! event's id carries the tag of its version of the history, which the replicas hold cursors
//! and their own connections to (`check_position`), and a keyed client shows the claim it was
//! acknowledged, which records that lost it refuse.

use tether_core::lineage::RESYNC_EVENT;
use tether_core::lineage::{
    Accepted, Checkpoint, Digest, Divergence, Epoch, EventId, FirstEvent, InvalidReason, Next, ObservedId, Reconnect,
    ResyncNotice, SeqRange, ServerDecision, SessionLookup, StreamAt, StreamName, StreamRange, StreamState,
    StreamValidator, Tag, Verdict, check_position, client_verdict, decide_resume, next_after,
};

use crate::checker::{Invariant, Model};

/// What the session store holds for the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Session {
    /// Live in its current incarnation.
    Live,
    /// Expired (idle past its TTL).
    Expired,
    /// Ended by a replica that found the store no longer holds what the client saw.
    Rewritten,
}

/// The request's stream in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    /// Its tool is still running.
    Live,
    /// It holds the response.
    Complete,
    /// Its tool's replica died; nothing more will come.
    Aborted,
    /// The store has no such stream: it went back to before the call.
    Gone,
}

/// How the client's request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Still waiting.
    Pending,
    /// The response arrived.
    Result,
    /// The client could not learn it and says so (`OutcomeUnknown`).
    Unknown,
    /// The client stopped waiting without saying what happened (only broken clients do).
    Dropped,
    /// An explicit error: the tool may have partly run (`request_aborted`, `request_cancelled`).
    Error,
}

/// The idempotency record of a keyed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyRecord {
    /// Claimed; its tool runs, or ran until its replica crashed (then it is abandoned).
    Running,
    /// Finished with the result.
    Result,
    /// Finished with an error: the request was cancelled when its session expired.
    Cancelled,
    /// The store went back to before the claim: it no longer knows the key.
    Lost,
}

/// Where a keyed request's re-send stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reissue {
    /// Not needed (yet).
    None,
    /// The stream diverged: the client will re-initialize and send the request again.
    Due,
    /// Sent again, attached to the original: its outcome is the record's.
    Attached,
}

/// What a replica writes on a connection, as the client reads it (one item is delivered whole
/// or lost with the connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Wire {
    /// Event `seq` of the stream, of history `version` (0 before the store went back in time,
    /// 1 for what it stored after).
    Event(u8, u8),
    /// A resync naming events `from..=to` as gone, written when the stream's head was `head`.
    Gap {
        /// First event gone.
        from: u8,
        /// Last event gone: the notice's position.
        to: u8,
        /// The stream's head when the notice was written.
        head: u8,
        /// The history of the event at `to`, whose tag the notice's id carries.
        version: u8,
    },
    /// The stream's producer died after event `head`: the `request_aborted` notice, then the
    /// request's error (the trailer). The connection ends with it.
    Aborted {
        /// The stream's head.
        head: u8,
        /// The history of the event at `head`.
        version: u8,
    },
    /// The stream ended right after a gap that took its response: the request's
    /// `request_history_expired` error (the trailer). The connection ends with it.
    Expired,
}

/// One connection of the client to a replica.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Conn {
    /// The replica serving it.
    pub replica: u8,
    /// The last position the replica wrote (or accounted for with a gap).
    pub cursor: u8,
    /// The history of the event at `cursor`, as the replica wrote it (or was told it).
    pub cursor_version: u8,
    /// The last thing the replica wrote was a gap: a stream that ends now lost its response.
    pub after_gap: bool,
    /// Written by the replica, not yet read by the client (at most two).
    pub in_flight: Vec<Wire>,
    /// The replica wrote the stream's end (the aborted notice or the expired trailer).
    pub ended: bool,
    /// The client has not judged this connection's first item yet (it is a resume).
    pub first: bool,
}

impl Conn {
    /// A connection whose replica writes what follows `cursor`.
    fn from(replica: u8, cursor: u8, cursor_version: u8, first: bool) -> Conn {
        Conn { replica, cursor, cursor_version, after_gap: false, in_flight: Vec::new(), ended: false, first }
    }
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The session's status in the store.
    pub session: Session,
    /// The session's incarnation (a re-initialization starts a new one).
    pub incarnation: u8,
    /// The stream's last sequence number (0: only the priming event).
    pub head: u8,
    /// The lowest sequence number still retained.
    pub retained_from: u8,
    /// The stream's state.
    pub stream: Stream,
    /// The replica running the tool, while it runs.
    pub producer: Option<u8>,
    /// How many times the tool was executed.
    pub executions: u8,
    /// A resume of an ended or unknown session was answered with a stream.
    pub revived: bool,
    /// Replica 0 crashed and, with per-replica stores, forgot the session, its stream and the
    /// key's record (it now serves records with another name).
    pub forgotten: bool,
    /// The client's connection, if open.
    pub conn: Option<Conn>,
    /// The sequence number of the client's cursor: the last event the application got (0: the
    /// priming event), or the position of the last resync it accepted.
    pub checkpoint: u8,
    /// The history of the event the cursor names, whose tag the cursor carries.
    pub checkpoint_version: u8,
    /// The cursor is a resync's position: the notice it was (`from`, `to`, `head`; `from` 0 for
    /// a `request_aborted` notice), whose digest the cursor carries.
    pub checkpoint_notice: Option<(u8, u8, u8)>,
    /// Bit `s` set: the application got event `s`.
    pub delivered: u32,
    /// Bit `s` set: the client was told event `s` is gone.
    pub announced: u32,
    /// A replica wrote that an event was gone while the store still retained it.
    pub needless_loss: bool,
    /// The application got some event twice.
    pub duplicate: bool,
    /// How the request ended.
    pub outcome: Outcome,
    /// The divergence the client reported, with the sequence numbers it says are lost.
    pub reported: Option<(&'static str, Option<(u64, u64)>)>,
    /// Resumes since the client last made progress (its reconnect budget).
    pub idle_resumes: u8,
    /// Faults left: connection cuts, evictions, expiries, crashes.
    pub budget: Budget,
    /// The idempotency record of the request (keyed clients).
    pub key: KeyRecord,
    /// Where the re-send of a keyed request stands.
    pub reissue: Reissue,
    /// The store as it was when a snapshot (or a backup) of it was taken, to go back to.
    pub snapshot: Option<Snapshot>,
    /// Once the store went back in time: the last position it kept; every event it holds past
    /// it is of the history it stored since (version 1).
    pub fork: Option<u8>,
    /// The application got events of a history the store lost.
    pub lost_seen: bool,
    /// ... and then events of the history that replaced it: two contents under one position.
    pub mixed: bool,
}

/// What a snapshot of the store holds of the session, the stream and the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Snapshot {
    /// The session's status.
    pub session: Session,
    /// The stream's head.
    pub head: u8,
    /// Its lowest retained event.
    pub retained_from: u8,
    /// Its state.
    pub stream: Stream,
    /// The key's record.
    pub key: KeyRecord,
}

/// Faults the environment may still inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Budget {
    /// Connection cuts.
    pub cuts: u8,
    /// Evictions of the oldest retained event.
    pub evictions: u8,
    /// Session expiries.
    pub expiries: u8,
    /// Replica crashes.
    pub crashes: u8,
    /// Times the shared store goes back to a snapshot of itself (taken at a `Snapshot` step, or
    /// a backup from before the call).
    pub rollbacks: u8,
}

/// A step of the system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The tool appends its next event (the last is the response).
    Produce,
    /// The replica sends the connection's next event.
    Send,
    /// The client reads the oldest event in flight.
    Receive,
    /// The replica ends the connection: the stream is over.
    End,
    /// The network cuts the connection; what was in flight is lost.
    Cut,
    /// The client resumes through this replica.
    Resume(u8),
    /// The store evicts its oldest retained event.
    Evict,
    /// The idle session expires.
    Expire,
    /// A replica crashes and restarts.
    Crash(u8),
    /// A keyed client re-initializes through this replica and sends the request again.
    Reissue(u8),
    /// A snapshot of the store is taken.
    Snapshot,
    /// The store goes back to its snapshot.
    Rollback,
}

/// How the server replicas decide; every variant but `Real` is deliberately broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerVariant {
    /// `decide_resume`, as shipped.
    Real,
    /// Replays from the cursor's own event instead of the one after it.
    ReplaysCursorEvent,
    /// Answers a cursor whose history was evicted with an empty replay instead of saying what
    /// is gone.
    EmptyReplayWhenEvicted,
    /// Says what is gone, but names everything up to the head as gone and skips the retained
    /// tail after the gap (tether before exact resync).
    DiscardsRetainedTail,
    /// Looks an expired session up as live (the "resurrected session" of the seeds).
    RevivesExpired,
    /// A replica that does not know the session accepts it anyway, as a fresh incarnation with
    /// an empty stream (the "replica without the buffer replayed from zero" of the seeds).
    AdoptsUnknownSession,
    /// Holds neither a resume's cursor nor its own connections to the tags of the history the
    /// store holds (tether before history fencing).
    IgnoresTags,
    /// Claims a key the client was acknowledged before as if it were new when the records no
    /// longer know it (tether before records fencing).
    IgnoresClaims,
}

/// How the client judges; every variant but `Real` is deliberately broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientVariant {
    /// `client_verdict` and `StreamValidator`, as shipped.
    Real,
    /// Takes a resumed connection's first event without the first-event probe.
    SkipsFirstEventProbe,
    /// Treats a stream that ended without the response as finished.
    ForgetsUnfinished,
    /// Re-initializes and sends the request again after a divergence, without an idempotency
    /// key.
    ReissuesUnkeyed,
    /// Never reconnects after a cut.
    NeverReconnects,
    /// The real client with an idempotency key: after a divergence it re-sends the request under
    /// the key, only to the records the key was first sent under.
    Keyed,
    /// A keyed client that re-sends to whatever records the new session has.
    ReissuesToOtherRecords,
}

/// The model's bounds and variants.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Notifications before the response.
    pub events: u8,
    /// The faults' budgets.
    pub budget: Budget,
    /// The servers' decision.
    pub server: ServerVariant,
    /// The client's judgement.
    pub client: ClientVariant,
    /// Where the replicas keep sessions and events.
    pub stores: Stores,
    /// The store may go back (with the rollback budget) to a backup taken before the call: no
    /// stream, no key. Otherwise to a snapshot a `Snapshot` step takes.
    pub backup_before_call: bool,
}

/// Where the replicas keep sessions and events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stores {
    /// One store shared by both replicas (the Redis deployment): either can resume.
    Shared,
    /// Each replica in its own memory (replicas behind a balancer without a shared store):
    /// only replica 0, which served the session, knows it, until it crashes.
    PerReplica,
}

impl Config {
    /// Real decisions under every fault: three notifications, three cuts, two evictions, one
    /// expiry, one crash.
    pub fn real() -> Config {
        Config {
            events: 3,
            budget: Budget { cuts: 3, evictions: 2, expiries: 1, crashes: 1, rollbacks: 0 },
            server: ServerVariant::Real,
            client: ClientVariant::Real,
            stores: Stores::Shared,
            backup_before_call: false,
        }
    }

    /// Real decisions with a store that goes back in time once, to a snapshot taken at any
    /// point, while the tool still runs or after it finished; three notifications, two cuts,
    /// one eviction.
    pub fn rollback() -> Config {
        Config { budget: Budget { cuts: 2, evictions: 1, expiries: 0, crashes: 0, rollbacks: 1 }, ..Config::real() }
    }

    /// A keyed client, and a store that goes back once to a backup taken before the call.
    pub fn rollback_before_call() -> Config {
        Config {
            budget: Budget { cuts: 2, evictions: 1, expiries: 0, crashes: 0, rollbacks: 1 },
            client: ClientVariant::Keyed,
            backup_before_call: true,
            ..Config::real()
        }
    }

    /// The sequence number of the response.
    fn last(&self) -> u8 {
        self.events + 1
    }

    /// Resumes without progress after which the client gives up: more than the faults could
    /// ever cause, so only a server that makes no progress exhausts it.
    fn resume_budget(&self) -> u8 {
        self.budget.cuts + self.budget.crashes + 2
    }
}

/// The system of [`Config`] as a [`Model`].
#[derive(Debug, Clone)]
pub struct Resumption {
    config: Config,
    session_id: String,
}

impl Resumption {
    /// The model of `config`.
    pub fn new(config: Config) -> Resumption {
        Resumption { config, session_id: "s".into() }
    }
}

fn epoch(incarnation: u8) -> Epoch {
    Epoch::from_entropy([incarnation.wrapping_add(1); 16])
}

fn stream_name(incarnation: u8) -> StreamName {
    // Lowercase letters and digits are in the stream-name alphabet.
    StreamName::parse(&format!("r{incarnation}")).unwrap_or_else(|_| unreachable!("r<digits> is a valid stream name"))
}

/// The tag the store drew for event `seq` of incarnation `incarnation` in history `version`.
fn tag(incarnation: u8, seq: u8, version: u8) -> Tag {
    Tag::from_bits(u64::from(version) << 16 | u64::from(incarnation) << 8 | u64::from(seq))
}

fn event_id(incarnation: u8, seq: u8, version: u8) -> String {
    format!("{}:{}:{seq}:{}", epoch(incarnation), stream_name(incarnation), tag(incarnation, seq, version))
}

/// The data of event `seq` of history `version` (the priming event has none).
fn data(incarnation: u8, seq: u8, version: u8) -> Vec<u8> {
    if seq == 0 { Vec::new() } else { format!("{{\"inc\":{incarnation},\"seq\":{seq},\"v\":{version}}}").into_bytes() }
}

/// The history of the event the store holds at `seq`.
fn version_at(state: &State, seq: u8) -> u8 {
    u8::from(state.fork.is_some_and(|fork| seq > fork))
}

/// What the store tells of position `seq`: the tag there while it can (the event is retained,
/// or is the last one dropped).
fn held_at(state: &State, range: StreamRange, seq: u8) -> StreamAt {
    let known = u64::from(seq) <= range.head && u64::from(seq) + 1 >= range.retained_from;
    StreamAt { range, tag: known.then(|| tag(state.incarnation, seq, version_at(state, seq))) }
}

fn bit(seq: u8) -> u32 {
    1 << seq
}

/// The notice a gap item carries.
fn gap_notice(incarnation: u8, from: u8, to: u8, head: u8) -> ResyncNotice {
    let lost = SeqRange { from: u64::from(from), to: u64::from(to) };
    ResyncNotice::evicted(stream_name(incarnation).as_str(), lost, u64::from(head))
}

/// The notice of a stream whose producer died after `head`.
fn aborted_notice(incarnation: u8, head: u8) -> ResyncNotice {
    ResyncNotice::aborted(stream_name(incarnation).as_str(), u64::from(head))
}

impl Resumption {
    fn checkpoint(&self, state: &State) -> Checkpoint {
        let id = event_id(state.incarnation, state.checkpoint, state.checkpoint_version);
        let data = match state.checkpoint_notice {
            Some((0, _, head)) => aborted_notice(state.incarnation, head).to_json().into_bytes(),
            Some((from, to, head)) => gap_notice(state.incarnation, from, to, head).to_json().into_bytes(),
            None => data(state.incarnation, state.checkpoint, state.checkpoint_version),
        };
        Checkpoint {
            session_id: self.session_id.clone(),
            epoch: Some(epoch(state.incarnation).to_string()),
            last_digest: Digest::of(&id, &data),
            last_id: ObservedId::parse(&id),
        }
    }

    /// The application takes event `seq` of history `version`.
    fn deliver(&self, state: &mut State, seq: u8, version: u8) {
        if state.delivered & bit(seq) != 0 {
            state.duplicate = true;
        }
        if version == 1 && state.lost_seen {
            state.mixed = true;
        }
        state.delivered |= bit(seq);
        state.checkpoint = seq;
        state.checkpoint_version = version;
        state.checkpoint_notice = None;
        state.idle_resumes = 0;
        if seq == self.config.last() {
            state.outcome = Outcome::Result;
            state.conn = None;
        }
    }

    /// Whether the client sends its request again under an idempotency key.
    fn keyed(&self) -> bool {
        matches!(self.config.client, ClientVariant::Keyed | ClientVariant::ReissuesToOtherRecords)
    }

    /// The name of the records `replica` claims keys in: one for a shared store; with
    /// per-replica stores, replica 0's (whose name changes when a crash loses them) and replica 1's.
    fn records(&self, state: &State, replica: u8) -> u8 {
        match (self.config.stores, replica, state.forgotten) {
            (Stores::Shared, _, _) | (Stores::PerReplica, 0, false) => 0,
            (Stores::PerReplica, 0, true) => 2,
            _ => 1,
        }
    }

    /// A keyed request sent again through `replica`, in a new session.
    fn reissue(&self, state: &mut State, replica: u8) {
        let same = self.records(state, replica) == 0;
        if !same && self.config.client == ClientVariant::Keyed {
            // Records that never saw the key: the client does not re-send, and says so.
            state.reissue = Reissue::None;
            state.outcome = Outcome::Unknown;
            return;
        }
        if !same {
            // The key is unknown there: the request runs again.
            state.executions += 1;
            state.reissue = Reissue::None;
            state.outcome = Outcome::Result;
            return;
        }
        if state.key == KeyRecord::Lost {
            state.reissue = Reissue::None;
            if self.config.server == ServerVariant::IgnoresClaims {
                // Taken for a new key: the request runs again.
                state.executions += 1;
                state.key = KeyRecord::Result;
                state.outcome = Outcome::Result;
            } else {
                // The client shows the claim it was acknowledged; the records that lost it
                // refuse the key (`records_regressed`), and the client reports the outcome
                // unknown.
                state.reported = Some(("records_regressed", None));
                state.outcome = Outcome::Unknown;
            }
            return;
        }
        state.reissue = Reissue::Attached;
        self.settle(state);
    }

    /// An attached re-send ends when the original's record does.
    fn settle(&self, state: &mut State) {
        if state.reissue != Reissue::Attached {
            return;
        }
        let outcome = match state.key {
            KeyRecord::Result => Outcome::Result,
            KeyRecord::Cancelled => Outcome::Error,
            // Lost with the memory of the replica that held it (and served the re-send): the
            // client learns nothing more and says so.
            KeyRecord::Running if state.forgotten => Outcome::Unknown,
            // Abandoned: its replica crashed mid-run (the tool is not resumable).
            KeyRecord::Running if state.producer.is_none() => Outcome::Error,
            KeyRecord::Running | KeyRecord::Lost => return,
        };
        state.outcome = outcome;
        state.reissue = Reissue::None;
    }

    /// The client reports a divergence: the request's outcome is unknown, or a broken client
    /// sends it again in a new session.
    fn diverge(&self, state: &mut State, divergence: &Divergence) {
        let lost = match divergence {
            Divergence::Gap { lost } => Some((lost.from, lost.to)),
            Divergence::Resync(Some(notice)) => notice.lost.map(|lost| (lost.from, lost.to)),
            _ => None,
        };
        state.conn = None;
        if self.config.client == ClientVariant::ReissuesUnkeyed && state.executions < 2 {
            // A new session and incarnation; the request is sent again and runs again.
            state.session = Session::Live;
            state.incarnation += 1;
            state.head = 0;
            state.retained_from = 1;
            state.stream = Stream::Live;
            state.producer = Some(0);
            state.executions += 1;
            state.checkpoint = 0;
            state.checkpoint_version = 0;
            state.checkpoint_notice = None;
            state.delivered = 0;
            state.announced = 0;
            state.conn = Some(Conn::from(0, 0, 0, false));
            return;
        }
        state.reported = Some((divergence.kind(), lost));
        if self.keyed() {
            state.reissue = Reissue::Due;
            return;
        }
        state.outcome = Outcome::Unknown;
    }

    /// The request's stream ended without its response and said so (`aborted`: its producer
    /// died; else its response is no longer retained): a keyed request is sent again, an
    /// unkeyed one ends with the error or as unknown.
    fn ended_without_response(&self, state: &mut State, aborted: bool) {
        state.conn = None;
        if self.config.client == ClientVariant::ForgetsUnfinished {
            state.outcome = Outcome::Dropped;
            return;
        }
        if self.keyed() {
            state.reported = Some((if aborted { "request_aborted" } else { "request_history_expired" }, None));
            state.reissue = Reissue::Due;
            return;
        }
        state.outcome = if aborted { Outcome::Error } else { Outcome::Unknown };
    }

    /// The client judges one item: the first of a resumed connection with `client_verdict`,
    /// every other with the `StreamValidator` continuing from its cursor.
    fn judge(
        &self,
        state: &State,
        id: &str,
        event: Option<&str>,
        data: &[u8],
        first: bool,
    ) -> Result<Accepted, Judged> {
        let checkpoint = self.checkpoint(state);
        if first {
            if self.config.client == ClientVariant::SkipsFirstEventProbe && event.is_none() {
                return Ok(Accepted::Event);
            }
            let epoch = epoch(state.incarnation).to_string();
            let reconnect = Reconnect {
                status: 200,
                session_id: Some(&self.session_id),
                epoch: Some(&epoch),
                first_event: Some(FirstEvent { id: Some(id), event, data }),
            };
            match client_verdict(&checkpoint, &reconnect) {
                Verdict::ProvisionallyContinuous | Verdict::Resynced(_) => {}
                Verdict::BoundaryDuplicate => return Err(Judged::Skip),
                Verdict::Diverged(divergence) => return Err(Judged::Diverged(divergence)),
                // Lineage ids are always verifiable; the strict client re-initializes otherwise.
                Verdict::Unverifiable(_) | Verdict::AwaitingFirstEvent | Verdict::Unavailable { .. } => {
                    return Err(Judged::Diverged(Divergence::NonMonotonic { after: id.to_owned(), got: None }));
                }
            }
        }
        StreamValidator::resume(&checkpoint).accept(Some(id), event, data).map_err(Judged::Diverged)
    }

    /// The client accepted a resync, whose id carries the tag of history `version`: its
    /// position is the cursor, and what it names is gone.
    fn resynced(&self, state: &mut State, notice: (u8, u8, u8), version: u8) {
        state.checkpoint_version = version;
        let (from, to, _) = notice;
        if from > 0 {
            let lost = (from..=to).fold(0, |bits, seq| bits | bit(seq));
            state.announced |= lost;
            state.checkpoint = to;
        }
        state.checkpoint_notice = Some(notice);
        state.idle_resumes = 0;
    }

    fn receive(&self, state: &mut State) {
        let Some(conn) = state.conn.as_mut() else { return };
        if conn.in_flight.is_empty() {
            return;
        }
        let item = conn.in_flight.remove(0);
        let first = std::mem::replace(&mut conn.first, false);
        let inc = state.incarnation;
        let (id, event, data, notice) = match item {
            Wire::Event(seq, version) => (event_id(inc, seq, version), None, data(inc, seq, version), None),
            Wire::Gap { from, to, head, version } => (
                event_id(inc, to, version),
                Some(RESYNC_EVENT),
                gap_notice(inc, from, to, head).to_json().into_bytes(),
                Some(((from, to, head), version)),
            ),
            Wire::Aborted { head, version } => (
                event_id(inc, head, version),
                Some(RESYNC_EVENT),
                aborted_notice(inc, head).to_json().into_bytes(),
                Some(((0, head, head), version)),
            ),
            // The trailer follows a resync at the head, which the validator admits it after.
            Wire::Expired => return self.ended_without_response(state, false),
        };
        match self.judge(state, &id, event, &data, first) {
            Ok(Accepted::Event) => {
                if let Wire::Event(seq, version) = item {
                    self.deliver(state, seq, version);
                }
            }
            Ok(Accepted::Resync(_)) => {
                if let Some((notice, version)) = notice {
                    self.resynced(state, notice, version);
                }
                if let Wire::Aborted { .. } = item {
                    self.ended_without_response(state, true);
                }
            }
            Ok(Accepted::Trailer) | Err(Judged::Skip) => {}
            Err(Judged::Diverged(divergence)) => self.diverge(state, &divergence),
        }
    }

    /// Whether `replica` can read the session's store.
    fn knows_session(&self, state: &State, replica: u8) -> bool {
        match self.config.stores {
            Stores::Shared => true,
            Stores::PerReplica => replica == 0 && !state.forgotten,
        }
    }

    /// A resume answered by a replica that has no record of the session.
    fn resume_unknown(&self, state: &mut State, replica: u8) {
        let cursor = EventId::parse(&event_id(state.incarnation, state.checkpoint, state.checkpoint_version))
            .unwrap_or_else(|_| unreachable!("the model mints valid lineage ids"));
        let seen = tag(state.incarnation, state.checkpoint, state.checkpoint_version);
        let decision = decide_resume(SessionLookup::Unknown, &cursor, seen, None, 0);
        if self.config.server == ServerVariant::AdoptsUnknownSession {
            // A new incarnation under the old id, replaying an empty history: a revival.
            state.revived = true;
            state.conn = Some(Conn::from(replica, 0, 0, true));
            return;
        }
        let status = match decision {
            ServerDecision::SessionInvalid(_) => 404,
            other => unreachable!("an unknown session is refused, not {other:?}"),
        };
        self.refused(state, status);
    }

    /// The client's judgement of a resume refused with `status`: always a divergence.
    fn refused(&self, state: &mut State, status: u16) {
        let reconnect = Reconnect { status, session_id: None, epoch: None, first_event: None };
        match client_verdict(&self.checkpoint(state), &reconnect) {
            Verdict::Diverged(divergence) => self.diverge(state, &divergence),
            other => unreachable!("a resume answered {status} is a divergence, not {other:?}"),
        }
    }

    /// The stream as the store retains it; `None` if the store has no such stream.
    fn range(state: &State) -> Option<StreamRange> {
        let stream = match state.stream {
            Stream::Live => StreamState::Live,
            Stream::Complete => StreamState::Complete,
            Stream::Aborted => StreamState::Aborted,
            Stream::Gone => return None,
        };
        Some(StreamRange { retained_from: u64::from(state.retained_from), head: u64::from(state.head), state: stream })
    }

    /// What the replica of `conn` writes next, by `next_after` (or the broken variant), with the
    /// connection as it is after writing it; `None` when it has nothing to write.
    fn next_write(&self, state: &State, conn: &Conn) -> Option<(Wire, Conn)> {
        if conn.ended {
            return None;
        }
        let range = Self::range(state)?;
        let cursor = u64::from(conn.cursor);
        let narrow = |n: u64| u8::try_from(n).unwrap_or(u8::MAX);
        let mut after = conn.clone();
        let item = match next_after(cursor, range, range.first_after(cursor)) {
            Next::Events => {
                after.cursor += 1;
                after.cursor_version = version_at(state, after.cursor);
                after.after_gap = false;
                Wire::Event(after.cursor, after.cursor_version)
            }
            Next::Gap(lost) => {
                let to = match self.config.server {
                    ServerVariant::DiscardsRetainedTail => state.head,
                    _ => narrow(lost.to),
                };
                after.cursor = to;
                after.cursor_version = version_at(state, to);
                after.after_gap = true;
                Wire::Gap { from: narrow(lost.from), to, head: state.head, version: after.cursor_version }
            }
            Next::Aborted => {
                after.ended = true;
                Wire::Aborted { head: state.head, version: version_at(state, state.head) }
            }
            Next::End if conn.after_gap => {
                after.ended = true;
                Wire::Expired
            }
            Next::End | Next::Wait => return None,
        };
        Some((item, after))
    }

    /// Whether the replica of `conn` finds that the store no longer holds what it wrote on it
    /// (`check_position`, the page check of every read): it then writes nothing more, closes the
    /// connection and ends the session.
    fn finds_rewritten(&self, state: &State, conn: &Conn) -> bool {
        if self.config.server == ServerVariant::IgnoresTags {
            return false;
        }
        let Some(range) = Self::range(state) else { return false };
        let seen = tag(state.incarnation, conn.cursor, conn.cursor_version);
        check_position(held_at(state, range, conn.cursor), u64::from(conn.cursor), seen).is_err()
    }

    fn resume(&self, state: &mut State, replica: u8) {
        state.idle_resumes += 1;
        if !self.knows_session(state, replica) {
            self.resume_unknown(state, replica);
            return;
        }
        let ended = state.session != Session::Live;
        let session_epoch = epoch(state.incarnation);
        let lookup = match (state.session, self.config.server) {
            (Session::Live, _) | (Session::Expired, ServerVariant::RevivesExpired) => {
                SessionLookup::Live { epoch: &session_epoch, expires_at_ms: u64::MAX }
            }
            (Session::Expired, _) => SessionLookup::Expired,
            (Session::Rewritten, _) => SessionLookup::HistoryRewritten,
        };
        let seen = tag(state.incarnation, state.checkpoint, state.checkpoint_version);
        let cursor = EventId::parse(&event_id(state.incarnation, state.checkpoint, state.checkpoint_version))
            .unwrap_or_else(|_| unreachable!("the model mints valid lineage ids"));
        let held = Self::range(state).map(|range| match self.config.server {
            ServerVariant::IgnoresTags => StreamAt { range, tag: None },
            _ => held_at(state, range, state.checkpoint),
        });
        let decision = decide_resume(lookup, &cursor, seen, held, 0);
        let checkpoint = self.checkpoint(state);
        match decision {
            ServerDecision::SessionInvalid(reason) => {
                if reason == InvalidReason::HistoryRewritten {
                    // The replica ends the session: every later request is told so.
                    state.session = Session::Rewritten;
                }
                self.refused(state, 404);
            }
            ServerDecision::Resync(notice) => {
                if ended {
                    state.revived = true;
                }
                // An unknown stream's notice stands at the cursor, whose tag the store cannot tell.
                let position = u8::try_from(notice.position()).unwrap_or(u8::MAX);
                let id = format!("{}:{}:{position}", epoch(state.incarnation), stream_name(state.incarnation));
                let data = notice.to_json();
                let first = FirstEvent { id: Some(&id), event: Some(RESYNC_EVENT), data: data.as_bytes() };
                let epoch_header = session_epoch.to_string();
                let reconnect = Reconnect {
                    status: 200,
                    session_id: Some(&self.session_id),
                    epoch: Some(&epoch_header),
                    first_event: Some(first),
                };
                match client_verdict(&checkpoint, &reconnect) {
                    Verdict::Diverged(divergence) => self.diverge(state, &divergence),
                    other => unreachable!("a resume the server cannot continue is a divergence, not {other:?}"),
                }
            }
            ServerDecision::Replay { after, starts } => {
                if ended {
                    state.revived = true;
                }
                let after = u8::try_from(after).unwrap_or(u8::MAX);
                let cursor = match (self.config.server, starts) {
                    (ServerVariant::ReplaysCursorEvent, _) => after.saturating_sub(1),
                    // Nothing is replayed: the connection starts at the head.
                    (ServerVariant::EmptyReplayWhenEvicted, Next::Gap(_)) => state.head,
                    _ => after,
                };
                let mut conn = Conn::from(replica, cursor, version_at(state, cursor), true);
                // As the reader starts: a cursor whose own event is gone came from a gap's notice,
                // and a stream that ends there lost its response.
                conn.after_gap = cursor > 0 && state.retained_from > cursor;
                state.conn = Some(conn);
            }
        }
    }
}

/// Why the client did not accept an item.
enum Judged {
    /// It is the cursor's own event again: skipped.
    Skip,
    /// It breaks the stream.
    Diverged(Divergence),
}

impl Model for Resumption {
    type State = State;
    type Action = Action;

    fn init(&self) -> State {
        State {
            session: Session::Live,
            incarnation: 0,
            head: 0,
            retained_from: 1,
            stream: Stream::Live,
            producer: Some(0),
            executions: 1,
            revived: false,
            forgotten: false,
            // The POST's response stream, after its priming event.
            conn: Some(Conn::from(0, 0, 0, false)),
            checkpoint: 0,
            checkpoint_version: 0,
            checkpoint_notice: None,
            delivered: 0,
            announced: 0,
            needless_loss: false,
            duplicate: false,
            outcome: Outcome::Pending,
            reported: None,
            idle_resumes: 0,
            budget: self.config.budget,
            key: KeyRecord::Running,
            reissue: Reissue::None,
            snapshot: self.config.backup_before_call.then_some(Snapshot {
                session: Session::Live,
                head: 0,
                retained_from: 1,
                stream: Stream::Gone,
                key: KeyRecord::Lost,
            }),
            fork: None,
            lost_seen: false,
            mixed: false,
        }
    }

    fn actions(&self, state: &State) -> Vec<Action> {
        let mut actions = Vec::new();
        let running = state.producer.is_some() && state.session == Session::Live && state.stream == Stream::Live;
        if running {
            actions.push(Action::Produce);
        }
        if let Some(conn) = &state.conn {
            // Only a replica that can read the stream has events to send, unless it finds that
            // the stream is gone, or that its history is not what the replica wrote.
            let serves = self.knows_session(state, conn.replica);
            let closes = serves && (Self::range(state).is_none() || self.finds_rewritten(state, conn));
            let write = if serves && !closes { self.next_write(state, conn) } else { None };
            if write.is_some() && conn.in_flight.len() < 2 {
                actions.push(Action::Send);
            }
            if !conn.in_flight.is_empty() {
                actions.push(Action::Receive);
            }
            let at_end =
                Self::range(state).is_some_and(|range| next_after(u64::from(conn.cursor), range, None) == Next::End);
            if serves && write.is_none() && !conn.ended && conn.in_flight.is_empty() && (at_end || closes) {
                actions.push(Action::End);
            }
            if state.budget.cuts > 0 {
                actions.push(Action::Cut);
            }
        }
        let follows = state.outcome == Outcome::Pending && state.reported.is_none();
        let reconnects =
            self.config.client != ClientVariant::NeverReconnects || state.budget.cuts == self.config.budget.cuts;
        if state.conn.is_none() && follows && reconnects && state.idle_resumes < self.config.resume_budget() {
            actions.push(Action::Resume(0));
            actions.push(Action::Resume(1));
        }
        if state.budget.evictions > 0 && state.retained_from <= state.head {
            actions.push(Action::Evict);
        }
        // Activity keeps a session alive: it can only expire with no connection open.
        if state.budget.expiries > 0 && state.session == Session::Live && state.conn.is_none() {
            actions.push(Action::Expire);
        }
        if state.budget.crashes > 0 {
            actions.push(Action::Crash(0));
            actions.push(Action::Crash(1));
        }
        if state.reissue == Reissue::Due {
            actions.push(Action::Reissue(0));
            actions.push(Action::Reissue(1));
        }
        if state.budget.rollbacks > 0 {
            actions.push(if state.snapshot.is_some() { Action::Rollback } else { Action::Snapshot });
        }
        actions
    }

    fn next(&self, state: &State, action: &Action) -> State {
        let mut next = state.clone();
        match action {
            Action::Produce => {
                next.head += 1;
                if next.head == self.config.last() {
                    next.stream = Stream::Complete;
                    next.producer = None;
                    next.key = KeyRecord::Result;
                }
            }
            Action::Send => {
                if let Some(conn) = &next.conn
                    && let Some((item, mut written)) = self.next_write(&next, conn)
                {
                    // A notice is held to what the store retains when the replica writes it.
                    if let Wire::Gap { to, .. } = item
                        && to >= next.retained_from
                    {
                        next.needless_loss = true;
                    }
                    written.in_flight.push(item);
                    next.conn = Some(written);
                }
            }
            Action::Receive => self.receive(&mut next),
            Action::End => {
                if next.conn.as_ref().is_some_and(|conn| self.finds_rewritten(&next, conn)) {
                    next.session = Session::Rewritten;
                }
                next.conn = None;
                if self.config.client == ClientVariant::ForgetsUnfinished && next.outcome == Outcome::Pending {
                    next.outcome = Outcome::Dropped;
                }
            }
            Action::Snapshot => {
                next.snapshot = Some(Snapshot {
                    session: next.session,
                    head: next.head,
                    retained_from: next.retained_from,
                    stream: next.stream,
                    key: next.key,
                });
            }
            Action::Rollback => {
                next.budget.rollbacks -= 1;
                if let Some(snapshot) = next.snapshot.take() {
                    // What the client got past the snapshot is of a history the store lost.
                    next.lost_seen = next.delivered >> (snapshot.head + 1) != 0;
                    next.fork = Some(snapshot.head);
                    next.session = snapshot.session;
                    next.head = snapshot.head;
                    next.retained_from = snapshot.retained_from;
                    next.stream = snapshot.stream;
                    next.key = snapshot.key;
                    match next.stream {
                        // The tool's output has nowhere to go: its writes fail.
                        Stream::Gone => next.producer = None,
                        // Live again with nothing running it: its replica gives it up once it
                        // sees the store restarted.
                        Stream::Live if next.producer.is_none() => next.stream = Stream::Aborted,
                        _ => {}
                    }
                }
            }
            Action::Cut => {
                next.conn = None;
                next.budget.cuts -= 1;
            }
            Action::Resume(replica) => self.resume(&mut next, *replica),
            Action::Evict => {
                next.retained_from += 1;
                next.budget.evictions -= 1;
            }
            Action::Expire => {
                next.session = Session::Expired;
                next.budget.expiries -= 1;
                if next.producer.is_some() {
                    // The session's requests are cancelled with it; the record says so.
                    next.producer = None;
                    next.key = KeyRecord::Cancelled;
                }
            }
            Action::Reissue(replica) => self.reissue(&mut next, *replica),
            Action::Crash(replica) => {
                next.budget.crashes -= 1;
                if next.conn.as_ref().is_some_and(|c| c.replica == *replica) {
                    next.conn = None;
                }
                if next.producer == Some(*replica) {
                    // Its lease lapses: the store marks the stream aborted.
                    next.producer = None;
                    next.stream = Stream::Aborted;
                }
                if self.config.stores == Stores::PerReplica && *replica == 0 {
                    // Its memory is gone, and with it the session and the key's record.
                    next.forgotten = true;
                }
            }
        }
        // The client gives up once its reconnect budget is spent without progress; a keyed
        // client sends the request again instead.
        if next.conn.is_none()
            && next.outcome == Outcome::Pending
            && next.reported.is_none()
            && next.idle_resumes >= self.config.resume_budget()
        {
            if self.keyed() {
                next.reported = Some(("gave_up", None));
                next.reissue = Reissue::Due;
            } else {
                next.outcome = Outcome::Unknown;
            }
        }
        self.settle(&mut next);
        next
    }

    fn invariants(&self) -> Vec<Invariant<State>> {
        vec![
            Invariant { name: "no_duplicate_delivery", check: no_duplicate_delivery },
            Invariant { name: "no_silent_loss", check: no_silent_loss },
            Invariant { name: "outcome_never_silently_lost", check: outcome_never_silently_lost },
            Invariant { name: "tool_runs_once", check: tool_runs_once },
            Invariant { name: "no_revival", check: no_revival },
            Invariant { name: "no_needless_loss", check: no_needless_loss },
            Invariant { name: "one_history", check: one_history },
        ]
    }

    fn goal(&self, state: &State) -> bool {
        state.outcome != Outcome::Pending
    }
}

/// (7) No position reaches the application with two contents: once the store went back in
/// time, the application never gets events of the history that replaced the one it had.
fn one_history(state: &State) -> Result<(), String> {
    if state.mixed {
        Err(format!(
            "the application got events past position {} of a history the store lost, then events of the one it stored \
             since",
            state.fork.unwrap_or_default()
        ))
    } else {
        Ok(())
    }
}

/// (1) No event reaches the application twice.
fn no_duplicate_delivery(state: &State) -> Result<(), String> {
    if state.duplicate { Err("an event reached the application twice".into()) } else { Ok(()) }
}

/// (2) The application's events are the stream's, in order, without holes but the ones it was
/// told are gone; and a client that stopped without the response either reported a divergence,
/// or was told the response is gone, or its stream had nothing more.
fn no_silent_loss(state: &State) -> Result<(), String> {
    let expected = if state.checkpoint == 0 { 0 } else { (bit(state.checkpoint) << 1) - 2 };
    if state.delivered & state.announced != 0 {
        return Err(format!("events {:#b} were delivered and also named lost", state.delivered & state.announced));
    }
    if state.delivered | state.announced != expected {
        return Err(format!(
            "delivered {:#b} and named lost {:#b}: not exactly events 1..={}",
            state.delivered, state.announced, state.checkpoint
        ));
    }
    let told_response_gone = state.announced & bit(state.head) != 0 && state.stream != Stream::Live;
    if state.outcome == Outcome::Unknown && state.reported.is_none() && !told_response_gone {
        let missing = state.head > state.checkpoint || state.stream == Stream::Live;
        if missing {
            return Err(format!(
                "the client gave up after event {} with no divergence or resync reported (stream head {})",
                state.checkpoint, state.head
            ));
        }
    }
    Ok(())
}

/// (6) A replica names lost only what the store no longer retains when it writes the notice.
fn no_needless_loss(state: &State) -> Result<(), String> {
    if state.needless_loss {
        Err("a replica named events lost while the store still retained them".into())
    } else {
        Ok(())
    }
}

/// (3) The request ends with its result, an error or `OutcomeUnknown`; never just dropped.
fn outcome_never_silently_lost(state: &State) -> Result<(), String> {
    match state.outcome {
        Outcome::Dropped => Err("the client stopped waiting for the request without an outcome".into()),
        _ => Ok(()),
    }
}

/// (4) The tool runs at most once.
fn tool_runs_once(state: &State) -> Result<(), String> {
    if state.executions > 1 { Err(format!("the tool ran {} times", state.executions)) } else { Ok(()) }
}

/// (5) A resume never brings an ended or forgotten session back.
fn no_revival(state: &State) -> Result<(), String> {
    if state.revived {
        Err("a resume of an ended or unknown session was answered with a stream".into())
    } else {
        Ok(())
    }
}
