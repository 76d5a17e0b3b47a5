//! The network tools a deployment runs: ip(8) for its namespaces, bridge and addresses,
//! nft(8) for the tables that cut a member off (or one direction of a client's link).

use std::io::Write;
use std::process::{Command, Stdio};

/// Runs `ip` with `args`; the error has its stderr.
pub(super) fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ip(8): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `nft -f -` with `script` inside namespace `ns`.
pub(super) fn nft(ns: &str, script: &str) -> Result<(), String> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, "nft", "-f", "-"]);
    nft_run(cmd, &format!("in {ns}"), script)
}

/// Runs `nft -f -` with `script` in the runner's own namespace, where the client processes are.
pub(super) fn nft_host(script: &str) -> Result<(), String> {
    let mut cmd = Command::new("nft");
    cmd.args(["-f", "-"]);
    nft_run(cmd, "in the root namespace", script)
}

fn nft_run(mut cmd: Command, place: &str, script: &str) -> Result<(), String> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run nft {place}: {e} (scripts/faults installs nftables)"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| format!("nft: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft {place}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
