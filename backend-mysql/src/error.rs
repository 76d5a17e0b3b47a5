//! How the driver's errors map onto distlock's: the server's error numbers that matter, and
//! which failures a retry can get past.

use distlock_api::{Error, ErrorKind};
use sqlx::mysql::MySqlDatabaseError;

use crate::BACKEND;

/// The server's error number, if it is a server error.
pub(crate) fn error_number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(d) => d
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number),
        _ => None,
    }
}

const ER_DUP_FIELDNAME: u16 = 1060;
const ER_DUP_ENTRY: u16 = 1062;
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
const ER_LOCK_DEADLOCK: u16 = 1213;

pub(crate) fn is_duplicate(e: &sqlx::Error) -> bool {
    error_number(e) == Some(ER_DUP_ENTRY)
}

/// An `ADD COLUMN` of a column the table has: another client's connect added it first.
pub(crate) fn is_duplicate_column(e: &sqlx::Error) -> bool {
    error_number(e) == Some(ER_DUP_FIELDNAME)
}

/// A lock conflict between concurrent transactions, which InnoDB resolved by rolling back
/// ours: retrying is correct, since nothing of ours took effect.
pub(crate) fn is_conflict(e: &sqlx::Error) -> bool {
    matches!(
        error_number(e),
        Some(ER_LOCK_DEADLOCK | ER_LOCK_WAIT_TIMEOUT)
    )
}

/// Maps a driver error to distlock's kinds: no connection is `Unavailable`; a server in the
/// middle of shutting down, full, or read-only (a demoted primary during failover) is
/// `Unavailable` too, since retrying elsewhere or later can succeed; other server errors are
/// `Backend`.
pub(crate) fn map_error(e: sqlx::Error, what: &str) -> Error {
    let (kind, temporary) = classify(&e);
    Error::new(kind, format!("{what} failed"))
        .with_source(e)
        .with_backend(BACKEND)
        .temporary(temporary)
}

/// [`map_error`] for an error shared by several operations.
pub(crate) fn error_from(
    e: &sqlx::Error,
    what: &str,
    source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> Error {
    let (kind, temporary) = classify(e);
    Error::new(kind, format!("{what} failed"))
        .with_source(source)
        .with_backend(BACKEND)
        .temporary(temporary)
}

pub(crate) fn classify(e: &sqlx::Error) -> (ErrorKind, bool) {
    let kind = match e {
        // Reached, but its certificate is not trusted: retrying will not help.
        sqlx::Error::Io(_) | sqlx::Error::Tls(_)
            if distlock_api::backend::refused_as_untrusted(e) =>
        {
            ErrorKind::Backend
        }
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => ErrorKind::Unavailable,
        sqlx::Error::Database(_) => match error_number(e) {
            // Too many connections, shutdown in progress, connection killed, read-only
            // (server option, transaction, MariaDB read-only mode).
            Some(1040 | 1053 | 1927 | 1290 | 1792 | 1836) => ErrorKind::Unavailable,
            _ => ErrorKind::Backend,
        },
        _ => ErrorKind::Backend,
    };
    let temporary =
        kind == ErrorKind::Unavailable || is_conflict(e) || matches!(e, sqlx::Error::Protocol(_));
    (kind, temporary)
}
