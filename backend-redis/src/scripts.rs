//! The Lua scripts, the lock's and the permits', hashed once per process: what every server
//! loads at connect and every operation runs.

use std::sync::LazyLock;

use redis::Script;

/// One script: its source (for SCRIPT LOAD) and the driver's handle, which sends EVALSHA and,
/// on NOSCRIPT (a restarted or flushed server), loads the script and retries once.
pub(crate) struct Lua {
    pub(crate) source: &'static str,
    pub(crate) script: Script,
}

impl Lua {
    pub(crate) fn new(source: &'static str) -> Self {
        Self {
            source,
            script: Script::new(source),
        }
    }

    /// The same script for Redis Cluster: release notices go out on the name's *shard*
    /// channel (`SPUBLISH`, Redis 7), which lives in the slot of the name's keys, so a
    /// release is told only on the shard that owns the lock instead of on every node.
    fn sharded(&self) -> Self {
        let source = self
            .source
            .replace("redis.call('publish',", "redis.call('spublish',");
        // Built once per process (the statics below), so leaking the text costs nothing.
        Self::new(Box::leak(source.into_boxed_str()))
    }
}

/// The scripts every operation runs, hashed once per process.
pub(crate) struct LockScripts {
    pub(crate) acquire: Lua,
    pub(crate) release: Lua,
    pub(crate) handover: Lua,
    pub(crate) renew: Lua,
    pub(crate) inspect: Lua,
    pub(crate) fence: Lua,
    pub(crate) proclaim: Lua,
}

pub(crate) static LOCK: LazyLock<LockScripts> = LazyLock::new(|| LockScripts {
    acquire: Lua::new(include_str!("acquire.lua")),
    release: Lua::new(include_str!("release.lua")),
    handover: Lua::new(include_str!("handover.lua")),
    renew: Lua::new(include_str!("renew.lua")),
    // Its semaphore branch uses the permit scripts' shared functions.
    inspect: Lua::new(concat!(
        include_str!("permits.lua"),
        include_str!("inspect.lua")
    )),
    fence: Lua::new(include_str!("fence.lua")),
    proclaim: Lua::new(include_str!("proclaim.lua")),
});

/// The lock scripts for Redis Cluster (`SPUBLISH` instead of `PUBLISH`).
pub(crate) static CLUSTER_LOCK: LazyLock<LockScripts> = LazyLock::new(|| {
    let l = &*LOCK;
    LockScripts {
        acquire: l.acquire.sharded(),
        release: l.release.sharded(),
        handover: l.handover.sharded(),
        renew: l.renew.sharded(),
        inspect: l.inspect.sharded(),
        fence: l.fence.sharded(),
        proclaim: l.proclaim.sharded(),
    }
});

/// The permit scripts, each after the functions they share (`permits.lua`).
pub(crate) struct PermitScripts {
    pub(crate) acquire: Lua,
    pub(crate) release: Lua,
    pub(crate) renew: Lua,
    pub(crate) force: Lua,
    pub(crate) owner: Lua,
}

macro_rules! permit_script {
    ($file:literal) => {
        Lua::new(concat!(include_str!("permits.lua"), include_str!($file)))
    };
}

pub(crate) static PERMIT: LazyLock<PermitScripts> = LazyLock::new(|| PermitScripts {
    acquire: permit_script!("permit_acquire.lua"),
    release: permit_script!("permit_release.lua"),
    renew: permit_script!("permit_renew.lua"),
    force: permit_script!("permit_force.lua"),
    owner: permit_script!("permit_of.lua"),
});

/// The permit scripts for Redis Cluster (`SPUBLISH` instead of `PUBLISH`).
pub(crate) static CLUSTER_PERMIT: LazyLock<PermitScripts> = LazyLock::new(|| {
    let p = &*PERMIT;
    PermitScripts {
        acquire: p.acquire.sharded(),
        release: p.release.sharded(),
        renew: p.renew.sharded(),
        force: p.force.sharded(),
        owner: p.owner.sharded(),
    }
});

/// The scripts of one kind of deployment: a server (or RedLock master), or Redis Cluster.
pub(crate) fn of(cluster: bool) -> (&'static LockScripts, &'static PermitScripts) {
    if cluster {
        (&CLUSTER_LOCK, &CLUSTER_PERMIT)
    } else {
        (&LOCK, &PERMIT)
    }
}

/// Every script, for loading at connect.
pub(crate) fn all(cluster: bool) -> [&'static Lua; 12] {
    let (l, p) = of(cluster);
    [
        &l.acquire,
        &l.release,
        &l.handover,
        &l.renew,
        &l.inspect,
        &l.fence,
        &l.proclaim,
        &p.acquire,
        &p.release,
        &p.renew,
        &p.force,
        &p.owner,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_scripts_publish_on_shard_channels_only() {
        for (plain, sharded) in all(false).iter().zip(all(true)) {
            assert!(!sharded.source.contains("redis.call('publish'"));
            let publishes = plain.source.matches("redis.call('publish'").count();
            assert_eq!(
                sharded.source.matches("redis.call('spublish'").count(),
                publishes
            );
        }
        assert!(CLUSTER_LOCK.release.source.contains("spublish"));
        assert!(CLUSTER_PERMIT.release.source.contains("spublish"));
    }
}
