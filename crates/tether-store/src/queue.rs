//! A first-in, first-out queue that never copies what it holds to grow.
//!
//! A `VecDeque` that is full doubles and moves every element: once in a while, one push costs
//! time proportional to the whole queue. The memory store keeps queues as long as its retained
//! history under the lock every request takes, so its queues grow a chunk at a time instead.

use std::collections::VecDeque;

/// Most elements per chunk. A chunk grows as a `VecDeque` does up to this size (so a short
/// queue holds little), and the list of chunks doubles at a thousandth of the rate.
const CHUNK: usize = 1_024;

/// A FIFO queue in bounded chunks: no push or pop copies more than a chunk, at any length.
#[derive(Debug)]
pub(crate) struct ChunkedQueue<T> {
    chunks: VecDeque<VecDeque<T>>,
    len: usize,
}

impl<T> Default for ChunkedQueue<T> {
    fn default() -> Self {
        ChunkedQueue { chunks: VecDeque::new(), len: 0 }
    }
}

impl<T> ChunkedQueue<T> {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn front(&self) -> Option<&T> {
        self.chunks.front().and_then(VecDeque::front)
    }

    pub(crate) fn push_back(&mut self, value: T) {
        match self.chunks.back_mut() {
            Some(last) if last.len() < CHUNK => last.push_back(value),
            _ => self.chunks.push_back(VecDeque::from([value])),
        }
        self.len += 1;
    }

    /// Puts `value` back in front, as next to be popped.
    pub(crate) fn push_front(&mut self, value: T) {
        match self.chunks.front_mut() {
            Some(first) if first.len() < CHUNK => first.push_front(value),
            _ => self.chunks.push_front(VecDeque::from([value])),
        }
        self.len += 1;
    }

    pub(crate) fn pop_front(&mut self) -> Option<T> {
        let first = self.chunks.front_mut()?;
        let value = first.pop_front();
        if first.is_empty() {
            self.chunks.pop_front();
        }
        if value.is_some() {
            self.len -= 1;
        }
        value
    }

    /// The last `n` elements (all, if there are fewer), last first.
    pub(crate) fn back_mut(&mut self, n: usize) -> impl Iterator<Item = &mut T> {
        self.chunks.iter_mut().rev().flat_map(|chunk| chunk.iter_mut().rev()).take(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_is_first_in_first_out_across_chunks() {
        let mut queue = ChunkedQueue::default();
        let n = 3 * CHUNK + 7;
        for i in 0..n {
            queue.push_back(i);
        }
        assert_eq!((queue.len(), queue.front()), (n, Some(&0)));
        assert_eq!(queue.chunks.len(), 4, "grown a chunk at a time");
        for i in 0..CHUNK + 1 {
            assert_eq!(queue.pop_front(), Some(i));
        }
        queue.push_front(CHUNK);
        assert_eq!(queue.pop_front(), Some(CHUNK));
        let rest: Vec<usize> = std::iter::from_fn(|| queue.pop_front()).collect();
        assert_eq!(rest, (CHUNK + 1..n).collect::<Vec<_>>());
        assert_eq!((queue.len(), queue.front(), queue.chunks.len()), (0, None, 0));
    }

    #[test]
    fn elements_put_back_in_front_come_out_first_even_when_the_first_chunk_is_full() {
        let mut queue = ChunkedQueue::default();
        for i in 0..CHUNK {
            queue.push_back(i + 2);
        }
        queue.push_front(1);
        queue.push_front(0);
        assert_eq!(queue.len(), CHUNK + 2);
        let all: Vec<usize> = std::iter::from_fn(|| queue.pop_front()).collect();
        assert_eq!(all, (0..CHUNK + 2).collect::<Vec<_>>());
    }

    #[test]
    fn the_last_elements_are_reached_across_a_chunk_boundary() {
        let mut queue = ChunkedQueue::default();
        for i in 0..CHUNK + 2 {
            queue.push_back(i);
        }
        for value in queue.back_mut(3) {
            *value += 10_000;
        }
        let all: Vec<usize> = std::iter::from_fn(|| queue.pop_front()).collect();
        assert_eq!(&all[CHUNK - 2..], &[CHUNK - 2, CHUNK - 1 + 10_000, CHUNK + 10_000, CHUNK + 1 + 10_000]);
        assert_eq!(queue.back_mut(5).count(), 0);
    }
}
