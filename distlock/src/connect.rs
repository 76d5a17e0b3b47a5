//! Picking a backend from a URL at run time.

use std::sync::Arc;

use distlock_api::{BackendDescriptor, DistributedLock, Error, ErrorKind, Result};

/// A backend the facade knows: the Cargo feature that brings it, the URL schemes it answers
/// (known even when the feature is off, to say which feature a URL needs) and its descriptor
/// when this build has the feature.
struct Known {
    feature: &'static str,
    schemes: &'static [&'static str],
    descriptor: Option<&'static BackendDescriptor>,
}

/// Whether this build has `feature`'s backend: its descriptor, or `None`.
macro_rules! descriptor {
    ($feature:literal, $($path:ident)::+) => {{
        #[cfg(feature = $feature)]
        let d = Some(&$($path)::+);
        #[cfg(not(feature = $feature))]
        let d = None;
        d
    }};
}

/// The server backends, in the order the capability table lists them: the one list of them
/// in the facade. (The in-memory backend is always there: [`distlock_api::MEMORY`].)
fn known() -> [Known; 7] {
    [
        Known {
            feature: "redis",
            schemes: &[
                "redis",
                "rediss",
                "redis+cluster",
                "rediss+cluster",
                "redis+sentinel",
                "rediss+sentinel",
            ],
            descriptor: descriptor!("redis", distlock_redis::DESCRIPTOR),
        },
        Known {
            feature: "redis",
            schemes: &["redlock"],
            descriptor: descriptor!("redis", distlock_redis::REDLOCK_DESCRIPTOR),
        },
        Known {
            feature: "mysql",
            schemes: &["mysql", "mariadb"],
            descriptor: descriptor!("mysql", distlock_mysql::DESCRIPTOR),
        },
        Known {
            feature: "postgres",
            schemes: &["postgres", "postgresql"],
            descriptor: descriptor!("postgres", distlock_postgres::DESCRIPTOR),
        },
        Known {
            feature: "mongo",
            schemes: &["mongodb", "mongodb+srv"],
            descriptor: descriptor!("mongo", distlock_mongo::DESCRIPTOR),
        },
        Known {
            feature: "zk",
            schemes: &["zk"],
            descriptor: descriptor!("zk", distlock_zk::DESCRIPTOR),
        },
        Known {
            feature: "etcd",
            schemes: &["etcd"],
            descriptor: descriptor!("etcd", distlock_etcd::DESCRIPTOR),
        },
    ]
}

/// The descriptors of every backend this build includes, the in-memory one first.
pub fn backends() -> Vec<&'static BackendDescriptor> {
    std::iter::once(&distlock_api::MEMORY)
        .chain(known().into_iter().filter_map(|k| k.descriptor))
        .collect()
}

/// The URL schemes [`connect`] knows, with the Cargo feature each needs (`None`: always on)
/// and whether this build has it.
pub fn schemes() -> Vec<(&'static str, Option<&'static str>, bool)> {
    let mut all: Vec<_> = distlock_api::MEMORY
        .schemes
        .iter()
        .map(|&s| (s, None, true))
        .collect();
    for k in known() {
        all.extend(
            k.schemes
                .iter()
                .map(|&s| (s, Some(k.feature), k.descriptor.is_some())),
        );
    }
    all
}

/// Connects to the backend the URL's scheme names and returns it as a shared trait object:
///
/// | URL | backend | feature |
/// |---|---|---|
/// | `memory://`, `memory://NAME` | in-process [`MemoryLock`](distlock_api::MemoryLock), one store per name for the whole process | — |
/// | `redis://host:6379/0`, `rediss://…` | Redis | `redis` |
/// | `redis+cluster://h1:7000,h2:7000`, `rediss+cluster://…` | Redis Cluster (seed nodes) | `redis` |
/// | `redis+sentinel://s1:26379,s2:26379/master-name`, `rediss+sentinel://…` | Redis through Sentinel (sentinels, master name) | `redis` |
/// | `redlock://h1:6379,h2:6379,h3:6379` | RedLock over independent masters | `redis` |
/// | `mysql://user:pass@host:3306/db`, `mariadb://…` | MySQL/MariaDB | `mysql` |
/// | `postgres://user:pass@host:5432/db`, `postgresql://…` | PostgreSQL | `postgres` |
/// | `mongodb://host:27017/db`, `mongodb+srv://cluster.example.com/db` | MongoDB | `mongo` |
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
    if let Some(d) = backends().into_iter().find(|d| d.handles(&scheme)) {
        return d.connect(url).await;
    }
    match known()
        .iter()
        .find(|k| k.schemes.contains(&scheme.as_str()))
    {
        Some(k) => Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "{scheme}:// needs distlock's `{}` Cargo feature, which this build lacks",
                k.feature
            ),
        )),
        None => Err(Error::invalid(format!(
            "unknown lock URL scheme {scheme:?} in {url:?}"
        ))),
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

    /// The facade's scheme list for a backend it has must be the backend's own.
    #[test]
    fn known_schemes_are_the_descriptors() {
        for k in known() {
            if let Some(d) = k.descriptor {
                assert_eq!(k.schemes, d.schemes, "{}", d.id);
                assert!(
                    d.id == k.feature || (d.id == "redlock" && k.feature == "redis"),
                    "{} is behind feature {}",
                    d.id,
                    k.feature
                );
            }
        }
    }

    /// `scripts/services` names the backends each server serves (for `DISTLOCK_SKIP`); they
    /// must be exactly the server backends' ids.
    #[test]
    #[cfg(all(
        feature = "redis",
        feature = "mysql",
        feature = "postgres",
        feature = "mongo",
        feature = "zk",
        feature = "etcd"
    ))]
    fn the_scripts_name_the_backends_the_descriptors_do() {
        let script = include_str!("../../scripts/services");
        let line = script
            .lines()
            .find(|l| l.starts_with("declare -A BACKENDS="))
            .expect("scripts/services declares BACKENDS");
        let mut in_script: Vec<&str> = line
            .split('"')
            .skip(1)
            .step_by(2)
            .flat_map(str::split_whitespace)
            .collect();
        let mut described: Vec<&str> = backends()
            .into_iter()
            .map(|d| d.id)
            .filter(|&id| id != "memory")
            .collect();
        in_script.sort_unstable();
        described.sort_unstable();
        assert_eq!(in_script, described);
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
