//! When to reconnect: exponential backoff with full jitter and a cap, the server's `retry:`
//! honoured, and a budget that only progress refills.

use std::time::Duration;

/// Reconnection policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Upper bound of the first delay.
    pub initial: Duration,
    /// Upper bound of any delay.
    pub max: Duration,
    /// Reconnects allowed in a row without the cursor advancing. A server that keeps closing
    /// the stream without delivering anything cannot make the client loop forever.
    pub max_attempts_without_progress: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { initial: Duration::from_millis(250), max: Duration::from_secs(10), max_attempts_without_progress: 8 }
    }
}

/// The reconnect state of one stream.
#[derive(Debug, Clone)]
pub(crate) struct Attempts {
    policy: Backoff,
    failures: u32,
    /// The cursor when the budget was last refilled.
    cursor_at_reset: Option<String>,
}

impl Attempts {
    pub fn new(policy: Backoff) -> Attempts {
        Attempts { policy, failures: 0, cursor_at_reset: None }
    }

    /// Refills the budget after a connection that stayed up for a long time: a server that
    /// closes idle connections now and then (SEP-1699 polling) is not a reconnect storm.
    pub fn refill(&mut self) {
        self.failures = 0;
    }

    /// The delay before the next reconnect, or `None` when the budget is spent. `cursor` is the
    /// stream's current cursor: if it moved since the last reconnect, the budget is refilled.
    /// `server_retry` (ms), when the server sent one, is a floor: the client waits at least that
    /// long (the spec's MUST), and longer as failures repeat, so a server that is down is not
    /// hammered at its own announced rate.
    pub fn next_delay(&mut self, cursor: Option<&str>, server_retry: Option<u64>) -> Option<Duration> {
        if cursor.is_some() && cursor != self.cursor_at_reset.as_deref() {
            self.failures = 0;
            self.cursor_at_reset = cursor.map(str::to_owned);
        }
        if self.failures >= self.policy.max_attempts_without_progress {
            return None;
        }
        self.failures += 1;
        let ceiling = self.policy.initial.saturating_mul(1 << (self.failures - 1).min(16)).min(self.policy.max);
        let jittered = ceiling.mul_f64(unit_random());
        Some(jittered.max(Duration::from_millis(server_retry.unwrap_or(0))))
    }
}

/// A uniform value in [0, 1) for jitter; falls back to 1 (no jitter) if the OS has no randomness.
fn unit_random() -> f64 {
    let mut bytes = [0u8; 8];
    match getrandom::fill(&mut bytes) {
        Ok(()) => (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64,
        Err(_) => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Backoff {
        Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(1), max_attempts_without_progress: 3 }
    }

    #[test]
    fn delays_are_jittered_below_an_exponential_capped_ceiling() {
        let mut attempts = Attempts::new(Backoff { max_attempts_without_progress: 100, ..policy() });
        for n in 0..20u32 {
            let delay = attempts.next_delay(Some("c"), None).expect("budget left");
            let ceiling = Duration::from_millis(100).saturating_mul(1 << n.min(16)).min(Duration::from_secs(1));
            assert!(delay <= ceiling, "attempt {n}: {delay:?} > {ceiling:?}");
        }
    }

    #[test]
    fn delays_grow_and_spread_over_the_whole_range_below_the_ceiling() {
        // Full jitter: each delay is uniform below its ceiling. Over 64 draws per attempt, the
        // chance that all fall in one half is 2^-63: the largest is above half the ceiling (so
        // delays grow, and are not zero), the smallest below it (so they are jittered).
        for n in 0..8u32 {
            let ceiling = Duration::from_millis(100).saturating_mul(1 << n).min(Duration::from_secs(1));
            let draws: Vec<Duration> = (0..64)
                .map(|_| {
                    let mut attempts = Attempts::new(policy_without_limit());
                    (0..=n).map(|_| attempts.next_delay(Some("c"), None).expect("budget left")).last().expect("drawn")
                })
                .collect();
            let (low, high) = (draws.iter().min().expect("draws"), draws.iter().max().expect("draws"));
            assert!(*high > ceiling / 2 && *high <= ceiling, "attempt {n}: largest {high:?} of ceiling {ceiling:?}");
            assert!(*low < ceiling / 2, "attempt {n}: smallest {low:?}, not jittered below {ceiling:?}");
        }
    }

    fn policy_without_limit() -> Backoff {
        Backoff { max_attempts_without_progress: 100, ..policy() }
    }

    #[test]
    fn budget_is_spent_without_progress_and_refilled_by_progress() {
        let mut attempts = Attempts::new(policy());
        for _ in 0..3 {
            assert!(attempts.next_delay(Some("a"), None).is_some());
        }
        assert_eq!(attempts.next_delay(Some("a"), None), None, "no progress: no storm");
        assert!(attempts.next_delay(Some("b"), None).is_some(), "the cursor advanced");
    }

    #[test]
    fn server_retry_is_a_floor() {
        let mut attempts = Attempts::new(Backoff { max_attempts_without_progress: 100, ..policy() });
        for _ in 0..50 {
            let delay = attempts.next_delay(None, Some(500)).expect("budget left");
            assert!(delay >= Duration::from_millis(500) && delay <= Duration::from_secs(1), "{delay:?}");
        }
    }

    #[test]
    fn a_server_that_closes_without_progress_cannot_cause_a_storm_even_with_retry() {
        let mut attempts = Attempts::new(policy());
        let granted = (0..100).filter(|_| attempts.next_delay(Some("same"), Some(0)).is_some()).count();
        assert_eq!(granted, 3);
    }
}
