//! How ZooKeeper's errors map onto distlock's: which answers mean the server did not apply a
//! request, which leave its outcome in doubt, and the error kinds callers see.

use std::time::Duration;

use distlock_api::{Error, ErrorKind};
use zookeeper_client as zk;

/// Whether the server itself answered with this error, so the request was not applied. Any
/// other error (a connection lost or timed out, however the client words it) leaves it
/// unknown whether the server applied the request.
pub(crate) fn answered(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::NoNode
            | zk::Error::NoAuth
            | zk::Error::BadVersion
            | zk::Error::NoChildrenForEphemerals
            | zk::Error::NodeExists
            | zk::Error::NotEmpty
            | zk::Error::InvalidAcl
            | zk::Error::QuotaExceeded
            | zk::Error::Throttled
            | zk::Error::MarshallingError
            | zk::Error::Unimplemented
            | zk::Error::BadArguments(_)
            | zk::Error::NoWatcher
            | zk::Error::NotReadOnly
            | zk::Error::ReconfigDisabled
            | zk::Error::UnexpectedErrorCode(_)
            | zk::Error::AuthFailed
            | zk::Error::SessionExpired
            | zk::Error::SessionMoved
            | zk::Error::ClientClosed
    )
}

/// Whether a request's outcome is unknown: no answer in time, or the connection went.
pub(crate) fn in_doubt(e: &Option<zk::Error>) -> bool {
    e.as_ref().is_none_or(|e| !answered(e))
}

/// Maps a client error: connection trouble, throttling and a session that is gone are
/// `Unavailable` (retrying, on this or the next session, may work); the server's other
/// answers are `Backend`.
pub(crate) fn zk_error(e: zk::Error, what: &str) -> Error {
    let kind = match e {
        zk::Error::Throttled
        | zk::Error::SessionExpired
        | zk::Error::SessionMoved
        | zk::Error::ClientClosed => ErrorKind::Unavailable,
        ref e if !answered(e) => ErrorKind::Unavailable,
        _ => ErrorKind::Backend,
    };
    let message = match e {
        zk::Error::NoAuth => format!(
            "{what}: ZooKeeper refused it (NoAuth): the node's ACL does not grant this \
             session's identity; lock nodes made with digest credentials (the creator ACL) are \
             open only to sessions with the same user and password"
        ),
        zk::Error::InvalidAcl => format!(
            "{what}: ZooKeeper refused the ACL (InvalidAcl): the creator ACL needs a session \
             that authenticated (digest credentials, its connector's auth, or a TLS client \
             certificate)"
        ),
        zk::Error::AuthFailed => {
            format!("{what}: ZooKeeper refused the session's authentication (AuthFailed)")
        }
        _ => what.to_string(),
    };
    Error::new(kind, message).with_source(e).with_backend("zk")
}

/// The error of a request that got no answer within the per-request bound.
pub(crate) fn no_answer(what: &str, limit: Duration) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!("{what}: no answer from ZooKeeper within {limit:?}"),
    )
    .with_backend("zk")
}

/// An `InvalidArgument` error of this backend (a configuration it refuses).
pub(crate) fn invalid(message: impl Into<String>) -> Error {
    Error::invalid(message).with_backend("zk")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_answers_are_unavailable_and_in_doubt_server_answers_are_not() {
        for e in [
            zk::Error::ConnectionLoss,
            zk::Error::Timeout,
            zk::Error::NoHosts,
        ] {
            assert!(in_doubt(&Some(e.clone())), "{e}");
            assert_eq!(zk_error(e, "x").kind(), ErrorKind::Unavailable);
        }
        assert!(in_doubt(&None));
        for e in [zk::Error::SessionExpired, zk::Error::Throttled] {
            assert!(!in_doubt(&Some(e.clone())), "{e}");
            assert_eq!(zk_error(e, "x").kind(), ErrorKind::Unavailable);
        }
        for e in [zk::Error::NoNode, zk::Error::NoAuth, zk::Error::NodeExists] {
            assert!(!in_doubt(&Some(e.clone())), "{e}");
            let err = zk_error(e, "x");
            assert_eq!(err.kind(), ErrorKind::Backend);
            assert!(!err.is_temporary());
        }
    }
}
