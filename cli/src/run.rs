//! `distlock run` and `distlock elect`: a command run while holding a lock, a permit, or an
//! election's leadership, stopped when it is lost.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Arc;
use std::task::Poll;

use distlock::{
    DistributedLock, FencingToken, Leadership, LockExt, LockGuard, LockOptions, LostReason, Result,
};
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::{code, fail, report, Exit, RunArgs};

/// What the command runs under.
enum Held {
    Lock(LockGuard),
    Lead(Leadership),
}

impl Held {
    fn token(&self) -> FencingToken {
        match self {
            Held::Lock(g) => g.token(),
            Held::Lead(l) => l.epoch(),
        }
    }

    fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        match self {
            Held::Lock(g) => g.lost(),
            Held::Lead(l) => l.guard().lost(),
        }
    }

    async fn release(self) -> Result<bool> {
        match self {
            Held::Lock(g) => g.release().await,
            Held::Lead(l) => l.resign().await,
        }
    }
}

/// The signals `distlock run` passes on to the command, with their numbers on Linux.
pub(crate) const FORWARDED: [(&str, i32); 6] = [
    ("HUP", 1),
    ("INT", 2),
    ("QUIT", 3),
    ("USR1", 10),
    ("USR2", 12),
    ("TERM", 15),
];

/// Runs the command of `args` under a lock or permit, or, with `value`, while leading the
/// election of `args.name` with that value.
pub(crate) async fn run(
    locks: &Arc<dyn DistributedLock>,
    args: RunArgs,
    value: Option<&str>,
    json: bool,
) -> Exit {
    // Listen before acquiring, so that a signal while waiting ends the wait instead of
    // killing distlock with the lock half taken.
    let mut signals = Vec::new();
    for (label, number) in FORWARDED {
        match signal(SignalKind::from_raw(number)) {
            Ok(s) => signals.push((label, number, s)),
            Err(e) => {
                eprintln!("distlock: cannot listen for SIG{label}: {e}");
                return Exit(code::FAILED);
            }
        }
    }
    let mut options = LockOptions::new();
    if let Some(ttl) = args.ttl {
        options = options.watchdog_ttl(ttl);
    }
    let options = options.wait(args.wait.unwrap_or(distlock::MAX_WAIT));
    let acquired = match value {
        None => lock(locks, &args, &options, &mut signals).await,
        Some(value) => lead(locks, &args, value, &options, &mut signals).await,
    };
    let guard = match acquired {
        Ok(Ok(held)) => held,
        Ok(Err(())) => {
            report(
                json,
                serde_json::json!({"event": "not-acquired", "name": args.name}),
                &format!("distlock: {} is held by someone else", args.name),
            );
            return Exit(code::NOT_ACQUIRED);
        }
        Err(exit) => return exit(json),
    };
    let token = guard.token();
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let mut child = match tokio::process::Command::new(program)
        .args(rest)
        .env("DISTLOCK_NAME", &args.name)
        .env("DISTLOCK_TOKEN", token.to_string())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            let status = if e.kind() == std::io::ErrorKind::NotFound {
                code::NOT_FOUND
            } else {
                code::CANNOT_RUN
            };
            eprintln!("distlock: cannot run {}: {e}", program.to_string_lossy());
            let _ = guard.release().await;
            return Exit(status);
        }
    };
    let pid = child.id().unwrap_or(0);
    let lost = guard.lost();
    tokio::pin!(lost);
    let status = loop {
        tokio::select! {
            biased;
            status = child.wait() => break status,
            (label, _) = next_signal(&mut signals) => send(pid, label).await,
            reason = &mut lost => {
                report(
                    json,
                    serde_json::json!({"event": "lost", "name": args.name, "token": token.0, "reason": reason.to_string()}),
                    &format!("distlock: lost {} ({reason}); stopping the command", args.name),
                );
                send(pid, "TERM").await;
                if tokio::time::timeout(args.grace, child.wait()).await.is_err() {
                    send(pid, "KILL").await;
                    let _ = child.wait().await;
                }
                return Exit(code::LOST);
            }
        }
    };
    // The command ended while the lock was held: give it back and pass the command's status on.
    if let Err(e) = guard.release().await {
        eprintln!(
            "distlock: releasing {}: {e} (its lease runs out by itself)",
            args.name
        );
    }
    match status {
        Ok(s) => Exit(exit_code(s)),
        Err(e) => {
            eprintln!("distlock: waiting for the command: {e}");
            Exit(code::FAILED)
        }
    }
}

/// How an acquire that did not get as far as running the command ends.
type NotRun = Box<dyn FnOnce(bool) -> Exit + Send>;

fn failed(e: distlock::Error) -> NotRun {
    Box::new(move |json| fail(&e, json))
}

fn signalled(name: &str, label: &str, number: i32) -> NotRun {
    eprintln!("distlock: SIG{label} while waiting for {name}; not running the command");
    Box::new(move |_| Exit(128 + number as u8))
}

/// Takes the lock (or a permit): `Err(())` inside if it is held and `--no-wait` was given.
async fn lock(
    locks: &Arc<dyn DistributedLock>,
    args: &RunArgs,
    options: &LockOptions,
    signals: &mut [(&'static str, i32, Signal)],
) -> std::result::Result<std::result::Result<Held, ()>, NotRun> {
    if args.no_wait {
        return match locks.try_permit(&args.name, args.permits, options).await {
            Ok(got) => Ok(got.map(Held::Lock).ok_or(())),
            Err(e) => Err(failed(e)),
        };
    }
    tokio::select! {
        got = locks.permit(&args.name, args.permits, options) => got.map(|g| Ok(Held::Lock(g))).map_err(failed),
        (label, number) = next_signal(signals) => Err(signalled(&args.name, label, number)),
    }
}

/// Campaigns in the election `args.name` with `value`: `Err(())` inside if someone leads and
/// `--no-wait` was given.
async fn lead(
    locks: &Arc<dyn DistributedLock>,
    args: &RunArgs,
    value: &str,
    options: &LockOptions,
    signals: &mut [(&'static str, i32, Signal)],
) -> std::result::Result<std::result::Result<Held, ()>, NotRun> {
    let election = locks.election(&args.name).map_err(failed)?;
    if args.no_wait {
        return match election.try_campaign(value, options).await {
            Ok(got) => Ok(got.map(Held::Lead).ok_or(())),
            Err(e) => Err(failed(e)),
        };
    }
    tokio::select! {
        got = election.campaign(value, options) => got.map(|l| Ok(Held::Lead(l))).map_err(failed),
        (label, number) = next_signal(signals) => Err(signalled(&args.name, label, number)),
    }
}

/// The next forwarded signal's name and number.
async fn next_signal(signals: &mut [(&'static str, i32, Signal)]) -> (&'static str, i32) {
    std::future::poll_fn(|cx| {
        for (label, number, s) in signals.iter_mut() {
            if s.poll_recv(cx).is_ready() {
                return Poll::Ready((*label, *number));
            }
        }
        Poll::Pending
    })
    .await
}

/// Sends SIG`label` to `pid` with kill(1) (the workspace forbids `unsafe`, so no libc::kill).
async fn send(pid: u32, label: &str) {
    if pid == 0 {
        return;
    }
    let _ = tokio::process::Command::new("kill")
        .args(["-s", label, &pid.to_string()])
        .status()
        .await;
}

/// The command's status as an exit code: its own code, or 128+N if signal N ended it.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(sig)) => 128u8.saturating_add(sig as u8),
        (None, None) => code::FAILED,
    }
}
