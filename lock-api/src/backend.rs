//! For backend authors: what implementing [`DistributedLock`](crate::DistributedLock) takes,
//! apart from what users see at the crate root.
//!
//! A backend implements the server's operations ([`attempt`], `release`, `renew`, `inspect`,
//! optionally a batched `renew_many` and a `give_back`), says how its acquires wait
//! ([`Waiting`]) and keeps its per-client state in a [`ClientCore`]. lock-api does the rest:
//! try-acquire, the wait loops, cancellation safety, lost answers, the watchdog and the
//! guards. A backend that waits in a queue of its own undoes half-done work with [`Armed`].
//!
//! [`attempt`]: crate::DistributedLock::attempt
//! [`Waiting`]: wait::Waiting
//! [`Armed`]: wait::Armed

pub use crate::grant::{
    check_ttl, check_wait, drift, lost, safe_until, AcquireRequest, Grant, Surplus, MAX_TTL,
    MAX_WAIT,
};
pub use crate::keeper::Hold;
pub use crate::lock::{ClientCore, LeaseKeeper};
pub use crate::wakes::HANDED_IN_A_ROW;
/// Re-exported so backends implement the trait with the same macro version.
pub use async_trait::async_trait;

mod by_release;
mod escape;
mod recent;
pub mod testing;
pub mod wait;

pub use by_release::{force_release_by_releases, give_back_by_release};
pub use escape::{escape, unescape};
pub use recent::Recent;

/// Makes sure rustls has a process-wide crypto provider before a driver builds a TLS config
/// with it: ring's, unless the application installed one of its own (which is kept). rustls
/// picks one from its crate features only when exactly one provider is enabled, and a build
/// with several drivers enables both ring and aws-lc-rs (the ZooKeeper client's rustls brings
/// aws-lc-rs), so without this a TLS connection would panic inside the driver. Call it on every
/// TLS path, before connecting.
#[cfg(feature = "tls")]
pub fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: a provider is installed either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Whether `e`, or an error it wraps, says the server was reached but the connection was
/// refused as untrusted or not understood: a TLS certificate that does not verify (rustls's
/// "invalid peer certificate"), or bytes of a protocol the driver does not speak (an I/O error
/// of kind `InvalidData`, e.g. plain text to a TLS port). Retrying the same way cannot succeed,
/// so a backend reports such a failure as [`ErrorKind::Backend`](crate::ErrorKind::Backend),
/// not as a temporary [`Unavailable`](crate::ErrorKind::Unavailable).
pub fn refused_as_untrusted(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::InvalidData)
            || e.to_string().contains("invalid peer certificate")
        {
            return true;
        }
        next = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::refused_as_untrusted;
    use std::io;

    #[derive(Debug)]
    struct Wrap(io::Error);
    impl std::fmt::Display for Wrap {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("connect failed")
        }
    }
    impl std::error::Error for Wrap {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn an_untrusted_certificate_or_foreign_protocol_is_told_apart_from_an_unreachable_server() {
        let bad_cert = Wrap(io::Error::new(
            io::ErrorKind::InvalidData,
            "invalid peer certificate: UnknownIssuer",
        ));
        assert!(refused_as_untrusted(&bad_cert));
        let message_only = io::Error::other("invalid peer certificate: Expired");
        assert!(refused_as_untrusted(&message_only));
        for kind in [
            io::ErrorKind::ConnectionRefused,
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::TimedOut,
        ] {
            assert!(
                !refused_as_untrusted(&Wrap(io::Error::new(kind, "gone"))),
                "{kind:?}"
            );
        }
    }
}
