//! The tags stores draw for the events they keep ([`Tag`]): 64 random bits per event, drawn
//! before the store's atomic step, so no backend needs randomness inside it (a Redis script
//! has none).
//!
//! What matters of a tag is that a store which went back in time and stored another event at a
//! position it had handed out draws another tag there. A generator seeded from the OS per
//! thread gives that: neither secrecy nor order is asked of tags.

use std::cell::Cell;

use tether_core::lineage::Tag;

thread_local! {
    static STATE: Cell<u64> = Cell::new(seed());
}

/// A seed from the OS, or, if it fails, from the time and this thread's stack: tags only need
/// to differ from the ones a store drew before, in another process or on another thread.
fn seed() -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_ok() {
        return u64::from_le_bytes(bytes);
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let here = std::ptr::addr_of!(bytes) as usize as u64;
    (nanos as u64) ^ here.rotate_left(32) ^ u64::from(std::process::id())
}

/// A fresh tag (SplitMix64 over the thread's state: every output of a 64-bit state is distinct
/// until it wraps).
pub(crate) fn fresh() -> Tag {
    STATE.with(|state| {
        let next = state.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        state.set(next);
        let mut z = next;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Tag::from_bits(z ^ (z >> 31))
    })
}

/// `n` fresh tags.
pub(crate) fn fresh_n(n: usize) -> Vec<Tag> {
    (0..n).map(|_| fresh()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_drawn_in_a_row_differ() {
        let drawn: std::collections::HashSet<_> = fresh_n(10_000).into_iter().collect();
        assert_eq!(drawn.len(), 10_000);
    }

    #[test]
    fn each_thread_draws_its_own() {
        let here = fresh_n(100);
        let there = std::thread::spawn(|| fresh_n(100)).join().expect("a thread");
        assert!(here.iter().all(|tag| !there.contains(tag)));
    }
}
