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

/// Every script, for loading at connect.
pub(crate) fn all() -> [&'static Lua; 12] {
    let (l, p) = (&*LOCK, &*PERMIT);
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
