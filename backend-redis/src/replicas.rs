//! `sync_replicas=N`: replication-aware grants. Every script that grants or extends a hold (an
//! acquire, a re-entry, a renewal, a permit's grant and renewal; the fencing counter is bumped
//! inside the acquire) is sent in one pipeline with `WAIT N timeout` right behind it, on the same
//! connection, so the `WAIT` counts the replicas that acknowledged this connection's writes up to
//! and including the script's. On a cluster the pipeline is routed by the script's first key,
//! so both go to the primary that owns the name's slot (a `MOVED`/`ASK` redirection moves the
//! whole pipeline). A grant that fewer than `N` replicas acknowledged is given back with its
//! own owner and token and reported as `Unavailable`; such a renewal is `Unavailable` too, so the
//! guard's safe-until does not move (the watchdog retries it, and the guard is lost when
//! safe-until passes). `WAITAOF` (Redis 7.2, fsync on the replicas' AOF) is not used.
//!
//! This module holds the option and what a write carries; the server side of sending a write
//! and judging its acknowledgements is in `replicated.rs`, beside `ops.rs`.

use std::time::Duration;

use distlock_api::config::UrlQuery;
use distlock_api::{Error, ErrorKind, LockName, Result};
use redis::ToRedisArgs;

use crate::scripts::Lua;

/// `sync_replicas` and `sync_timeout` as configured (`replicas` 0: off).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SyncReplicas {
    pub(crate) replicas: u32,
    pub(crate) timeout: Option<Duration>,
}

impl SyncReplicas {
    /// Takes `sync_replicas` and `sync_timeout` (or `sync_timeout_ms`) from a URL's query.
    pub(crate) fn take_from(&mut self, query: &mut UrlQuery<'_>) -> Result<()> {
        let what = "a whole number of replicas (0 or more)";
        if let Some(n) = query.take_parsed::<u32>("sync_replicas", what)? {
            self.replicas = n;
        }
        if let Some(t) = query.take_duration(&["sync_timeout"])? {
            self.timeout = Some(t);
        }
        Ok(())
    }

    /// `sync_timeout` needs `sync_replicas`, is above zero (`WAIT` with 0 waits forever) and at
    /// most half the operation timeout (the script's round trip and the `WAIT` must both fit).
    pub(crate) fn validate(&self, operation_timeout: Duration) -> Result<()> {
        match self.timeout {
            Some(_) if self.replicas == 0 => Err(Error::invalid(
                "sync_timeout is the WAIT timeout of sync_replicas, which is not set",
            )),
            Some(t) if t < Duration::from_millis(1) => Err(Error::invalid(
                "sync_timeout must be at least 1ms (WAIT 0 would wait forever)",
            )),
            Some(t) if t > operation_timeout / 2 => Err(Error::invalid(format!(
                "sync_timeout {t:?} is more than half the operation timeout \
                 ({operation_timeout:?}): the write and its WAIT must both answer within it"
            ))),
            _ => Ok(()),
        }
    }

    /// What a server with this option in force waits for; `None` when it is off.
    pub(crate) fn in_force(&self, operation_timeout: Duration) -> Option<Waiting> {
        (self.replicas > 0).then_some(Waiting {
            replicas: self.replicas,
            timeout: self.timeout,
            default_cap: operation_timeout / 2,
        })
    }
}

/// How a server waits for its replicas.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Waiting {
    pub(crate) replicas: u32,
    timeout: Option<Duration>,
    default_cap: Duration,
}

impl Waiting {
    /// The `WAIT` timeout for a write of a lease of `ttl`: `sync_timeout` but at most a third of
    /// the lease; by default a tenth of the lease, at most half the operation timeout.
    pub(crate) fn timeout(&self, ttl: Duration) -> Duration {
        let t = match self.timeout {
            Some(t) => t.min(ttl / 3),
            None => (ttl / 10).min(self.default_cap),
        };
        t.max(Duration::from_millis(1))
    }
}

/// How many replicas acknowledged a write: `None` when none were asked for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Acks(pub(crate) Option<(u32, i64, Duration)>);

impl Acks {
    /// Whether fewer replicas than asked for acknowledged.
    pub(crate) fn short(&self) -> bool {
        matches!(self.0, Some((asked, got, _)) if got < i64::from(asked))
    }

    /// The `Unavailable` error of an unacknowledged write.
    pub(crate) fn error(&self, name: &LockName, what: &str) -> Error {
        let (asked, got, timeout) = self.0.unwrap_or((0, 0, Duration::ZERO));
        Error::new(
            ErrorKind::Unavailable,
            format!(
                "{what}: {got} of the {asked} replicas asked for (sync_replicas) acknowledged \
                 it within {timeout:?}"
            ),
        )
        .with_lock(name)
    }
}

/// A script call, sent alone or followed by `WAIT`.
pub(crate) struct Call {
    pub(crate) lua: &'static Lua,
    pub(crate) keys: Vec<Vec<u8>>,
    pub(crate) args: Vec<Vec<u8>>,
}

impl Call {
    pub(crate) fn new(lua: &'static Lua) -> Self {
        Self {
            lua,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    pub(crate) fn key(mut self, key: impl ToRedisArgs) -> Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    pub(crate) fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        arg.write_redis_args(&mut self.args);
        self
    }
}

#[cfg(test)]
mod tests {
    use distlock_api::ErrorKind;

    use crate::{RedLockConfig, RedisConfig};

    #[test]
    fn sync_replicas_is_parsed_and_checked_before_any_io() {
        let c = RedisConfig::from_url("redis://h:1?sync_replicas=2&sync_timeout=250ms").unwrap();
        assert_eq!(c.get_sync_replicas(), 2);
        assert_eq!(
            c.get_sync_timeout(),
            Some(std::time::Duration::from_millis(250))
        );
        for ok in [
            "redis+sentinel://h:1/m?sync_replicas=1",
            "redis+cluster://h:1,h:2?sync_replicas=1&sync_timeout_ms=100",
            "redis://h:1?sync_replicas=0",
        ] {
            RedisConfig::from_url(ok).expect(ok);
        }
        for bad in [
            "redis://h:1?sync_replicas=abc",
            "redis://h:1?sync_replicas=-1",
            "redis://h:1?sync_replicas=1.5",
            "redis://h:1?sync_timeout=1s",
            "redis://h:1?sync_replicas=1&sync_timeout=0ms",
            "redis://h:1?sync_replicas=1&sync_timeout=2s",
            "redis://h:1?sync_replicas=1&sync_timeout=soon",
            "redis+sentinel://h:1/m?sync_replicas=x",
            "redis+cluster://h:1?sync_replicas=-2",
        ] {
            let e = RedisConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}");
        }
        let e = RedLockConfig::from_url("redlock://a:1,b:2,c:3?sync_replicas=1").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.message().contains("RedLock"), "{e}");
        let c = RedisConfig::from_url("redis://h:1").unwrap();
        let bad = c.sync_replicas(1).sync_timeout(std::time::Duration::ZERO);
        assert_eq!(
            bad.validate().unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn the_wait_timeout_is_well_below_the_lease() {
        use std::time::Duration;
        let s = super::SyncReplicas {
            replicas: 1,
            timeout: None,
        };
        let w = s.in_force(Duration::from_secs(3)).unwrap();
        assert_eq!(
            w.timeout(Duration::from_secs(30)),
            Duration::from_millis(1500)
        );
        assert_eq!(
            w.timeout(Duration::from_secs(2)),
            Duration::from_millis(200)
        );
        assert_eq!(
            w.timeout(Duration::from_millis(5)),
            Duration::from_millis(1)
        );
        let s = super::SyncReplicas {
            timeout: Some(Duration::from_millis(900)),
            ..s
        };
        let w = s.in_force(Duration::from_secs(3)).unwrap();
        assert_eq!(
            w.timeout(Duration::from_secs(30)),
            Duration::from_millis(900)
        );
        assert_eq!(
            w.timeout(Duration::from_millis(600)),
            Duration::from_millis(200)
        );
        assert!(super::SyncReplicas::default()
            .in_force(Duration::from_secs(3))
            .is_none());
    }
}
