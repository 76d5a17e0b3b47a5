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

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use distlock_api::backend::async_trait;
use distlock_api::backend::wait::{Backoff, Notices};
use distlock_api::LockName;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{AssertSqlSafe, Connection};
use tokio::sync::mpsc;

use crate::hint::Hints;

/// How long the signal session's `GET_LOCK` waits for a companion lock that a waiter holds for
/// the instant of its own statement.
const TAKE_WAIT_S: f64 = 0.01;

/// The most operations the signal task sends as one statement.
const BATCH: usize = 64;

/// How long the signal task holds a take back: a grant released sooner (an uncontended cycle)
/// never sends one, nor its give; a grant handed over sooner passes the held-back take on. A waiter that comes
/// in that time finds the channel free and takes a backoff step (2 ms at first) before it
/// looks again.
const TAKE_DELAY: Duration = Duration::from_millis(2);

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

/// What the signal task does for one grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// A fresh grant of the companion name's lock, with its token: take the companion lock.
    Take(String, u64),
    /// That grant was released or found gone: let go of the companion lock, if taken for it.
    Give(String, u64),
}

/// What the client queues for its signal task, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Queued {
    /// An operation on the companion lock.
    Op(Op),
    /// The grant of the companion name with the first token was handed over to the grant with
    /// the second: the companion lock (taken, or held back) now belongs to the new grant. The
    /// lock stays held, so nothing is sent: letting go and taking again would wake waiters of
    /// other clients for a lock that never came free.
    Moved(String, u64, u64),
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
        self.waits.opened.load(Ordering::SeqCst)
    }
}

/// The signal task: takes and lets go of companion locks on its session, in the order they
/// were queued, sending whatever has queued up together as one statement. A session that
/// fails is closed, which lets go of everything it held (the server ends a closed session's
/// locks); waiters then wake and look at the rows.
async fn keep(
    mut rx: mpsc::UnboundedReceiver<Queued>,
    options: MySqlConnectOptions,
    timeout: Duration,
) {
    let mut session: Option<MySqlConnection> = None;
    let mut taken = Taken::default();
    // Takes held back for TAKE_DELAY, oldest first: a grant released by then costs nothing.
    let mut held_back: VecDeque<(tokio::time::Instant, Op)> = VecDeque::new();
    loop {
        let mut batch = Vec::new();
        let due = held_back.front().map(|(at, _)| *at);
        tokio::select! {
            op = rx.recv() => match op {
                Some(op) => batch.push(op),
                None => break,
            },
            () = sleep_until_some(due) => {}
        }
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let now = tokio::time::Instant::now();
        let mut out = Vec::new();
        for queued in batch {
            match queued {
                Queued::Moved(c, from, to) => move_take(&mut held_back, &mut taken, &c, from, to),
                Queued::Op(op @ Op::Take(..)) => held_back.push_back((now + TAKE_DELAY, op)),
                Queued::Op(Op::Give(c, t)) => {
                    let its_take = held_back
                        .iter()
                        .position(|(_, o)| matches!(o, Op::Take(tc, tt) if *tc == c && *tt == t));
                    match its_take {
                        // Never sent: neither is.
                        Some(at) => {
                            held_back.remove(at);
                        }
                        None => out.push(Op::Give(c, t)),
                    }
                }
            }
        }
        while out.len() < BATCH && held_back.front().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, take)) = held_back.pop_front() {
                out.push(take);
            }
        }
        let ops = taken.plan(out);
        if ops.is_empty() {
            continue;
        }
        if session.is_none() {
            match tokio::time::timeout(timeout, MySqlConnection::connect_with(&options)).await {
                Ok(Ok(conn)) => session = Some(conn),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "distlock-mysql: no signal session");
                    continue;
                }
                Err(_) => continue,
            }
        }
        let Some(conn) = session.as_mut() else {
            continue;
        };
        let sql = statement(&ops);
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for op in &ops {
            query = match op {
                Op::Take(c, _) => query.bind(c.clone()),
                Op::Give(c, _) => query.bind(c.clone()),
            };
        }
        match tokio::time::timeout(timeout, query.fetch_one(&mut *conn)).await {
            Ok(Ok(row)) => taken.settle(&ops, &row),
            outcome => {
                if let Ok(Err(e)) = outcome {
                    tracing::debug!(error = %e, "distlock-mysql: signal session failed");
                }
                // Closing the session lets go of every companion lock it held.
                session = None;
                taken.clear();
            }
        }
    }
}

/// Passes the companion lock `c` of the grant with token `from` to the grant with token `to`:
/// its take if still held back (sent when it was due, as before), else the lock the session
/// took for it, if it did. Every earlier operation is settled by now: the signal task handles
/// them in order, and awaits each statement's answer before the next batch.
fn move_take(
    held_back: &mut VecDeque<(tokio::time::Instant, Op)>,
    taken: &mut Taken,
    c: &str,
    from: u64,
    to: u64,
) {
    let take = held_back
        .iter_mut()
        .find(|(_, o)| matches!(o, Op::Take(tc, tt) if tc == c && *tt == from));
    match take {
        Some((_, Op::Take(_, token))) => *token = to,
        _ => taken.rekey(c, from, to),
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The statement for `ops`, one column per operation, evaluated left to right.
fn statement(ops: &[Op]) -> String {
    let columns: Vec<String> = ops
        .iter()
        .map(|op| match op {
            Op::Take(..) => format!("GET_LOCK(?, {TAKE_WAIT_S})"),
            Op::Give(..) => "RELEASE_LOCK(?)".to_string(),
        })
        .collect();
    format!("SELECT {}", columns.join(", "))
}

/// The companion locks the signal session holds, by companion name and grant token.
#[derive(Default)]
struct Taken(HashMap<(String, u64), ()>);

impl Taken {
    /// What of `batch` to send: a take and the give of the same grant in one batch cancel out
    /// (nobody could have waited on a channel held that briefly), and a give of a lock never
    /// taken (its take failed or was cancelled out) sends nothing.
    fn plan(&self, batch: Vec<Op>) -> Vec<Op> {
        let mut out: Vec<Op> = Vec::with_capacity(batch.len());
        for op in batch {
            match op {
                Op::Give(c, t) => {
                    let pending = Op::Take(c.clone(), t);
                    if let Some(at) = out.iter().position(|o| *o == pending) {
                        out.remove(at);
                    } else if self.0.contains_key(&(c.clone(), t)) {
                        out.push(Op::Give(c, t));
                    }
                }
                take => out.push(take),
            }
        }
        out
    }

    /// Records what the statement for `ops` did: column `i` is operation `i`'s result.
    fn settle(&mut self, ops: &[Op], row: &sqlx::mysql::MySqlRow) {
        use sqlx::Row;
        for (i, op) in ops.iter().enumerate() {
            let done = matches!(row.try_get::<Option<i64>, _>(i), Ok(Some(1)));
            match op {
                Op::Take(c, t) if done => {
                    self.0.insert((c.clone(), *t), ());
                }
                // Not taken (held by another session for longer than the short wait): the
                // waiters of this hold poll instead.
                Op::Take(..) => {}
                Op::Give(c, t) => {
                    self.0.remove(&(c.clone(), *t));
                }
            }
        }
    }

    /// The companion lock `c` taken for the grant with `from` now stands for the grant with `to`.
    fn rekey(&mut self, c: &str, from: u64, to: u64) {
        if self.0.remove(&(c.to_string(), from)).is_some() {
            self.0.insert((c.to_string(), to), ());
        }
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// Sessions for waiters to block in `GET_LOCK` on, at most `limit` open; a waiter that finds
/// none to spare polls with its backoff instead.
struct WaitSessions {
    options: MySqlConnectOptions,
    idle: Mutex<Vec<MySqlConnection>>,
    open: AtomicUsize,
    /// Sessions opened so far.
    opened: AtomicUsize,
    limit: usize,
    timeout: Duration,
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
    companion: String,
    /// The lock's name, forgotten as held in `hints` when its holder's release is signalled.
    name: LockName,
    hints: Arc<Hints>,
    waits: Arc<WaitSessions>,
    own: Arc<Mutex<HashMap<String, usize>>>,
    backoff: Mutex<Backoff>,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn take(c: &str, t: u64) -> Op {
        Op::Take(c.into(), t)
    }
    fn give(c: &str, t: u64) -> Op {
        Op::Give(c.into(), t)
    }

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

    #[test]
    fn a_batch_sends_only_what_changes_the_sessions_locks() {
        let mut taken = Taken::default();
        // A grant released before its take was sent: neither is sent.
        assert_eq!(taken.plan(vec![take("a", 1), give("a", 1)]), vec![]);
        // A give of something never taken sends nothing; a take of another grant is sent.
        assert_eq!(
            taken.plan(vec![give("b", 1), take("b", 2)]),
            vec![take("b", 2)]
        );
        taken.0.insert(("b".into(), 2), ());
        // The give of a taken lock is sent, and only for its own token.
        assert_eq!(
            taken.plan(vec![give("b", 3), give("b", 2)]),
            vec![give("b", 2)]
        );
        // A take, its give and a new take of the same name: only the new take.
        assert_eq!(
            taken.plan(vec![take("c", 1), give("c", 1), take("c", 2)]),
            vec![take("c", 2)]
        );
        // A hand-over moves a taken lock to the new grant, whose give then lets go of it; the
        // old grant's give sends nothing.
        taken.0.insert(("d".into(), 1), ());
        taken.rekey("d", 1, 2);
        assert_eq!(taken.plan(vec![give("d", 1)]), vec![]);
        assert_eq!(taken.plan(vec![give("d", 2)]), vec![give("d", 2)]);
        // A take still held back is moved too: sent for the new grant when due.
        let mut held_back = VecDeque::from([(tokio::time::Instant::now(), take("e", 1))]);
        move_take(&mut held_back, &mut taken, "e", 1, 5);
        assert_eq!(held_back[0].1, take("e", 5));
        // A move of something neither taken nor held back changes nothing.
        move_take(&mut held_back, &mut taken, "f", 1, 2);
        assert!(!taken.0.contains_key(&("f".to_string(), 2)));
        assert_eq!(
            statement(&[take("c", 2), give("b", 2)]),
            format!("SELECT GET_LOCK(?, {TAKE_WAIT_S}), RELEASE_LOCK(?)")
        );
    }
}
