//! The lifecycle model: every request ends, and "not executed" is never said of one that ran,
//! for tether's real decisions; each broken variant yields a counterexample, printed as a
//! trace.

use std::time::Instant;

use tether_model::checker::{self, Report};
use tether_model::lifecycle::{Action, ClientVariant, Config, Lifecycle, ServerVariant, State};

/// Far more than the model reaches.
const MAX_STATES: usize = 1_000_000;

fn run(config: Config) -> Report<Action, State> {
    let started = Instant::now();
    let report = checker::check(&Lifecycle::new(config), MAX_STATES).expect("the state space is bounded");
    println!(
        "lifecycle, {:?} server, {:?} client: {} states, {} transitions, {:.2?}",
        config.server,
        config.client,
        report.states,
        report.transitions,
        started.elapsed()
    );
    report
}

fn broken(config: Config) -> &'static str {
    let report = run(config);
    let counterexample = report.counterexample.expect("the broken variant has a counterexample");
    println!("{counterexample}");
    counterexample.property
}

/// Checks that `config` has no counterexample, having explored its faults.
fn holds(config: Config) {
    let report = run(config);
    if let Some(counterexample) = &report.counterexample {
        panic!("{counterexample}");
    }
    assert!(report.states > 50, "the faults were explored ({} states)", report.states);
}

#[test]
fn every_request_ends_and_is_never_said_not_to_have_run_when_it_ran() {
    holds(Config::real());
}

#[test]
fn a_response_refused_after_a_cancellation_leaves_the_request_without_an_end() {
    let config = Config { server: ServerVariant::RefusesResponseAfterCancel, ..Config::real() };
    assert_eq!(broken(config), "liveness");
}

#[test]
fn a_claim_kept_for_a_request_that_never_started_is_never_finished() {
    let config = Config { server: ServerVariant::KeepsUnstartedClaim, ..Config::real() };
    assert_eq!(broken(config), "liveness");
}

#[test]
fn trusting_the_last_attempt_says_a_request_that_ran_did_not() {
    let config = Config { client: ClientVariant::TrustsLastAttempt, ..Config::real() };
    assert_eq!(broken(config), "not_run_means_not_run");
}

#[test]
fn recording_a_store_unavailable_answer_never_gives_a_resumable_request_its_result() {
    let config = Config { server: ServerVariant::RecordsUnavailable, ..Config::real() };
    assert_eq!(broken(config), "liveness");
}

#[test]
fn in_2026_07_28_every_request_ends_and_a_resumable_one_gets_its_result() {
    holds(Config::stateless());
}

#[test]
fn a_waiter_that_never_takes_over_a_released_key_never_gives_a_resumable_request_its_result() {
    let config = Config { server: ServerVariant::NeverTakesOver, ..Config::stateless() };
    assert_eq!(broken(config), "liveness");
}

#[test]
fn a_released_claim_not_counted_as_forgotten_leaves_a_resumable_request_unknown() {
    let config = Config { server: ServerVariant::ReleaseForgetsNothing, ..Config::real() };
    assert_eq!(broken(config), "liveness");
}

#[test]
fn in_2026_07_28_a_released_claim_not_counted_as_forgotten_leaves_a_resumable_request_unknown() {
    let config = Config { server: ServerVariant::ReleaseForgetsNothing, ..Config::stateless() };
    assert_eq!(broken(config), "liveness");
}
