//! Section 8: the libraries a user would pick instead of distlock, each on the same server in
//! the same run, with the same three measures — the uncontended cycle (in slices alternating
//! with distlock's backend on that server), one hot lock with eight contenders, and the wake-up
//! after a release.
//!
//! rslock runs in this process. The others are small harness programs kept in `bench/peers/`
//! (Java for Curator, Go for etcd's `concurrency.Mutex`, Python for redis-py and
//! python-redis-lock), built or installed into `target/peers/` by `bench/peers/install`, which
//! `scripts/bench` runs. They print raw measurements only; [`protocol`] reads them and the
//! bench's own statistics summarise them. A peer that is not installed is reported as skipped
//! with the reason; the bench itself never installs anything.

pub(crate) mod harness;
pub(crate) mod protocol;
mod rslock;

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use tokio::process::Command;

use self::harness::Harness;
pub(crate) use self::protocol::Hello;
use crate::error::Res;
pub(crate) use crate::model::CONTENDERS;
use crate::model::{BackendResult, LibraryMeasures, LibraryResult, ScenarioError};
use crate::run::contention::HotRecord;
use crate::run::plan::Plan;
use crate::run::progress::Progress;
use crate::run::scenarios::{self, run_for, unique_name, Cycle, LockCycle, Measured, ACQUIRE_WAIT};
use crate::run::stats::Recorder;
use crate::run::targets::{self, Kind};
use distlock_api::LockOptions;

/// Progress steps per library: cycle, hot lock, wake-up.
pub(crate) const STEPS: usize = 3;

/// What a peer does with its measurements: the harness programs and rslock alike.
#[async_trait]
pub(crate) trait Driver: Send {
    /// Library, version, runtime and how its contenders run.
    fn hello(&self) -> Hello;
    /// One client, acquire + release on `name` for about `run`.
    async fn cycle(&mut self, name: &str, run: Duration) -> Res<Measured>;
    /// `clients` contenders on `name`, for `run`.
    async fn hot(&mut self, name: &str, clients: usize, run: Duration) -> Res<HotRecord>;
    /// `samples` wake-ups, each on a fresh name, after a random wait in `delay`.
    async fn wake(
        &mut self,
        prefix: &str,
        samples: u32,
        delay: (Duration, Duration),
    ) -> Res<Recorder>;
    /// One client, take + release one permit of a `max`-permit semaphore on `name`, for
    /// about `run` (section 9); an error where the library has no semaphore.
    async fn permit(&mut self, _name: &str, _max: u32, _run: Duration) -> Res<Measured> {
        Err("this library has no semaphore".into())
    }
    /// Ends the harness.
    async fn close(self: Box<Self>);
}

/// The peers, in report order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Library {
    Rslock,
    RedisPy,
    PythonRedisLock,
    /// Node.js `redis-semaphore`: semaphores only (section 9).
    RedisSemaphore,
    Curator,
    EtcdGo,
}

impl Library {
    pub(crate) const ALL: [Library; 6] = [
        Library::Rslock,
        Library::RedisPy,
        Library::PythonRedisLock,
        Library::RedisSemaphore,
        Library::Curator,
        Library::EtcdGo,
    ];

    /// Whether section 8 measures its lock.
    pub(crate) fn locks(self) -> bool {
        self != Library::RedisSemaphore
    }

    /// Whether section 9 measures its semaphore.
    pub(crate) fn permits(self) -> bool {
        matches!(self, Library::RedisSemaphore | Library::Curator)
    }

    /// Whether section 10 measures its leader election.
    pub(crate) fn elections(self) -> bool {
        matches!(self, Library::Curator | Library::EtcdGo)
    }

    /// The `--only` name, also the JSON id and the install script's name for it.
    pub(crate) fn id(self) -> &'static str {
        match self {
            Library::Rslock => "rslock",
            Library::RedisPy => "redis-py",
            Library::PythonRedisLock => "python-redis-lock",
            Library::RedisSemaphore => "redis-semaphore",
            Library::Curator => "curator",
            Library::EtcdGo => "etcd-go",
        }
    }

    pub(crate) fn from_id(id: &str) -> Option<Library> {
        Library::ALL.into_iter().find(|l| l.id() == id)
    }

    /// The distlock backend on the same server.
    pub(crate) fn against(self) -> Kind {
        match self {
            Library::Rslock
            | Library::RedisPy
            | Library::PythonRedisLock
            | Library::RedisSemaphore => Kind::Redis,
            Library::Curator => Kind::Zk,
            Library::EtcdGo => Kind::Etcd,
        }
    }

    /// The lock's name before the harness has said it.
    fn name(self) -> &'static str {
        match self {
            Library::Rslock => "rslock",
            Library::RedisPy => "redis-py Lock",
            Library::PythonRedisLock => "python-redis-lock",
            Library::RedisSemaphore => "redis-semaphore Semaphore",
            Library::Curator => "Apache Curator InterProcessMutex",
            Library::EtcdGo => "etcd clientv3/concurrency.Mutex",
        }
    }

    /// What a cycle sends and how a waiter waits, next to distlock's backend.
    fn note(self) -> &'static str {
        match self {
            Library::Rslock => {
                "`acquire` (SET NX PX; when held, retried after a random 0–200 ms pause, \
                 three tries per `lock` call and `acquire` loops over `lock`) + `unlock` \
                 (compare-and-delete script); no fencing token, no release notice"
            }
            Library::RedisPy => {
                "`with client.lock(name, timeout=30)`: SET NX PX, a waiter retries every \
                 0.1 s (its default `sleep`); release: compare-and-delete script; no fencing \
                 token, no release notice"
            }
            Library::PythonRedisLock => {
                "`with redis_lock.Lock(client, name, expire=30)`: SET NX EX, a waiter blocks \
                 in BLPOP on a signal list that the release script (compare, delete, push, \
                 expire) pushes to; no fencing token"
            }
            Library::RedisSemaphore => "semaphores only (section 9)",
            Library::Curator => {
                "`InterProcessMutex.acquire()` + `release()`: a protected \
                 ephemeral-sequential node, the children listed, a watch on the predecessor \
                 when not first; release deletes the node; reentrant per thread; no fencing \
                 token in the API"
            }
            Library::EtcdGo => {
                "`Mutex.Lock` + `Unlock` on a `concurrency.Session` (lease): one transaction \
                 puts the key under the session's lease and reads the first creator; a \
                 waiter watches the deletion of every earlier key from a past revision (the \
                 unsynced-watcher path, caught up every 100 ms); unlock deletes the key"
            }
        }
    }

    /// Where it came from, with a package version where a package manager has one.
    fn source(self) -> String {
        let deb = |pkg: &str| match dpkg_version(pkg) {
            Some(v) => format!("Debian {pkg} {v}"),
            None => format!("Debian {pkg}"),
        };
        match self {
            Library::Rslock => "crates.io, version from Cargo.lock".into(),
            Library::RedisPy | Library::PythonRedisLock => {
                "PyPI, in a venv under target/peers".into()
            }
            Library::RedisSemaphore => "npm, under target/peers/node".into(),
            Library::Curator => deb("libcurator-recipes-java"),
            Library::EtcdGo => deb("golang-etcd-server-dev"),
        }
    }
}

/// Where `bench/peers/install` puts what it builds and installs.
pub(crate) fn peers_dir() -> PathBuf {
    match std::env::var_os("DISTLOCK_PEERS_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/peers"),
    }
}

/// The harness sources kept in the repository.
fn peers_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("peers")
}

const NOT_INSTALLED: &str = "not installed (scripts/bench installs it)";

/// How to start `lib`'s harness against `url`, or why it cannot run here.
enum Launch {
    InProcess(String),
    Process(Command),
}

fn launch(lib: Library, dir: &Path, url: &str) -> Result<Launch, String> {
    if lib == Library::Rslock {
        return Ok(Launch::InProcess(driver_url(url).into()));
    }
    // The installer's own verdict, when it could not install this peer.
    if let Ok(reason) = std::fs::read_to_string(dir.join(format!("{}.skipped", lib.id()))) {
        let reason = reason.trim();
        if !reason.is_empty() {
            return Err(format!("could not be installed: {reason}"));
        }
    }
    let need = |path: PathBuf| match path.exists() {
        true => Ok(path),
        false => Err(NOT_INSTALLED.to_string()),
    };
    match lib {
        Library::Rslock => unreachable!("handled above"),
        Library::RedisPy | Library::PythonRedisLock => {
            let python = need(dir.join("python/venv/bin/python"))?;
            let package = match lib {
                Library::RedisPy => "redis",
                _ => "redis_lock",
            };
            if !site_package(&dir.join("python/venv/lib"), package) {
                return Err(NOT_INSTALLED.into());
            }
            let mut cmd = Command::new(python);
            cmd.arg(peers_src().join("python/harness.py"))
                .arg(lib.id())
                .arg(driver_url(url))
                .env("PYTHONDONTWRITEBYTECODE", "1");
            Ok(Launch::Process(cmd))
        }
        Library::Curator => {
            let classes = need(dir.join("curator"))?;
            need(classes.join("Harness.class"))?;
            let jar = need(PathBuf::from("/usr/share/java/curator-recipes.jar"))?;
            let java = on_path("java").ok_or_else(|| "no `java` on the PATH".to_string())?;
            let mut classpath = format!("{}:{}", classes.display(), jar.display());
            // Curator logs through SLF4J; without a binding it prints a warning per start.
            let nop = Path::new("/usr/share/java/slf4j-nop.jar");
            if nop.exists() {
                classpath.push_str(&format!(":{}", nop.display()));
            }
            let mut cmd = Command::new(java);
            cmd.arg("-cp")
                .arg(classpath)
                .arg("Harness")
                .arg(hosts(url, true));
            Ok(Launch::Process(cmd))
        }
        Library::RedisSemaphore => {
            let modules = need(dir.join("node/node_modules"))?;
            need(modules.join("redis-semaphore/package.json"))?;
            let node = on_path("node").ok_or_else(|| "no `node` on the PATH".to_string())?;
            let mut cmd = Command::new(node);
            cmd.arg(peers_src().join("node/harness.js"))
                .arg(driver_url(url))
                .env("NODE_PATH", modules);
            Ok(Launch::Process(cmd))
        }
        Library::EtcdGo => {
            let mut cmd = Command::new(need(dir.join("etcd-go/harness"))?);
            cmd.arg("-endpoints").arg(hosts(url, false));
            Ok(Launch::Process(cmd))
        }
    }
}

/// How to start `lib`'s harness process against its server, or why it cannot run here.
pub(crate) fn process(lib: Library) -> Result<Command, String> {
    match launch(lib, &peers_dir(), &lib.against().url())? {
        Launch::Process(cmd) => Ok(cmd),
        Launch::InProcess(_) => Err("runs in the bench process".into()),
    }
}

/// Whether a venv's `lib/python3.x/site-packages` holds `package`.
fn site_package(lib: &Path, package: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(lib) else {
        return false;
    };
    entries.flatten().any(|e| {
        e.path()
            .join("site-packages")
            .join(package)
            .join("__init__.py")
            .exists()
    })
}

fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// The URL without distlock's own query options, which other clients do not know.
fn driver_url(url: &str) -> &str {
    let url = url.trim();
    url.split('?').next().unwrap_or(url)
}

/// `scheme://h1:p1,h2:p2/path?opts` as `h1:p1,h2:p2`, with `/path` kept when `with_path`
/// (a ZooKeeper chroot, which Curator's connect string takes the same way).
fn hosts(url: &str, with_path: bool) -> String {
    let url = driver_url(url);
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    match rest.find('/') {
        Some(i) if !with_path || rest[i..].len() <= 1 => rest[..i].to_string(),
        _ => rest.to_string(),
    }
}

/// The installed version of a Debian package.
fn dpkg_version(pkg: &str) -> Option<String> {
    let out = std::process::Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", pkg])
        .output()
        .ok()?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !v.is_empty()).then_some(v)
}

/// rslock's version from the workspace's Cargo.lock: what this binary was built with.
fn rslock_version() -> String {
    let lock = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.lock");
    std::fs::read_to_string(lock)
        .ok()
        .and_then(|text| locked_version(&text, "rslock"))
        .unwrap_or_else(|| "0.10 (bench/Cargo.toml)".into())
}

/// The version of `package` in a Cargo.lock's text.
fn locked_version(lock: &str, package: &str) -> Option<String> {
    let wanted = format!("name = \"{package}\"");
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == wanted {
            let next = lines.next()?.trim();
            let v = next.strip_prefix("version = \"")?.strip_suffix('"')?;
            return Some(v.to_string());
        }
    }
    None
}

/// Runs every library in `wanted`, in report order.
pub(crate) async fn run(
    wanted: &[Library],
    plan: &Plan,
    progress: &Progress,
    backends: &[BackendResult],
    line: fn(&LibraryResult) -> String,
) -> Vec<LibraryResult> {
    let dir = peers_dir();
    let mut out = Vec::new();
    for &lib in Library::ALL
        .iter()
        .filter(|l| l.locks() && wanted.contains(l))
    {
        let result = run_one(lib, &dir, plan, progress, backends).await;
        progress.note(&line(&result));
        out.push(result);
    }
    out
}

async fn run_one(
    lib: Library,
    dir: &Path,
    plan: &Plan,
    progress: &Progress,
    backends: &[BackendResult],
) -> LibraryResult {
    let kind = lib.against();
    let mut result = LibraryResult {
        id: lib.id().into(),
        library: lib.name().into(),
        version: None,
        source: lib.source(),
        runtime: None,
        contenders: None,
        against: kind.id().into(),
        server: None,
        skipped: None,
        note: lib.note().into(),
        peer: LibraryMeasures::default(),
        distlock: LibraryMeasures::default(),
        errors: Vec::new(),
    };
    let url = kind.url();
    let launch = match launch(lib, dir, &url) {
        Ok(l) => l,
        Err(reason) => {
            result.skipped = Some(reason);
            progress.skip(STEPS);
            return result;
        }
    };
    progress.stage(lib.id(), "starting");
    let target = match targets::open(kind).await {
        Ok(t) => t,
        Err(e) => {
            result.skipped = Some(format!("the {} server did not answer: {e}", kind.label()));
            progress.skip(STEPS);
            return result;
        }
    };
    result.server = target.server_version().await.ok();
    let limit = scenarios::bound(plan);
    let started: Res<Box<dyn Driver>> = match launch {
        Launch::InProcess(url) => Ok(Box::new(rslock::Rslock::new(&url, rslock_version()))),
        Launch::Process(cmd) => Harness::start(cmd, limit)
            .await
            .map(|h| Box::new(h) as Box<dyn Driver>),
    };
    let mut driver = match started {
        Ok(d) => d,
        Err(e) => {
            fail(&mut result, "start", e);
            progress.skip(STEPS);
            return result;
        }
    };
    let hello = driver.hello();
    result.library = hello.library;
    result.version = Some(hello.version);
    result.runtime = Some(hello.runtime);
    result.contenders = Some(hello.contenders);

    let ours = backends.iter().find(|b| b.id == kind.id() && b.available());

    progress.stage(lib.id(), "uncontended cycle, alternating with distlock's");
    let cycled = async {
        let mut ours = LockCycle {
            lock: target.client().await?,
            name: unique_name("library-distlock-cycle"),
            opts: LockOptions::new().wait(ACQUIRE_WAIT),
        };
        cycles(&mut *driver, &mut ours, None, plan).await
    };
    match scenarios::bounded(limit, cycled).await {
        Ok((theirs, mine)) => {
            result.peer.cycles_per_sec = theirs.per_sec();
            result.peer.cycle = Some(theirs.latencies.summary());
            result.distlock.cycles_per_sec = mine.per_sec();
            result.distlock.cycle = Some(mine.latencies.summary());
        }
        Err(e) => fail(&mut result, "cycle", e),
    }
    progress.step();

    progress.stage(lib.id(), &format!("one hot lock, {CONTENDERS} contenders"));
    let name = unique_name(&format!("library-{}-hot", lib.id()));
    match scenarios::bounded(limit, driver.hot(&name, CONTENDERS, plan.hot_for)).await {
        Ok(record) => result.peer.hot = Some(record.summary()),
        Err(e) => fail(&mut result, "hot", e),
    }
    // distlock's own level from this run's section 4 when it ran, else measured now.
    result.distlock.hot = match ours.and_then(|b| b.hot.iter().find(|h| h.clients == CONTENDERS)) {
        Some(h) => Some(h.clone()),
        None => match scenarios::hot_level(&*target, plan, CONTENDERS).await {
            Ok(h) => Some(h),
            Err(e) => {
                fail(&mut result, &format!("distlock-{} hot", kind.id()), e);
                None
            }
        },
    };
    progress.step();

    progress.stage(lib.id(), "wake-up");
    let prefix = unique_name(&format!("library-{}-wake", lib.id()));
    match scenarios::bounded(
        limit,
        driver.wake(&prefix, plan.wake_samples, plan.wake_delay),
    )
    .await
    {
        Ok(rec) => result.peer.wake = Some(rec.summary()),
        Err(e) => fail(&mut result, "wake", e),
    }
    result.distlock.wake = match ours.and_then(|b| b.wake.as_ref()) {
        Some(w) => Some(w.latency),
        None => match scenarios::wake_latency(&*target, plan).await {
            Ok(w) => Some(w),
            Err(e) => {
                fail(&mut result, &format!("distlock-{} wake", kind.id()), e);
                None
            }
        },
    };
    progress.step();

    driver.close().await;
    if let Err(e) = target.cleanup().await {
        progress.note(&format!("{}: cleanup failed: {e}", kind.id()));
    }
    result
}

fn fail(result: &mut LibraryResult, what: &str, e: crate::error::BoxError) {
    result.errors.push(ScenarioError {
        scenario: what.into(),
        error: e.to_string(),
    });
}

/// The peer's cycle and distlock's `ours` on the same server, in alternating slices after a
/// warm-up (four times the plan's for the peer: a JVM compiles its hot paths in that time). The
/// peer's lock cycle, or with `permits` its permit cycle on a semaphore of that many.
pub(crate) async fn cycles(
    driver: &mut dyn Driver,
    ours: &mut dyn Cycle,
    permits: Option<u32>,
    plan: &Plan,
) -> Res<(Measured, Measured)> {
    let peer_name = unique_name("library-peer-cycle");
    let mut theirs = Measured {
        latencies: Recorder::new(),
        busy: Duration::ZERO,
    };
    let mut mine = Measured {
        latencies: Recorder::new(),
        busy: Duration::ZERO,
    };
    let mut peer = async |run: Duration| match permits {
        None => driver.cycle(&peer_name, run).await,
        Some(max) => driver.permit(&peer_name, max, run).await,
    };
    peer(plan.warmup * 4).await?;
    run_for(ours, plan.warmup, None).await?;
    for _ in 0..plan.slices {
        let slice = peer(plan.slice).await?;
        theirs.latencies.merge(&slice.latencies);
        theirs.busy += slice.busy;
        mine.busy += run_for(ours, plan.slice, Some(&mut mine.latencies)).await?;
    }
    Ok((theirs, mine))
}

#[cfg(test)]
mod tests;
