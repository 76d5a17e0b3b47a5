//! Advisory mode: session advisory locks (`pg_try_advisory_lock`) on one dedicated connection
//! per client, whose lease is that session (see the crate docs, "Advisory mode").
//!
//! One statement at a time runs on the session (its state is behind an async mutex).
//! Releases, renewals and give-backs run in tasks of their own, so a caller that stops waiting
//! never cuts them in half; attempts are polled in the caller's task (see
//! [`Advisory::attempt`]).

mod rows;
mod session;
pub(crate) mod sql;

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::backend::wait::Attempt;
use distlock_api::backend::{lost, AcquireRequest, ClientCore, Surplus};
use distlock_api::{Error, ErrorKind, FencingToken, Grant, LockName, LostReason, Result};
use sha2::{Digest, Sha256};
use sqlx::postgres::PgConnectOptions;
use sqlx::Row;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use self::session::{keepalive, query, Held, State};
use self::sql::{AdvisoryStatements, UNLOCK};
use crate::error::map_error;
use crate::BACKEND;

/// The advisory key of a lock name: the first 8 bytes of the SHA-256 of its UTF-8 bytes, as
/// a big-endian signed 64-bit integer (what `pg_advisory_lock(bigint)` takes).
pub fn advisory_key(name: &str) -> i64 {
    let digest = Sha256::digest(name.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// What the session's tasks share.
pub(crate) struct Shared {
    options: PgConnectOptions,
    sql: AdvisoryStatements,
    bound: Duration,
    operation_timeout: Duration,
    connect_timeout: Duration,
    endpoint: String,
    channel: String,
    state: Mutex<State>,
}

/// The advisory side of a client: its session and the keepalive task.
pub(crate) struct Advisory {
    shared: Arc<Shared>,
    keepalive: JoinHandle<()>,
}

/// Settings of the advisory side.
pub(crate) struct Setup {
    pub(crate) options: PgConnectOptions,
    pub(crate) sql: AdvisoryStatements,
    pub(crate) bound: Duration,
    pub(crate) operation_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) endpoint: String,
    pub(crate) channel: String,
}

impl Drop for Advisory {
    fn drop(&mut self) {
        self.keepalive.abort();
    }
}

fn collision(name: &LockName, other: &str, key: i64) -> Error {
    Error::invalid(format!(
        "advisory key {key} of this name is the key of {other:?} too (a SHA-256 prefix \
         collision), which holds it now: the two names cannot both be used in advisory mode; \
         rename one or use mode=table"
    ))
    .with_backend(BACKEND)
    .with_lock(name)
}

/// A confirmation's outcome on the session.
enum Renewed {
    /// The server's answer (or a failed round trip).
    Answer(Result<Duration>),
    /// The session that held the grant ended (or the grant was released).
    SessionEnded(Error),
}

fn session_lost(name: &LockName, why: &str) -> Error {
    lost(name, format!("the advisory session {why}")).with_backend(BACKEND)
}

impl Advisory {
    pub(crate) fn new(setup: Setup) -> Self {
        let shared = Arc::new(Shared {
            options: setup.options,
            sql: setup.sql,
            bound: setup.bound,
            operation_timeout: setup.operation_timeout,
            connect_timeout: setup.connect_timeout,
            endpoint: setup.endpoint,
            channel: setup.channel,
            state: Mutex::new(State::default()),
        });
        let keepalive = tokio::spawn(keepalive(shared.clone()));
        Self { shared, keepalive }
    }

    /// The session bound: every grant's lease.
    pub(crate) fn bound(&self) -> Duration {
        self.shared.bound
    }

    /// Opens the session now (connect does, so that a proxy is refused at once).
    pub(crate) async fn open(&self) -> Result<()> {
        let shared = self.shared.clone();
        detached(async move {
            let mut st = shared.lock_state().await;
            shared.session(&mut st).await.map(|_| ())
        })
        .await
    }

    /// One attempt, polled in the caller's task so that its statement is written at once (a
    /// waiter woken by a release asks before anyone the release's caller goes on to). The core
    /// finishes an attempt whose caller left in a task of its own and releases a grant it won
    /// ([`distlock_api::backend::wait`]); an attempt dropped outside a runtime, mid-statement,
    /// leaves a mark that makes the next operation drop the session (whose locks the server
    /// then frees) rather than guess what the statement did.
    pub(crate) async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        let mut st = self.shared.lock_state().await;
        st.inflight = true;
        let answer = self.shared.attempt_locked(&mut st, req).await;
        st.inflight = false;
        answer
    }

    pub(crate) async fn release(&self, grant: &Grant) -> Result<bool> {
        let (shared, grant) = (self.shared.clone(), grant.clone());
        detached(async move { shared.release(&grant).await }).await
    }

    /// Confirms `grants` on the session. A grant whose session ended is lost with
    /// [`LostReason::Session`] (its guard learns why), not as a lock taken over.
    pub(crate) async fn renew_many(
        &self,
        core: &ClientCore,
        grants: &[(Grant, Duration)],
    ) -> Vec<Result<Duration>> {
        let (shared, owned) = (self.shared.clone(), grants.to_vec());
        let n = grants.len();
        match detached(async move { Ok(shared.renew_many(&owned).await) }).await {
            Ok(results) => results
                .into_iter()
                .zip(grants)
                .map(|(renewed, (g, _))| match renewed {
                    Renewed::Answer(r) => r,
                    Renewed::SessionEnded(e) => {
                        core.mark_lost(
                            |x| x.name == g.name && x.token == g.token && x.key == g.key,
                            LostReason::Session(e.message().to_string()),
                        );
                        Err(e)
                    }
                })
                .collect(),
            Err(e) => (0..n).map(|_| Err(crate::error::clone_error(&e))).collect(),
        }
    }

    pub(crate) async fn give_back(&self, core: &ClientCore, surplus: &Surplus) -> Result<bool> {
        let (shared, surplus) = (self.shared.clone(), surplus.clone());
        let holds = {
            let st = self.shared.lock_state().await;
            match st.held.get(&surplus.name) {
                Some(h) if h.owner == surplus.owner => h.holds,
                _ => return Ok(false),
            }
        };
        if !core.has_surplus(&surplus, holds) {
            return Ok(false);
        }
        detached(async move { shared.give_back(&surplus).await }).await
    }
}

/// Runs `fut` in a task of its own: the caller may stop waiting, the work goes on.
async fn detached<T: Send + 'static>(
    fut: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    tokio::spawn(fut).await.unwrap_or_else(|e| {
        Err(
            Error::new(ErrorKind::Backend, format!("an advisory task failed: {e}"))
                .with_backend(BACKEND),
        )
    })
}

impl Shared {
    async fn with_timeout<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = sqlx::Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.operation_timeout, fut).await {
            Ok(r) => r.map_err(|e| map_error(e, what)),
            Err(_) => Err(crate::error::timed_out(what, self.operation_timeout)),
        }
    }

    fn grant(
        &self,
        req: &AcquireRequest,
        epoch: u64,
        token: i64,
        holds: u32,
        sent_at: Instant,
    ) -> Grant {
        let mut grant = Grant::new(
            req.name.clone(),
            req.owner.clone(),
            FencingToken(token as u64),
            holds,
            self.bound,
            sent_at,
        );
        grant.key = epoch.to_string();
        grant
    }

    /// The session's state, locked; a session an attempt was dropped in the middle of is
    /// dropped first.
    async fn lock_state(&self) -> tokio::sync::MutexGuard<'_, State> {
        let mut st = self.state.lock().await;
        if st.inflight {
            st.inflight = false;
            st.kill("an acquire was dropped in the middle of its statement");
        }
        st
    }

    async fn attempt_locked(&self, st: &mut State, req: &AcquireRequest) -> Result<Attempt> {
        let key = advisory_key(req.name.as_str());
        let sent_at = Instant::now();
        if let Some(h) = st.held.get(&req.name).cloned() {
            if h.owner != req.owner {
                // Another acquisition of this handle holds it: the session would re-enter
                // its own lock, so the handle answers for it.
                return Ok(Attempt::Held { expires_in: None });
            }
            let holds = h.holds + 1;
            let sql = self.sql.holds.clone();
            let updated = self
                .on_session(st, "re-entering an advisory lock", move |c| {
                    Box::pin(async move {
                        query(&sql)
                            .bind(key)
                            .bind(h.token)
                            .bind(holds as i32)
                            .execute(c)
                            .await
                    })
                })
                .await
                .map_err(|e| e.with_lock(&req.name))?;
            if updated.rows_affected() == 0 {
                // The row was removed behind the holder's back (force-released): give the
                // key up, as the next probe would.
                let _ = self
                    .release_hold(st, &req.name, Held { holds: 1, ..h })
                    .await;
                return Err(lost(
                    &req.name,
                    "the advisory lock's row was removed (force-released)",
                )
                .with_backend(BACKEND));
            }
            st.held.get_mut(&req.name).expect("held").holds = holds;
            let epoch = st.epoch;
            return Ok(Attempt::Granted(
                self.grant(req, epoch, h.token, holds, sent_at),
            ));
        }
        if let Some((other, _)) = st.held.iter().find(|(_, h)| h.key == key) {
            return Err(collision(&req.name, other.as_str(), key));
        }
        let (sql, name, owner) = (
            self.sql.acquire.clone(),
            req.name.as_str().to_string(),
            req.owner.text().to_string(),
        );
        let answer = self
            .on_session(st, "taking an advisory lock", move |c| {
                Box::pin(async move {
                    let row = query(&sql)
                        .bind(key)
                        .bind(&name)
                        .bind(&owner)
                        .fetch_one(c)
                        .await?;
                    let got: bool = row.try_get(0)?;
                    let token: Option<i64> = row.try_get(1)?;
                    let recorded: Option<String> = row.try_get(2)?;
                    Ok((got, token, recorded))
                })
            })
            .await;
        let (got, token, recorded) = match answer {
            Ok(a) => a,
            Err(e) => {
                // The key may have been taken before the statement failed: a session lock
                // outlives a rollback. Give it back, or end the session.
                if st.conn.is_some() {
                    let unlocked = self
                        .on_session(st, "unlocking after a failed acquire", move |c| {
                            Box::pin(async move {
                                sqlx::query_scalar::<_, bool>(UNLOCK)
                                    .bind(key)
                                    .fetch_one(c)
                                    .await
                            })
                        })
                        .await;
                    if unlocked.is_err() {
                        st.kill("could not unlock after a failed acquire");
                    }
                }
                return Err(e.with_lock(&req.name));
            }
        };
        match (got, token) {
            (true, Some(token)) => {
                st.held.insert(
                    req.name.clone(),
                    Held {
                        key,
                        owner: req.owner.clone(),
                        token,
                        holds: 1,
                    },
                );
                let epoch = st.epoch;
                Ok(Attempt::Granted(self.grant(req, epoch, token, 1, sent_at)))
            }
            (true, None) => {
                st.kill("took a key but wrote no row");
                Err(
                    Error::new(ErrorKind::Backend, "the advisory acquire wrote no row")
                        .with_backend(BACKEND)
                        .with_lock(&req.name),
                )
            }
            (false, _) => match recorded {
                Some(other) if other != req.name.as_str() => Err(collision(&req.name, &other, key)),
                // A holder that dies sends no notice: the server frees the key when its
                // session ends (at once when its socket closes, by the idle timeout at the
                // latest). A waiter looks again every third of the bound, as often as holders
                // probe their sessions, rather than at the notices' five-second recheck.
                _ => Ok(Attempt::Held {
                    expires_in: Some(self.bound / 3),
                }),
            },
        }
    }

    /// Whether `g` is a hold of this session: its epoch, owner and token.
    fn holds_grant(st: &State, g: &Grant) -> Option<Held> {
        if st.conn.is_none() || g.key != st.epoch.to_string() {
            return None;
        }
        st.held
            .get(&g.name)
            .filter(|h| h.owner == g.owner && h.token == g.token.0 as i64)
            .cloned()
    }

    async fn release(&self, g: &Grant) -> Result<bool> {
        let mut st = self.lock_state().await;
        let Some(h) = Self::holds_grant(&st, g) else {
            return Ok(false);
        };
        self.release_hold(&mut st, &g.name, h).await
    }

    async fn release_hold(&self, st: &mut State, name: &LockName, h: Held) -> Result<bool> {
        let key = h.key;
        if h.holds > 1 {
            let sql = self.sql.holds.clone();
            let holds = h.holds - 1;
            self.on_session(st, "releasing an advisory hold", move |c| {
                Box::pin(async move {
                    query(&sql)
                        .bind(key)
                        .bind(h.token)
                        .bind(holds as i32)
                        .execute(c)
                        .await
                })
            })
            .await
            .map_err(|e| e.with_lock(name))?;
            st.held.get_mut(name).expect("held").holds = holds;
            return Ok(true);
        }
        let (sql, channel, n) = (
            self.sql.release.clone(),
            self.channel.clone(),
            name.as_str().to_string(),
        );
        let unlocked = self
            .on_session(st, "unlocking an advisory lock", move |c| {
                Box::pin(async move {
                    let row = query(&sql)
                        .bind(key)
                        .bind(h.token)
                        .bind(&channel)
                        .bind(&n)
                        .fetch_one(c)
                        .await?;
                    row.try_get::<bool, _>(0)
                })
            })
            .await
            .map_err(|e| e.with_lock(name))?;
        st.held.remove(name);
        Ok(unlocked)
    }

    async fn give_back(&self, surplus: &Surplus) -> Result<bool> {
        let mut st = self.lock_state().await;
        let Some(h) = st
            .held
            .get(&surplus.name)
            .filter(|h| h.owner == surplus.owner)
            .cloned()
        else {
            return Ok(false);
        };
        self.release_hold(&mut st, &surplus.name, h).await
    }

    /// One probe for every grant: the session answers, holds each key, and each key's row
    /// still records the grant. A key whose row was removed (an operator's force-release) is
    /// unlocked here.
    async fn renew_many(&self, grants: &[(Grant, Duration)]) -> Vec<Renewed> {
        let mut st = self.lock_state().await;
        let mut results: Vec<Option<Renewed>> = Vec::with_capacity(grants.len());
        let mut asked = Vec::new();
        for (i, (g, _)) in grants.iter().enumerate() {
            match Self::holds_grant(&st, g) {
                Some(h) => {
                    asked.push((i, h));
                    results.push(None);
                }
                None => results.push(Some(Renewed::SessionEnded(session_lost(
                    &g.name,
                    "that held this grant ended, or the grant was released",
                )))),
            }
        }
        if !asked.is_empty() {
            let keys: Vec<i64> = asked.iter().map(|(_, h)| h.key).collect();
            let tokens: Vec<i64> = asked.iter().map(|(_, h)| h.token).collect();
            let sql = self.sql.probe.clone();
            let rows = self
                .on_session(&mut st, "probing the advisory session", move |c| {
                    Box::pin(async move {
                        let rows = query(&sql).bind(&keys).bind(&tokens).fetch_all(c).await?;
                        rows.iter()
                            .map(|r| Ok((r.try_get::<i64, _>(0)?, r.try_get(1)?, r.try_get(2)?)))
                            .collect::<sqlx::Result<Vec<(i64, bool, bool)>>>()
                    })
                })
                .await;
            match rows {
                Ok(rows) => {
                    for (j, (i, h)) in asked.into_iter().enumerate() {
                        let name = &grants[i].0.name;
                        let (held, recorded) = rows
                            .iter()
                            .find(|r| r.0 == j as i64 + 1)
                            .map_or((false, false), |r| (r.1, r.2));
                        results[i] = Some(if held && recorded {
                            Renewed::Answer(Ok(self.bound))
                        } else if held {
                            // Removed behind the holder's back: give the key up.
                            let _ = self
                                .release_hold(&mut st, name, Held { holds: 1, ..h })
                                .await;
                            Renewed::Answer(Err(lost(
                                name,
                                "the advisory lock's row was removed (force-released)",
                            )
                            .with_backend(BACKEND)))
                        } else {
                            st.held.remove(name);
                            Renewed::SessionEnded(session_lost(name, "no longer holds the key"))
                        });
                    }
                }
                Err(e) => {
                    for (i, _) in asked {
                        let g = &grants[i].0;
                        results[i] = Some(if st.conn.is_none() {
                            Renewed::SessionEnded(session_lost(
                                &g.name,
                                "was dropped after a failed probe",
                            ))
                        } else {
                            Renewed::Answer(Err(crate::error::clone_error(&e).with_lock(&g.name)))
                        });
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every grant answered"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::advisory_key;

    #[test]
    fn the_key_is_the_first_eight_bytes_of_the_sha256() {
        // SHA-256("abc") = ba7816bf 8f01cfea ...
        assert_eq!(
            advisory_key("abc"),
            i64::from_be_bytes([0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea])
        );
        assert_ne!(advisory_key("a"), advisory_key("A"));
    }
}
