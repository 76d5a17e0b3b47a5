//! For tests that run servers of their own: signalling a process, free loopback ports, and
//! watching a guard's lost signal while the server misbehaves.

use std::net::TcpListener;
use std::ops::Range;
use std::process::Command;
use std::time::Instant;

use distlock_api::{LockGuard, LostReason};
use tokio::task::JoinHandle;

use crate::case::unique_suffix;

/// Sends `signal` (`STOP`, `CONT`, `KILL`, …) to process `pid` with kill(1); panics if it
/// cannot be delivered.
pub fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill(1)");
    assert!(status.success(), "kill -{signal} {pid} failed: {status}");
}

/// The ports of `range` that nothing listens on at the moment each is offered, starting at a
/// random one so that concurrent tests spread out. Another process may still take a port
/// between the check and a server's bind: callers start their server and move on to the next
/// port if it lost the race.
pub fn free_ports(range: Range<u16>) -> impl Iterator<Item = u16> {
    let len = range.len().max(1) as u32;
    let first = unique_suffix() % len;
    (0..len)
        .map(move |i| range.start + ((first + i) % len) as u16)
        .filter(|&port| TcpListener::bind(("127.0.0.1", port)).is_ok())
}

/// When `guard`'s `lost()` resolves, and why: a task that can be awaited (or checked with
/// `is_finished`) after the guard itself is gone. Must be called inside a Tokio runtime.
pub fn watch_lost(guard: &LockGuard) -> JoinHandle<(Instant, LostReason)> {
    let lost = guard.lost();
    tokio::spawn(async move {
        let reason = lost.await;
        (Instant::now(), reason)
    })
}
