//! Cleaning up: what an earlier, killed campaign left behind, and a deployment's data
//! directory.

use std::path::Path;
use std::process::Command;

use super::net::{ip, nft_host};

/// Removes what an earlier campaign that was killed before its cleanup left behind: network
/// namespaces (and the servers still running in them), bridges, one-way cuts' nftables tables
/// and data directories named after a process that no longer exists. Those of live campaigns
/// are left alone.
pub(crate) fn sweep_stale() {
    let alive = |pid: &str| Path::new("/proc").join(pid).exists();
    let mut live_subnets = Vec::new();
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some(ns) = line.split_whitespace().next() else {
                continue;
            };
            // distlock-faults-{pid}-{subnet}-{member}
            let Some(rest) = ns.strip_prefix("distlock-faults-") else {
                continue;
            };
            let parts: Vec<&str> = rest.split('-').collect();
            if parts.len() != 3 {
                continue;
            }
            if alive(parts[0]) {
                live_subnets.push(parts[1].to_string());
                continue;
            }
            if let Ok(pids) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            }
            eprintln!("removing network namespace {ns} left by an earlier campaign");
            let _ = ip(&["netns", "delete", ns]);
        }
    }
    if let Ok(entries) = std::fs::read_dir("/sys/class/net") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(subnet) = name.strip_prefix("dlf") else {
                continue;
            };
            if !subnet.bytes().all(|b| b.is_ascii_digit())
                || live_subnets.iter().any(|s| s == subnet)
            {
                continue;
            }
            // A bridge with ports belongs to a deployment being set up right now.
            let ports = std::fs::read_dir(e.path().join("brif")).map_or(0, |d| d.count());
            if ports == 0 {
                let _ = ip(&["link", "delete", &name]);
            }
        }
    }
    // A one-way cut's table in the root namespace, named after its deployment's bridge.
    if let Ok(out) = Command::new("nft").args(["list", "tables"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some(table) = line.strip_prefix("table inet ") else {
                continue;
            };
            let Some(subnet) = table.strip_prefix("distlock_oneway_dlf") else {
                continue;
            };
            if !live_subnets.iter().any(|s| s == subnet) {
                let _ = nft_host(&format!("delete table inet {table}\n"));
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix("distlock-faults-") else {
                continue;
            };
            // Server data is distlock-faults-{Kind}-{pid}-{subnet}; the histories of failed runs
            // (distlock-faults-{pid}) are kept for the user to read.
            let parts: Vec<&str> = rest.split('-').collect();
            if parts.len() == 3 && parts[0].parse::<u32>().is_err() && !alive(parts[1]) {
                remove_dir(&e.path());
            }
        }
    }
}

pub(super) fn remove_dir(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}
