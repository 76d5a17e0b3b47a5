//! [`PostgresConfig`]: the URL, the pool, the table names, the sweeper, and their validation.

use std::fmt;
use std::time::Duration;

use distlock_api::backend::wait::Backoff;
use distlock_api::config::{ConfigUrl, HostPort};
use distlock_api::{ClientOptions, Error, Result, DEFAULT_TTL};
use sqlx::postgres::{PgConnectOptions, PgPool};

/// The default lock table.
pub const DEFAULT_LOCK_TABLE: &str = "distlock_locks";
/// The default fencing-counter table.
pub const DEFAULT_FENCING_TABLE: &str = "distlock_fencing";
/// The default number of pooled connections per pool (a client has two).
pub const DEFAULT_POOL_SIZE: u32 = 10;
/// The default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The default limit on one server operation: every statement of this backend touches one
/// row (or one batch of them), which a healthy server answers in milliseconds; 5 s only cuts
/// off a server that is paused, partitioned or stuck, well within the default 30 s lease.
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(5);
/// The default pause between two sweeps of expired rows.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// The default number of rows one sweep statement deletes at most.
pub const DEFAULT_SWEEP_BATCH: u32 = 100;
/// The default first backoff step of a waiting acquire (when notices are off or lost).
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(2);
/// The default longest backoff step of a waiting acquire.
pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_millis(100);
/// The default session bound of advisory mode: the server ends a session idle this long (its
/// `idle_session_timeout`), and the client probes its session every third of it.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a client keeps its locks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Rows of the lock table, each with its lease on the server's clock (the default).
    #[default]
    Table,
    /// Session advisory locks (`pg_try_advisory_lock`) on one dedicated connection per client,
    /// whose lease is that session (see the crate docs, "Advisory mode").
    Advisory,
}

const MAX_POOL_SIZE: u32 = 1_000;
const MAX_SWEEP_BATCH: u32 = 10_000;
/// PostgreSQL cuts identifiers at 63 bytes; the lock table's index appends `_expires_at`.
const MAX_TABLE_LEN: usize = 48;

/// How a [`PostgresLock`](crate::PostgresLock) reaches its server and keeps its tables.
///
/// Build one from a URL with [`from_url`](PostgresConfig::from_url) (or around an application's
/// pool with [`from_pool`](PostgresConfig::from_pool)), then adjust it with the setters.
/// Everything is checked by [`validate`](PostgresConfig::validate), which
/// [`PostgresLock::connect`](crate::PostgresLock::connect) calls before any I/O: bad input is
/// an [`ErrorKind::InvalidArgument`](distlock_api::ErrorKind::InvalidArgument). The shared
/// options and the builder style are those of [`distlock_api::config`].
///
/// ```
/// use std::time::Duration;
/// use distlock_postgres::PostgresConfig;
///
/// let config = PostgresConfig::from_url(
///     "postgres://app:secret@db.internal:5432/app?pool_size=4&lock_table=app_locks",
/// )?
/// .connect_timeout(Duration::from_secs(2))
/// .sweep_interval(Some(Duration::from_secs(30)));
/// assert_eq!(config.get_lock_table(), "app_locks");
/// assert_eq!(config.get_pool_size(), 4);
/// # Ok::<_, distlock_api::Error>(())
/// ```
#[derive(Clone)]
pub struct PostgresConfig {
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
    notices: bool,
    statement_cache: bool,
    mode: Mode,
    session_timeout: Duration,
    pool: Option<PgPool>,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    tls: crate::tls::Tls,
}

impl PostgresConfig {
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
            notices: true,
            statement_cache: true,
            mode: Mode::Table,
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            pool: None,
            tls: crate::tls::Tls::default(),
        }
    }

    /// Uses the application's own sqlx pool: its connect options (credentials, TLS, socket)
    /// and its connections, for acquire attempts, reads and the sweeper. Renewals and releases
    /// get a small pool of their own with the same connect options, and the notice listener
    /// one connection, so a busy application cannot starve the statements that keep held locks
    /// alive. The pool's options must name a database.
    ///
    /// ```
    /// use distlock_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    /// use distlock_postgres::PostgresConfig;
    ///
    /// # let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    /// # let _inside = runtime.enter(); // a pool needs a runtime, even one that opens nothing yet
    /// let options = PgConnectOptions::new_without_pgpass()
    ///     .host("127.0.0.1")
    ///     .username("distlock")
    ///     .password("distlock")
    ///     .database("distlock");
    /// let pool = PgPoolOptions::new().max_connections(8).connect_lazy_with(options);
    /// let config = PostgresConfig::from_pool(pool)?.lock_table("app_locks");
    /// assert_eq!(config.endpoint(), "127.0.0.1:5432");
    /// # Ok::<_, distlock_api::Error>(())
    /// ```
    pub fn from_pool(pool: PgPool) -> Result<Self> {
        let options = pool.connect_options();
        let database = options.get_database().unwrap_or_default().to_string();
        if database.is_empty() {
            return Err(Error::invalid(
                "the pool's connect options name no database: set one with \
                 PgConnectOptions::database",
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

    /// Parses `postgres://user:password@host:port/database` (or `postgresql://…`).
    ///
    /// The user and password are optional and percent-decoded; the port defaults to 5432; the
    /// database is required. Query parameters set options: the shared ones of
    /// [`distlock_api::config`] (`owner`, `default_ttl`, `connect_timeout`,
    /// `operation_timeout`) and `pool_size`, `lock_table`, `fencing_table`, `sweep_interval`
    /// (`0s` turns the sweeper off), `sweep_batch`, `create_tables`, `notices` (`LISTEN` for
    /// releases, default `true`), `statement_cache` (`false` behind a transaction-pooling proxy
    /// that cannot keep prepared statements), `mode` (`table`, the default, or `advisory`),
    /// `session_timeout` (advisory mode's session bound, default 10 s), and with
    /// the `tls` feature `sslmode` (`disable`, `prefer`, `require`, `verify-ca`,
    /// `verify-full`) and `sslrootcert` (a PEM file). Anything else is an `InvalidArgument`.
    pub fn from_url(raw: &str) -> Result<Self> {
        let url = ConfigUrl::parse(crate::BACKEND, raw)?;
        if !matches!(url.scheme, "postgres" | "postgresql") {
            return Err(url.invalid("the PostgreSQL backend takes postgres:// or postgresql://"));
        }
        let [host] = &url.hosts(5432)?[..] else {
            return Err(url.invalid("the PostgreSQL backend takes one host"));
        };
        let decode = |part: Option<&str>, what| part.map(|p| url.decode(p, what)).transpose();
        let database = url.decode(url.path.unwrap_or("/").trim_start_matches('/'), "database")?;
        if database.is_empty() {
            return Err(url.invalid("no database (postgres://user:pass@host:port/DATABASE)"));
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
        config.notices = q.take_bool("notices")?.unwrap_or(true);
        config.statement_cache = q.take_bool("statement_cache")?.unwrap_or(true);
        match q.take_str("mode").as_deref() {
            None | Some("table") => {}
            Some("advisory") => config.mode = Mode::Advisory,
            Some(other) => {
                return Err(url.invalid(format!(
                    "mode={other}: the modes are `table` and `advisory`"
                )));
            }
        }
        if let Some(bound) = q.take_duration(&["session_timeout"])? {
            config.session_timeout = bound;
        }
        config.tls.take_from(&mut q)?;
        q.finish(&[
            "pool_size",
            "lock_table",
            "fencing_table",
            "sweep_interval",
            "sweep_batch",
            "create_tables",
            "notices",
            "statement_cache",
            "mode",
            "session_timeout",
            "sslmode",
            "sslrootcert",
        ])?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every setting; a bad one is an `InvalidArgument` naming it.
    pub fn validate(&self) -> Result<()> {
        let err = |why: String| Error::invalid(why).with_backend(crate::BACKEND);
        if !(1..=MAX_POOL_SIZE).contains(&self.pool_size) {
            return Err(err(format!(
                "pool size {} is outside 1..={MAX_POOL_SIZE}",
                self.pool_size
            )));
        }
        check_table("lock table", &self.lock_table).map_err(err)?;
        check_table("fencing table", &self.fencing_table).map_err(err)?;
        if crate::sql::permit_table(&self.lock_table) == self.fencing_table {
            return Err(err(format!(
                "the fencing table {:?} is the lock table's permit table; they must differ",
                self.fencing_table
            )));
        }
        if self.lock_table == self.fencing_table {
            return Err(err(format!(
                "the lock table and the fencing table are both {:?}; they must differ",
                self.lock_table
            )));
        }
        self.client.validate(crate::BACKEND)?;
        if let Some(every) = self.sweep_interval {
            if every < Duration::from_millis(1) {
                return Err(err(format!(
                    "sweep interval {every:?} is shorter than 1ms (use None to turn it off)"
                )));
            }
        }
        if !(1..=MAX_SWEEP_BATCH).contains(&self.sweep_batch) {
            return Err(err(format!(
                "sweep batch {} is outside 1..={MAX_SWEEP_BATCH}",
                self.sweep_batch
            )));
        }
        if self.session_timeout < Duration::from_secs(1)
            || self.session_timeout > Duration::from_secs(24 * 3600)
        {
            return Err(err(format!(
                "session timeout {:?} is outside 1s..=24h",
                self.session_timeout
            )));
        }
        let (base, cap) = self.backoff;
        Backoff::check(base, cap).map_err(|e| e.with_backend(crate::BACKEND))?;
        if self.host.is_empty() || self.database.is_empty() {
            return Err(err("the config has no host or database".to_string()));
        }
        Ok(())
    }

    distlock_api::client_option_methods!(client);

    /// How many connections each of the client's two pools keeps at most (default 10): one
    /// for acquire attempts, reads and the sweeper, one for renewals and releases.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// The lock table (default `distlock_locks`): 1..=48 of `[a-z0-9_]`, starting with a
    /// letter or `_`, in the connection's default schema (its `search_path`).
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
    /// `None` turns it off. Expired rows never block anyone (an acquire takes them over).
    pub fn sweep_interval(mut self, every: Option<Duration>) -> Self {
        self.sweep_interval = every;
        self
    }

    /// How many rows one sweep statement deletes at most (default 100).
    pub fn sweep_batch(mut self, rows: u32) -> Self {
        self.sweep_batch = rows;
        self
    }

    /// Whether `connect` creates both tables if missing (default `true`).
    pub fn create_tables(mut self, create: bool) -> Self {
        self.create_tables = create;
        self
    }

    /// The backoff of a waiting acquire when notices are off, or while the listener is
    /// reconnecting (default 2 ms to 100 ms).
    pub fn backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.backoff = (base, cap);
        self
    }

    /// Whether waiters are woken by `LISTEN/NOTIFY` (default `true`): every release notifies
    /// the lock table's channel, and the client keeps one more connection (opened at the first
    /// wait) on which it listens. Off, waiters poll with the backoff.
    pub fn notices(mut self, on: bool) -> Self {
        self.notices = on;
        self
    }

    /// Whether the lock statements are prepared once per connection and kept (default `true`).
    /// Turn it off behind a transaction-pooling proxy (PgBouncer without prepared-statement
    /// support): each statement is then parsed as an unnamed statement every time.
    pub fn statement_cache(mut self, on: bool) -> Self {
        self.statement_cache = on;
        self
    }

    /// Where the client keeps its locks (default [`Mode::Table`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Advisory mode's session bound (default 10 s, 1 s to 24 h): the server ends the
    /// client's lock session once it has been idle this long (`idle_session_timeout`), the
    /// client probes it every third of it, and a grant's lease is this bound.
    pub fn session_timeout(mut self, bound: Duration) -> Self {
        self.session_timeout = bound;
        self
    }

    /// The mode.
    pub fn get_mode(&self) -> Mode {
        self.mode
    }

    /// Advisory mode's session bound.
    pub fn get_session_timeout(&self) -> Duration {
        self.session_timeout
    }

    /// Whether notices are on.
    pub fn get_notices(&self) -> bool {
        self.notices
    }

    /// Whether statements are kept prepared.
    pub fn get_statement_cache(&self) -> bool {
        self.statement_cache
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
    pub fn get_pool(&self) -> Option<&PgPool> {
        self.pool.as_ref()
    }

    /// The driver's connect options for this server: the given pool's, if the config was
    /// made from one. `PGPASSWORD`, `.pgpass` and other `PG*` variables are not read.
    pub fn connect_options(&self) -> PgConnectOptions {
        if let Some(pool) = &self.pool {
            return (*pool.connect_options()).clone();
        }
        let mut o = PgConnectOptions::new_without_pgpass()
            .host(&self.host)
            .port(self.port)
            .database(&self.database)
            .application_name("distlock");
        o = o.username(self.user.as_deref().unwrap_or("postgres"));
        if let Some(p) = &self.password {
            o = o.password(p);
        }
        self.tls.apply(o)
    }
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
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
            .field("notices", &self.notices)
            .field("statement_cache", &self.statement_cache)
            .field("mode", &self.mode)
            .field("session_timeout", &self.session_timeout)
            .field("own_pool", &self.pool.is_some())
            .finish()
    }
}

/// Table names are spliced into SQL (identifiers cannot be bound), so only lower-case letters,
/// digits and `_` are accepted (what PostgreSQL folds an unquoted name to); the statements
/// quote them on top.
fn check_table(what: &str, name: &str) -> std::result::Result<(), String> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    if name.is_empty()
        || name.len() > MAX_TABLE_LEN
        || !name.chars().all(ok_char)
        || name.starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(format!(
            "{what} name {name:?} must be 1..={MAX_TABLE_LEN} characters of [a-z0-9_], not \
             starting with a digit"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_api::ErrorKind;

    #[test]
    fn full_url_is_parsed() {
        let c = PostgresConfig::from_url(
            "postgresql://us%40er:p%3Ass@db.example:5433/my_db?pool_size=3&lock_table=l1\
             &fencing_table=f1&connect_timeout_ms=1500&sweep_interval_ms=250&sweep_batch=7\
             &owner=w-1&create_tables=false&notices=false&statement_cache=false&mode=table",
        )
        .unwrap();
        assert_eq!(c.user.as_deref(), Some("us@er"));
        assert_eq!(c.password.as_deref(), Some("p:ss"));
        assert_eq!(c.endpoint(), "db.example:5433");
        assert_eq!(c.database(), "my_db");
        assert_eq!(c.get_pool_size(), 3);
        assert_eq!((c.get_lock_table(), c.get_fencing_table()), ("l1", "f1"));
        assert_eq!(c.get_connect_timeout(), Duration::from_millis(1500));
        assert_eq!(c.get_sweep_interval(), Some(Duration::from_millis(250)));
        assert_eq!(c.get_sweep_batch(), 7);
        assert!(!c.get_create_tables() && !c.get_notices() && !c.get_statement_cache());
        assert!(!format!("{c:?}").contains("p:ss"));
    }

    #[test]
    fn bad_input_is_invalid_before_any_io() {
        for url in [
            "mysql://h/db",
            "postgres://h",
            "postgres://h/db?lock_table=Bad",
            "postgres://h/db?lock_table=x;drop",
            "postgres://h/db?lock_table=a&fencing_table=a",
            "postgres://h/db?pool_size=0",
            "postgres://h/db?sweep_batch=0",
            "postgres://h/db?frobnicate=1",
            "postgres://h/db?mode=weird",
            "postgres://h1,h2/db",
        ] {
            let e = PostgresConfig::from_url(url).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{url}: {e}");
        }
        let c = PostgresConfig::from_url("postgres://h/db?mode=advisory&session_timeout_ms=2500")
            .unwrap();
        assert_eq!(c.get_mode(), Mode::Advisory);
        assert_eq!(c.get_session_timeout(), Duration::from_millis(2500));
        let e = PostgresConfig::from_url("postgres://h/db?mode=advisory&session_timeout_ms=10")
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert_eq!(
            PostgresConfig::from_url("postgres://h/db")
                .unwrap()
                .endpoint(),
            "h:5432"
        );
    }
}
