//! The holder's side: the signal task, which takes and lets go of the client's companion locks
//! on its signal session, batched and held back briefly.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{AssertSqlSafe, Connection};
use tokio::sync::mpsc;

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

/// What the signal task does for one grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// A fresh grant of the companion name's lock, with its token: take the companion lock.
    Take(String, u64),
    /// That grant was released or found gone: let go of the companion lock, if taken for it.
    Give(String, u64),
}

/// What the client queues for its signal task, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Queued {
    /// An operation on the companion lock.
    Op(Op),
    /// The grant of the companion name with the first token was handed over to the grant with
    /// the second: the companion lock (taken, or held back) now belongs to the new grant. The
    /// lock stays held, so nothing is sent: letting go and taking again would wake waiters of
    /// other clients for a lock that never came free.
    Moved(String, u64, u64),
}

/// The signal task: takes and lets go of companion locks on its session, in the order they
/// were queued, sending whatever has queued up together as one statement. A session that
/// fails is closed, which lets go of everything it held (the server ends a closed session's
/// locks); waiters then wake and look at the rows.
pub(super) async fn keep(
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
