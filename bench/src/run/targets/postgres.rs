//! PostgreSQL, in both modes, each against its own floor over one raw sqlx connection.
//!
//! - Table mode (the backend's default): the least a lock cycle on a table needs, the `INSERT`
//!   of the lock row and its conditional `DELETE`, in autocommit, into the backend's own table
//!   with the backend's column values. The backend sends the same two statements, each with
//!   more inside it: the acquire also bumps the durable fencing counter (an upsert in the same
//!   statement), the release also notifies the table's channel, and both read the server's
//!   clock once.
//! - Advisory mode: the least a fenced advisory lock needs, `pg_try_advisory_lock` with the
//!   durable counter's bump in one statement (one commit that waits for the disk), then
//!   `pg_advisory_unlock` (no write). The backend also records the holder's row in the first
//!   statement (its grant, for other clients to see and for `pg_locks` to judge) and deletes it
//!   in the second, whose commit does not wait for the disk.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_api::{OwnerId, SharedLock};
use distlock_postgres::sqlx::postgres::PgConnection;
use distlock_postgres::sqlx::{self, AssertSqlSafe, ConnectOptions};
use distlock_postgres::{PostgresConfig, PostgresLock};

use super::{Floor, FloorOps, Kind, Target};
use crate::error::Res;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The floor's lease: long enough that nothing expires mid-cycle.
const FLOOR_TTL_US: i64 = 30_000_000;

pub(crate) struct PostgresTarget {
    kind: Kind,
    config: PostgresConfig,
    version: String,
}

impl PostgresTarget {
    /// `kind` is [`Kind::Postgres`] or [`Kind::PostgresAdvisory`], and `url` its URL.
    pub(crate) async fn open(kind: Kind, url: &str) -> Res<Self> {
        let config = PostgresConfig::from_url(url)?.connect_timeout(CONNECT_TIMEOUT);
        // Connecting creates the tables the floor writes to, and reads the version.
        let lock = PostgresLock::connect(config.clone()).await?;
        Ok(Self {
            kind,
            version: lock.server_version().to_string(),
            config,
        })
    }

    /// One raw connection, as the floor and the sqlx peer use.
    pub(crate) async fn raw(&self) -> Res<PgConnection> {
        Ok(
            tokio::time::timeout(CONNECT_TIMEOUT, self.config.connect_options().connect())
                .await
                .map_err(|_| "no PostgreSQL connection within the connect timeout")??,
        )
    }
}

#[async_trait]
impl Target for PostgresTarget {
    fn kind(&self) -> Kind {
        self.kind
    }

    async fn server_version(&self) -> Res<String> {
        Ok(self.version.clone())
    }

    async fn client(&self) -> Res<SharedLock> {
        Ok(Arc::new(PostgresLock::connect(self.config.clone()).await?))
    }

    async fn client_ttl(&self, ttl: Duration) -> Res<SharedLock> {
        let mut config = self.config.clone().default_ttl(ttl);
        if self.kind == Kind::PostgresAdvisory {
            // Advisory mode's lease is the session bound.
            config = config.session_timeout(ttl);
        }
        Ok(Arc::new(PostgresLock::connect(config).await?))
    }

    async fn floor(&self) -> Res<Box<dyn Floor>> {
        let owner = OwnerId::random();
        let conn = self.raw().await?;
        if self.kind == Kind::PostgresAdvisory {
            let fencing = self.config.get_fencing_table();
            return Ok(Box::new(AdvisoryFloor {
                conn,
                lock: format!(
                    "WITH got AS MATERIALIZED (SELECT pg_try_advisory_lock($1) AS ok), \
                     bump AS (INSERT INTO \"{fencing}\" AS c (name, token) \
                     SELECT $2, 1 FROM got WHERE got.ok \
                     ON CONFLICT (name) DO UPDATE SET token = c.token + 1 RETURNING c.token) \
                     SELECT got.ok, (SELECT token FROM bump) FROM got"
                )
                .into(),
                // A key of this floor's own: the backend hashes names into the same space,
                // and a collision would only make a cycle fail, never pass unchecked.
                key: {
                    use std::hash::{Hash, Hasher};
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    owner.text().hash(&mut h);
                    h.finish() as i64
                },
            }));
        }
        let table = self.config.get_lock_table();
        Ok(Box::new(PostgresFloor {
            conn,
            insert: format!(
                "INSERT INTO \"{table}\" (name, owner, token, hold_count, expires_at, since) \
                 VALUES ($1, $2, $3, 1, clock_timestamp() + $4 * interval '1 microsecond', \
                 clock_timestamp())"
            )
            .into(),
            delete: format!(
                "DELETE FROM \"{table}\" WHERE name = $1 AND owner = $2 AND token = $3 \
                 AND hold_count = 1 AND expires_at > clock_timestamp()"
            )
            .into(),
            owner,
            token: 0,
        }))
    }

    fn floor_ops(&self) -> FloorOps {
        if self.kind == Kind::PostgresAdvisory {
            return FloorOps {
                what: "`pg_try_advisory_lock` + the fencing counter's bump in one statement \
                       (a durable commit), then `pg_advisory_unlock` (prepared, one session)",
                round_trips: 2,
            };
        }
        FloorOps {
            what: "`INSERT` of the lock row + conditional `DELETE` (autocommit, prepared, the \
                   backend's table and columns)",
            round_trips: 2,
        }
    }
}

struct PostgresFloor {
    conn: PgConnection,
    /// `Arc<str>` so the driver's prepared-statement cache hits, as in the backend.
    insert: Arc<str>,
    delete: Arc<str>,
    owner: OwnerId,
    token: i64,
}

#[async_trait]
impl Floor for PostgresFloor {
    async fn cycle(&mut self, name: &str) -> Res<Duration> {
        self.token += 1;
        let owner = self.owner.text();
        let conn = &mut self.conn;
        sqlx::query(AssertSqlSafe(self.insert.clone()))
            .bind(name)
            .bind(&owner)
            .bind(self.token)
            .bind(FLOOR_TTL_US)
            .execute(&mut *conn)
            .await?;
        let release = Instant::now();
        let deleted = sqlx::query(AssertSqlSafe(self.delete.clone()))
            .bind(name)
            .bind(&owner)
            .bind(self.token)
            .execute(&mut *conn)
            .await?;
        if deleted.rows_affected() != 1 {
            return Err("floor: the delete did not remove the lock row".into());
        }
        Ok(release.elapsed())
    }
}

struct AdvisoryFloor {
    conn: PgConnection,
    lock: Arc<str>,
    key: i64,
}

#[async_trait]
impl Floor for AdvisoryFloor {
    async fn cycle(&mut self, name: &str) -> Res<Duration> {
        let conn = &mut self.conn;
        let (got, token): (bool, Option<i64>) = sqlx::query_as(AssertSqlSafe(self.lock.clone()))
            .bind(self.key)
            .bind(name)
            .fetch_one(&mut *conn)
            .await?;
        if !got || token.is_none() {
            return Err("floor: the advisory lock was not taken".into());
        }
        let release = Instant::now();
        let unlocked: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
            .bind(self.key)
            .fetch_one(&mut *conn)
            .await?;
        if !unlocked {
            return Err("floor: the advisory unlock found nothing held".into());
        }
        Ok(release.elapsed())
    }
}
