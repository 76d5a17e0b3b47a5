//! Release signals: a server-side wait channel beside the lock table, so that a waiter of
//! another client is woken when the holder lets go instead of at its next backoff step.
//!
//! The lock itself stays the row of the lock table, with its lease and fencing token; the
//! channel only tells waiters when to look at the row again. It is a user-level lock of the
//! server (`GET_LOCK`) on a companion name derived from the database, the lock table and the
//! lock's name:
//!
//! - A client that wins a fresh grant takes the companion lock on a session of its own (the
//!   *signal session*, one per client, opened on first use), right after the grant and off the
//!   acquire's path; it lets go of it when the grant is released (or found gone). Taking and
//!   letting go are queued to one task, which sends what has queued up as one statement.
//! - A waiter whose attempt found the row held waits in `GET_LOCK` on the companion name, up to
//!   the wait's bound, and lets go again in the same statement
//!   (`SELECT IS_FREE_LOCK(c), GET_LOCK(c, t), RELEASE_LOCK(c)`): it never holds the channel
//!   after the statement, so the next holder can take it. A release by the holder, or the end
//!   of the holder's signal session (a crashed process, a cut connection), wakes it.
//! - A hand-over to a task of the same client ([`Signals::handed`]) keeps the lock held, so it
//!   keeps the companion lock too: it passes from the old grant to the new one in the signal
//!   task's books, with no statement, and waiters of other clients sleep on.
//! - Where the companion lock was free (a holder that keeps no channel: an older client, one
//!   with signals off, or one whose take has not landed yet), the waiter falls back to its
//!   backoff step, so it never waits on a channel nobody holds.
//!
//! Nothing here can grant or keep a lock: a lost, late or spurious signal only moves the next
//! attempt, and every wait is bounded by the holder's expiry and the 5 s re-check of
//! [`NOTICE_RECHECK`](distlock_api::backend::wait::NOTICE_RECHECK).

mod holder;
mod waiter;

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock_api::backend::wait::Backoff;
use distlock_api::LockName;
use sqlx::mysql::MySqlConnectOptions;
use tokio::sync::mpsc;

use self::holder::{keep, Op, Queued};
pub(crate) use self::waiter::ReleaseNotices;
use self::waiter::WaitSessions;
use crate::hint::Hints;

/// The companion name of `name`'s lock in `table` of `database`: `distlock:` and 16 hex digits
/// of a 64-bit FNV-1a hash (the server's lock names are limited to 64 characters, lock names
/// are not). Stable across processes and versions; a collision only wakes a waiter in vain.
pub(crate) fn companion(database: &str, table: &str, name: &LockName) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [
        database.as_bytes(),
        table.as_bytes(),
        name.as_str().as_bytes(),
    ] {
        for &b in part.iter().chain(&[0u8]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("distlock:{h:016x}")
}

/// A client's release signals: the queue to its signal task, and the sessions its waiters
/// wait on.
pub(crate) struct Signals {
    ops: mpsc::UnboundedSender<Queued>,
    waits: Arc<WaitSessions>,
    /// The companion names of the grants this client holds, with how many: a waiter of this
    /// client for one of them is woken by the client's own release (lock-api's same-handle
    /// wake-up) and does not wait on the server.
    own: Arc<Mutex<HashMap<String, usize>>>,
    database: String,
    table: String,
    backoff: (Duration, Duration),
    hints: Arc<Hints>,
}

impl Signals {
    /// Starts the signal task (it opens its session on first use and ends with `self`).
    pub(crate) fn start(
        options: MySqlConnectOptions,
        database: String,
        table: String,
        sessions: usize,
        backoff: (Duration, Duration),
        timeout: Duration,
        hints: Arc<Hints>,
    ) -> Self {
        let (ops, rx) = mpsc::unbounded_channel();
        tokio::spawn(keep(rx, options.clone(), timeout));
        Self {
            ops,
            waits: Arc::new(WaitSessions {
                options,
                idle: Mutex::default(),
                open: AtomicUsize::new(0),
                opened: AtomicUsize::new(0),
                limit: sessions.max(1),
                timeout,
            }),
            own: Arc::default(),
            database,
            table,
            backoff,
            hints,
        }
    }

    fn own(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.own.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The companion name of `name`'s lock.
    pub(crate) fn companion(&self, name: &LockName) -> String {
        companion(&self.database, &self.table, name)
    }

    /// A fresh grant of `name` with `token`: the signal task takes its companion lock.
    pub(crate) fn granted(&self, name: &LockName, token: u64) {
        let companion = self.companion(name);
        *self.own().entry(companion.clone()).or_default() += 1;
        let _ = self.ops.send(Queued::Op(Op::Take(companion, token)));
    }

    /// The grant of `name` with `token` is released or gone: its companion lock is let go.
    pub(crate) fn released(&self, name: &LockName, token: u64) {
        let companion = self.companion(name);
        {
            let mut own = self.own();
            if let Some(n) = own.get_mut(&companion) {
                *n -= 1;
                if *n == 0 {
                    own.remove(&companion);
                }
            }
        }
        let _ = self.ops.send(Queued::Op(Op::Give(companion, token)));
    }

    /// The grant of `name` with `from` was handed over to a grant of this client with `to`:
    /// its companion lock goes with it. This client's count of its own grants of the name is
    /// unchanged (one ended, one began).
    pub(crate) fn handed(&self, name: &LockName, from: u64, to: u64) {
        let _ = self.ops.send(Queued::Moved(self.companion(name), from, to));
    }

    /// Notices for a waiter of `name`.
    pub(crate) fn notices(&self, name: &LockName) -> ReleaseNotices {
        ReleaseNotices {
            companion: self.companion(name),
            name: name.clone(),
            hints: self.hints.clone(),
            waits: self.waits.clone(),
            own: self.own.clone(),
            backoff: Mutex::new(Backoff::new(self.backoff.0, self.backoff.1)),
        }
    }

    /// How many wait sessions this client has opened so far (test-only).
    #[cfg(feature = "testing")]
    pub(crate) fn wait_sessions(&self) -> usize {
        self.waits.opened.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn companion_names_are_short_stable_and_differ_by_database_table_and_name() {
        let n = LockName::new("orders/42").unwrap();
        let c = companion("app", "distlock_locks", &n);
        assert_eq!(c, companion("app", "distlock_locks", &n));
        assert_eq!(c.len(), "distlock:".len() + 16);
        assert!(c.starts_with("distlock:"));
        let long = LockName::new("x".repeat(200)).unwrap();
        assert!(companion("app", "distlock_locks", &long).len() <= 64);
        // The parts are separated: moving bytes between them gives another name.
        assert_ne!(c, companion("ap", "pdistlock_locks", &n));
        assert_ne!(c, companion("other", "distlock_locks", &n));
        assert_ne!(c, companion("app", "other_locks", &n));
        assert_ne!(
            c,
            companion(
                "app",
                "distlock_locks",
                &LockName::new("orders/43").unwrap()
            )
        );
    }
}
