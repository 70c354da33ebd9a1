//! The model checks: every property holds for tether's real decision functions, and each
//! deliberately broken variant yields a counterexample, printed as a trace.

use std::time::Instant;

use tether_model::checker::{self, Report};
use tether_model::protocol::{Action, Budget, ClientVariant, Config, Resumption, ServerVariant, State, Stores};

/// Far more than any configuration here reaches; a model that grows past it is a bug.
const MAX_STATES: usize = 2_000_000;

fn run(config: Config) -> Report<Action, State> {
    let started = Instant::now();
    let report = checker::check(&Resumption::new(config), MAX_STATES).expect("the state space is bounded");
    println!(
        "{:?} server, {:?} client, {:?} stores: {} states, {} transitions, {:.2?}",
        config.server,
        config.client,
        config.stores,
        report.states,
        report.transitions,
        started.elapsed()
    );
    report
}

#[test]
fn every_property_holds_for_the_real_decisions() {
    holds(Config::real());
}

#[test]
fn every_property_holds_with_a_longer_stream_and_more_cuts() {
    let config = Config {
        events: 6,
        budget: Budget { cuts: 4, evictions: 1, expiries: 1, crashes: 1, rollbacks: 0 },
        ..Config::real()
    };
    holds(config);
}

#[test]
fn every_property_holds_for_replicas_that_do_not_share_a_store() {
    // A switch to the replica without the session is a visible 404, never a silent replay.
    holds(Config { stores: Stores::PerReplica, ..Config::real() });
}

#[test]
fn a_replica_that_adopts_an_unknown_session_revives_it() {
    let config =
        Config { stores: Stores::PerReplica, ..variant(ServerVariant::AdoptsUnknownSession, ClientVariant::Real) };
    assert_eq!(broken(config), "no_revival");
}

/// The real configuration with these decisions.
fn variant(server: ServerVariant, client: ClientVariant) -> Config {
    Config { server, client, ..Config::real() }
}

/// Checks a configuration that must hold; fails with the counterexample's trace.
fn holds(config: Config) {
    let report = run(config);
    if let Some(counterexample) = &report.counterexample {
        panic!("{counterexample}");
    }
    // A property that holds in a handful of states says little: the faults must have run.
    assert!(report.states > 1_000, "the faults were explored ({} states)", report.states);
}

/// Checks a broken variant and returns the property its counterexample breaks.
fn broken(config: Config) -> &'static str {
    let report = run(config);
    let counterexample = report.counterexample.expect("the broken variant has a counterexample");
    println!("{counterexample}");
    counterexample.property
}

#[test]
fn a_client_without_the_first_event_probe_delivers_a_replayed_cursor_event_twice() {
    assert_eq!(
        broken(variant(ServerVariant::ReplaysCursorEvent, ClientVariant::SkipsFirstEventProbe)),
        "no_duplicate_delivery"
    );
}

#[test]
fn the_real_client_skips_a_replayed_cursor_event() {
    // The same faulty server: the first-event probe recognizes the cursor's own event by its
    // digest and skips it. (With evictions too, that server fails differently: a cursor whose
    // own event was evicted can never be resumed, and the client gives up without a resync.)
    let budget = Budget { evictions: 0, ..Config::real().budget };
    holds(Config { budget, ..variant(ServerVariant::ReplaysCursorEvent, ClientVariant::Real) });
}

#[test]
fn an_empty_replay_of_evicted_history_loses_events_silently() {
    assert_eq!(broken(variant(ServerVariant::EmptyReplayWhenEvicted, ClientVariant::Real)), "no_silent_loss");
}

#[test]
fn a_server_that_discards_the_retained_tail_after_a_gap_loses_more_than_is_gone() {
    assert_eq!(broken(variant(ServerVariant::DiscardsRetainedTail, ClientVariant::Real)), "no_needless_loss");
}

#[test]
fn a_client_that_forgets_an_unfinished_stream_loses_the_outcome() {
    assert_eq!(broken(variant(ServerVariant::Real, ClientVariant::ForgetsUnfinished)), "outcome_never_silently_lost");
}

#[test]
fn reissuing_without_an_idempotency_key_runs_the_tool_twice() {
    assert_eq!(broken(variant(ServerVariant::Real, ClientVariant::ReissuesUnkeyed)), "tool_runs_once");
}

#[test]
fn a_server_that_revives_an_expired_session_is_caught() {
    assert_eq!(broken(variant(ServerVariant::RevivesExpired, ClientVariant::Real)), "no_revival");
}

#[test]
fn a_client_that_never_reconnects_waits_forever() {
    assert_eq!(broken(variant(ServerVariant::Real, ClientVariant::NeverReconnects)), "liveness");
}

#[test]
fn keyed_reissues_run_the_tool_once_and_every_request_ends() {
    // Every divergence leads to a re-send under the key, through either replica.
    holds(Config { client: ClientVariant::Keyed, ..Config::real() });
}

#[test]
fn keyed_reissues_never_reach_records_that_did_not_see_the_key() {
    holds(Config { client: ClientVariant::Keyed, stores: Stores::PerReplica, ..Config::real() });
}

#[test]
fn a_keyed_reissue_to_other_records_runs_the_tool_twice() {
    // Replicas each in their own memory: the other replica's records never saw the key.
    let config =
        Config { stores: Stores::PerReplica, ..variant(ServerVariant::Real, ClientVariant::ReissuesToOtherRecords) };
    assert_eq!(broken(config), "tool_runs_once");
}

#[test]
fn a_keyed_reissue_attaches_to_the_running_original_and_gets_its_result() {
    use tether_model::checker::Model;
    use tether_model::protocol::{Outcome, Reissue};
    let model = Resumption::new(Config { client: ClientVariant::Keyed, stores: Stores::PerReplica, ..Config::real() });
    let walk = |actions: &[Action]| actions.iter().fold(model.init(), |state, action| model.next(&state, action));
    // The balancer sends the resume to the replica without the session: 404, re-initialize.
    let diverged = walk(&[Action::Cut, Action::Resume(1)]);
    assert_eq!((diverged.reissue, diverged.outcome), (Reissue::Due, Outcome::Pending));
    assert!(model.actions(&diverged).contains(&Action::Reissue(0)));
    let attached = model.next(&diverged, &Action::Reissue(0));
    assert_eq!((attached.reissue, attached.outcome), (Reissue::Attached, Outcome::Pending));
    let finished = (0..4).fold(attached, |state, _| model.next(&state, &Action::Produce));
    assert_eq!((finished.outcome, finished.executions), (Outcome::Result, 1));
    // Through the other replica, whose records never saw the key, it is not re-sent.
    let elsewhere = model.next(&diverged, &Action::Reissue(1));
    assert_eq!((elsewhere.outcome, elsewhere.executions), (Outcome::Unknown, 1));
    // A crash of the replica holding the record (in its memory) leaves the outcome unknown.
    let crashed = model.next(&model.next(&diverged, &Action::Reissue(0)), &Action::Crash(0));
    assert_eq!((crashed.outcome, crashed.executions), (Outcome::Unknown, 1));
    // With a shared store the record outlives the crash: it says the original was abandoned.
    let shared = Resumption::new(Config { client: ClientVariant::Keyed, ..Config::real() });
    let walk = |actions: &[Action]| actions.iter().fold(shared.init(), |state, action| shared.next(&state, action));
    let aborted = walk(&[Action::Cut, Action::Expire, Action::Resume(1), Action::Reissue(1)]);
    assert_eq!((aborted.outcome, aborted.executions), (Outcome::Error, 1), "cancelled with its session");
    // Resumed after the crash: event 1 is replayed, then the stream says its request was aborted.
    let resumed =
        walk(&[Action::Produce, Action::Cut, Action::Crash(0), Action::Resume(1), Action::Send, Action::Receive]);
    assert_eq!((resumed.delivered, resumed.reissue), (0b10, Reissue::None), "what is retained is replayed");
    let crashed = shared.next(&shared.next(&resumed, &Action::Send), &Action::Receive);
    assert_eq!(crashed.reissue, Reissue::Due, "the aborted end sends a keyed request again");
    let answered = shared.next(&crashed, &Action::Reissue(1));
    assert_eq!((answered.outcome, answered.executions), (Outcome::Error, 1), "request_aborted, not a second run");
}

#[test]
fn every_property_holds_when_the_store_goes_back_in_time() {
    holds(Config::rollback());
}

#[test]
fn every_property_holds_for_keyed_calls_when_the_store_goes_back_to_before_the_call() {
    holds(Config::rollback_before_call());
}

#[test]
fn a_server_that_ignores_tags_continues_a_history_the_store_lost() {
    assert_eq!(broken(Config { server: ServerVariant::IgnoresTags, ..Config::rollback() }), "one_history");
}

#[test]
fn records_that_ignore_the_acknowledged_claim_run_the_tool_twice() {
    assert_eq!(
        broken(Config { server: ServerVariant::IgnoresClaims, ..Config::rollback_before_call() }),
        "tool_runs_once"
    );
}
