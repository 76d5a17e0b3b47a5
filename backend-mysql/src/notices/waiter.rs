//! The waiter's side: sessions to wait in `GET_LOCK` on, and the [`Notices`] of one waiter.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use distlock_api::backend::async_trait;
use distlock_api::backend::wait::{Backoff, Notices};
use distlock_api::LockName;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::Connection;

use crate::hint::Hints;

/// Sessions for waiters to block in `GET_LOCK` on, at most `limit` open; a waiter that finds
/// none to spare polls with its backoff instead.
pub(super) struct WaitSessions {
    pub(super) options: MySqlConnectOptions,
    pub(super) idle: Mutex<Vec<MySqlConnection>>,
    pub(super) open: AtomicUsize,
    /// Sessions opened so far.
    pub(super) opened: AtomicUsize,
    pub(super) limit: usize,
    pub(super) timeout: Duration,
}

impl WaitSessions {
    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<MySqlConnection>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An idle session, or a new one if fewer than `limit` are open; `None` if none can be had
    /// within `max`.
    async fn take(self: &Arc<Self>, max: Duration) -> Option<WaitSession> {
        if let Some(conn) = self.idle().pop() {
            return Some(WaitSession {
                conn: Some(conn),
                sessions: self.clone(),
            });
        }
        let counted = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .is_ok();
        if !counted {
            return None;
        }
        // Counted from here: dropped without a connection, the guard uncounts it.
        let mut session = WaitSession {
            conn: None,
            sessions: self.clone(),
        };
        let connect = MySqlConnection::connect_with(&self.options);
        match tokio::time::timeout(max.min(self.timeout), connect).await {
            Ok(Ok(conn)) => {
                self.opened.fetch_add(1, Ordering::Relaxed);
                session.conn = Some(conn);
                Some(session)
            }
            _ => None,
        }
    }
}

/// One wait session, counted as open until it is dropped (which closes it) or given back idle.
struct WaitSession {
    conn: Option<MySqlConnection>,
    sessions: Arc<WaitSessions>,
}

impl WaitSession {
    fn give_back(mut self) {
        if let Some(conn) = self.conn.take() {
            // Still open, now idle: counted once more before the drop below uncounts it.
            self.sessions.open.fetch_add(1, Ordering::AcqRel);
            self.sessions.idle().push(conn);
        }
    }
}

impl Drop for WaitSession {
    fn drop(&mut self) {
        // Closed here (mid-statement or failed: its state is unknown), never opened, or given
        // back (counted again there).
        self.sessions.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A waiter's notices: a wait in `GET_LOCK` on the companion name, or the backoff step where
/// no holder keeps the channel.
pub(crate) struct ReleaseNotices {
    pub(super) companion: String,
    /// The lock's name, forgotten as held in `hints` when its holder's release is signalled.
    pub(super) name: LockName,
    pub(super) hints: Arc<Hints>,
    pub(super) waits: Arc<WaitSessions>,
    pub(super) own: Arc<Mutex<HashMap<String, usize>>>,
    pub(super) backoff: Mutex<Backoff>,
}

impl ReleaseNotices {
    fn step(&self, max: Duration) -> Duration {
        let mut b = self.backoff.lock().unwrap_or_else(PoisonError::into_inner);
        b.next_delay().min(max)
    }
}

#[async_trait]
impl Notices for ReleaseNotices {
    async fn wait(&self, max: Duration) {
        let started = Instant::now();
        let held_here = self
            .own
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&self.companion);
        if held_here {
            // This client holds the lock: its release wakes the waiter through the handle
            // (the caller waits for that too), and a wait in `GET_LOCK` cut short by it would
            // cost the session.
            tokio::time::sleep(max).await;
            return;
        }
        let Some(mut session) = self.waits.take(max).await else {
            tokio::time::sleep(self.step(max)).await;
            return;
        };
        let left = max.saturating_sub(started.elapsed());
        let Some(conn) = session.conn.as_mut() else {
            return;
        };
        let query = sqlx::query_as::<_, (Option<i64>, Option<i64>, Option<i64>)>(
            "SELECT IS_FREE_LOCK(?), GET_LOCK(?, ?), RELEASE_LOCK(?)",
        )
        .bind(&self.companion)
        .bind(&self.companion)
        .bind(left.as_secs_f64())
        .bind(&self.companion);
        // A cut here (the waiter went away, or the server stopped answering) drops the session,
        // which closes it; it holds the companion lock only inside the statement, so nothing
        // is left held.
        let answered = tokio::time::timeout(left + self.waits.timeout, query.fetch_one(conn)).await;
        match answered {
            Ok(Ok((free, got, _))) => {
                session.give_back();
                let waited = started.elapsed();
                // Nobody held the channel, or the server did not wait as asked (a server that
                // rounds the timeout down): the backoff step, less what was spent.
                if free == Some(1) || (got == Some(0) && waited < left / 2) {
                    let step = self.step(max).saturating_sub(waited);
                    tokio::time::sleep(step).await;
                } else if got == Some(1) {
                    // The holder let go of the channel: its release (or its session's end).
                    self.hints.released(self.name.as_str().as_bytes());
                }
            }
            _ => {
                drop(session);
                let step = self.step(max).saturating_sub(started.elapsed());
                tokio::time::sleep(step).await;
            }
        }
    }
}
