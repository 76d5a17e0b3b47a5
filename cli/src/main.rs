//! `distlock`: run a command while holding a distributed lock, like `flock(1)` across machines,
//! and see who holds a lock. Every backend of the `distlock` facade, picked by URL.
//!
//! ```text
//! distlock --url redis://127.0.0.1:6379 run --name nightly-report --wait 30s -- ./report.sh
//! distlock --url redis://127.0.0.1:6379 holder nightly-report --json
//! distlock --url redis://127.0.0.1:6379 list nightly-
//! distlock --url redis://127.0.0.1:6379 release --force nightly-report
//! distlock --url redis://127.0.0.1:6379 elect --name scheduler --value "$(hostname)" -- ./scheduler
//! distlock --url redis://127.0.0.1:6379 leader scheduler --watch
//! ```
//!
//! Exit codes of `run` and `elect` (the table is in [`code`]): the command's own status when it ran (128+N
//! when signal N killed it), 124 when the lock was not acquired within `--wait`, 123 when the
//! lock was lost while the command ran (the command got SIGTERM, then SIGKILL after `--grace`),
//! 69 when the server was unavailable, 64 for bad arguments, 125 for any other failure of
//! `distlock` itself, 126/127 when the command could not be run / was not found.

mod run;

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use clap::{Args, Parser, Subcommand};
use distlock::config::parse_duration;
use distlock::{DistributedLock, Error, ErrorKind, Leader, LockExt, LockInfo};

/// The exit codes, following `timeout(1)` and `sysexits.h` where they have one.
pub mod code {
    /// Bad arguments: an unknown option, a malformed URL, name or duration (`EX_USAGE`).
    pub const USAGE: u8 = 64;
    /// The server could not be reached within the connect timeout (`EX_UNAVAILABLE`).
    pub const UNAVAILABLE: u8 = 69;
    /// The lock was lost while the command ran; the command was terminated.
    pub const LOST: u8 = 123;
    /// The lock was not acquired within `--wait` (or was held, with `--no-wait`), as
    /// `timeout(1)` exits 124 when the time ran out.
    pub const NOT_ACQUIRED: u8 = 124;
    /// Any other failure of `distlock` itself (a backend error).
    pub const FAILED: u8 = 125;
    /// The command was found but could not be run.
    pub const CANNOT_RUN: u8 = 126;
    /// The command was not found.
    pub const NOT_FOUND: u8 = 127;
    /// `holder`, `leader`: nobody holds the lock, nobody leads. `release --force`: nothing was released (the lock
    /// was free, or is held under another token than the one given).
    pub const FREE: u8 = 1;
}

#[derive(Parser)]
#[command(
    name = "distlock",
    version,
    about = "Run a command while holding a distributed lock"
)]
struct Cli {
    /// The lock server: redis://, redlock://, mysql://, mariadb://, mongodb://, zk://, etcd://
    /// (see the distlock crate's `connect`).
    #[arg(long, env = "DISTLOCK_URL", global = true)]
    url: Option<String>,
    /// Machine-readable output: one JSON object per report.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs a command while holding the lock; the lock is renewed while it runs and released
    /// when it exits. The command gets DISTLOCK_NAME and DISTLOCK_TOKEN (the fencing token).
    Run(RunArgs),
    /// Runs a command while leading the election NAME with VALUE: campaigns (waiting as
    /// `run` waits for a lock), proclaims VALUE, runs the command with DISTLOCK_NAME and
    /// DISTLOCK_TOKEN (the epoch), stops it if leadership is lost and resigns when it exits.
    Elect {
        /// What the leader proclaims (an address, say): what `leader` shows.
        #[arg(long)]
        value: String,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Shows who leads the election NAME: owner, epoch, value. Exits 1 when nobody leads.
    Leader {
        /// The election's name.
        name: String,
        /// Keep watching: one line per change (a takeover, a new value, a vacancy) until
        /// interrupted.
        #[arg(long)]
        watch: bool,
    },
    /// Shows who holds a lock: owner, hold count, fencing token, lease left. Exits 1 when
    /// nobody holds it.
    Holder {
        /// The lock name.
        name: String,
    },
    /// Lists the held locks whose names start with PREFIX (every one without it), with what
    /// `holder` shows of each.
    List {
        /// The start of the names to list.
        prefix: Option<String>,
    },
    /// For an operator: frees a lock whatever its holder, but only the grant it shows (or the
    /// one `--token` names), so a lock that changed hands meanwhile is left alone. The
    /// holder's guard learns of it at its next renewal. Exits 1 when nothing was released.
    Release {
        /// Required: a release by anyone but the holder is forced.
        #[arg(long)]
        force: bool,
        /// Release only the grant with this fencing token (as `holder` showed it).
        #[arg(long)]
        token: Option<u64>,
        /// The lock name.
        name: String,
    },
}

#[derive(Args)]
struct RunArgs {
    /// The lock name.
    #[arg(long, short)]
    name: String,
    /// How long to wait for the lock (e.g. 30s, 500ms, 2m); by default as long as it takes.
    #[arg(long, short, value_parser = duration, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Try once: exit 124 at once if someone else holds the lock.
    #[arg(long, short = 'N')]
    no_wait: bool,
    /// Take one permit of a semaphore of this many (up to 10000): up to this many commands
    /// run at once under the name. 1 (the default) is the lock.
    #[arg(long, default_value_t = 1)]
    permits: u32,
    /// The lease, renewed every third of it while the command runs (the client's default
    /// otherwise). A holder that stops (a paused machine) loses the lock after this long.
    #[arg(long, value_parser = duration)]
    ttl: Option<Duration>,
    /// How long a command whose lock was lost has between SIGTERM and SIGKILL.
    #[arg(long, value_parser = duration, default_value = "10s")]
    grace: Duration,
    /// The command and its arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    command: Vec<OsString>,
}

fn duration(text: &str) -> Result<Duration, String> {
    parse_duration(text).ok_or_else(|| {
        format!("{text:?} is not a duration: a number with ms, s, m or h (e.g. 500ms, 30s)")
    })
}

/// How `distlock` ends: with a status, after saying why on stderr.
struct Exit(u8);

fn fail(e: &Error, json: bool) -> Exit {
    let status = match e.kind() {
        ErrorKind::InvalidArgument | ErrorKind::Unsupported => code::USAGE,
        ErrorKind::Unavailable => code::UNAVAILABLE,
        ErrorKind::Timeout => code::NOT_ACQUIRED,
        ErrorKind::Lost => code::LOST,
        _ => code::FAILED,
    };
    report(
        json,
        serde_json::json!({"event": "error", "kind": e.kind().to_string(), "message": e.to_string()}),
        &format!("distlock: {e}"),
    );
    Exit(status)
}

/// One report on stderr: the JSON object with `--json`, the text otherwise.
fn report(json: bool, object: serde_json::Value, text: &str) {
    if json {
        eprintln!("{object}");
    } else {
        eprintln!("{text}");
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { code::USAGE } else { 0 });
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("distlock: cannot start the async runtime: {e}");
            return ExitCode::from(code::FAILED);
        }
    };
    let Exit(status) = runtime.block_on(main_async(cli));
    // The lock's background tasks (renewals, a give-back in flight) end with the runtime.
    runtime.shutdown_timeout(Duration::from_secs(2));
    ExitCode::from(status)
}

async fn main_async(cli: Cli) -> Exit {
    let Some(url) = cli.url.as_deref() else {
        eprintln!("distlock: no lock server: pass --url or set DISTLOCK_URL (e.g. redis://127.0.0.1:6379)");
        return Exit(code::USAGE);
    };
    // Arguments are checked before any I/O.
    let name = match &cli.command {
        Command::Run(args) | Command::Elect { run: args, .. } => Some(&args.name),
        Command::Holder { name } | Command::Leader { name, .. } => Some(name),
        Command::Release { force: false, .. } => {
            eprintln!(
                "distlock: release takes --force: a lock is released by its holder (`distlock \
                 run` releases when its command exits); --force frees it for an operator"
            );
            return Exit(code::USAGE);
        }
        Command::Release { name, .. } => Some(name),
        Command::List { .. } => None,
    };
    if let Some(Err(e)) = name.map(distlock::LockName::new) {
        return fail(&e, cli.json);
    }
    if let Command::Elect { value, run } = &cli.command {
        if run.permits != 1 {
            eprintln!("distlock: elect takes no --permits: an election has one leader");
            return Exit(code::USAGE);
        }
        if value.len() > distlock::MAX_VALUE_LEN {
            let e = Error::invalid(format!(
                "the value is {} bytes; a leader's value is at most {}",
                value.len(),
                distlock::MAX_VALUE_LEN
            ));
            return fail(&e, cli.json);
        }
    }
    let locks = match distlock::connect(url).await {
        Ok(l) => l,
        Err(e) => return fail(&e, cli.json),
    };
    match cli.command {
        Command::Run(args) => run::run(&locks, args, None, cli.json).await,
        Command::Elect { value, run } => run::run(&locks, run, Some(&value), cli.json).await,
        Command::Leader { name, watch } => leader(&locks, &name, watch, cli.json).await,
        Command::Holder { name } => holder(&locks, &name, cli.json).await,
        Command::List { prefix } => list(&locks, prefix.as_deref().unwrap_or(""), cli.json).await,
        Command::Release { name, token, .. } => force_release(&locks, &name, token, cli.json).await,
    }
}

async fn holder(locks: &Arc<dyn DistributedLock>, name: &str, json: bool) -> Exit {
    let info = match locks.holder(name).await {
        Ok(info) => info,
        Err(e) => return fail(&e, json),
    };
    if json {
        println!("{}", holder_json(name, info.as_ref()));
    } else {
        match &info {
            None => println!("{name}: free"),
            Some(i) => println!("{}", holder_text(name, i)),
        }
    }
    Exit(if info.is_some() { 0 } else { code::FREE })
}

async fn list(locks: &Arc<dyn DistributedLock>, prefix: &str, json: bool) -> Exit {
    let held = match locks.list(prefix).await {
        Ok(held) => held,
        Err(e) => return fail(&e, json),
    };
    if json {
        let all: Vec<_> = held
            .iter()
            .map(|(name, info)| holder_json(name.as_str(), Some(info)))
            .collect();
        println!("{}", serde_json::Value::Array(all));
    } else if held.is_empty() {
        println!("no locks held under {prefix:?}");
    } else {
        for (name, info) in &held {
            println!("{}", holder_text(name.as_str(), info));
        }
    }
    Exit(0)
}

async fn force_release(
    locks: &Arc<dyn DistributedLock>,
    name: &str,
    token: Option<u64>,
    json: bool,
) -> Exit {
    let info = match locks.holder(name).await {
        Ok(info) => info,
        Err(e) => return fail(&e, json),
    };
    let Some(info) = info else {
        report(
            json,
            serde_json::json!({"name": name, "released": false, "why": "free"}),
            &format!("distlock: {name} is free: nothing to release"),
        );
        return Exit(code::FREE);
    };
    // The grant the operator saw: a lock that changed hands since is not freed.
    let token = token.map_or(info.token, distlock::FencingToken);
    match locks.force_release(name, token).await {
        Ok(true) => {
            if json {
                let mut object = holder_json(name, Some(&info));
                object["released"] = true.into();
                println!("{object}");
            } else {
                println!("released {}", holder_text(name, &info));
            }
            Exit(0)
        }
        Ok(false) => {
            report(
                json,
                serde_json::json!({"name": name, "released": false, "why": "not held with that token", "token": token.0}),
                &format!(
                    "distlock: {name} is not held with fencing token {token} (it changed hands): \
                     nothing released"
                ),
            );
            Exit(code::FREE)
        }
        Err(e) => fail(&e, json),
    }
}

async fn leader(locks: &Arc<dyn DistributedLock>, name: &str, watch: bool, json: bool) -> Exit {
    let election = match locks.election(name) {
        Ok(e) => e,
        Err(e) => return fail(&e, json),
    };
    if !watch {
        return match election.leader().await {
            Ok(now) => {
                println!("{}", leader_line(name, now.as_ref(), json));
                Exit(if now.is_some() { 0 } else { code::FREE })
            }
            Err(e) => fail(&e, json),
        };
    }
    let mut observer = election.observe();
    loop {
        tokio::select! {
            next = observer.next() => match next {
                Ok(now) => println!("{}", leader_line(name, now.as_ref(), json)),
                // The observer subscribes and reads again at its next call.
                Err(e) => report(
                    json,
                    serde_json::json!({"event": "error", "kind": e.kind().to_string(), "message": e.to_string()}),
                    &format!("distlock: {e}; watching again"),
                ),
            },
            _ = tokio::signal::ctrl_c() => return Exit(0),
        }
    }
}

fn leader_line(name: &str, leader: Option<&Leader>, json: bool) -> String {
    match (leader, json) {
        (None, false) => format!("{name}: nobody leads"),
        (None, true) => serde_json::json!({"name": name, "led": false}).to_string(),
        (Some(l), false) => format!(
            "{name}: led by {}, epoch {}, value {}{}",
            l.owner,
            l.epoch,
            l.value
                .as_deref()
                .map_or("(none yet)".to_string(), |v| format!("{v:?}")),
            l.since
                .map_or(String::new(), |t| format!(", since {}", rfc3339(t)))
        ),
        (Some(l), true) => serde_json::json!({
            "name": name,
            "led": true,
            "owner": l.owner.to_string(),
            "epoch": l.epoch.0,
            "value": l.value,
            "since": l.since.map(rfc3339),
        })
        .to_string(),
    }
}

fn holder_text(name: &str, i: &LockInfo) -> String {
    let lease = match i.remaining {
        Some(d) => format!("{:.1}s left", d.as_secs_f64()),
        None => "kept by the holder's session".to_string(),
    };
    let since = match i.since {
        Some(t) => format!(", since {}", rfc3339(t)),
        None => String::new(),
    };
    let permits = match i.permits {
        (_, 1) => String::new(),
        (held, max) => format!(" ({held} of {max} permits held; the oldest shown)"),
    };
    format!(
        "{name}: held by {}{permits}\n  hold count {}, fencing token {}, lease {lease}{since}",
        i.owner, i.hold_count, i.token
    )
}

fn holder_json(name: &str, info: Option<&LockInfo>) -> serde_json::Value {
    match info {
        None => serde_json::json!({"name": name, "held": false}),
        Some(i) => serde_json::json!({
            "name": name,
            "held": true,
            "owner": i.owner.to_string(),
            "hold_count": i.hold_count,
            "token": i.token.0,
            "remaining_ms": i.remaining.map(|d| d.as_millis() as u64),
            "since": i.since.map(rfc3339),
            "since_unix_ms": i.since.and_then(unix_ms),
            "permits_held": i.permits.0,
            "permits": i.permits.1,
        }),
    }
}

fn unix_ms(t: SystemTime) -> Option<u64> {
    let ms = t.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_millis();
    u64::try_from(ms).ok()
}

/// `t` as an RFC 3339 UTC timestamp to the millisecond (`2026-11-25T06:10:03.123Z`).
fn rfc3339(t: SystemTime) -> String {
    let ms = unix_ms(t).unwrap_or(0);
    let (days, ms_of_day) = (ms / 86_400_000, ms % 86_400_000);
    // Days since 1970-01-01 to a civil date (proleptic Gregorian), by 400-year eras.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let s = ms_of_day / 1000;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        s / 3600,
        s / 60 % 60,
        s % 60,
        ms_of_day % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_utc_to_the_millisecond() {
        let at = |ms: u64| rfc3339(SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(at(1_795_586_462_215), "2026-11-25T06:01:02.215Z");
        assert_eq!(at(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }
}
