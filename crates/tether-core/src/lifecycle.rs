//! How a request ends, as pure decisions: what of its output goes out once it is cancelled,
//! what its stream ends with when its response cannot be written, what becomes of its key's
//! claim, what a re-send waiting for that claim does when it goes, and what a client may say of
//! a request after all its attempts. The server and the client call these; the model checks
//! them (`tether-model`'s `lifecycle`).
//!
//! The rule they keep: every request's stream ends with a terminal event (its response, or an
//! explicit `request_aborted` or `request_cancelled` error); every claimed idempotency key
//! reaches a final state or is released for a re-send to run; and "it did not run" is said
//! only when the server said so of every attempt.

/// Whether an output of a request goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emit {
    /// Written to the request's stream.
    Deliver,
    /// Refused: the request was cancelled, and only its response still goes out.
    Refuse,
}

/// Decides an output of a request that was `cancelled` or not; `last` is its response. A
/// cancelled request's notifications are dropped, but its response (the handler's own, or the
/// `request_cancelled` error) is the terminal event its stream must get.
pub fn emit(cancelled: bool, last: bool) -> Emit {
    if cancelled && !last {
        Emit::Refuse
    } else {
        Emit::Deliver
    }
}

/// What is done once a request's response was offered to its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterResponse {
    /// It was written: the stream ended with it (and the key's outcome with it).
    Ended,
    /// It could not be written: the stream is ended as aborted, so that its readers are told
    /// (`request_aborted`) instead of waiting, and the key's outcome is recorded on its own.
    AbortStream,
}

/// Decides what follows a response that was `written` or not.
pub fn after_response(written: bool) -> AfterResponse {
    if written {
        AfterResponse::Ended
    } else {
        AfterResponse::AbortStream
    }
}

/// What becomes of a keyed request's claim once the request was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// The answer is recorded as the key's outcome: a re-send gets it, and nothing runs again.
    Record,
    /// The claim is released: a re-send runs the request again.
    Release,
}

/// Decides what becomes of a keyed request's claim: its answer is recorded, unless the handler
/// failed because the store was `unavailable` under it (the answer asks the client to send the
/// request again) and it keys its own effects (`resumable`, so running it again applies nothing
/// twice). Then the claim is released: recorded, that answer would be all every re-send got,
/// and the request would never be answered with its result.
pub fn settle(unavailable: bool, resumable: bool) -> Settle {
    if unavailable && resumable {
        Settle::Release
    } else {
        Settle::Record
    }
}

/// What a request does that waited for its key's original (with no stream to follow) when the
/// key's record went: released because the store failed under the original, or forgotten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordGone {
    /// It claims the key and runs the request itself.
    Run,
    /// It is answered that the request may have run (`idempotency_record_lost`).
    Unknown,
}

/// Decides what a waiter whose key's record went does: it runs the request itself if the
/// handler keys its own effects (`resumable`), so that running it again applies nothing twice
/// and the waiter gets the result; any other request could apply its effects twice.
pub fn record_gone(resumable: bool) -> RecordGone {
    if resumable {
        RecordGone::Run
    } else {
        RecordGone::Unknown
    }
}

/// How one attempt of a request ended, as the client learned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The server answered it (a result or an error from the request itself).
    Answered,
    /// The server said positively that this attempt never started (its session was gone when
    /// it arrived, say).
    NotExecuted,
    /// It may have run: its stream broke, it was aborted or cancelled, it may not have arrived.
    MayHaveRun,
}

/// What a client may say of a request once it stops sending it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Said {
    /// The answer of the last attempt.
    Answered,
    /// It did not run: no attempt may have.
    NotExecuted,
    /// It may have run.
    OutcomeUnknown,
}

/// The attempts of one request so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Attempts {
    may_have_run: bool,
}

impl Attempts {
    /// Adds an attempt that ended as `attempt`.
    pub fn record(&mut self, attempt: Attempt) {
        self.may_have_run |= attempt == Attempt::MayHaveRun;
    }

    /// What may be said of the request if `last` is its last attempt (already recorded): "not
    /// executed" only if no attempt may have run.
    pub fn verdict(&self, last: Attempt) -> Said {
        match last {
            Attempt::Answered => Said::Answered,
            Attempt::NotExecuted if !self.may_have_run => Said::NotExecuted,
            Attempt::NotExecuted | Attempt::MayHaveRun => Said::OutcomeUnknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancelled_request_still_gets_its_response_and_nothing_else() {
        assert_eq!(emit(false, false), Emit::Deliver);
        assert_eq!(emit(true, false), Emit::Refuse);
        assert_eq!(emit(true, true), Emit::Deliver);
    }

    #[test]
    fn a_response_that_could_not_be_written_aborts_the_stream() {
        assert_eq!(after_response(true), AfterResponse::Ended);
        assert_eq!(after_response(false), AfterResponse::AbortStream);
    }

    #[test]
    fn only_a_resumable_request_failed_by_its_store_is_released() {
        assert_eq!(settle(true, true), Settle::Release);
        assert_eq!(settle(true, false), Settle::Record);
        assert_eq!(settle(false, true), Settle::Record);
        assert_eq!(settle(false, false), Settle::Record);
    }

    #[test]
    fn only_a_resumable_request_is_run_by_a_waiter_whose_record_went() {
        assert_eq!(record_gone(true), RecordGone::Run);
        assert_eq!(record_gone(false), RecordGone::Unknown);
    }

    #[test]
    fn not_executed_holds_only_if_no_attempt_may_have_run() {
        let mut attempts = Attempts::default();
        attempts.record(Attempt::NotExecuted);
        assert_eq!(attempts.verdict(Attempt::NotExecuted), Said::NotExecuted);
        attempts.record(Attempt::MayHaveRun);
        assert_eq!(attempts.verdict(Attempt::MayHaveRun), Said::OutcomeUnknown);
        attempts.record(Attempt::NotExecuted);
        assert_eq!(
            attempts.verdict(Attempt::NotExecuted),
            Said::OutcomeUnknown,
            "an earlier attempt may have run"
        );
        attempts.record(Attempt::Answered);
        assert_eq!(attempts.verdict(Attempt::Answered), Said::Answered);
    }
}
