//! [`Recent`]: a small bounded memory of keys seen lately.

use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// The last `N` keys inserted, each with a value; inserting one more forgets the oldest. For a
/// client's record of what it did lately (the grants it released, say), which must stay small
/// however long the client runs. Inserting a key already remembered keeps its first value and
/// place.
#[derive(Debug)]
pub struct Recent<K, V, const N: usize> {
    values: HashMap<K, V>,
    order: VecDeque<K>,
}

impl<K, V, const N: usize> Default for Recent<K, V, N> {
    fn default() -> Self {
        Self {
            values: HashMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl<K: Eq + Hash + Clone, V, const N: usize> Recent<K, V, N> {
    /// Remembers `key` with `value`, forgetting the oldest key if `N` are remembered already.
    pub fn insert(&mut self, key: K, value: V) {
        if self.values.contains_key(&key) || N == 0 {
            return;
        }
        if self.order.len() >= N {
            if let Some(oldest) = self.order.pop_front() {
                self.values.remove(&oldest);
            }
        }
        self.order.push_back(key.clone());
        self.values.insert(key, value);
    }

    /// The value remembered with `key`, if it is remembered.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.values.get(key)
    }

    /// How many keys are remembered.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_n_keys_with_their_first_values() {
        let mut recent = Recent::<String, u32, 3>::default();
        for (i, k) in ["a", "b", "c"].into_iter().enumerate() {
            recent.insert(k.to_string(), i as u32);
        }
        recent.insert("a".into(), 9);
        assert_eq!(recent.get("a"), Some(&0), "the first value stays");
        recent.insert("d".into(), 3);
        assert_eq!(recent.get("a"), None, "the oldest is forgotten");
        assert_eq!(
            ["b", "c", "d"].map(|k| recent.get(k).copied()),
            [Some(1), Some(2), Some(3)]
        );
        assert_eq!(recent.len(), 3);
    }
}
