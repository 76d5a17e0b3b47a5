//! One direction of one client process's link to the members dropped. The client processes
//! share the root namespace and the bridge's address, so a member's namespace cannot tell one
//! client from another: the table goes in the root namespace and knows the client by the group
//! id it was started with (`meta skgid`, which sees every packet it sends). It matches only the
//! deployment's own member addresses, so nothing else on the machine is touched.
//!
//! Its sends to the server are dropped by group. The server's packets to it are dropped on the
//! connections it had when the cut began (by their local ports, read with ss(8)) and on any it
//! opens during the cut (marked in conntrack by its first packet out).

use std::process::{Command, Stdio};

use super::net::nft_host;
use super::Deployment;

/// The conntrack mark of a cut client's connections.
const MARK: &str = "0x4f57";

impl Deployment {
    fn one_way_table(&self) -> String {
        format!("distlock_oneway_{}", self.bridge)
    }

    /// Drops the packets of the client process `pid` (started with group `gid`) to every
    /// member (`to_server`), or the members' packets to it.
    pub(crate) fn cut_one_way(
        &mut self,
        pid: u32,
        gid: u32,
        to_server: bool,
    ) -> Result<(), String> {
        let ips: Vec<&str> = self.members.iter().map(|m| m.ip.as_str()).collect();
        let set = ips.join(", ");
        let table = self.one_way_table();
        let script = if to_server {
            format!(
                "table inet {table} {{\n\
                   chain output {{ type filter hook output priority 0; \
                     meta skgid {gid} ip daddr {{ {set} }} drop; }}\n\
                 }}\n"
            )
        } else {
            let ports = local_ports(pid, &ips)?;
            let by_port = if ports.is_empty() {
                String::new()
            } else {
                format!(
                    "ip saddr {{ {set} }} tcp dport {{ {} }} drop; ",
                    ports.join(", ")
                )
            };
            format!(
                "table inet {table} {{\n\
                   chain output {{ type filter hook output priority 0; \
                     meta skgid {gid} ip daddr {{ {set} }} ct mark set {MARK}; }}\n\
                   chain input {{ type filter hook input priority 0; \
                     {by_port}ip saddr {{ {set} }} ct mark {MARK} drop; }}\n\
                 }}\n"
            )
        };
        nft_host(&script)?;
        self.one_way = true;
        Ok(())
    }

    /// Undoes [`cut_one_way`](Self::cut_one_way).
    pub(crate) fn heal_one_way(&mut self) -> Result<(), String> {
        nft_host(&format!("delete table inet {}\n", self.one_way_table()))?;
        self.one_way = false;
        Ok(())
    }
}

/// The local TCP ports of `pid`'s connections to any of `ips`, from `ss -Htnp`.
fn local_ports(pid: u32, ips: &[&str]) -> Result<Vec<String>, String> {
    let out = Command::new("ss")
        .args(["-Htnp"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ss(8): {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let owner = format!("pid={pid},");
    let mut ports: Vec<String> = text
        .lines()
        .filter(|l| l.contains(&owner))
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            let (local, peer) = (fields.get(3)?, fields.get(4)?);
            let (peer_ip, _) = peer.rsplit_once(':')?;
            ips.contains(&peer_ip)
                .then(|| local.rsplit_once(':').map(|(_, p)| p.to_string()))
                .flatten()
        })
        .collect();
    ports.sort();
    ports.dedup();
    Ok(ports)
}
