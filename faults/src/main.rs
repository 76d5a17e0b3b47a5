//! `distlock-faults`: the fault campaign. The parent process is the runner, the nemesis, the
//! shared resource and the checker; it starts client processes of this same binary
//! (`distlock-faults client <config>`) that contend for locks over loopback, faults them or
//! their servers, and checks the merged history; `scripts/faults` writes `faults/report.md`.
//!
//! ```text
//! distlock-faults [--quick] [--backend redis,etcd] [--scenario baseline,holder-kill]
//!                 [--runs N] [--out DIR] [--skip mongo]
//! distlock-faults --soak 30m [--backend redis,etcd] [--out DIR] [--skip mongo]
//! ```

mod campaign;
mod checker;
mod client;
mod clock;
mod history;
mod matrix;
mod resource;
mod run;
mod servers;
mod soak;

use std::process::ExitCode;

/// Sends `signal` (`STOP`, `CONT`, `KILL`) to `pid` with kill(1): the crate forbids `unsafe`,
/// so no `libc::kill`.
pub(crate) fn signal(pid: u32, signal: &str) -> Result<(), String> {
    kill(signal, &pid.to_string())
}

/// Sends `signal` to the process group `pgid` leads, the same way.
pub(crate) fn signal_group(pgid: u32, signal: &str) -> Result<(), String> {
    kill(signal, &format!("-{pgid}"))
}

fn kill(signal: &str, target: &str) -> Result<(), String> {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), "--", target])
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("cannot run kill(1): {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -{signal} -- {target} failed ({status})"))
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.first().map(String::as_str) == Some("client") {
        let Some(config) = args
            .get(1)
            .and_then(|json| serde_json::from_str::<client::ClientConfig>(json).ok())
        else {
            eprintln!("usage: distlock-faults client <config as JSON>");
            return ExitCode::from(2);
        };
        return match runtime.block_on(client::run(config)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        };
    }
    let options = match campaign::Options::parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}\n\n{}", campaign::usage());
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(campaign::run(options)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
