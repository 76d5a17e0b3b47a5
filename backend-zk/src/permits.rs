//! Semaphores on the lock's queue: what a contender makes of a look at its name's queue, for a
//! lock (1 permit) or a permit of a semaphore of `max`, and the signal a permit's node gives
//! the waiter behind it when it is granted.
//!
//! Every request, lock or permit, is one ephemeral-sequential node in the name's one queue,
//! and its node's name says how many permits it asked for ([`crate::path::queue`]). The node
//! at the head of the queue holds, so the head's number is the name's: a request with another
//! number is refused. A permit's node holds while fewer than `max` nodes are ahead of it, all
//! of its own semaphore. Nodes only ever leave the queue, and new ones join at its end, so a
//! node's place never rises: once it holds, it holds until it is deleted, and at most `max`
//! nodes hold at any instant.

use std::cmp::Ordering;
use std::sync::Arc;

use distlock_api::backend::AcquireRequest;
use distlock_api::{Error, OwnerId};

use crate::error::in_doubt;
use crate::holds::NodeData;
use crate::path::QueueNode;
use crate::session::Session;

/// What a contender does after a look at the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Its node holds: the lock, or one of the semaphore's permits.
    Hold,
    /// The name is held with another number of permits (the head's, given): refused.
    Refuse(u32),
    /// Wait for the node at this index of the queue to change: deleted, or written to.
    Node(usize),
    /// The semaphore's first waiter: wait for the queue itself to change.
    Children,
}

/// The verdict for the node at index `me` of `queue` (sorted, the head first), whose request
/// asked for `max` permits (1: the lock).
///
/// - The head holds with its own number of permits, so another number is refused.
/// - A lock holds at the head and otherwise waits for the node just ahead of its own (the
///   classic recipe, unchanged).
/// - A permit waits while a node of another number is ahead of it: that node refuses itself
///   when it looks (the head is not of its kind), or becomes the head after all before it are
///   gone and then this request is refused. Counting it as one of the semaphore's holders
///   instead would let a lock (or a semaphore of another size) hold at once with permits.
/// - Otherwise a permit holds at a place below `max`. The first waiter, at place `max`, waits
///   for any change of the queue: a release of any of the `max` holders is its turn. Every
///   later waiter watches the node just ahead of its own, itself a waiter: that node's deletion
///   (it gave up), or the write that marks it granted ([`mark_granted`]), makes this one the
///   first waiter, or a holder.
pub(crate) fn judge(queue: &[QueueNode], me: usize, max: u32) -> Verdict {
    let head = queue[0].max;
    if head != max {
        return Verdict::Refuse(head);
    }
    if max == 1 {
        return match me {
            0 => Verdict::Hold,
            _ => Verdict::Node(me - 1),
        };
    }
    if let Some(other) = queue[..me].iter().rposition(|n| n.max != max) {
        return Verdict::Node(other);
    }
    match me.cmp(&(max as usize)) {
        Ordering::Less => Verdict::Hold,
        Ordering::Equal => Verdict::Children,
        Ordering::Greater => Verdict::Node(me - 1),
    }
}

/// How many of `queue`'s nodes hold, and of how many permits: the head's number, and the nodes
/// of that number from the head on, up to it. `None` for an empty queue.
pub(crate) fn held(queue: &[QueueNode]) -> Option<(u32, u32)> {
    let max = queue.first()?.max;
    let run = queue.iter().take_while(|n| n.max == max).count();
    Some((u32::try_from(run).unwrap_or(u32::MAX).min(max), max))
}

/// The refusal of `req` on a name whose queue's head asked for `held` permits.
pub(crate) fn other_permits(req: &AcquireRequest, held: u32) -> Error {
    let kind = |n: u32| match n {
        1 => "as a lock".to_string(),
        n => format!("as a semaphore of {n} permits"),
    };
    Error::invalid(format!(
        "{} is held {}; this request asks for it {}",
        req.name,
        kind(held),
        kind(req.permits)
    ))
    .with_backend("zk")
}

/// Marks the permit node at `path`, just granted, as granted: a write to it, which fires the
/// data watch of the waiter queued right behind it (see [`judge`]), so that waiter becomes the
/// first waiter. Sent before the grant is returned, so before any re-entry's write; it applies
/// only to a node never written to (version 0), so a repeat, after an answer lost with the
/// connection, never undoes a later write. Nobody waits for it.
///
/// A node written to has been granted (waiters' nodes are written to by no one), so a waiter
/// that finds its predecessor's version above 0 looks at the queue again at once.
pub(crate) fn mark_granted(s: &Arc<Session>, path: &str, owner: &OwnerId) {
    let data = NodeData::bytes(owner, 1, None);
    let first = s.client.set_data(path, &data, Some(0));
    let (session, path) = (Arc::downgrade(s), path.to_string());
    let limit = s.op_timeout;
    let repeat = async move {
        let outcome = match tokio::time::timeout(limit, first).await {
            Ok(outcome) => outcome.map_err(Some),
            Err(_) => Err(None),
        };
        if !matches!(outcome, Err(ref e) if in_doubt(e)) {
            return;
        }
        tokio::time::sleep(crate::session::RETRY_PAUSE).await;
        if let Some(s) = session.upgrade() {
            let _ = s
                .call_again(|| s.client.set_data(&path, &data, Some(0)))
                .await;
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => drop(handle.spawn(repeat)),
        // No runtime: the write is on its way; a lost answer is not repeated.
        Err(_) => drop(repeat),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(maxes: &[u32]) -> Vec<QueueNode> {
        maxes
            .iter()
            .enumerate()
            .map(|(i, &max)| QueueNode {
                name: format!("n{i}"),
                seq: i as i64,
                max,
            })
            .collect()
    }

    #[test]
    fn a_lock_holds_at_the_head_and_watches_its_predecessor() {
        let queue = q(&[1, 1, 1]);
        assert_eq!(judge(&queue, 0, 1), Verdict::Hold);
        assert_eq!(judge(&queue, 1, 1), Verdict::Node(0));
        assert_eq!(judge(&queue, 2, 1), Verdict::Node(1));
        // A lock on a semaphore's name, and a permit on a lock's, are refused.
        assert_eq!(judge(&q(&[3, 1]), 1, 1), Verdict::Refuse(3));
        assert_eq!(judge(&q(&[1, 3]), 1, 3), Verdict::Refuse(1));
        // Another size while permits are held.
        assert_eq!(judge(&q(&[3, 3, 5]), 2, 5), Verdict::Refuse(3));
    }

    #[test]
    fn permits_hold_below_max_and_waiters_watch_one_node_each() {
        let queue = q(&[3, 3, 3, 3, 3, 3]);
        for me in 0..3 {
            assert_eq!(judge(&queue, me, 3), Verdict::Hold);
        }
        assert_eq!(judge(&queue, 3, 3), Verdict::Children);
        assert_eq!(judge(&queue, 4, 3), Verdict::Node(3));
        assert_eq!(judge(&queue, 5, 3), Verdict::Node(4));
        assert_eq!(held(&queue), Some((3, 3)));
        assert_eq!(held(&queue[..2]), Some((2, 3)));
        assert_eq!(held(&[]), None);
    }

    #[test]
    fn a_node_of_another_size_ahead_is_waited_for_not_counted() {
        // A lock's request queued behind permit holders: it will refuse itself, or hold once
        // they are gone; a permit behind it waits for it rather than holding beside it.
        let queue = q(&[3, 1, 3, 3]);
        assert_eq!(judge(&queue, 1, 1), Verdict::Refuse(3));
        assert_eq!(judge(&queue, 2, 3), Verdict::Node(1));
        assert_eq!(judge(&queue, 3, 3), Verdict::Node(1));
        assert_eq!(held(&queue), Some((1, 3)));
        let queue = q(&[2, 2, 4, 2]);
        assert_eq!(judge(&queue, 3, 2), Verdict::Node(2));
    }

    #[test]
    fn never_more_than_max_hold_whatever_the_queue() {
        // Every queue of up to 7 nodes of sizes 1, 2 and 3: the nodes that hold are the head's
        // kind and at most its size, and the first waiter is unique.
        let sizes = [1u32, 2, 3];
        for len in 1..=7usize {
            for code in 0..3usize.pow(len as u32) {
                let mut c = code;
                let maxes: Vec<u32> = (0..len)
                    .map(|_| {
                        let m = sizes[c % 3];
                        c /= 3;
                        m
                    })
                    .collect();
                let queue = q(&maxes);
                let verdicts: Vec<Verdict> =
                    (0..len).map(|me| judge(&queue, me, maxes[me])).collect();
                let holding: Vec<usize> =
                    (0..len).filter(|&i| verdicts[i] == Verdict::Hold).collect();
                assert!(holding.len() as u32 <= maxes[0], "{maxes:?}: {verdicts:?}");
                assert!(
                    holding.iter().all(|&i| maxes[i] == maxes[0]),
                    "{maxes:?}: {verdicts:?}"
                );
                let firsts = verdicts.iter().filter(|v| **v == Verdict::Children).count();
                assert!(firsts <= 1, "{maxes:?}: {verdicts:?}");
                assert_eq!(
                    held(&queue).map(|(n, _)| n as usize),
                    Some(holding.len()),
                    "{maxes:?}: {verdicts:?}"
                );
                for (i, v) in verdicts.iter().enumerate() {
                    if let Verdict::Node(w) = v {
                        assert!(*w < i, "a waiter watches a node ahead of its own");
                    }
                }
            }
        }
    }
}
