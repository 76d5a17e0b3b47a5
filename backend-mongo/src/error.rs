//! The driver's errors as distlock's: what is temporary (a retry may succeed) and what is not,
//! and a driver operation bounded by the operation timeout.

use std::future::Future;
use std::time::Duration;

use distlock_api::{Error, ErrorKind, LockName};
use mongodb::error::{ErrorKind as DriverKind, WriteFailure};

use crate::BACKEND;

/// Server error codes that mean "not now": the node is stepping down, shutting down, not
/// primary, or a network or time limit on the server's side was hit. The operation did not
/// take effect or, for write-concern timeouts, its outcome is unknown; either way a retry may
/// succeed.
const TEMPORARY_CODES: &[i32] = &[
    6,     // HostUnreachable
    7,     // HostNotFound
    50,    // MaxTimeMSExpired
    64,    // WriteConcernFailed (wtimeout)
    89,    // NetworkTimeout
    91,    // ShutdownInProgress
    189,   // PrimarySteppedDown
    262,   // ExceededTimeLimit
    9001,  // SocketException
    10107, // NotWritablePrimary
    11600, // InterruptedAtShutdown
    11602, // InterruptedDueToReplStateChange
    13435, // NotPrimaryNoSecondaryOk
    13436, // NotPrimaryOrSecondary
];

/// The server's error code, wherever the driver put it.
pub(crate) fn command_code(e: &mongodb::error::Error) -> Option<i32> {
    match e.kind.as_ref() {
        DriverKind::Command(c) => Some(c.code),
        DriverKind::Write(WriteFailure::WriteError(w)) => Some(w.code),
        DriverKind::Write(WriteFailure::WriteConcernError(w)) => Some(w.code),
        _ => None,
    }
}

/// Maps a driver error: unreachable, timed out, or a node that is not (or no longer) primary is
/// `Unavailable` and temporary; a write-concern timeout too (its outcome is unknown); the rest
/// is `Backend`.
pub(crate) fn map_err(e: mongodb::error::Error, what: &str) -> Error {
    let kind = match e.kind.as_ref() {
        DriverKind::Io(_)
        | DriverKind::ServerSelection { .. }
        | DriverKind::ConnectionPoolCleared { .. }
        | DriverKind::DnsResolve { .. }
        | DriverKind::Shutdown => ErrorKind::Unavailable,
        DriverKind::InvalidArgument { .. } | DriverKind::InvalidTlsConfig { .. } => {
            ErrorKind::InvalidArgument
        }
        _ if command_code(&e).is_some_and(|c| TEMPORARY_CODES.contains(&c)) => {
            ErrorKind::Unavailable
        }
        _ if e.contains_label("RetryableWriteError") => ErrorKind::Unavailable,
        _ => ErrorKind::Backend,
    };
    Error::new(kind, what.to_string())
        .with_backend(BACKEND)
        .with_source(e)
}

/// The duplicate-key error code: a concurrent upsert inserted the document first.
const DUPLICATE_KEY: i32 = 11000;

/// A driver error mapped to ours, remembering whether it was a duplicate key.
pub(crate) struct OpError {
    pub(crate) error: Error,
    pub(crate) duplicate_key: bool,
}

impl OpError {
    pub(crate) fn with_lock(self, name: &LockName) -> Error {
        self.error.with_lock(name)
    }
}

/// Runs `op` for at most `timeout`: the driver has no per-operation deadline of its own, and
/// a server that accepts a connection but never answers must not hang a caller.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    what: &'static str,
    op: impl Future<Output = mongodb::error::Result<T>>,
) -> std::result::Result<T, OpError> {
    match tokio::time::timeout(timeout, op).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(OpError {
            duplicate_key: command_code(&e) == Some(DUPLICATE_KEY),
            error: map_err(e, what),
        }),
        Err(_) => Err(OpError {
            error: Error::new(
                ErrorKind::Unavailable,
                format!("{what}: no answer from MongoDB within {timeout:?}"),
            )
            .with_backend(BACKEND),
            duplicate_key: false,
        }),
    }
}
