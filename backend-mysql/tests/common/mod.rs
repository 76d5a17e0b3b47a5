//! Helpers of the extra tests: the server URL, the skip switch, private tables with server-side
//! audit triggers.

#![allow(dead_code, unreachable_pub)]

use distlock_mysql::sqlx::{self, AssertSqlSafe, Connection, MySqlConnection};
use distlock_mysql::MysqlConfig;

pub fn url() -> String {
    distlock_mysql::DESCRIPTOR.test_url()
}

/// Whether `DISTLOCK_SKIP` names `mysql` (printed, so a skip is never silent).
pub fn skipped() -> bool {
    let skip = std::env::var("DISTLOCK_SKIP")
        .map(|v| v.split(',').any(|s| s.trim() == "mysql"))
        .unwrap_or(false);
    if skip {
        eprintln!("SKIPPING: DISTLOCK_SKIP names mysql");
    }
    skip
}

pub fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

/// A small xorshift generator, one per task.
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// A lock table and fencing table of this test run alone, plus an audit table that triggers
/// fill when the server does something that must never happen. Dropped by [`drop_all`].
///
/// [`drop_all`]: PrivateTables::drop_all
pub struct PrivateTables {
    pub locks: String,
    pub fencing: String,
    pub audit: String,
}

/// What the audit triggers watch for.
#[derive(Clone, Copy)]
pub enum Audit {
    /// Any deletion of a row that is live by the deleting statement's clock (only meaningful
    /// where nobody releases: a release deletes a live row on purpose).
    LiveDeletes,
    /// Any takeover (token change) of a row that is live by the updating statement's clock.
    LiveTakeovers,
}

impl PrivateTables {
    pub fn new(tag: &str) -> Self {
        let id = format!("{tag}_{}_{:x}", std::process::id(), seed() & 0xffff_ffff);
        Self {
            locks: format!("dl_{id}_locks"),
            fencing: format!("dl_{id}_fencing"),
            audit: format!("dl_{id}_audit"),
        }
    }

    pub fn config(&self) -> MysqlConfig {
        MysqlConfig::from_url(&url())
            .expect("DISTLOCK_MYSQL_URL")
            .lock_table(&self.locks)
            .fencing_table(&self.fencing)
    }

    pub async fn raw(&self) -> MySqlConnection {
        MySqlConnection::connect_with(&self.config().connect_options())
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "cannot reach MySQL/MariaDB: {e}\n  start it with `scripts/services up` or \
                     skip with DISTLOCK_SKIP=mysql"
                )
            })
    }

    /// Installs the audit table and triggers (the lock table must exist: connect a client
    /// first). `false`, with a loud note, if the server does not let this user create
    /// triggers (MySQL with the binary log on needs SUPER or
    /// `log_bin_trust_function_creators=1`).
    pub async fn install_audit(&self, watch: &[Audit]) -> bool {
        let mut conn = self.raw().await;
        let mut statements = vec![format!(
            "CREATE TABLE `{}` (what VARCHAR(16) NOT NULL, name VARBINARY(255) NOT NULL, \
             token BIGINT UNSIGNED NOT NULL, expires_at DATETIME(6) NOT NULL, \
             at DATETIME(6) NOT NULL) ENGINE = InnoDB",
            self.audit
        )];
        for w in watch {
            // UTC_TIMESTAMP(6) in a trigger is the triggering statement's start, the same
            // instant that statement's own WHERE clause judged expiry with.
            statements.push(match w {
                Audit::LiveDeletes => format!(
                    "CREATE TRIGGER `{locks}_ad` BEFORE DELETE ON `{locks}` FOR EACH ROW \
                     INSERT INTO `{audit}` SELECT 'delete', OLD.name, OLD.token, OLD.expires_at, \
                     UTC_TIMESTAMP(6) FROM DUAL WHERE OLD.expires_at > UTC_TIMESTAMP(6)",
                    locks = self.locks,
                    audit = self.audit
                ),
                Audit::LiveTakeovers => format!(
                    "CREATE TRIGGER `{locks}_au` BEFORE UPDATE ON `{locks}` FOR EACH ROW \
                     INSERT INTO `{audit}` SELECT 'takeover', OLD.name, OLD.token, \
                     OLD.expires_at, UTC_TIMESTAMP(6) FROM DUAL \
                     WHERE NEW.token <> OLD.token AND OLD.expires_at > UTC_TIMESTAMP(6)",
                    locks = self.locks,
                    audit = self.audit
                ),
            });
        }
        for sql in statements {
            if let Err(e) = sqlx::query(AssertSqlSafe(sql)).execute(&mut conn).await {
                eprintln!(
                    "NOTE: the server-side audit is OFF: {e}\n  (MySQL with the binary log needs \
                     SUPER or log_bin_trust_function_creators=1 for triggers); the client-side \
                     checks still run"
                );
                return false;
            }
        }
        true
    }

    /// What the audit triggers recorded, as readable lines.
    pub async fn audit_records(&self) -> Vec<String> {
        let mut conn = self.raw().await;
        let rows: Vec<(String, Vec<u8>, u64)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT what, name, token FROM `{}`",
            self.audit
        )))
        .fetch_all(&mut conn)
        .await
        .expect("read the audit table");
        rows.into_iter()
            .map(|(what, name, token)| {
                format!(
                    "{what} of live row {} (token {token})",
                    String::from_utf8_lossy(&name)
                )
            })
            .collect()
    }

    pub async fn drop_all(&self) {
        let mut conn = self.raw().await;
        // The permit table is named after the lock table (see the crate docs).
        let permits = format!("{}_permits", self.locks);
        for t in [&self.locks, &self.fencing, &self.audit, &permits] {
            let _ = sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS `{t}`")))
                .execute(&mut conn)
                .await;
        }
    }

    /// The fencing counter of `name` (0 if never granted).
    pub async fn fencing_value(&self, name: &str) -> u64 {
        let mut conn = self.raw().await;
        sqlx::query_scalar::<_, u64>(AssertSqlSafe(format!(
            "SELECT value FROM `{}` WHERE name = ?",
            self.fencing
        )))
        .bind(name.as_bytes())
        .fetch_optional(&mut conn)
        .await
        .expect("read the fencing counter")
        .unwrap_or(0)
    }
}

/// Runs `body` on a task of its own and drops the private tables afterwards, also when the body
/// panics (the panic is then resumed).
pub async fn with_tables<F, Fut>(tables: std::sync::Arc<PrivateTables>, body: F)
where
    F: FnOnce(std::sync::Arc<PrivateTables>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let outcome = tokio::spawn(body(tables.clone())).await;
    tables.drop_all().await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}
