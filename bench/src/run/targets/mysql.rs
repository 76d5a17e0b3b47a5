//! MySQL/MariaDB. The floor is what the issue names as the least a lock cycle needs: the
//! `INSERT` of the lock row and its conditional `DELETE`, in autocommit, into the backend's own
//! table with the backend's column values, over one raw sqlx connection (no pool: sqlx's pool
//! pings every connection handed back to it, a round trip the floor must not pay). The backend
//! does more per cycle — a read before the insert and
//! a transaction that bumps the durable fencing counter with the grant — and the ratio shows
//! what that costs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_api::{OwnerId, SharedLock};
use distlock_mysql::sqlx::mysql::MySqlConnection;
use distlock_mysql::sqlx::{self, AssertSqlSafe, ConnectOptions};
use distlock_mysql::{MysqlConfig, MysqlLock};

use super::{Floor, FloorOps, Kind, Target};
use crate::error::Res;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The floor's lease: long enough that nothing expires mid-cycle.
const FLOOR_TTL_US: u64 = 30_000_000;

pub(crate) struct MysqlTarget {
    config: MysqlConfig,
    version: String,
}

impl MysqlTarget {
    pub(crate) async fn open(url: &str) -> Res<Self> {
        let config = MysqlConfig::from_url(url)?.connect_timeout(CONNECT_TIMEOUT);
        // Connecting creates the tables the floor writes to, and reads the version.
        let lock = MysqlLock::connect(config.clone()).await?;
        Ok(Self {
            version: lock.server_version().to_string(),
            config,
        })
    }
}

#[async_trait]
impl Target for MysqlTarget {
    fn kind(&self) -> Kind {
        Kind::Mysql
    }

    async fn server_version(&self) -> Res<String> {
        Ok(self.version.clone())
    }

    async fn client(&self) -> Res<SharedLock> {
        Ok(Arc::new(MysqlLock::connect(self.config.clone()).await?))
    }

    async fn client_ttl(&self, ttl: std::time::Duration) -> Res<SharedLock> {
        Ok(Arc::new(
            MysqlLock::connect(self.config.clone().default_ttl(ttl)).await?,
        ))
    }

    /// The server's `Questions` status: statements sent by clients, less the one asking.
    async fn server_requests(&self) -> Res<Option<u64>> {
        let mut conn = self.config.connect_options().connect().await?;
        let (_, value): (String, String) = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'")
            .fetch_one(&mut conn)
            .await?;
        Ok(Some(value.trim().parse::<u64>()?.saturating_sub(1)))
    }

    async fn floor(&self) -> Res<Box<dyn Floor>> {
        let conn = tokio::time::timeout(CONNECT_TIMEOUT, self.config.connect_options().connect())
            .await
            .map_err(|_| "floor: no MySQL connection within the connect timeout")??;
        let table = self.config.get_lock_table();
        Ok(Box::new(MysqlFloor {
            conn,
            insert: format!(
                "INSERT INTO `{table}` (name, owner, hold_count, token, expires_at) \
                 VALUES (?, ?, 1, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)"
            )
            .into(),
            delete: format!(
                "DELETE FROM `{table}` WHERE name = ? AND owner = ? AND token = ? \
                 AND hold_count = 1 AND expires_at > UTC_TIMESTAMP(6)"
            )
            .into(),
            owner: OwnerId::random(),
            token: 0,
        }))
    }

    fn floor_ops(&self) -> FloorOps {
        FloorOps {
            what: "`INSERT` of the lock row + conditional `DELETE` (autocommit, prepared, the \
                   backend's table and columns)",
            round_trips: 2,
        }
    }
}

struct MysqlFloor {
    conn: MySqlConnection,
    /// `Arc<str>` so the driver's prepared-statement cache hits, as in the backend.
    insert: Arc<str>,
    delete: Arc<str>,
    owner: OwnerId,
    token: u64,
}

#[async_trait]
impl Floor for MysqlFloor {
    async fn cycle(&mut self, name: &str) -> Res<Duration> {
        self.token += 1;
        let owner_text = self.owner.text();
        let (name, owner) = (name.as_bytes(), owner_text.as_bytes());
        let conn = &mut self.conn;
        sqlx::query(AssertSqlSafe(self.insert.clone()))
            .bind(name)
            .bind(owner)
            .bind(self.token)
            .bind(FLOOR_TTL_US)
            .execute(&mut *conn)
            .await?;
        let release = Instant::now();
        let deleted = sqlx::query(AssertSqlSafe(self.delete.clone()))
            .bind(name)
            .bind(owner)
            .bind(self.token)
            .execute(&mut *conn)
            .await?;
        if deleted.rows_affected() != 1 {
            return Err("floor: the delete did not remove the lock row".into());
        }
        Ok(release.elapsed())
    }
}
