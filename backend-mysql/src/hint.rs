//! What a client last saw of each lock name: held until some moment, or not known to be held.
//!
//! An acquire attempt on a name not known to be held sends its whole fresh grant as one
//! request ([`Statements::grant_in_one`](crate::sql::Statements::grant_in_one)), which costs
//! two requests instead of one when the row turns out to be there. So a name is remembered as
//! held when an attempt finds it held or this client is granted it, until the lease it saw
//! ends, and forgotten when this client releases it or a release signal of another client's
//! holder arrives: the moments after which the next attempt most likely finds it free. A
//! hand-over to another task of this client is not such a moment: the name stays held, now by
//! the new grant, and is remembered as held until that grant's lease ends (or it is released).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Above this many remembered names, the ones whose lease has ended are dropped.
const TIDY_ABOVE: usize = 4096;

#[derive(Debug, Default)]
pub(crate) struct Hints {
    held_until: Mutex<HashMap<Box<[u8]>, Instant>>,
}

impl Hints {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Box<[u8]>, Instant>> {
        self.held_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `name` is not known to be held now.
    pub(crate) fn likely_free(&self, name: &[u8]) -> bool {
        let mut map = self.map();
        match map.get(name) {
            Some(until) if *until > Instant::now() => false,
            Some(_) => {
                map.remove(name);
                true
            }
            None => true,
        }
    }

    /// `name` was seen held, with `left` of its lease to run.
    pub(crate) fn held(&self, name: &[u8], left: Duration) {
        let now = Instant::now();
        let mut map = self.map();
        if map.len() >= TIDY_ABOVE {
            map.retain(|_, until| *until > now);
        }
        map.insert(name.into(), now + left);
    }

    /// `name` was released (by this client, or a signal says by its holder).
    pub(crate) fn released(&self, name: &[u8]) {
        self.map().remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_seen_held_is_not_likely_free_until_its_lease_ends_or_it_is_released() {
        let hints = Hints::default();
        assert!(hints.likely_free(b"a"));
        hints.held(b"a", Duration::from_secs(60));
        assert!(!hints.likely_free(b"a"));
        assert!(hints.likely_free(b"b"));
        hints.released(b"a");
        assert!(hints.likely_free(b"a"));
        hints.held(b"a", Duration::ZERO);
        assert!(
            hints.likely_free(b"a"),
            "a lease that has ended is not held"
        );
        assert!(hints.map().is_empty(), "and is forgotten");
    }

    #[test]
    fn ended_leases_are_dropped_when_many_names_are_remembered() {
        let hints = Hints::default();
        for i in 0..TIDY_ABOVE {
            hints.held(format!("n{i}").as_bytes(), Duration::ZERO);
        }
        hints.held(b"live", Duration::from_secs(60));
        assert_eq!(hints.map().len(), 1);
    }
}
