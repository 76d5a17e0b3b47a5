//! How the driver's errors map onto distlock's: the SQLSTATEs that matter, and which failures
//! a retry can get past.

use distlock_api::{Error, ErrorKind};

use crate::BACKEND;

/// The server's SQLSTATE, if it is a server error.
pub(crate) fn sqlstate(e: &sqlx::Error) -> Option<String> {
    match e {
        sqlx::Error::Database(d) => d.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// A conflict between concurrent transactions that the server resolved by rolling ours back
/// (serialization failure, deadlock) or a race of two `CREATE … IF NOT EXISTS` (unique
/// violation on the catalog): retrying is correct, since nothing of ours took effect.
pub(crate) fn is_conflict(e: &sqlx::Error) -> bool {
    matches!(sqlstate(e).as_deref(), Some("40001" | "40P01" | "23505"))
}

/// Maps a driver error to distlock's kinds: no connection is `Unavailable`; a server shutting
/// down, starting up, out of connections or read-only (a standby, a demoted primary) is
/// `Unavailable` too, since retrying elsewhere or later can succeed; other server errors are
/// `Backend`.
pub(crate) fn map_error(e: sqlx::Error, what: &str) -> Error {
    let (kind, temporary) = classify(&e);
    Error::new(kind, format!("{what} failed"))
        .with_source(e)
        .with_backend(BACKEND)
        .temporary(temporary)
}

pub(crate) fn classify(e: &sqlx::Error) -> (ErrorKind, bool) {
    let kind = match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_)
            if distlock_api::backend::refused_as_untrusted(e) =>
        {
            ErrorKind::Backend
        }
        sqlx::Error::Protocol(m) if closed_while_connecting(m) => ErrorKind::Unavailable,
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => ErrorKind::Unavailable,
        sqlx::Error::Database(_) => match sqlstate(e).as_deref() {
            // Class 08 (connection exception), 57P01..57P03 (admin shutdown, crash shutdown,
            // cannot connect now), 53300 (too many connections), 25006 (read-only
            // transaction: a standby).
            Some(s) if s.starts_with("08") => ErrorKind::Unavailable,
            Some("57P01" | "57P02" | "57P03" | "53300" | "25006") => ErrorKind::Unavailable,
            _ => ErrorKind::Backend,
        },
        _ => ErrorKind::Backend,
    };
    let temporary =
        kind == ErrorKind::Unavailable || is_conflict(e) || matches!(e, sqlx::Error::Protocol(_));
    (kind, temporary)
}

/// Whether a protocol error is the driver's report of a connection closed before the server's
/// first byte: sqlx reads the one-byte answer to its `SSLRequest` into a zeroed buffer and,
/// at end of stream, reports that zero as an unexpected answer. The server never spoke: the
/// connection was lost, as when a firewall or proxy drops it.
/// (The driver appends where it raised the error, in parentheses.)
fn closed_while_connecting(message: &str) -> bool {
    message.starts_with("unexpected response from SSLRequest: 0x00")
}

/// The error of an operation that got no answer within the operation timeout: temporary
/// `Unavailable`, like any other unreachable server.
pub(crate) fn timed_out(what: &str, limit: std::time::Duration) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!(
            "{what} failed: no answer from the PostgreSQL server within the operation timeout \
             of {limit:?}"
        ),
    )
    .with_backend(BACKEND)
    .temporary(true)
}
/// An error for each of several grants: the same kind, message and temporariness.
pub(crate) fn clone_error(e: &Error) -> Error {
    Error::new(e.kind(), e.to_string())
        .with_backend(BACKEND)
        .temporary(e.is_temporary())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_closed_before_the_servers_first_byte_is_unavailable() {
        let closed = sqlx::Error::Protocol(
            "unexpected response from SSLRequest: 0x00 (sqlx_postgres::connection::tls:95)".into(),
        );
        assert_eq!(classify(&closed), (ErrorKind::Unavailable, true));
        let garbled = sqlx::Error::Protocol(
            "unexpected response from SSLRequest: 0x48 (sqlx_postgres::connection::tls:95)".into(),
        );
        assert_eq!(classify(&garbled), (ErrorKind::Backend, true));
    }
}
