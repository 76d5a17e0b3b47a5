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
pub struct Error {
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
        Self {
            kind,
            message: message.into(),
            lock: None,
            backend: None,
            temporary: kind.default_temporary(),
            source: None,
        }
    }

    /// Names the lock this error concerns (kept if already set).
    pub fn with_lock(mut self, lock: impl fmt::Display) -> Self {
        if self.lock.is_none() {
            self.lock = Some(lock.to_string());
        }
        self
    }

    /// Names the backend this error comes from (kept if already set).
    pub fn with_backend(mut self, backend: &'static str) -> Self {
        if self.backend.is_none() {
            self.backend = Some(backend);
        }
        self
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl Into<Source>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Overrides whether a retry may succeed; decided where the error is made.
    pub fn temporary(mut self, temporary: bool) -> Self {
        self.temporary = temporary;
        self
    }

    /// The kind of error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without context.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The lock this error concerns, if known.
    pub fn lock(&self) -> Option<&str> {
        self.lock.as_deref()
    }

    /// The backend this error comes from, if known.
    pub fn backend(&self) -> Option<&'static str> {
        self.backend
    }

    /// Whether the same operation may succeed if retried.
    pub fn is_temporary(&self) -> bool {
        self.temporary
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
        if let Some(b) = self.backend {
            write!(f, "{b}: ")?;
        }
        write!(f, "{}: {}", self.kind, self.message)?;
        if let Some(l) = &self.lock {
            write!(f, " (lock {l:?})")?;
        }
        if let Some(s) = &self.source {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.kind)
            .field("message", &self.message)
            .field("lock", &self.lock)
            .field("backend", &self.backend)
            .field("temporary", &self.temporary)
            .field("source", &self.source)
            .finish()
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
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
}
