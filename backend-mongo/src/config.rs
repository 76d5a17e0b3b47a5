//! Parsing and validating the MongoDB backend's configuration, with no I/O. The shared
//! options and the builder style are those of [`distlock_api::config`].

use std::time::Duration;

use distlock_api::backend::wait::Backoff;
use distlock_api::config::ConfigUrl;
use distlock_api::{ClientOptions, Error, Result, DEFAULT_TTL};
use mongodb::options::{ConnectionString, HostInfo};

use crate::BACKEND;

/// The database used when neither the URL's path nor [`MongoConfig::database`] names one.
pub const DEFAULT_DATABASE: &str = "distlock";
/// The collection used unless [`MongoConfig::collection`] names another.
pub const DEFAULT_COLLECTION: &str = "locks";
/// How long `connect` may take to reach a usable server, unless the URL or
/// [`MongoConfig::connect_timeout`] say otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one lock operation (and its `w: majority` acknowledgement) may take.
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(10);
/// The default first backoff step of a polling waiter.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(2);
/// The default longest backoff step of a polling waiter.
pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_millis(100);

/// A database name's limit in bytes (MongoDB's own).
const MAX_DATABASE_LEN: usize = 63;
/// A namespace's (`database.collection`) limit in bytes since MongoDB 4.4.
const MAX_NAMESPACE_LEN: usize = 255;

/// How to reach the server and where the lock documents live.
///
/// ```
/// use std::time::Duration;
/// use distlock_mongo::MongoConfig;
///
/// let config = MongoConfig::from_url("mongodb://db1:27017,db2:27017/app?replicaSet=rs0&default_ttl=10s")?
///     .collection("job_locks")
///     .connect_timeout(Duration::from_secs(3));
/// config.validate()?;
/// assert_eq!(config.get_database(), "app");
/// assert_eq!(config.get_collection(), "job_locks");
/// assert_eq!(config.get_default_ttl(), Duration::from_secs(10));
/// # Ok::<_, distlock_mongo::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct MongoConfig {
    pub(crate) conn: ConnectionString,
    pub(crate) endpoint: String,
    pub(crate) database: String,
    pub(crate) collection: String,
    pub(crate) client: ClientOptions,
    /// The application's own driver client (see [`MongoConfig::from_client`]).
    pub(crate) given: Option<mongodb::Client>,
    /// A polling waiter's first backoff step and cap.
    pub(crate) backoff: (Duration, Duration),
    /// Whether waiters listen to a change stream (where the server has them).
    pub(crate) change_streams: bool,
}

impl MongoConfig {
    /// Parses a `mongodb://` or `mongodb+srv://` connection string, the driver's own format
    /// (hosts, credentials, `replicaSet`, TLS and the other standard options), plus the shared
    /// options of [`distlock_api::config`] (`owner`, `default_ttl`, `connect_timeout`,
    /// `operation_timeout`) and this backend's own (`backoff_base` and `backoff_cap`, durations,
    /// see [`backoff`](Self::backoff); `change_streams`, `true`/`false`, see
    /// [`change_streams`](Self::change_streams)), which are taken out before the rest goes to
    /// the driver. The path
    /// names the database (default `distlock`). Without `connect_timeout`,
    /// `serverSelectionTimeoutMS` (or else `connectTimeoutMS`) sets the connect timeout. No
    /// I/O happens here: a `mongodb+srv://` host is resolved by
    /// [`MongoLock::connect`](crate::MongoLock::connect).
    ///
    /// A malformed URL, an unknown option or a bad database name is
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument).
    pub fn from_url(raw: &str) -> Result<Self> {
        let url = ConfigUrl::parse(BACKEND, raw)?;
        let mut query = url.options()?;
        let connect_timeout = query.take_duration(&["connect_timeout"])?;
        let mut client = ClientOptions::new(
            DEFAULT_TTL,
            DEFAULT_CONNECT_TIMEOUT,
            DEFAULT_OPERATION_TIMEOUT,
        );
        client.take_from(&mut query)?;
        let backoff_base = query.take_duration(&["backoff_base"])?;
        let backoff_cap = query.take_duration(&["backoff_cap"])?;
        let change_streams = query.take_bool("change_streams")?.unwrap_or(true);
        let base = raw.split_once('?').map_or(raw, |(b, _)| b);
        let driver_url = match query.rest() {
            Some(rest) => format!("{base}?{rest}"),
            None => base.to_string(),
        };
        // The driver's message never repeats the URL, which may hold a password.
        let conn = ConnectionString::parse(&driver_url).map_err(|e| {
            url.invalid(format!(
                "bad MongoDB connection string: {}",
                driver_message(&e)
            ))
        })?;
        let endpoint = match &conn.host_info {
            HostInfo::HostIdentifiers(hosts) => hosts
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
            HostInfo::DnsRecord(host) => format!("mongodb+srv://{host}"),
            // `HostInfo` is non-exhaustive; a future form is still named, just less precisely.
            #[allow(unreachable_patterns)]
            _ => "the configured hosts".to_string(),
        };
        client.connect_timeout = (connect_timeout.or(conn.server_selection_timeout))
            .or(conn.connect_timeout)
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        let config = Self {
            database: (conn.default_database.clone())
                .unwrap_or_else(|| DEFAULT_DATABASE.to_string()),
            conn,
            endpoint,
            collection: DEFAULT_COLLECTION.to_string(),
            client,
            given: None,
            backoff: (
                backoff_base.unwrap_or(DEFAULT_BACKOFF_BASE),
                backoff_cap.unwrap_or(DEFAULT_BACKOFF_CAP),
            ),
            change_streams,
        };
        config.validate()?;
        Ok(config)
    }

    /// Uses a `mongodb::Client` the application made itself, with its hosts, credentials, TLS
    /// and pool settings, sharing its connections. The lock documents go to the client's
    /// default database (or `distlock`) unless [`database`](Self::database) names another;
    /// the connect timeout bounds the first round trip of
    /// [`MongoLock::connect`](crate::MongoLock::connect), and the lock operations keep their
    /// own read and write concerns (majority, primary) whatever the client's defaults are.
    ///
    /// ```
    /// use distlock_mongo::{mongodb, MongoConfig};
    ///
    /// # let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    /// # runtime.block_on(async {
    /// let client = mongodb::Client::with_uri_str("mongodb://127.0.0.1:27017/app").await?;
    /// let config = MongoConfig::from_client(client).collection("job_locks");
    /// assert_eq!(config.get_database(), "app");
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_client(client: mongodb::Client) -> Self {
        Self {
            database: client
                .default_database()
                .map_or_else(|| DEFAULT_DATABASE.to_string(), |d| d.name().to_string()),
            conn: ConnectionString::default(),
            endpoint: "the application's MongoDB client".to_string(),
            collection: DEFAULT_COLLECTION.to_string(),
            client: ClientOptions::new(
                DEFAULT_TTL,
                DEFAULT_CONNECT_TIMEOUT,
                DEFAULT_OPERATION_TIMEOUT,
            ),
            given: Some(client),
            backoff: (DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP),
            change_streams: true,
        }
    }

    distlock_api::client_option_methods!(client);

    /// Keeps the lock documents in database `name` instead of the URL's (or `distlock`).
    pub fn database(mut self, name: impl Into<String>) -> Self {
        self.database = name.into();
        self
    }

    /// Keeps the lock documents in collection `name` (default `locks`). Use the collection for
    /// nothing else, and never delete its documents: each one holds its lock's fencing counter.
    pub fn collection(mut self, name: impl Into<String>) -> Self {
        self.collection = name.into();
        self
    }

    /// The backoff of a polling waiter: the first step and the cap of the doubling steps
    /// (default 2 ms to 100 ms, at most 60 s). A waiter polls where it has no change stream
    /// (see [`change_streams`](Self::change_streams)), and wakes at the holder's expiry either
    /// way.
    pub fn backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.backoff = (base, cap);
        self
    }

    /// Whether waiters are woken by a change stream on the lock collection (default `true`):
    /// the client opens one when a waiter first finds a lock held, shares it among its waiters
    /// and closes it about 10 s after the last one is done. Where the server has no change
    /// streams (a standalone server) waiters poll with the [`backoff`](Self::backoff) anyway;
    /// turn it off where the stream is not wanted (an account without the `changeStream`
    /// privilege, a proxy that does not pass it through).
    pub fn change_streams(mut self, on: bool) -> Self {
        self.change_streams = on;
        self
    }

    /// The backoff's first step and cap.
    pub fn get_backoff(&self) -> (Duration, Duration) {
        self.backoff
    }

    /// Whether waiters listen to a change stream.
    pub fn get_change_streams(&self) -> bool {
        self.change_streams
    }

    /// Checks every option; [`MongoLock::connect`](crate::MongoLock::connect) calls it before
    /// any I/O. The connect timeout bounds the driver's connect and server selection and the
    /// first round trip; the operation timeout bounds one lock operation including its
    /// `w: majority` acknowledgement (sent as `wtimeout`).
    pub fn validate(&self) -> Result<()> {
        validate_database(&self.database)?;
        validate_collection(&self.collection)?;
        validate_namespace(&self.database, &self.collection)?;
        let (base, cap) = self.backoff;
        Backoff::check(base, cap).map_err(|e| e.with_backend(BACKEND))?;
        self.client.validate(BACKEND)
    }

    /// The database the lock documents live in.
    pub fn get_database(&self) -> &str {
        &self.database
    }

    /// The collection the lock documents live in.
    pub fn get_collection(&self) -> &str {
        &self.collection
    }

    /// The hosts (or SRV name) the client connects to, without credentials.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

fn invalid(message: String) -> Error {
    Error::invalid(message).with_backend(BACKEND)
}

/// The driver's message alone: its `Display` adds labels and source chains meant for logs.
pub(crate) fn driver_message(e: &mongodb::error::Error) -> String {
    match e.kind.as_ref() {
        mongodb::error::ErrorKind::InvalidArgument { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

fn validate_database(name: &str) -> Result<()> {
    // MongoDB's rules for database names on every platform (Windows forbids a few more, which
    // keeps names portable when they are avoided everywhere).
    const BAD: &[char] = &['/', '\\', '.', ' ', '"', '$', '*', '<', '>', ':', '|', '?'];
    let problem = if name.is_empty() {
        Some("is empty".to_string())
    } else if name.len() > MAX_DATABASE_LEN {
        Some(format!("is longer than {MAX_DATABASE_LEN} bytes"))
    } else {
        name.chars()
            .find(|c| BAD.contains(c) || c.is_control())
            .map(|c| format!("contains {c:?}"))
    };
    match problem {
        Some(p) => Err(invalid(format!("database name {name:?} {p}"))),
        None => Ok(()),
    }
}

fn validate_collection(name: &str) -> Result<()> {
    let problem = if name.is_empty() {
        Some("is empty")
    } else if name.contains('$') {
        Some("contains '$'")
    } else if name.chars().any(char::is_control) {
        Some("contains a control character")
    } else if name.starts_with("system.") {
        Some("is in the reserved system. namespace")
    } else if name.starts_with('.') || name.ends_with('.') {
        Some("starts or ends with '.'")
    } else {
        None
    };
    match problem {
        Some(p) => Err(invalid(format!("collection name {name:?} {p}"))),
        None => Ok(()),
    }
}

fn validate_namespace(database: &str, collection: &str) -> Result<()> {
    let len = database.len() + 1 + collection.len();
    if len > MAX_NAMESPACE_LEN {
        return Err(invalid(format!(
            "namespace \"{database}.{collection}\" is {len} bytes; the limit is {MAX_NAMESPACE_LEN}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_api::ErrorKind;

    fn kind<T: std::fmt::Debug>(r: Result<T>) -> ErrorKind {
        r.expect_err("accepted").kind()
    }

    #[test]
    fn defaults_from_a_plain_url() {
        let c = MongoConfig::from_url("mongodb://127.0.0.1:27017").unwrap();
        assert_eq!(c.get_database(), DEFAULT_DATABASE);
        assert_eq!(c.get_collection(), DEFAULT_COLLECTION);
        assert_eq!(c.get_connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(c.get_operation_timeout(), DEFAULT_OPERATION_TIMEOUT);
        assert_eq!(c.get_default_ttl(), DEFAULT_TTL);
        assert_eq!(c.endpoint(), "127.0.0.1:27017");
    }

    #[test]
    fn url_path_names_the_database_and_options_set_the_timeout() {
        let c = MongoConfig::from_url(
            "mongodb://u:secret@a:1,b:2/app?replicaSet=rs0&serverSelectionTimeoutMS=1500",
        )
        .unwrap();
        assert_eq!(c.get_database(), "app");
        assert_eq!(c.get_connect_timeout(), Duration::from_millis(1500));
        assert_eq!(c.endpoint(), "a:1,b:2");
        let c = MongoConfig::from_url("mongodb://a/?connectTimeoutMS=700").unwrap();
        assert_eq!(c.get_connect_timeout(), Duration::from_millis(700));
    }

    #[test]
    fn shared_options_are_taken_out_before_the_driver_sees_the_url() {
        let c = MongoConfig::from_url(
            "mongodb://u:secret@a:1/app?replicaSet=rs0&owner=w-1&default_ttl=10s\
             &connect_timeout_ms=250&operation_timeout=2s&serverSelectionTimeoutMS=1500",
        )
        .unwrap();
        assert_eq!(c.get_owner().map(|o| o.label()), Some("w-1"));
        assert_eq!(c.get_default_ttl(), Duration::from_secs(10));
        assert_eq!(c.get_connect_timeout(), Duration::from_millis(250));
        assert_eq!(c.get_operation_timeout(), Duration::from_secs(2));
        assert_eq!(c.conn.replica_set.as_deref(), Some("rs0"));
        assert_eq!(c.get_database(), "app");
        for bad in [
            "mongodb://a/?default_ttl=10",
            "mongodb://a/?operation_timeout=0ms",
            "mongodb://a/?owner=a%20b",
            "mongodb://a/?connect_timeout=11m",
        ] {
            let e = MongoConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}: {e}");
            assert_eq!(e.backend(), Some("mongo"), "{bad}: {e}");
        }
    }

    #[test]
    fn srv_urls_parse_without_dns() {
        let c = MongoConfig::from_url("mongodb+srv://cluster0.example.invalid/locks").unwrap();
        assert_eq!(c.endpoint(), "mongodb+srv://cluster0.example.invalid");
        assert_eq!(c.get_database(), "locks");
    }

    #[test]
    fn bad_urls_are_invalid_argument_and_never_echo_the_password() {
        for bad in [
            "",
            "127.0.0.1:27017",
            "redis://127.0.0.1",
            "mongodb://",
            "mongodb://host:notaport",
            "mongodb://host/?noSuchOption=1",
            "mongodb://host/bad.db",
            "mongodb+srv://a:1",
            "mongodb+srv://a,b",
        ] {
            assert_eq!(
                kind(MongoConfig::from_url(bad)),
                ErrorKind::InvalidArgument,
                "{bad:?}"
            );
        }
        let e = MongoConfig::from_url("mongodb://user:hunter2@host/?bogus=1").unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[test]
    fn names_and_timeouts_are_validated() {
        let c = || MongoConfig::from_url("mongodb://localhost").unwrap();
        for bad in ["", "a.b", "a b", "a$", "a/b", "x\0", &"d".repeat(64)] {
            assert_eq!(
                kind(c().database(bad).validate()),
                ErrorKind::InvalidArgument,
                "{bad:?}"
            );
        }
        for bad in [
            "",
            "a$b",
            "system.users",
            ".x",
            "x.",
            "a\nb",
            &"c".repeat(250),
        ] {
            assert_eq!(
                kind(c().collection(bad).validate()),
                ErrorKind::InvalidArgument,
                "{bad:?}"
            );
        }
        let ok = c().collection("my.locks").database("Ünï");
        ok.validate().unwrap();
        assert_eq!(ok.get_collection(), "my.locks");
        assert_eq!(ok.get_database(), "Ünï");
        for bad in [Duration::ZERO, Duration::from_secs(601)] {
            assert_eq!(
                kind(c().connect_timeout(bad).validate()),
                ErrorKind::InvalidArgument
            );
            assert_eq!(
                kind(c().operation_timeout(bad).validate()),
                ErrorKind::InvalidArgument
            );
        }
        assert_eq!(
            kind(c().default_ttl(Duration::ZERO).validate()),
            ErrorKind::InvalidArgument
        );
        let ms = Duration::from_millis;
        for (base, cap) in [(ms(0), ms(10)), (ms(10), ms(1)), (ms(1), ms(60_001))] {
            assert_eq!(
                kind(c().backoff(base, cap).validate()),
                ErrorKind::InvalidArgument,
                "{base:?}..{cap:?}"
            );
        }
        c().backoff(ms(5), Duration::from_secs(60))
            .validate()
            .unwrap();
    }

    #[test]
    fn backoff_and_change_streams_from_the_url() {
        let c = MongoConfig::from_url("mongodb://a/app?replicaSet=rs0").unwrap();
        assert_eq!(c.get_backoff(), (DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP));
        assert!(c.get_change_streams());
        let c = MongoConfig::from_url(
            "mongodb://a/app?backoff_base=20ms&backoff_cap=30s&change_streams=false&replicaSet=rs0",
        )
        .unwrap();
        assert_eq!(
            c.get_backoff(),
            (Duration::from_millis(20), Duration::from_secs(30))
        );
        assert!(!c.get_change_streams());
        assert_eq!(c.conn.replica_set.as_deref(), Some("rs0"));
        for bad in [
            "mongodb://a/?backoff_cap=1ms",
            "mongodb://a/?backoff_base=0ms",
            "mongodb://a/?backoff_cap=2m",
            "mongodb://a/?backoff_base=fast",
            "mongodb://a/?change_streams=maybe",
        ] {
            let e = MongoConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}: {e}");
        }
    }
}
