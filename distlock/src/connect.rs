//! Picking a backend from a URL at run time.

use std::sync::Arc;

use distlock_api::{DistributedLock, Error, ErrorKind, MemoryStore, Result};

/// The URL schemes [`connect`] knows, with the Cargo feature each needs (`None`: always on)
/// and whether this build has it.
pub fn schemes() -> Vec<(&'static str, Option<&'static str>, bool)> {
    vec![
        ("memory", None, true),
        ("redis", Some("redis"), cfg!(feature = "redis")),
        ("rediss", Some("redis"), cfg!(feature = "redis")),
        ("redlock", Some("redis"), cfg!(feature = "redis")),
        ("mysql", Some("mysql"), cfg!(feature = "mysql")),
        ("mariadb", Some("mysql"), cfg!(feature = "mysql")),
        ("mongodb", Some("mongo"), cfg!(feature = "mongo")),
        ("zk", Some("zk"), cfg!(feature = "zk")),
        ("etcd", Some("etcd"), cfg!(feature = "etcd")),
    ]
}

/// Connects to the backend the URL's scheme names and returns it as a shared trait object:
///
/// | URL | backend | feature |
/// |---|---|---|
/// | `memory://`, `memory://NAME` | in-process [`MemoryLock`](distlock_api::MemoryLock), one store per name for the whole process | — |
/// | `redis://host:6379/0`, `rediss://…` | Redis | `redis` |
/// | `redlock://h1:6379,h2:6379,h3:6379` | RedLock over independent masters | `redis` |
/// | `mysql://user:pass@host:3306/db`, `mariadb://…` | MySQL / MariaDB | `mysql` |
/// | `mongodb://host:27017/db` | MongoDB | `mongo` |
/// | `zk://h1:2181,h2:2181/chroot` | ZooKeeper | `zk` |
/// | `etcd://h1:2379,h2:2379` | etcd | `etcd` |
///
/// A malformed URL, or a scheme whose feature this build lacks, is
/// [`ErrorKind::InvalidArgument`] / [`ErrorKind::Unsupported`] before any I/O; an unreachable
/// server is [`ErrorKind::Unavailable`] within the backend's connect timeout.
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>> {
    let scheme = match url.split_once("://") {
        Some((s, _)) if !s.is_empty() => s.to_ascii_lowercase(),
        _ => {
            return Err(Error::invalid(format!(
                "{url:?} is not a lock URL: expected scheme://…, one of {}",
                schemes().iter().map(|s| s.0).collect::<Vec<_>>().join(", ")
            )))
        }
    };
    let Some(&(_, feature, enabled)) = schemes().iter().find(|s| s.0 == scheme) else {
        return Err(Error::invalid(format!(
            "unknown lock URL scheme {scheme:?} in {url:?}"
        )));
    };
    if !enabled {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "{scheme}:// needs distlock's `{}` Cargo feature, which this build lacks",
                feature.unwrap_or("?")
            ),
        ));
    }
    match scheme.as_str() {
        "memory" => {
            // `memory://` is one store for the whole process and `memory://NAME` a named one,
            // so code written against a URL behaves the same pointed at memory in tests.
            let rest = &url["memory://".len()..];
            let store = rest.strip_suffix('/').unwrap_or(rest);
            let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
            if store.len() > 64 || !store.chars().all(ok) {
                return Err(Error::invalid(format!(
                    "the memory backend takes only a store name of [A-Za-z0-9-_.] (up to 64): \
                     use \"memory://\" or \"memory://NAME\", not {url:?}"
                )));
            }
            Ok(Arc::new(MemoryStore::named(store).client()))
        }
        _ => backends::connect(&scheme, url).await,
    }
}

/// The capabilities of every server backend compiled in, by display name.
pub(crate) fn backend_capabilities() -> Vec<(&'static str, distlock_api::Capabilities)> {
    #[allow(unused_mut)]
    let mut v = Vec::new();
    #[cfg(feature = "redis")]
    v.extend([
        ("Redis", distlock_redis::CAPABILITIES),
        ("RedLock (3+ masters)", distlock_redis::REDLOCK_CAPABILITIES),
    ]);
    #[cfg(feature = "mysql")]
    v.push(("MySQL / MariaDB", distlock_mysql::CAPABILITIES));
    #[cfg(feature = "mongo")]
    v.push(("MongoDB", distlock_mongo::CAPABILITIES));
    #[cfg(feature = "zk")]
    v.push(("ZooKeeper", distlock_zk::CAPABILITIES));
    #[cfg(feature = "etcd")]
    v.push(("etcd", distlock_etcd::CAPABILITIES));
    v
}

mod backends {
    use super::*;

    pub(super) async fn connect(scheme: &str, url: &str) -> Result<Arc<dyn DistributedLock>> {
        match scheme {
            #[cfg(feature = "redis")]
            "redis" | "rediss" => {
                let config = distlock_redis::RedisConfig::from_url(url)?;
                Ok(Arc::new(distlock_redis::RedisLock::connect(config).await?))
            }
            #[cfg(feature = "redis")]
            "redlock" => {
                let config = distlock_redis::RedLockConfig::from_url(url)?;
                Ok(Arc::new(distlock_redis::RedLock::connect(config).await?))
            }
            #[cfg(feature = "mysql")]
            "mysql" | "mariadb" => {
                let config = distlock_mysql::MysqlConfig::from_url(url)?;
                Ok(Arc::new(distlock_mysql::MysqlLock::connect(config).await?))
            }
            #[cfg(feature = "zk")]
            "zk" => {
                let config = distlock_zk::ZkConfig::from_url(url)?;
                Ok(Arc::new(distlock_zk::ZkLock::connect(config).await?))
            }
            #[cfg(feature = "etcd")]
            "etcd" => {
                let config = distlock_etcd::EtcdConfig::from_url(url)?;
                Ok(Arc::new(distlock_etcd::EtcdLock::connect(config).await?))
            }
            #[cfg(feature = "mongo")]
            "mongodb" => {
                let config = distlock_mongo::MongoConfig::from_url(url)?;
                Ok(Arc::new(distlock_mongo::MongoLock::connect(config).await?))
            }
            _ => Err(Error::new(
                ErrorKind::Unsupported,
                format!("no backend for {scheme}:// ({url:?})"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bad_urls_are_invalid_argument() {
        for bad in [
            "",
            "redis",
            "://x",
            "nope://x",
            "memory://some/where",
            "memory://a?b=c",
        ] {
            let e = connect(bad).await.err().expect(bad);
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}: {e}");
        }
    }

    #[tokio::test]
    async fn memory_url_connects() {
        let lock = connect("memory://").await.unwrap();
        assert_eq!(lock.core().backend(), "memory");
    }

    /// Two connects to one memory URL are two clients of one store, as two connects to one
    /// server are; another store name is another store.
    #[tokio::test]
    async fn memory_connects_share_locks() {
        use distlock_api::LockExt;
        let name = format!("shared-{}", std::process::id());
        let (a, b) = (
            connect("memory://").await.unwrap(),
            connect("memory:///").await.unwrap(),
        );
        let g = a.try_lock(&name).await.unwrap().expect("free");
        assert!(
            b.try_lock(&name).await.unwrap().is_none(),
            "memory:// connects do not share"
        );
        let info = b.holder(&name).await.unwrap().expect("held");
        assert_eq!(&info.owner, g.owner());
        let (c, d) = (
            connect("memory://tests-x").await.unwrap(),
            connect("memory://tests-x").await.unwrap(),
        );
        let gc = c
            .try_lock(&name)
            .await
            .unwrap()
            .expect("another store: free");
        assert!(d.try_lock(&name).await.unwrap().is_none());
        assert!(gc.release().await.unwrap());
        assert!(g.release().await.unwrap());
        assert!(b.try_lock(&name).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn scheme_without_its_feature_is_unsupported() {
        for (scheme, _, enabled) in schemes() {
            if !enabled {
                let e = connect(&format!("{scheme}://127.0.0.1:1"))
                    .await
                    .err()
                    .unwrap();
                assert_eq!(e.kind(), ErrorKind::Unsupported, "{scheme}: {e}");
            }
        }
    }
}
