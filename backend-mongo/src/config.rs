//! Parsing and validating the MongoDB backend's configuration, with no I/O.

use std::time::Duration;

use distlock_api::backend::check_ttl;
use distlock_api::{Error, OwnerId, Result, DEFAULT_TTL};
use mongodb::options::{ConnectionString, HostInfo};

/// The database used when neither the URL's path nor [`MongoConfig::database`] names one.
pub const DEFAULT_DATABASE: &str = "distlock";
/// The collection used unless [`MongoConfig::collection`] names another.
pub const DEFAULT_COLLECTION: &str = "locks";
/// How long `connect` may take to reach a usable server, unless the URL or
/// [`MongoConfig::connect_timeout`] say otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one lock operation (and its `w: majority` acknowledgement) may take.
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(10);

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
/// let config = MongoConfig::from_url("mongodb://db1:27017,db2:27017/app?replicaSet=rs0")?
///     .collection("job_locks")?
///     .connect_timeout(Duration::from_secs(3))?;
/// assert_eq!(config.database_name(), "app");
/// assert_eq!(config.collection_name(), "job_locks");
/// # Ok::<_, distlock_mongo::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct MongoConfig {
    pub(crate) conn: ConnectionString,
    pub(crate) endpoint: String,
    pub(crate) database: String,
    pub(crate) collection: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) operation_timeout: Duration,
    pub(crate) default_ttl: Duration,
    pub(crate) owner: Option<OwnerId>,
}

impl MongoConfig {
    /// Parses a `mongodb://` or `mongodb+srv://` connection string, the driver's own format
    /// (hosts, credentials, `replicaSet`, TLS and the other standard options). The path names
    /// the database (default `distlock`). `serverSelectionTimeoutMS` (or else
    /// `connectTimeoutMS`) in the URL sets the connect timeout. No I/O happens here: a
    /// `mongodb+srv://` host is resolved by [`MongoLock::connect`](crate::MongoLock::connect).
    ///
    /// A malformed URL, an unknown option or a bad database name is
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument).
    pub fn from_url(url: &str) -> Result<Self> {
        // The driver's message never repeats the URL, which may hold a password.
        let conn = ConnectionString::parse(url).map_err(|e| {
            invalid(format!(
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
        let database = conn
            .default_database
            .clone()
            .unwrap_or_else(|| DEFAULT_DATABASE.to_string());
        let connect_timeout = conn
            .server_selection_timeout
            .or(conn.connect_timeout)
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        let config = Self {
            conn,
            endpoint,
            database: String::new(),
            collection: DEFAULT_COLLECTION.to_string(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            operation_timeout: DEFAULT_OPERATION_TIMEOUT,
            default_ttl: DEFAULT_TTL,
            owner: None,
        };
        config.database(database)?.connect_timeout(connect_timeout)
    }

    /// Keeps the lock documents in database `name` instead of the URL's (or `distlock`).
    pub fn database(mut self, name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        validate_database(&name)?;
        validate_namespace(&name, &self.collection)?;
        self.database = name;
        Ok(self)
    }

    /// Keeps the lock documents in collection `name` (default `locks`). Use the collection for
    /// nothing else, and never delete its documents: each one holds its lock's fencing counter.
    pub fn collection(mut self, name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        validate_collection(&name)?;
        validate_namespace(&self.database, &name)?;
        self.collection = name;
        Ok(self)
    }

    /// How long `connect` may take to find a usable server (the driver's connect and server
    /// selection timeouts, and the bound of the first round trip). 1 ms ..= 10 min.
    pub fn connect_timeout(mut self, timeout: Duration) -> Result<Self> {
        check_timeout("connect timeout", timeout)?;
        self.connect_timeout = timeout;
        Ok(self)
    }

    /// How long one lock operation may take, including the `w: majority` acknowledgement
    /// (sent as `wtimeout`); past it the operation fails with
    /// [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable). 1 ms ..= 10 min, default 10 s.
    pub fn operation_timeout(mut self, timeout: Duration) -> Result<Self> {
        check_timeout("operation timeout", timeout)?;
        self.operation_timeout = timeout;
        Ok(self)
    }

    /// The lease of watchdog-managed locks when the caller does not choose one (default 30 s).
    pub fn default_ttl(mut self, ttl: Duration) -> Result<Self> {
        check_ttl(ttl)?;
        self.default_ttl = ttl;
        Ok(self)
    }

    /// Uses `owner` as the client's owner id instead of a fresh random one.
    pub fn owner(mut self, owner: OwnerId) -> Self {
        self.owner = Some(owner);
        self
    }

    /// The database the lock documents live in.
    pub fn database_name(&self) -> &str {
        &self.database
    }

    /// The collection the lock documents live in.
    pub fn collection_name(&self) -> &str {
        &self.collection
    }

    /// The hosts (or SRV name) the client connects to, without credentials.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

fn invalid(message: String) -> Error {
    Error::invalid(message).with_backend(crate::BACKEND)
}

/// The driver's message alone: its `Display` adds labels and source chains meant for logs.
pub(crate) fn driver_message(e: &mongodb::error::Error) -> String {
    match e.kind.as_ref() {
        mongodb::error::ErrorKind::InvalidArgument { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

fn check_timeout(what: &str, timeout: Duration) -> Result<()> {
    if timeout < Duration::from_millis(1) || timeout > Duration::from_secs(600) {
        return Err(invalid(format!(
            "{what} {timeout:?} is outside 1ms..=10min"
        )));
    }
    Ok(())
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
        assert_eq!(c.database_name(), DEFAULT_DATABASE);
        assert_eq!(c.collection_name(), DEFAULT_COLLECTION);
        assert_eq!(c.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(c.operation_timeout, DEFAULT_OPERATION_TIMEOUT);
        assert_eq!(c.default_ttl, DEFAULT_TTL);
        assert_eq!(c.endpoint(), "127.0.0.1:27017");
    }

    #[test]
    fn url_path_names_the_database_and_options_set_the_timeout() {
        let c = MongoConfig::from_url(
            "mongodb://u:secret@a:1,b:2/app?replicaSet=rs0&serverSelectionTimeoutMS=1500",
        )
        .unwrap();
        assert_eq!(c.database_name(), "app");
        assert_eq!(c.connect_timeout, Duration::from_millis(1500));
        assert_eq!(c.endpoint(), "a:1,b:2");
        let c = MongoConfig::from_url("mongodb://a/?connectTimeoutMS=700").unwrap();
        assert_eq!(c.connect_timeout, Duration::from_millis(700));
    }

    #[test]
    fn srv_urls_parse_without_dns() {
        let c = MongoConfig::from_url("mongodb+srv://cluster0.example.invalid/locks").unwrap();
        assert_eq!(c.endpoint(), "mongodb+srv://cluster0.example.invalid");
        assert_eq!(c.database_name(), "locks");
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
                kind(c().database(bad)),
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
                kind(c().collection(bad)),
                ErrorKind::InvalidArgument,
                "{bad:?}"
            );
        }
        assert_eq!(
            c().collection("my.locks").unwrap().collection_name(),
            "my.locks"
        );
        assert_eq!(c().database("Ünï").unwrap().database_name(), "Ünï");
        for bad in [Duration::ZERO, Duration::from_secs(601)] {
            assert_eq!(kind(c().connect_timeout(bad)), ErrorKind::InvalidArgument);
            assert_eq!(kind(c().operation_timeout(bad)), ErrorKind::InvalidArgument);
        }
        assert_eq!(
            kind(c().default_ttl(Duration::ZERO)),
            ErrorKind::InvalidArgument
        );
    }
}
