//! Talking to the Redis members of a Sentinel topology or a Redis Cluster: `redis-cli` against
//! one server or sentinel, and asking again until the answer says what a step waits for.

use std::process::Stdio;
use std::time::{Duration, Instant};

/// `redis-cli` against `host:port`: its output, or why not (2 s at most).
pub(super) async fn cli(host: &str, port: u16, args: &[&str]) -> Result<String, String> {
    let out = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::process::Command::new("redis-cli")
            .args(["-h", host, "-p", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| format!("redis-cli {host}:{port} {args:?}: no answer in 2 s"))?
    .map_err(|e| format!("cannot run redis-cli: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `redis-cli` against `host:port` for a command that answers `OK`; anything else is an error.
pub(super) async fn cli_ok(host: &str, port: u16, args: &[&str]) -> Result<(), String> {
    let got = cli(host, port, args).await?;
    if got == "OK" {
        Ok(())
    } else {
        Err(format!("{} on {host}:{port}: {got}", args.join(" ")))
    }
}

/// Asks `probe` every 50 ms until it answers `Some`, for at most `bound`; the error says what
/// did not happen and the probe's last answer (`probe` returns it as `Err`).
pub(super) async fn poll<T>(
    bound: Duration,
    what: &str,
    mut probe: impl AsyncFnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + bound;
    loop {
        match probe().await {
            Ok(got) => return Ok(got),
            Err(last) if Instant::now() > deadline => {
                return Err(format!("{what} within {bound:?} (last: {last})"))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// The value of `field` in an `INFO` or `CLUSTER INFO` answer (`field:value` lines).
pub(super) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
}
