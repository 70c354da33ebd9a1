//! The task stream model: what a client accepts of a task's events is one history of the task,
//! it says the stream broke only when the store went back in time, and it always reaches the
//! final status or a verdict; each broken client variant yields a counterexample, printed as a
//! trace.

use std::time::Instant;

use tether_model::checker::{self, Report};
use tether_model::task_stream::{Action, ClientVariant, State, TaskStream};

/// Far more than the model reaches.
const MAX_STATES: usize = 1_000_000;

fn run(client: ClientVariant) -> Report<Action, State> {
    let started = Instant::now();
    let report = checker::check(&TaskStream::new(client), MAX_STATES).expect("the state space is bounded");
    println!(
        "task stream, {client:?} client: {} states, {} transitions, {:.2?}",
        report.states,
        report.transitions,
        started.elapsed()
    );
    report
}

fn broken(client: ClientVariant) -> &'static str {
    let report = run(client);
    let counterexample = report.counterexample.expect("the broken variant has a counterexample");
    println!("{counterexample}");
    counterexample.property
}

#[test]
fn a_task_stream_is_one_history_to_its_end_or_a_verdict() {
    let report = run(ClientVariant::Real);
    if let Some(counterexample) = &report.counterexample {
        panic!("{counterexample}");
    }
    assert!(report.states > 100, "rollbacks, cuts and retention were explored ({} states)", report.states);
}

#[test]
fn a_client_that_checks_only_seq_splices_two_histories() {
    assert_eq!(broken(ClientVariant::SeqOnly), "one_history");
}

#[test]
fn a_client_that_resumes_after_the_response_follows_a_shorter_history_for_ever() {
    assert_eq!(broken(ClientVariant::ResumesAfterResponse), "liveness");
}
