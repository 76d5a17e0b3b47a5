//! The count-down: a waiter that read every entry older than its own (a queue no deeper than
//! the queueing read returns) and subscribed to the directory's deletes before that read takes
//! its turn when the last of them is deleted, with no further read. Without it, a waiter
//! watches its predecessor and reads the queue again each time one goes; the count-down is
//! kept for the grants a second it buys under contention.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;

use crate::holds::Shared;
use crate::notices::{Seen, Subscription, WATCH_RETRY};

/// The entries older than a waiter's own, by key, with their create-revisions: complete as of
/// the waiter's queueing read. Once every one is deleted, its entry is the oldest.
pub(crate) type Older = HashMap<Vec<u8>, i64>;

/// How a wait on the older entries ended.
enum AllGone {
    /// Every older entry is deleted.
    Yes,
    /// The subscription fell behind: the count is no longer complete.
    Lagged,
    /// The watch broke: neither the count nor the subscription is any good.
    Broken,
}

impl Shared {
    /// One step of a waiter's wait by counting `counting` down, for at most `max`: whether its
    /// entry is the oldest now. A subscription that fell behind clears `counting`, one that
    /// broke clears `sub` too (back to watching the predecessor, after a read of the queue).
    /// The waiter's own entry goes with its lease: then there is nothing left to wait for.
    pub(crate) async fn count_down(
        &self,
        counting: &mut Option<Older>,
        sub: &mut Option<Subscription>,
        lease: i64,
        max: Duration,
    ) -> bool {
        let (Some(set), Some(events)) = (counting.as_mut(), sub.as_mut()) else {
            return false;
        };
        let woken = async {
            tokio::select! {
                gone = self.wait_all_gone(set, events) => Some(gone),
                _ = self.lease.gone(lease) => None,
            }
        };
        match tokio::time::timeout(max, woken).await {
            Ok(Some(AllGone::Yes)) => return true,
            Ok(Some(AllGone::Lagged)) => *counting = None,
            Ok(Some(AllGone::Broken)) => {
                (*counting, *sub) = (None, None);
                tokio::time::sleep(WATCH_RETRY).await;
            }
            Ok(None) | Err(_) => {}
        }
        false
    }

    /// Counts `older` down by the deletes `events` sees (a delete at an entry's key after its
    /// creation); returns when none is left, or when the subscription fell behind or broke
    /// (the endpoint reported).
    async fn wait_all_gone(&self, older: &mut Older, events: &mut Subscription) -> AllGone {
        loop {
            if older.is_empty() {
                return AllGone::Yes;
            }
            match events.events.recv().await {
                Ok(Seen::Deleted { key, rev, .. }) => {
                    if older.get(&key).is_some_and(|&created| rev > created) {
                        older.remove(&key);
                    }
                }
                Ok(Seen::Broken) | Err(RecvError::Closed) => {
                    self.endpoints.failed(events.endpoint);
                    return AllGone::Broken;
                }
                Err(RecvError::Lagged(_)) => return AllGone::Lagged,
            }
        }
    }
}
