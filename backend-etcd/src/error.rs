//! How the etcd driver's errors map onto distlock's.

use distlock_api::{Error, ErrorKind};

use crate::BACKEND;

/// Maps a driver error: no answer or no connection is `Unavailable` (temporary), anything
/// the server said is `Backend`.
pub(crate) fn driver_error(what: &str, e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    // gRPC status codes (tonic's `Code` numbering).
    const CANCELLED: i32 = 1;
    const DEADLINE_EXCEEDED: i32 = 4;
    const NOT_FOUND: i32 = 5;
    const RESOURCE_EXHAUSTED: i32 = 8;
    const ABORTED: i32 = 10;
    const UNAVAILABLE: i32 = 14;
    let kind = match &e {
        // Reached, but its certificate is not trusted: retrying will not help.
        _ if distlock_api::backend::refused_as_untrusted(&e) => ErrorKind::Backend,
        E::GRpcStatus(s) => match i32::from(s.code()) {
            CANCELLED | DEADLINE_EXCEEDED | RESOURCE_EXHAUSTED | ABORTED | UNAVAILABLE => {
                ErrorKind::Unavailable
            }
            // The client's lease is gone; the keep-alive task is replacing it.
            NOT_FOUND if s.message().contains("lease not found") => ErrorKind::Unavailable,
            _ => ErrorKind::Backend,
        },
        E::TransportError(_) | E::IoError(_) => ErrorKind::Unavailable,
        _ => ErrorKind::Backend,
    };
    Error::new(kind, format!("{what}: {e}"))
        .with_source(e)
        .with_backend(BACKEND)
}
