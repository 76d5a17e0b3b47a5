//! A member's wall clock under libfaketime: the server starts with `LD_PRELOAD` of the library
//! and a timestamp file the nemesis rewrites while it runs (`FAKETIME_NO_CACHE`: the library
//! reads the file at every clock call, so a step shows at the server's next one). Only the
//! realtime clock moves (`FAKETIME_DONT_FAKE_MONOTONIC`): the server's own timers and timeouts
//! keep their monotonic clock, as they would through an NTP step.
//!
//! Not every server can be run so: Debian's redis-server allocates with jemalloc, which reads
//! the clock before libfaketime is initialised, and hangs (libfaketime issue #130); Go (etcd)
//! reads the clock through the vDSO, past libc. The matrix says so in those cells.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{Deployment, Kind};

/// Where Debian's libfaketime package puts the library, under `/usr/lib/<multiarch>/`: its
/// thread-safe build. With `FAKETIME_NO_CACHE` the plain one parses the timestamp file into
/// shared state at every call, and threads calling at once read the real clock now and then: a
/// C probe of 8 threads saw 15–44 reads in 400k off by the whole 3 s step, none with this one.
/// In mongod, whose `$$NOW` comes from such threads, that ended leases right after their grant
/// (clock-step-back × mongo flagged 3 runs of 8).
const LIB: &str = "faketime/libfaketimeMT.so.1";

/// The library's path on this machine.
fn library() -> Result<PathBuf, String> {
    let found = std::fs::read_dir("/usr/lib")
        .map_err(|e| format!("/usr/lib: {e}"))?
        .flatten()
        .map(|e| e.path().join(LIB))
        .find(|p| p.is_file());
    found.ok_or_else(|| {
        format!("no /usr/lib/*/{LIB}: scripts/services tools installs libfaketime (faketime)")
    })
}

/// The timestamp file of a deployment under `dir`.
pub(super) fn file(dir: &Path) -> PathBuf {
    dir.join("faketime")
}

/// Writes `spec` (libfaketime's syntax: `+0`, `+3`, `-3`, `+0.004 x1.003`) to `path` at once:
/// through a rename, so that the server never reads half a line.
pub(super) fn write(path: &Path, spec: &str) -> Result<(), String> {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, format!("{spec}\n")).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The words that run a server under the faked clock of `path`: `env` with libfaketime's
/// settings, put right before the server's program. Not on `ip netns exec`: the first
/// preloaded process creates libfaketime's shared memory for those it starts, and PostgreSQL,
/// which drops to its own user, could not open root's.
pub(super) fn env_args(path: &Path) -> Result<Vec<OsString>, String> {
    let mut preload = OsString::from("LD_PRELOAD=");
    preload.push(library()?);
    let mut file = OsString::from("FAKETIME_TIMESTAMP_FILE=");
    file.push(path);
    Ok(vec![
        "env".into(),
        preload,
        file,
        "FAKETIME_NO_CACHE=1".into(),
        "FAKETIME_DONT_FAKE_MONOTONIC=1".into(),
    ])
}

/// Removes the shared memory libfaketime made for the server of process `pid` (`env` creates
/// it and then becomes the server, which never removes it).
pub(super) fn forget(pid: u32) {
    for name in [
        format!("/dev/shm/faketime_shm_{pid}"),
        format!("/dev/shm/sem.faketime_sem_{pid}"),
    ] {
        let _ = std::fs::remove_file(name);
    }
}

fn unix_us(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

impl Deployment {
    /// Sets member 0's clock to `spec` (see [`write()`]); an error if the server was not
    /// started under a faked clock.
    pub(crate) fn set_clock(&self, spec: &str) -> Result<(), String> {
        let path = self
            .clock
            .as_deref()
            .ok_or("the server was not started under libfaketime")?;
        write(path, spec)
    }

    /// How far member 0's wall clock is ahead of this host's, in ms, as the server itself
    /// reads it (the host's clock taken halfway through the query).
    pub(crate) async fn clock_offset_ms(&self) -> Result<f64, String> {
        let url = self.member_url(0);
        let before = SystemTime::now();
        let server_us =
            tokio::time::timeout(Duration::from_secs(3), server_now_us(self.kind, &url))
                .await
                .map_err(|_| "the server did not tell its time within 3 s".to_string())??;
        let after = SystemTime::now();
        let host_us = (unix_us(before) + unix_us(after)) / 2;
        Ok((server_us - host_us) as f64 / 1000.0)
    }
}

/// The server's wall clock, in µs since the epoch, read the way its backend reads it.
async fn server_now_us(kind: Kind, url: &str) -> Result<i64, String> {
    match kind {
        Kind::Mariadb => {
            use distlock_mysql::sqlx::{self, Connection};
            let mut c = sqlx::mysql::MySqlConnection::connect(url)
                .await
                .map_err(|e| e.to_string())?;
            sqlx::query_scalar::<_, i64>("SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)")
                .fetch_one(&mut c)
                .await
                .map_err(|e| e.to_string())
        }
        Kind::Postgres => {
            use distlock_postgres::sqlx::{self, Connection};
            let mut c = sqlx::postgres::PgConnection::connect(url)
                .await
                .map_err(|e| e.to_string())?;
            sqlx::query_scalar::<_, i64>(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
            )
            .fetch_one(&mut c)
            .await
            .map_err(|e| e.to_string())
        }
        Kind::Mongo => {
            use distlock_mongo::mongodb::{bson::doc, Client};
            let client = Client::with_uri_str(url).await.map_err(|e| e.to_string())?;
            let hello = client
                .database("admin")
                .run_command(doc! { "hello": 1 })
                .await
                .map_err(|e| e.to_string())?;
            let at = hello
                .get_datetime("localTime")
                .map_err(|e| format!("hello has no localTime: {e}"))?;
            Ok(at.timestamp_millis() * 1000)
        }
        other => Err(format!("no clock query for {other:?}")),
    }
}
