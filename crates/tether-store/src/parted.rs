//! A hash map that grows a part at a time.
//!
//! A `HashMap` grows by moving every entry into a table twice its size, all at once: at 130,000
//! streams in one session that held the embedded store's writer thread for 73 ms (every request
//! waited; the memory store's lock would hold every session's requests the same), and each growth
//! takes twice as long as the last. Once it is large, [`PartedMap`] splits into
//! [`PARTS`] maps by the key's hash, each growing on its own, so a growth moves at most about a
//! 64th of the entries.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use hashbrown::{DefaultHashBuilder, HashMap};

/// Entries past which the map splits into parts: below it, a growth moves a few thousand entries.
const SPLIT_AT: usize = 4_096;
/// Parts of a split map.
const PARTS: usize = 64;

/// A map from `K` to `V` whose growth never moves all of it at once. Its hasher is hashbrown's
/// (foldhash, seeded at random per process), shared by its parts: a key's part is taken from
/// bits of its hash that a part does not use to place it.
#[derive(Debug, Clone)]
pub(crate) struct PartedMap<K, V> {
    /// One map until [`SPLIT_AT`] entries, then [`PARTS`].
    parts: Vec<HashMap<K, V>>,
    hasher: DefaultHashBuilder,
    len: usize,
}

impl<K, V> Default for PartedMap<K, V> {
    fn default() -> Self {
        let hasher = DefaultHashBuilder::default();
        PartedMap { parts: vec![HashMap::with_hasher(hasher.clone())], hasher, len: 0 }
    }
}

impl<K: Hash + Eq, V> PartedMap<K, V> {
    fn part<Q: Hash + ?Sized>(&self, key: &Q) -> usize {
        if self.parts.len() == 1 {
            return 0;
        }
        // A part places its keys by the low bits and tags them with the top seven: the part is
        // taken from bits between. The remainder is below PARTS: it fits.
        ((self.hasher.hash_one(key) >> 32) % PARTS as u64) as usize
    }

    /// The value of `key`.
    pub(crate) fn get<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.parts.get(self.part(key))?.get(key)
    }

    /// The value of `key`, to change.
    pub(crate) fn get_mut<Q: Hash + Eq + ?Sized>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        let part = self.part(key);
        self.parts.get_mut(part)?.get_mut(key)
    }

    /// Sets `key` to `value`; the value it replaces.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        // `part` is below the number of parts.
        let part = self.part(&key);
        let replaced = self.parts[part].insert(key, value);
        if replaced.is_none() {
            self.len += 1;
            self.split_if_large();
        }
        replaced
    }

    /// Sets `key` to what `make` makes, unless it has a value.
    pub(crate) fn insert_if_absent(&mut self, key: K, make: impl FnOnce() -> V) {
        if self.get(&key).is_none() {
            self.insert(key, make());
        }
    }

    /// Takes `key` out; its value.
    pub(crate) fn remove<Q: Hash + Eq + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let part = self.part(key);
        let removed = self.parts.get_mut(part)?.remove(key);
        if removed.is_some() {
            self.len -= 1;
        }
        removed
    }

    /// Every value, in no order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.parts.iter().flat_map(HashMap::values)
    }

    /// Every entry, in no order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.parts.iter().flat_map(HashMap::iter)
    }

    /// Every entry, in no order, to change.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut V)> {
        self.parts.iter_mut().flat_map(HashMap::iter_mut)
    }

    fn split_if_large(&mut self) {
        if self.parts.len() > 1 || self.len <= SPLIT_AT {
            return;
        }
        let parts = (0..PARTS).map(|_| HashMap::with_hasher(self.hasher.clone())).collect();
        let whole = std::mem::replace(&mut self.parts, parts);
        for (key, value) in whole.into_iter().flatten() {
            let part = self.part(&key);
            self.parts[part].insert(key, value);
        }
    }
}

impl<K, V> IntoIterator for PartedMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::iter::Flatten<std::vec::IntoIter<HashMap<K, V>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.parts.into_iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_map_keeps_every_entry() {
        let mut map = PartedMap::default();
        for n in 0..3 * SPLIT_AT {
            assert_eq!(map.insert(n.to_string(), n), None);
        }
        assert_eq!(map.parts.len(), PARTS, "a large map is split");
        assert!((0..3 * SPLIT_AT).all(|n| map.get(n.to_string().as_str()) == Some(&n)));
        assert_eq!(map.remove("7"), Some(7));
        assert_eq!((map.get("7"), map.len, map.iter().count()), (None, 3 * SPLIT_AT - 1, 3 * SPLIT_AT - 1));
    }
}
