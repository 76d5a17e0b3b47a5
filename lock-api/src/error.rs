//! One error type for every backend.

use std::fmt;

/// What went wrong, coarsely enough to decide what to do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The caller's input is wrong (name, TTL, wait bound, owner, URL, config). Raised before
    /// any I/O.
    InvalidArgument,
    /// The wait bound passed before the lock could be had.
    Timeout,
    /// The operation needs a grant that this owner does not hold.
    NotHeld,
    /// The lock was held but is gone: expired, taken over, removed, or its session/lease ended.
    Lost,
    /// The server could not be reached or did not answer in time.
    Unavailable,
    /// The backend cannot do what was asked (see its [`Capabilities`](crate::Capabilities)).
    Unsupported,
    /// The server answered with an error that fits none of the above.
    Backend,
}

impl ErrorKind {
    /// Whether errors of this kind are worth retrying unless the maker says otherwise.
    fn default_temporary(self) -> bool {
        matches!(self, ErrorKind::Timeout | ErrorKind::Unavailable)
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::Timeout => "timed out",
            ErrorKind::NotHeld => "not held",
            ErrorKind::Lost => "lock lost",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Backend => "backend error",
        })
    }
}

type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The error of every distlock operation: a kind, a message, the lock and backend it concerns,
/// the underlying error, and whether retrying may help ([`Error::is_temporary`]).
///
/// It is one pointer wide: its parts live in a box, so a `Result<T>` is hardly bigger than `T`
/// and the futures and guards that carry results stay small. Errors are rare; successes are
/// moved on every call.
pub struct Error(Box<Parts>);

struct Parts {
    kind: ErrorKind,
    message: String,
    lock: Option<String>,
    backend: Option<&'static str>,
    temporary: bool,
    source: Option<Source>,
}

impl Error {
    /// A new error of `kind`; temporary by default for `Timeout` and `Unavailable`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self(Box::new(Parts {
            kind,
            message: message.into(),
            lock: None,
            backend: None,
            temporary: kind.default_temporary(),
            source: None,
        }))
    }

    /// Names the lock this error concerns (kept if already set).
    pub fn with_lock(mut self, lock: impl fmt::Display) -> Self {
        if self.0.lock.is_none() {
            self.0.lock = Some(lock.to_string());
        }
        self
    }

    /// Names the backend this error comes from (kept if already set).
    pub fn with_backend(mut self, backend: &'static str) -> Self {
        if self.0.backend.is_none() {
            self.0.backend = Some(backend);
        }
        self
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl Into<Source>) -> Self {
        self.0.source = Some(source.into());
        self
    }

    /// Overrides whether a retry may succeed; decided where the error is made.
    pub fn temporary(mut self, temporary: bool) -> Self {
        self.0.temporary = temporary;
        self
    }

    /// The kind of error.
    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }

    /// The message, without context.
    pub fn message(&self) -> &str {
        &self.0.message
    }

    /// The lock this error concerns, if known.
    pub fn lock(&self) -> Option<&str> {
        self.0.lock.as_deref()
    }

    /// The backend this error comes from, if known.
    pub fn backend(&self) -> Option<&'static str> {
        self.0.backend
    }

    /// Whether the same operation may succeed if retried.
    pub fn is_temporary(&self) -> bool {
        self.0.temporary
    }

    /// Shorthand for an [`ErrorKind::InvalidArgument`] error.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    /// Shorthand for an [`ErrorKind::Unavailable`] error with its source.
    pub fn unavailable(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::new(ErrorKind::Unavailable, message).with_source(source)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(b) = self.0.backend {
            write!(f, "{b}: ")?;
        }
        write!(f, "{}: {}", self.0.kind, self.0.message)?;
        if let Some(l) = &self.0.lock {
            write!(f, " (lock {l:?})")?;
        }
        if let Some(s) = &self.0.source {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.0.kind)
            .field("message", &self.0.message)
            .field("lock", &self.0.lock)
            .field("backend", &self.0.backend)
            .field("temporary", &self.0.temporary)
            .field("source", &self.0.source)
            .finish()
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0
            .source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// `Result` with distlock's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_backend_kind_lock_and_source() {
        let e = Error::new(ErrorKind::Unavailable, "connect failed")
            .with_lock("jobs")
            .with_backend("redis")
            .with_source(std::io::Error::other("refused"));
        assert_eq!(
            e.to_string(),
            "redis: unavailable: connect failed (lock \"jobs\"): refused"
        );
        assert!(e.is_temporary());
        assert!(!Error::invalid("x").is_temporary());
        assert!(!Error::new(ErrorKind::Unavailable, "x")
            .temporary(false)
            .is_temporary());
    }

    #[test]
    fn an_error_is_one_pointer_wide_so_results_stay_small() {
        let word = std::mem::size_of::<usize>();
        assert_eq!(std::mem::size_of::<Error>(), word);
        assert_eq!(std::mem::size_of::<Result<bool>>(), 2 * word);
        assert_eq!(std::mem::size_of::<Result<()>>(), word);
    }
}

/// Why a guard stopped holding its lock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// Safe-until passed without a successful renewal (a fixed lease ran out, or renewals kept
    /// failing).
    Expired,
    /// A renewal found the lock gone or held by someone else.
    Taken(String),
    /// The backend's session or lease ended (ZooKeeper session expiry, etcd lease revoked).
    Session(String),
    /// The client handle was dropped.
    ClientGone,
    /// The guard was released or dropped: the lock was given up, not lost. Only a `lost()`
    /// future that outlives its guard sees this.
    Released,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::Expired => f.write_str("lease expired without a successful renewal"),
            LostReason::Taken(why) => write!(f, "lock gone or taken over: {why}"),
            LostReason::Session(why) => write!(f, "session or lease ended: {why}"),
            LostReason::ClientGone => f.write_str("client dropped"),
            LostReason::Released => f.write_str("guard released"),
        }
    }
}
