//! The shared conformance suite against a real MySQL/MariaDB server
//! (`DISTLOCK_MYSQL_URL`, default `mysql://distlock:distlock@127.0.0.1:3306/distlock`).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{async_trait, Capabilities, DistributedLock, LockName, Result};
use distlock_mysql::sqlx::{self, AssertSqlSafe, Connection};
use distlock_mysql::{MysqlConfig, MysqlLock};

struct Mysql {
    url: String,
}

impl Mysql {
    fn from_env() -> Self {
        Self {
            url: distlock_mysql::DESCRIPTOR.test_url(),
        }
    }

    fn config(&self) -> Result<MysqlConfig> {
        MysqlConfig::from_url(&self.url)
    }

    /// A connection of its own, outside any client's pool: what an operator would use.
    async fn raw(&self) -> Result<(sqlx::MySqlConnection, String)> {
        let config = self.config()?;
        let conn = sqlx::MySqlConnection::connect_with(&config.connect_options())
            .await
            .map_err(|e| distlock_api::Error::unavailable("raw connection", e))?;
        Ok((conn, config.get_lock_table().to_string()))
    }
}

fn raw_error(e: sqlx::Error) -> distlock_api::Error {
    distlock_api::Error::new(distlock_api::ErrorKind::Backend, "raw statement").with_source(e)
}

#[async_trait]
impl distlock_conformance::Harness for Mysql {
    fn backend(&self) -> &'static str {
        "mysql"
    }

    fn capabilities(&self) -> Capabilities {
        distlock_mysql::CAPABILITIES
    }

    fn start_hint(&self) -> &'static str {
        "run `scripts/services up` (MariaDB on 127.0.0.1:3306, database and user `distlock`), \
         or `docker compose up -d mysql`, or point DISTLOCK_MYSQL_URL at a server"
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>> {
        self.client_at(&self.url).await
    }

    fn url(&self) -> Option<String> {
        Some(self.url.clone())
    }

    /// A suite client of the server at `url`. Every suite client also runs a fast sweeper, so
    /// the sweeper races every case.
    async fn client_at(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        let config = MysqlConfig::from_url(url)?
            .default_ttl(self.short_ttl())
            .sweep_interval(Some(Duration::from_millis(250)));
        Ok(Arc::new(MysqlLock::connect(config).await?))
    }

    async fn unreachable_client(&self) -> Option<Result<Arc<dyn DistributedLock>>> {
        let config = match MysqlConfig::from_url("mysql://distlock:distlock@127.0.0.1:1/distlock") {
            Ok(c) => c.connect_timeout(self.connect_timeout()),
            Err(e) => return Some(Err(e)),
        };
        Some(
            MysqlLock::connect(config)
                .await
                .map(|c| Arc::new(c) as Arc<dyn DistributedLock>),
        )
    }

    fn connect_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn remove_behind_back(&self, name: &LockName) -> Result<()> {
        let (mut conn, table) = self.raw().await?;
        sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM `{table}` WHERE name = ?"
        )))
        .bind(name.as_str().as_bytes())
        .execute(&mut conn)
        .await
        .map_err(raw_error)?;
        Ok(())
    }

    /// Every grant and renewal is a durable commit (a redo-log flush with the server's default
    /// `innodb_flush_log_at_trx_commit = 1`). On a loaded two-core machine a flush was measured
    /// at up to ~200 ms, so a 400 ms lease left too little room for the suite's 100-lock case;
    /// one second leaves two thirds of the lease for each renewal's round trip.
    fn short_ttl(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn wake_bound(&self) -> Duration {
        // Waiters poll: the backoff cap (100 ms) plus a few round trips, with room for a
        // loaded two-core machine.
        Duration::from_millis(500)
    }

    /// Every row whose name starts with `prefix`, live or expired: a holder that releases
    /// deletes its row even when its lease already ran out, so the suite leaves no row at all.
    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>> {
        let (mut conn, table) = self.raw().await?;
        let names: Vec<Vec<u8>> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT name FROM `{table}` WHERE LEFT(name, ?) = ?"
        )))
        .bind(prefix.len() as u64)
        .bind(prefix.as_bytes())
        .fetch_all(&mut conn)
        .await
        .map_err(raw_error)?;
        Ok(names
            .into_iter()
            .map(|n| format!("lock row {:?}", String::from_utf8_lossy(&n)))
            .collect())
    }
}

fn main() -> ExitCode {
    distlock_conformance::run(Mysql::from_env())
}
