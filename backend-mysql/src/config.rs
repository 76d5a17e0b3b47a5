//! [`MysqlConfig`]: the URL, the pool, the table names, the sweeper, and their validation.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use distlock_api::backend::wait::Backoff;
use distlock_api::config::{ConfigUrl, HostPort};
use distlock_api::{ClientOptions, Error, Result, DEFAULT_TTL};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlSslMode};

/// The default lock table.
pub const DEFAULT_LOCK_TABLE: &str = "distlock_locks";
/// The default fencing-counter table.
pub const DEFAULT_FENCING_TABLE: &str = "distlock_fencing";
/// The default number of pooled connections per client.
pub const DEFAULT_POOL_SIZE: u32 = 10;
/// The default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The default limit on one server operation (an acquire attempt, a release, a batch of
/// renewals, a read, a sweep statement): 5 s, the same as the connect timeout and Redis's and
/// etcd's per-request limits. Every statement of this backend is a point read or write of one
/// row (or one batch of them) that a healthy server answers in milliseconds, so 5 s only ever
/// cuts off a server that is paused, partitioned or stuck; yet it is short enough that a
/// watchdog renewal (every TTL/3, 10 s with the default 30 s lease) that meets such a server
/// fails, and can be retried on a fresh connection, well within the lease.
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(5);
/// The default pause between two sweeps of expired rows.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// The default number of rows one sweep statement deletes at most.
pub const DEFAULT_SWEEP_BATCH: u32 = 100;
/// The default first backoff step of a waiting acquire.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(2);
/// The default longest backoff step of a waiting acquire.
pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_millis(100);

const MAX_POOL_SIZE: u32 = 1_000;
const MAX_SWEEP_BATCH: u32 = 10_000;
/// MySQL and MariaDB limit identifiers to 64 characters.
const MAX_IDENTIFIER_LEN: usize = 64;

/// How a [`MysqlLock`](crate::MysqlLock) reaches its server and keeps its tables.
///
/// Build one from a URL with [`from_url`](MysqlConfig::from_url), then adjust it with the
/// setters. Everything is checked by [`validate`](MysqlConfig::validate), which
/// [`MysqlLock::connect`](crate::MysqlLock::connect) calls before any I/O: bad input is an
/// [`ErrorKind::InvalidArgument`](distlock_api::ErrorKind::InvalidArgument). The shared options
/// and the builder style are those of [`distlock_api::config`].
///
/// ```
/// use std::time::Duration;
/// use distlock_mysql::MysqlConfig;
///
/// let config = MysqlConfig::from_url(
///     "mysql://app:secret@db.internal:3306/app?pool_size=4&lock_table=app_locks",
/// )?
/// .connect_timeout(Duration::from_secs(2))
/// .operation_timeout(Duration::from_secs(3))
/// .sweep_interval(Some(Duration::from_secs(30)));
/// assert_eq!(config.get_lock_table(), "app_locks");
/// assert_eq!(config.get_pool_size(), 4);
/// # Ok::<_, distlock_api::Error>(())
/// ```
#[derive(Clone)]
pub struct MysqlConfig {
    host: String,
    port: u16,
    user: Option<String>,
    password: Option<String>,
    database: String,
    pool_size: u32,
    lock_table: String,
    fencing_table: String,
    sweep_interval: Option<Duration>,
    sweep_batch: u32,
    client: ClientOptions,
    create_tables: bool,
    backoff: (Duration, Duration),
    release_signals: bool,
    /// The application's own pool (see [`MysqlConfig::from_pool`]).
    pool: Option<MySqlPool>,
    /// TLS, from the URL's `ssl-mode` and `ssl-ca` (feature `tls`).
    ssl_mode: Option<MySqlSslMode>,
    ssl_ca: Option<PathBuf>,
}

impl MysqlConfig {
    /// A config of defaults for `database` on `host:port`.
    fn base(host: String, port: u16, database: String) -> Self {
        Self {
            host,
            port,
            user: None,
            password: None,
            database,
            pool_size: DEFAULT_POOL_SIZE,
            lock_table: DEFAULT_LOCK_TABLE.to_string(),
            fencing_table: DEFAULT_FENCING_TABLE.to_string(),
            sweep_interval: Some(DEFAULT_SWEEP_INTERVAL),
            sweep_batch: DEFAULT_SWEEP_BATCH,
            client: ClientOptions::new(
                DEFAULT_TTL,
                DEFAULT_CONNECT_TIMEOUT,
                DEFAULT_OPERATION_TIMEOUT,
            ),
            create_tables: true,
            backoff: (DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP),
            release_signals: true,
            pool: None,
            ssl_mode: None,
            ssl_ca: None,
        }
    }

    /// Uses the application's own sqlx pool: its connect options (credentials, TLS mode and
    /// certificates, socket, charset) and its connections. Acquire attempts, inspection and
    /// the sweeper run on the given pool; renewals and releases get a small pool of their own
    /// opened with the same connect options (up to [`pool_size`](Self::pool_size)), so a busy
    /// application cannot starve the statements that keep held locks alive. The pool's
    /// options must name a database; the other settings keep their defaults.
    ///
    /// ```
    /// use distlock_mysql::sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
    /// use distlock_mysql::MysqlConfig;
    ///
    /// # let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    /// # let _inside = runtime.enter(); // a pool needs a runtime, even one that opens nothing yet
    /// let options = MySqlConnectOptions::new()
    ///     .host("127.0.0.1")
    ///     .username("distlock")
    ///     .password("distlock")
    ///     .database("distlock");
    /// let pool = MySqlPoolOptions::new().max_connections(8).connect_lazy_with(options);
    /// let config = MysqlConfig::from_pool(pool)?.lock_table("app_locks");
    /// assert_eq!(config.endpoint(), "127.0.0.1:3306");
    /// # Ok::<_, distlock_api::Error>(())
    /// ```
    pub fn from_pool(pool: MySqlPool) -> Result<Self> {
        let options = pool.connect_options();
        let database = options.get_database().unwrap_or_default().to_string();
        if database.is_empty() {
            return Err(Error::invalid(
                "the pool's connect options name no database: set one with \
                 MySqlConnectOptions::database",
            )
            .with_backend(crate::BACKEND));
        }
        let host = match options.get_socket() {
            Some(socket) => socket.display().to_string(),
            None => options.get_host().to_string(),
        };
        let mut config = Self::base(host, options.get_port(), database);
        config.user = Some(options.get_username().to_string()).filter(|u| !u.is_empty());
        config.pool = Some(pool);
        config.validate()?;
        Ok(config)
    }

    /// Parses `mysql://user:password@host:port/database` (or `mariadb://…`).
    ///
    /// The user and password are optional and percent-decoded; the port defaults to 3306; the
    /// database is required. Query parameters set options: the shared ones of
    /// [`distlock_api::config`] (`owner`, `default_ttl`, `connect_timeout`,
    /// `operation_timeout`) and `pool_size`, `lock_table`, `fencing_table`, `sweep_interval`
    /// (`0s` turns the sweeper off), `sweep_batch`, `create_tables` (`true`/`false`),
    /// `release_signals` (`true`/`false`), and with
    /// the `tls` feature `ssl-mode` (`disabled`, `preferred`, `required`, `verify_ca`,
    /// `verify_identity`) and `ssl-ca` (a PEM file; without it the system's trust store). Anything
    /// else, including a malformed URL, is an `InvalidArgument` (so a typo is not ignored).
    pub fn from_url(raw: &str) -> Result<Self> {
        let url = ConfigUrl::parse(crate::BACKEND, raw)?;
        if !matches!(url.scheme, "mysql" | "mariadb") {
            return Err(url.invalid("the MySQL backend takes mysql:// or mariadb://"));
        }
        let [host] = &url.hosts(3306)?[..] else {
            return Err(url.invalid("the MySQL backend takes one host"));
        };
        let decode = |part: Option<&str>, what| part.map(|p| url.decode(p, what)).transpose();
        let database = url.decode(url.path.unwrap_or("/").trim_start_matches('/'), "database")?;
        if database.is_empty() {
            return Err(url.invalid("no database (mysql://user:pass@host:port/DATABASE)"));
        }
        if database.contains('/') {
            return Err(url.invalid(format!("the database name {database:?} contains '/'")));
        }
        let mut config = Self::base(host.host.clone(), host.port, database);
        config.user = decode(url.user.filter(|u| !u.is_empty()), "user")?;
        config.password = decode(url.password, "password")?;
        let mut q = url.options()?;
        config.client.take_from(&mut q)?;
        let number = "a whole number in range";
        if let Some(n) = q.take_parsed("pool_size", number)? {
            config.pool_size = n;
        }
        if let Some(n) = q.take_parsed("sweep_batch", number)? {
            config.sweep_batch = n;
        }
        if let Some(every) = q.take_duration(&["sweep_interval"])? {
            config.sweep_interval = (!every.is_zero()).then_some(every);
        }
        config.lock_table = q.take_str("lock_table").unwrap_or(config.lock_table);
        config.fencing_table = q.take_str("fencing_table").unwrap_or(config.fencing_table);
        config.create_tables = q.take_bool("create_tables")?.unwrap_or(true);
        config.release_signals = q.take_bool("release_signals")?.unwrap_or(true);
        crate::tls::take_from(&mut q, &mut config.ssl_mode, &mut config.ssl_ca)?;
        q.finish(&[
            "pool_size",
            "lock_table",
            "fencing_table",
            "sweep_interval",
            "sweep_batch",
            "create_tables",
            "release_signals",
            "ssl-mode",
            "ssl-ca",
        ])?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every setting; a bad one is an `InvalidArgument` naming it.
    pub fn validate(&self) -> Result<()> {
        let err = |why: String| Error::invalid(why).with_backend(crate::BACKEND);
        let invalid = |why: String| Err(err(why));
        if !(1..=MAX_POOL_SIZE).contains(&self.pool_size) {
            return invalid(format!(
                "pool size {} is outside 1..={MAX_POOL_SIZE}",
                self.pool_size
            ));
        }
        check_identifier("lock table", &self.lock_table).map_err(err)?;
        check_identifier("fencing table", &self.fencing_table).map_err(err)?;
        if self.lock_table.eq_ignore_ascii_case(&self.fencing_table) {
            return invalid(format!(
                "the lock table and the fencing table are both {:?}; they must differ",
                self.lock_table
            ));
        }
        self.client.validate(crate::BACKEND)?;
        if let Some(every) = self.sweep_interval {
            if every < Duration::from_millis(1) {
                return invalid(format!(
                    "sweep interval {every:?} is shorter than 1ms (use None to turn it off)"
                ));
            }
        }
        if !(1..=MAX_SWEEP_BATCH).contains(&self.sweep_batch) {
            return invalid(format!(
                "sweep batch {} is outside 1..={MAX_SWEEP_BATCH}",
                self.sweep_batch
            ));
        }
        let (base, cap) = self.backoff;
        Backoff::check(base, cap).map_err(|e| e.with_backend(crate::BACKEND))?;
        if self.host.is_empty() || self.database.is_empty() {
            return invalid("the config has no host or database".to_string());
        }
        Ok(())
    }

    distlock_api::client_option_methods!(client);

    /// How many connections each of the client's two pools keeps at most (default 10): one
    /// pool for acquire attempts, inspect and the sweeper, one for renewals and releases, so a
    /// burst of contenders never delays the statements that keep held locks alive. Connections
    /// are opened on demand and closed after 5 idle minutes.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// The lock table (default `distlock_locks`): 1..=64 ASCII letters, digits, `_` or `$`,
    /// not only digits.
    pub fn lock_table(mut self, table: impl Into<String>) -> Self {
        self.lock_table = table.into();
        self
    }

    /// The fencing-counter table (default `distlock_fencing`), never swept: same rules as the
    /// lock table, and a different name.
    pub fn fencing_table(mut self, table: impl Into<String>) -> Self {
        self.fencing_table = table.into();
        self
    }

    /// How often the client's background sweeper deletes expired rows (default every 60 s);
    /// `None` turns it off. Expired rows never block anyone (an acquire takes them over), so the
    /// sweeper only keeps the table small when many names are used once.
    pub fn sweep_interval(mut self, every: Option<Duration>) -> Self {
        self.sweep_interval = every;
        self
    }

    /// How many rows one sweep statement deletes at most (default 100); a sweep repeats the
    /// statement until a batch comes back short, so short statements keep row locks brief.
    pub fn sweep_batch(mut self, rows: u32) -> Self {
        self.sweep_batch = rows;
        self
    }

    /// Whether `connect` runs `CREATE TABLE IF NOT EXISTS` for both tables (default `true`).
    /// Turn it off when the tables are created by a migration and the user lacks `CREATE`.
    pub fn create_tables(mut self, create: bool) -> Self {
        self.create_tables = create;
        self
    }

    /// The backoff of a waiting acquire: the first step and the cap of the doubling steps
    /// (default 2 ms to 100 ms). Waiters also wake at the holder's expiry.
    pub fn backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.backoff = (base, cap);
        self
    }

    /// Whether waiters of other clients are woken by the server when a lock this client holds
    /// is released (default `true`). The client then keeps one more session, on which it holds
    /// a `GET_LOCK` user lock on a companion name (`distlock:` and a hash of the database, the
    /// lock table and the lock's name) while it holds a lock, and its waiters wait in
    /// `GET_LOCK` on sessions of their own (at most [`pool_size`](Self::pool_size)) instead of
    /// polling. Waiters still poll with the backoff when the holder keeps no such lock (signals
    /// off, or an older client). The lock itself is the row either way: signals move only when
    /// waiters look again. Turn it off where `GET_LOCK` is not allowed (some proxies and
    /// managed services) or the extra sessions are not wanted.
    pub fn release_signals(mut self, on: bool) -> Self {
        self.release_signals = on;
        self
    }

    /// Whether release signals are on.
    pub fn get_release_signals(&self) -> bool {
        self.release_signals
    }

    /// The pool size.
    pub fn get_pool_size(&self) -> u32 {
        self.pool_size
    }

    /// The lock table's name.
    pub fn get_lock_table(&self) -> &str {
        &self.lock_table
    }

    /// The fencing table's name.
    pub fn get_fencing_table(&self) -> &str {
        &self.fencing_table
    }

    /// The sweeper's interval, `None` if it is off.
    pub fn get_sweep_interval(&self) -> Option<Duration> {
        self.sweep_interval
    }

    /// The rows one sweep statement deletes at most.
    pub fn get_sweep_batch(&self) -> u32 {
        self.sweep_batch
    }

    /// Whether `connect` creates the tables.
    pub fn get_create_tables(&self) -> bool {
        self.create_tables
    }

    /// The backoff's first step and cap.
    pub fn get_backoff(&self) -> (Duration, Duration) {
        self.backoff
    }

    /// `host:port`, as errors name the server.
    pub fn endpoint(&self) -> String {
        let (host, port) = (self.host.clone(), self.port);
        HostPort { host, port }.to_string()
    }

    /// The database.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// The application's pool given to [`from_pool`](Self::from_pool), if any.
    pub fn get_pool(&self) -> Option<&MySqlPool> {
        self.pool.as_ref()
    }

    /// The driver's connect options for this server (for a raw [`sqlx`] connection of your own,
    /// for example to inspect the tables): the given pool's, if the config was made from one.
    pub fn connect_options(&self) -> MySqlConnectOptions {
        if let Some(pool) = &self.pool {
            return (*pool.connect_options()).clone();
        }
        let mut o = MySqlConnectOptions::new()
            .host(&self.host)
            .port(self.port)
            .database(&self.database)
            // Every expiry is computed with UTC_TIMESTAMP(6), so the session time zone never
            // matters to the lock; UTC keeps any DATETIME a user reads back unambiguous.
            .timezone(Some(String::from("+00:00")));
        if let Some(u) = &self.user {
            o = o.username(u);
        }
        if let Some(p) = &self.password {
            o = o.password(p);
        }
        if let Some(mode) = self.ssl_mode {
            o = o.ssl_mode(mode);
        }
        if let Some(ca) = &self.ssl_ca {
            o = o.ssl_ca(ca);
        }
        o
    }
}

impl fmt::Debug for MysqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlConfig")
            .field("endpoint", &self.endpoint())
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("database", &self.database)
            .field("pool_size", &self.pool_size)
            .field("lock_table", &self.lock_table)
            .field("fencing_table", &self.fencing_table)
            .field("sweep_interval", &self.sweep_interval)
            .field("sweep_batch", &self.sweep_batch)
            .field("client", &self.client)
            .field("create_tables", &self.create_tables)
            .field("backoff", &self.backoff)
            .field("release_signals", &self.release_signals)
            .field("own_pool", &self.pool.is_some())
            .field("ssl_mode", &self.ssl_mode)
            .field("ssl_ca", &self.ssl_ca)
            .finish()
    }
}

/// Table names are spliced into SQL (identifiers cannot be bound), so only a conservative
/// character set is accepted; the statements quote them with backticks on top.
fn check_identifier(what: &str, name: &str) -> std::result::Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$';
    if name.is_empty()
        || name.len() > MAX_IDENTIFIER_LEN
        || !name.chars().all(ok_char)
        || name.chars().all(|c| c.is_ascii_digit())
    {
        return Err(format!(
            "{what} name {name:?} must be 1..={MAX_IDENTIFIER_LEN} characters of [A-Za-z0-9_$], \
             not only digits"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_api::config::MAX_TIMEOUT as MAX_OPERATION_TIMEOUT;
    use distlock_api::ErrorKind;

    #[test]
    fn full_url_is_parsed() {
        let c = MysqlConfig::from_url(
            "mysql://us%40er:p%3Ass@db.example:3307/my_db?pool_size=3&lock_table=l1&fencing_table=f1\
             &connect_timeout_ms=1500&operation_timeout_ms=2500&sweep_interval_ms=250&sweep_batch=7&default_ttl_ms=900\
             &owner=w-1&create_tables=false",
        )
        .unwrap();
        assert_eq!(c.user.as_deref(), Some("us@er"));
        assert_eq!(c.password.as_deref(), Some("p:ss"));
        assert_eq!(c.endpoint(), "db.example:3307");
        assert_eq!(c.database(), "my_db");
        assert_eq!(c.get_pool_size(), 3);
        assert_eq!(c.get_lock_table(), "l1");
        assert_eq!(c.get_fencing_table(), "f1");
        assert_eq!(c.get_connect_timeout(), Duration::from_millis(1500));
        assert_eq!(c.get_operation_timeout(), Duration::from_millis(2500));
        assert_eq!(c.get_sweep_interval(), Some(Duration::from_millis(250)));
        assert_eq!(c.get_sweep_batch(), 7);
        assert_eq!(c.get_default_ttl(), Duration::from_millis(900));
        assert_eq!(c.get_owner().map(|o| o.label()), Some("w-1"));
        assert!(!c.get_create_tables());
        assert!(
            !format!("{c:?}").contains("p:ss"),
            "password leaked into Debug"
        );
    }

    #[test]
    fn defaults_and_mariadb_scheme() {
        let c = MysqlConfig::from_url("mariadb://127.0.0.1/distlock").unwrap();
        assert_eq!(c.endpoint(), "127.0.0.1:3306");
        assert_eq!(c.user, None);
        assert_eq!(c.get_lock_table(), DEFAULT_LOCK_TABLE);
        assert_eq!(c.get_fencing_table(), DEFAULT_FENCING_TABLE);
        assert_eq!(c.get_sweep_interval(), Some(DEFAULT_SWEEP_INTERVAL));
        assert_eq!(c.get_pool_size(), DEFAULT_POOL_SIZE);
        assert_eq!(c.get_connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(c.get_operation_timeout(), DEFAULT_OPERATION_TIMEOUT);
        assert!(format!("{c:?}").contains("operation_timeout: 5s"), "{c:?}");
        let c = MysqlConfig::from_url("mysql://u@[::1]:3310/d?sweep_interval_ms=0").unwrap();
        assert_eq!(c.endpoint(), "[::1]:3310");
        assert_eq!(c.get_sweep_interval(), None);
    }

    #[test]
    fn bad_urls_are_invalid_argument() {
        for bad in [
            "",
            "not a url",
            "redis://127.0.0.1/db",
            "mysql://127.0.0.1",
            "mysql://127.0.0.1/",
            "mysql:///db",
            "mysql://127.0.0.1/a/b",
            "mysql://127.0.0.1:99999/db",
            "mysql://127.0.0.1/db?pool_size=0",
            "mysql://127.0.0.1/db?pool_size=x",
            "mysql://127.0.0.1/db?pool_size=99999999999",
            "mysql://127.0.0.1/db?lock_table=drop%20table",
            "mysql://127.0.0.1/db?lock_table=a%60b",
            "mysql://127.0.0.1/db?lock_table=123",
            "mysql://127.0.0.1/db?lock_table=",
            "mysql://127.0.0.1/db?fencing_table=distlock_locks",
            "mysql://127.0.0.1/db?connect_timeout_ms=0",
            "mysql://127.0.0.1/db?operation_timeout_ms=0",
            "mysql://127.0.0.1/db?operation_timeout_ms=600001",
            "mysql://127.0.0.1/db?operation_timeout_ms=-1",
            "mysql://127.0.0.1/db?operation_timeout=5000",
            "mysql://127.0.0.1/db?sweep_batch=0",
            "mysql://127.0.0.1/db?default_ttl_ms=0",
            "mysql://127.0.0.1/db?owner=bad%20owner",
            "mysql://127.0.0.1/db?create_tables=maybe",
            "mysql://127.0.0.1/db?ssl-mode=sometimes",
            "mysql://127.0.0.1/db?poolsize=3",
            "mysql://u:%ZZ@127.0.0.1/db",
        ] {
            let e = MysqlConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}: {e}");
            assert_eq!(e.backend(), Some("mysql"), "{bad}: {e}");
        }
        let unknown = MysqlConfig::from_url("mysql://127.0.0.1/db?poolsize=3").unwrap_err();
        assert!(
            unknown.to_string().contains("operation_timeout"),
            "the known parameters are listed: {unknown}"
        );
        let long = format!("mysql://127.0.0.1/db?lock_table={}", "t".repeat(65));
        assert!(MysqlConfig::from_url(&long).is_err());
        let ok = format!("mysql://127.0.0.1/db?lock_table={}", "t".repeat(64));
        assert!(MysqlConfig::from_url(&ok).is_ok());
    }

    #[test]
    fn setters_are_validated() {
        let base = MysqlConfig::from_url("mysql://127.0.0.1/db").unwrap();
        for bad in [
            base.clone().pool_size(0),
            base.clone().lock_table("a.b"),
            base.clone().fencing_table("x y"),
            base.clone().lock_table("same").fencing_table("SAME"),
            base.clone().connect_timeout(Duration::ZERO),
            base.clone().operation_timeout(Duration::ZERO),
            base.clone()
                .operation_timeout(MAX_OPERATION_TIMEOUT + Duration::from_millis(1)),
            base.clone().sweep_interval(Some(Duration::from_micros(10))),
            base.clone().sweep_batch(MAX_SWEEP_BATCH + 1),
            base.clone().default_ttl(Duration::ZERO),
            base.clone()
                .backoff(Duration::from_millis(10), Duration::from_millis(1)),
        ] {
            let e = bad.validate().expect_err("accepted");
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        }
        assert!(base
            .lock_table("Locks$2")
            .fencing_table("fence_2")
            .sweep_interval(None)
            .operation_timeout(MAX_OPERATION_TIMEOUT)
            .validate()
            .is_ok());
    }
}
