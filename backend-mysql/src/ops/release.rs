//! Releases and hand-overs, and their bookkeeping of hints and release signals.

use std::sync::Arc;
use std::time::Instant;

use distlock_api::backend::wait::HandOver;
use distlock_api::backend::AcquireRequest;
use distlock_api::{Error, ErrorKind, FencingToken, Grant, Result};
use sqlx::mysql::{MySqlConnection, MySqlRow};
use sqlx::{AssertSqlSafe, Row};

use super::{grant, micros, Inner, Released, MAX_ROUNDS};
use crate::error::{is_conflict, is_duplicate};
use crate::BACKEND;

impl Inner {
    /// A release within the operation timeout.
    pub(crate) async fn release(&self, g: &Grant) -> Result<bool> {
        // A permit's row is in the permit table; it keeps no hint and no release signal.
        if g.permits > 1 {
            return self.release_permit(g).await;
        }
        let released = async {
            let mut conn = self.lend(&self.holders, &g.name).await?;
            let outcome =
                tokio::time::timeout(self.operation_timeout, self.release_on(&mut conn, g)).await;
            conn.finish(outcome)
                .unwrap_or_else(|| Err(self.timed_out("releasing", &g.name)))
        }
        .await;
        // Unless one hold of several was let go, the next attempt on the name most likely finds
        // it free (whatever the answer: the hint only picks which request an attempt sends
        // first).
        if !matches!(released, Ok(Released::OneOfSeveral)) {
            self.hints.released(g.name.as_str().as_bytes());
        }
        // The grant is gone unless one hold of several was let go: its signal goes too (also
        // when the answer was lost; a waiter woken in vain looks at the row and waits again).
        if let Some(signals) = &self.signals {
            if !matches!(released, Ok(Released::OneOfSeveral)) {
                signals.released(&g.name, g.token.0);
            }
        }
        released.map(|r| r != Released::NotHeld)
    }

    /// A hand-over within the operation timeout, on a connection of the releasing pool, and its
    /// bookkeeping.
    ///
    /// The release signal: a hand-over does not free the name, so the companion lock that the
    /// signal session took for `from` is not let go (that would wake waiters of other clients
    /// as if the lock were free, only for them to find it held again). It is moved to the new
    /// grant instead, with no request: the companion lock is the session's, keyed here by
    /// token, and the new grant's release lets it go as any grant's would. The client's count
    /// of its own holds of the name is unchanged (one grant ended, one began), so its waiters
    /// keep waiting through the handle. A hand-over that only gave up one hold of several
    /// changes nothing here, like such a release; one that found `from` gone, or whose outcome
    /// is unknown, is bookkept like a release that did (the core then settles the rest with a
    /// release of `from` and a give-back of `to`, which let go of whatever is left).
    pub(crate) async fn hand_over(&self, from: &Grant, to: &AcquireRequest) -> Result<HandOver> {
        let done = async {
            let mut conn = self.lend(&self.holders, &from.name).await?;
            let outcome = tokio::time::timeout(
                self.operation_timeout,
                self.hand_over_on(&mut conn, from, to),
            )
            .await;
            conn.finish(outcome)
                .unwrap_or_else(|| Err(self.timed_out("handing over", &from.name)))
        }
        .await;
        let name = from.name.as_str().as_bytes();
        match &done {
            Ok(Ok(g)) => {
                self.hints.held(name, g.ttl);
                if let Some(signals) = &self.signals {
                    signals.handed(&from.name, from.token.0, g.token.0);
                }
            }
            Ok(Err(Released::OneOfSeveral)) => {}
            Ok(Err(Released::Last | Released::NotHeld)) | Err(_) => {
                self.hints.released(name);
                if let Some(signals) = &self.signals {
                    signals.released(&from.name, from.token.0);
                }
            }
        }
        Ok(match done? {
            Ok(g) => HandOver::Handed(g),
            Err(released) => HandOver::Released(released != Released::NotHeld),
        })
    }

    /// The common case first (`HAND_OVER_LAST` in `sql.rs`): the last hold of a grant that
    /// still holds the lock passes in one request. Otherwise (one hold of several, not held,
    /// a race) the full hand-over, which tells those cases apart, in a second request that
    /// begins with the rollback of the first; sent again (rolled back in the same way) while
    /// it loses a race to another change of the row, and after [`MAX_ROUNDS`] of them, a plain
    /// release. `Ok(grant)` when handed over, else what the release did.
    async fn hand_over_on(
        &self,
        conn: &mut MySqlConnection,
        from: &Grant,
        to: &AcquireRequest,
    ) -> Result<std::result::Result<Grant, Released>> {
        let from_owner = from.owner.text();
        let to_owner = to.owner.text();
        let (last, full) = self.sql.hand_over(
            from.name.as_str().as_bytes(),
            from_owner.as_bytes(),
            from.token.0,
            to_owner.as_bytes(),
            micros(to.ttl),
        );
        let fail = || self.err("handing over", &from.name);
        let sent_at = Instant::now();
        // Whether the transaction may still be open (a guard or lock conflict stopped the
        // batch, the counter perhaps bumped): rolled back at the start of the next request.
        let mut open = match sqlx::raw_sql(AssertSqlSafe(last))
            .fetch_all(&mut *conn)
            .await
        {
            Ok(rows) => {
                let token: u64 = match rows.first() {
                    Some(row) => row.try_get(0).map_err(fail())?,
                    None => {
                        return Err(fail()(sqlx::Error::Protocol(
                            "the hand-over returned no token".into(),
                        )))
                    }
                };
                if token > 0 {
                    return Ok(Ok(grant(to, FencingToken(token), 1, sent_at)));
                }
                // No counter row, so nothing was done: the full hand-over decides.
                false
            }
            Err(e) if is_duplicate(&e) || is_conflict(&e) => true,
            Err(e) => {
                let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
                return Err(fail()(e));
            }
        };
        let rollback_and_full = format!("ROLLBACK; {full}");
        for _ in 0..MAX_ROUNDS {
            let sent_at = Instant::now();
            let sql = if open { &rollback_and_full } else { &full };
            let answer = sqlx::raw_sql(AssertSqlSafe(sql.clone()))
                .fetch_all(&mut *conn)
                .await;
            let rows = match answer {
                Ok(rows) => rows,
                // The guard (a token taken, the row not passed on) or a lock conflict: the
                // server ran nothing after it, and the transaction may still be open with the
                // counter bumped. Rolled back (so no token is burned), then tried again.
                Err(e) if is_duplicate(&e) || is_conflict(&e) => {
                    open = true;
                    continue;
                }
                Err(e) => {
                    let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
                    return Err(fail()(e));
                }
            };
            open = false;
            let read = |row: &MySqlRow| -> sqlx::Result<(u64, i64, Option<i64>)> {
                Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
            };
            let (token, one_of_several, live) = match rows.first() {
                Some(row) => read(row).map_err(fail())?,
                None => {
                    return Err(fail()(sqlx::Error::Protocol(
                        "the hand-over returned no outcome".into(),
                    )))
                }
            };
            if token > 0 {
                return Ok(Ok(grant(to, FencingToken(token), 1, sent_at)));
            }
            if one_of_several == 1 {
                return Ok(Err(Released::OneOfSeveral));
            }
            if live != Some(1) {
                return Ok(Err(Released::NotHeld));
            }
            // Still held live by `from`, yet neither passed on nor one hold given up: its hold
            // count moved across 1 between the statements. Try again.
        }
        if open {
            sqlx::raw_sql("ROLLBACK")
                .execute(&mut *conn)
                .await
                .map_err(fail())?;
        }
        // Kept losing races (or the name's counter row is gone, so no token can be taken):
        // release as a release would.
        self.release_on(conn, from).await.map(Err)
    }

    async fn release_on(&self, conn: &mut MySqlConnection, g: &Grant) -> Result<Released> {
        let name = g.name.as_str().as_bytes();
        let owner_text = g.owner.text();
        let owner = owner_text.as_bytes();
        let token = g.token.0;
        let fail = || self.err("releasing", &g.name);
        let exec = |sql: &Arc<str>| {
            sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(name)
                .bind(owner)
                .bind(token)
        };
        for _ in 0..MAX_ROUNDS {
            let step: sqlx::Result<Option<Released>> = async {
                if exec(&self.sql.release_last)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected()
                    == 1
                {
                    return Ok(Some(Released::Last));
                }
                if exec(&self.sql.release_one)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected()
                    == 1
                {
                    return Ok(Some(Released::OneOfSeveral));
                }
                let live: Option<i64> = sqlx::query_scalar(AssertSqlSafe(self.sql.probe.clone()))
                    .bind(name)
                    .bind(owner)
                    .bind(token)
                    .fetch_optional(&mut *conn)
                    .await?;
                match live {
                    None => Ok(Some(Released::NotHeld)),
                    Some(0) => {
                        exec(&self.sql.clear_expired).execute(&mut *conn).await?;
                        Ok(Some(Released::NotHeld))
                    }
                    // Still live: another hold of this owner moved the count across 1 between
                    // our two statements. Try again.
                    Some(_) => Ok(None),
                }
            }
            .await;
            match step {
                Ok(Some(held)) => return Ok(held),
                Ok(None) => continue,
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(fail()(e)),
            }
        }
        Err(Error::new(
            ErrorKind::Backend,
            "release kept racing with other holds of the same owner",
        )
        .with_backend(BACKEND)
        .with_lock(&g.name)
        .temporary(true))
    }
}
