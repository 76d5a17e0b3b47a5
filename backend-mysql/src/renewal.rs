//! Group renewal: renewals that are due together reach the server as one transaction of
//! conditional `UPDATE`s with one commit, instead of one durable commit each.
//!
//! A client holding many locks renews them in waves (the watchdog renews each at a third of its
//! lease). With `innodb_flush_log_at_trx_commit = 1` every commit waits for a log flush, so one
//! commit per renewal caps a client at a few hundred renewals a second on ordinary disks, and a
//! wave of them queues long enough to outlast short leases. Here each flusher takes whatever
//! renewals are queued when it gets a connection, so batches grow exactly when the server is
//! slow.
//!
//! Each `UPDATE` is still judged on its own (name, owner, token, live at that moment) and
//! reports its own result. The batch holds the row locks it takes until it commits, so a row
//! renewed early in the batch cannot be taken over before the commit makes the new lease
//! visible; rows are visited in name order so two batches never deadlock on each other.
//!
//! Each batch, its commit and any retries after a lock conflict included, runs within the
//! client's operation timeout. A batch that runs out of it answers every renewal in it with a
//! temporary `Unavailable` and closes its connection (see [`Lent`]), which ends the open
//! transaction on the server without a commit: none of the batch's renewals took effect, or, if
//! the commit was already on its way, all did.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sqlx::mysql::MySqlConnection;
use sqlx::{AssertSqlSafe, Connection};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::conn::{Lent, Pool};

/// The most renewals one transaction carries.
const MAX_BATCH: usize = 64;
/// How often a batch that lost a lock conflict (deadlock victim, lock wait timeout) is retried
/// before its renewals are answered with the error.
const CONFLICT_RETRIES: usize = 3;

/// One renewal waiting for a flusher.
struct Job {
    name: Vec<u8>,
    owner: Vec<u8>,
    token: u64,
    ttl_us: u64,
    /// `Ok(true)`: renewed; `Ok(false)`: the grant no longer holds the lock.
    reply: oneshot::Sender<Result<bool, BatchError>>,
}

/// Why a batch failed, as every renewal in it is told.
#[derive(Clone, Debug)]
pub(crate) enum BatchError {
    /// The driver's error.
    Driver(SharedError),
    /// No answer within the operation timeout; the batch's connection was closed.
    TimedOut,
}

/// The error of a failed batch, shared by every renewal in it (driver errors cannot be cloned).
#[derive(Clone, Debug)]
pub(crate) struct SharedError(pub(crate) Arc<sqlx::Error>);

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// The renewal queue of one client.
pub(crate) struct Renewals {
    queue: Mutex<Vec<Job>>,
    /// One permit per flusher that may run at once (the size of the holders' pool).
    flushers: Arc<Semaphore>,
    pool: Pool,
    renew_sql: Arc<str>,
    /// The limit on one batch, its commit included.
    operation_timeout: Duration,
}

impl Renewals {
    pub(crate) fn new(
        pool: Pool,
        renew_sql: Arc<str>,
        flushers: usize,
        operation_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            queue: Mutex::new(Vec::new()),
            flushers: Arc::new(Semaphore::new(flushers.max(1))),
            pool,
            renew_sql,
            operation_timeout,
        })
    }

    fn queue(&self) -> MutexGuard<'_, Vec<Job>> {
        // Every critical section is a push or a drain: a panic cannot leave it half done.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Renews one grant: `Ok(true)` if it still held the lock and now has at least `ttl_us`
    /// left, `Ok(false)` if it no longer held it. `None` if the client is shutting down.
    pub(crate) async fn renew(
        self: &Arc<Self>,
        name: &[u8],
        owner: &[u8],
        token: u64,
        ttl_us: u64,
    ) -> Option<Result<bool, BatchError>> {
        let (reply, rx) = oneshot::channel();
        self.queue().push(Job {
            name: name.to_vec(),
            owner: owner.to_vec(),
            token,
            ttl_us,
            reply,
        });
        // No permit free means every flusher is busy, and each one drains the queue again
        // before it stops (see `flush`), so the job is not stranded.
        if let Ok(permit) = self.flushers.clone().try_acquire_owned() {
            tokio::spawn(self.clone().flush(permit));
        }
        rx.await.ok()
    }

    async fn flush(self: Arc<Self>, mut permit: OwnedSemaphorePermit) {
        loop {
            self.drain().await;
            drop(permit);
            // A renewal queued after our last drain, whose sender found no free permit because
            // we still held ours, is ours to run.
            if self.queue().is_empty() {
                return;
            }
            match self.flushers.clone().try_acquire_owned() {
                Ok(p) => permit = p,
                Err(_) => return, // another flusher holds a permit and will drain it
            }
        }
    }

    /// Runs batches until the queue is empty. The connection is taken *before* the batch, so
    /// renewals that arrive while it waits for one ride along.
    async fn drain(&self) {
        let mut conn = match Lent::from(&self.pool).await {
            Ok(c) => c,
            Err(e) => {
                let batch: Vec<Job> = self.queue().drain(..).collect();
                fail(batch, driver(e));
                return;
            }
        };
        loop {
            let mut batch = {
                let mut q = self.queue();
                let n = q.len().min(MAX_BATCH);
                q.drain(..n).collect::<Vec<_>>()
            };
            if batch.is_empty() {
                conn.give_back();
                return;
            }
            batch.sort_by(|a, b| a.name.cmp(&b.name));
            let outcome = tokio::time::timeout(
                self.operation_timeout,
                self.execute_retrying(&mut conn, &batch),
            )
            .await;
            let Ok(outcome) = outcome else {
                // Returning drops `conn`, which closes it: the transaction ends uncommitted
                // unless its commit had already left.
                fail(batch, BatchError::TimedOut);
                return;
            };
            match outcome {
                Ok(results) => {
                    for (job, renewed) in batch.into_iter().zip(results) {
                        let _ = job.reply.send(Ok(renewed));
                    }
                }
                Err(e) => {
                    fail(batch, driver(e));
                    // The connection may be broken (the pool tests it before reuse); the next
                    // batch takes a fresh one.
                    conn.give_back_after_error();
                    return;
                }
            }
        }
    }

    /// [`execute`](Self::execute), again after a lock conflict that rolled the batch back, up
    /// to [`CONFLICT_RETRIES`] times in all.
    async fn execute_retrying(
        &self,
        conn: &mut MySqlConnection,
        batch: &[Job],
    ) -> sqlx::Result<Vec<bool>> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.execute(conn, batch).await {
                Err(e) if crate::error::is_conflict(&e) && attempt < CONFLICT_RETRIES => continue,
                other => return other,
            }
        }
    }

    async fn execute(&self, conn: &mut MySqlConnection, batch: &[Job]) -> sqlx::Result<Vec<bool>> {
        let update = |job: &Job| {
            sqlx::query(AssertSqlSafe(self.renew_sql.clone()))
                .bind(job.ttl_us)
                .bind(job.name.clone())
                .bind(job.owner.clone())
                .bind(job.token)
        };
        if let [job] = batch {
            // A lone renewal needs no transaction around it.
            let done = update(job).execute(&mut *conn).await?;
            return Ok(vec![done.rows_affected() == 1]);
        }
        let mut tx = conn.begin().await?;
        let mut results = Vec::with_capacity(batch.len());
        for job in batch {
            match update(job).execute(&mut *tx).await {
                Ok(done) => results.push(done.rows_affected() == 1),
                Err(e) => {
                    let _ = tx.rollback().await;
                    return Err(e);
                }
            }
        }
        tx.commit().await?;
        Ok(results)
    }
}

fn driver(e: sqlx::Error) -> BatchError {
    BatchError::Driver(SharedError(Arc::new(e)))
}

/// Answers every renewal of a failed batch with the (shared) error.
fn fail(batch: Vec<Job>, e: BatchError) {
    for job in batch {
        let _ = job.reply.send(Err(e.clone()));
    }
}
