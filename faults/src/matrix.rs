//! The one list of backends and the one list of scenarios, and which scenario applies where.
//! Backends come from their crates' descriptors (id, test URL, capabilities) and test-only
//! admins (deleting a lock behind its holder, listing what a run left), so nothing here
//! repeats a backend's key layout.

use std::time::Duration;

use distlock_api::backend::testing::AdminFn;
use distlock_api::{BackendDescriptor, Capabilities, LeaseKind};

mod timing;
pub(crate) use timing::{Timing, SKEW_RATE, SKEW_STEP_MS, STEP_S};

/// A backend the campaign runs against.
#[derive(Clone, Copy)]
pub(crate) struct Backend {
    /// What the backend crate says of itself.
    pub(crate) descriptor: &'static BackendDescriptor,
    /// Its test-only admin; `None` for the in-memory store (no server to act on).
    pub(crate) admin: Option<AdminFn>,
    /// A mode of the backend chosen by URL options: its key, the options, and what it
    /// promises (PostgreSQL's advisory mode). `None`: the descriptor's id and capabilities.
    pub(crate) mode: Option<Mode>,
}

/// A backend's mode: a second set of cells for one crate.
#[derive(Clone, Copy)]
pub(crate) struct Mode {
    pub(crate) key: &'static str,
    /// Appended to every URL of the backend.
    pub(crate) options: &'static str,
    pub(crate) capabilities: Capabilities,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key())
    }
}

/// Every backend, in report order.
pub(crate) fn backends() -> Vec<Backend> {
    vec![
        Backend {
            descriptor: &distlock_redis::DESCRIPTOR,
            admin: Some(|url| Box::pin(distlock_redis::testing::redis_admin(url))),
            mode: None,
        },
        Backend {
            descriptor: &distlock_redis::REDLOCK_DESCRIPTOR,
            admin: Some(|url| Box::pin(distlock_redis::testing::redlock_admin(url))),
            mode: None,
        },
        Backend {
            descriptor: &distlock_mysql::DESCRIPTOR,
            admin: Some(|url| Box::pin(distlock_mysql::testing::admin(url))),
            mode: None,
        },
        Backend {
            descriptor: &distlock_postgres::DESCRIPTOR,
            admin: Some(|url| Box::pin(distlock_postgres::testing::admin(url))),
            mode: None,
        },
        Backend {
            descriptor: &distlock_postgres::DESCRIPTOR,
            admin: Some(|url| Box::pin(distlock_postgres::testing::admin(url))),
            // The session bound is the campaign's session lease (see `ttl`).
            mode: Some(Mode {
                key: "postgres-advisory",
                options: "mode=advisory&session_timeout=2s",
                capabilities: distlock_postgres::ADVISORY_CAPABILITIES,
            }),
        },
        // Redis through Sentinel, on a private master, 2 replicas and 3 sentinels the run
        // starts (the sentinel-failover rows); with and without waiting for a replica.
        Backend {
            descriptor: &distlock_redis::DESCRIPTOR,
            admin: Some(|url| Box::pin(distlock_redis::testing::redis_admin(url))),
            mode: Some(Mode {
                key: "redis-sentinel",
                options: "",
                capabilities: distlock_redis::DESCRIPTOR.capabilities,
            }),
        },
        Backend {
            descriptor: &distlock_redis::DESCRIPTOR,
            admin: Some(|url| Box::pin(distlock_redis::testing::redis_admin(url))),
            mode: Some(Mode {
                key: "redis-sentinel-sync",
                options: "sync_replicas=1",
                capabilities: distlock_redis::DESCRIPTOR.capabilities,
            }),
        },
        Backend {
            descriptor: &distlock_mongo::DESCRIPTOR,
            admin: Some(|url| Box::pin(distlock_mongo::testing::admin(url))),
            mode: None,
        },
        Backend {
            descriptor: &distlock_zk::DESCRIPTOR,
            admin: Some(|url| Box::pin(distlock_zk::testing::admin(url))),
            mode: None,
        },
        Backend {
            descriptor: &distlock_etcd::DESCRIPTOR,
            admin: Some(|url| Box::pin(distlock_etcd::testing::admin(url))),
            mode: None,
        },
        Backend {
            descriptor: &distlock_api::MEMORY,
            admin: None,
            mode: None,
        },
    ]
}

impl Backend {
    /// Its key on the command line and in the report: the descriptor's id, or the mode's.
    pub(crate) fn key(&self) -> &'static str {
        self.mode.map_or(self.descriptor.id, |m| m.key)
    }

    /// Which server it talks to: the descriptor's id (a mode's server is its backend's).
    pub(crate) fn server_key(&self) -> &'static str {
        self.descriptor.id
    }

    /// What it promises.
    pub(crate) fn capabilities(&self) -> Capabilities {
        self.mode
            .map_or(self.descriptor.capabilities, |m| m.capabilities)
    }

    /// Whether each grant has its own lease (else it lives as long as the session or lease).
    pub(crate) fn per_lock(&self) -> bool {
        self.capabilities().ttl.kind == LeaseKind::PerLock
    }

    /// Whether it is Redis through Sentinel (a private topology only).
    pub(crate) fn sentinel(&self) -> bool {
        self.key().starts_with("redis-sentinel")
    }

    /// The shared server's URL (the descriptor's test URL).
    pub(crate) fn shared_url(&self) -> String {
        self.descriptor.test_url()
    }

    /// The lease the campaign's locks get: short, so that runs are short. Session backends
    /// take theirs from the URL; etcd's leases count in whole seconds and ZooKeeper's session
    /// must outlast a few of the shared server's 200 ms ticks, so both get 2 s. Through
    /// Sentinel, 3 s: longer than a failover (1 s down-after period, then the election and
    /// the promotion), so that a grant a promoted replica missed is still believed when the
    /// new master hands the name out again (the hazard `sync_replicas` closes).
    pub(crate) fn ttl(&self) -> Duration {
        if self.sentinel() {
            Duration::from_millis(3000)
        } else if self.per_lock() {
            Duration::from_millis(1000)
        } else {
            Duration::from_millis(2000)
        }
    }

    /// `url` with the session settings the campaign needs (and the mode's options).
    pub(crate) fn with_session(&self, url: &str) -> String {
        let sep = if url.contains('?') { '&' } else { '?' };
        match (self.key(), self.mode) {
            ("zk", _) => format!("{url}{sep}session_timeout_ms={}", self.ttl().as_millis()),
            ("etcd", _) => format!("{url}{sep}lease_ttl_ms={}", self.ttl().as_millis()),
            (_, Some(mode)) if !mode.options.is_empty() => format!("{url}{sep}{}", mode.options),
            _ => url.to_string(),
        }
    }
}

/// A nemesis scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scenario {
    Baseline,
    SharedHandle,
    HolderKill,
    HolderPause,
    CancelStorm,
    LeaseShrink,
    OobDelete,
    LostReplies,
    ClientCut,
    /// Every client's link to the server slowed: each chunk both ways held back 50 to 250 ms.
    Latency,
    ServerPause,
    ServerRestart,
    /// Redis without persistence, killed and restarted empty after the longest lease.
    ServerRestartVolatile,
    LeaderKill,
    FollowerKill,
    MemberCut,
    /// 3-member cluster: the leader cut off from its peers while a holder talks only to it.
    LeaderCut,
    MemberRestart,
    /// RedLock over 5 private masters, this many of them stopped past the lease.
    MastersDown(usize),
    /// RedLock over 5 private masters: 2 killed (-9) and restarted on their fsync-always
    /// append-only files.
    MastersRestart,
    /// RedLock over 5 private masters without persistence: 2 killed (-9) and restarted empty
    /// once the lease has passed (the delayed restart RedLock needs without persistence).
    MastersRestartVolatile,
    /// Redis through Sentinel (private master, 2 replicas, 3 sentinels): the master killed
    /// (-9) while clients hold and contend; a replica promoted; the old master restarted.
    SentinelFailover,
    /// As [`SentinelFailover`](Self::SentinelFailover), but both replicas first miss the
    /// master's last writes (nftables drops replication for 1 s while clients take locks)
    /// and the master is killed at the end of it: the promoted replica lacks the last grants.
    SentinelFailoverLagging,
    /// A private server's clock moved, or one direction of a holder's link cut (`timing.rs`).
    Timing(Timing),
}

/// Every scenario, in report order.
pub(crate) const SCENARIOS: &[Scenario] = &[
    Scenario::Baseline,
    Scenario::SharedHandle,
    Scenario::HolderKill,
    Scenario::HolderPause,
    Scenario::CancelStorm,
    Scenario::LeaseShrink,
    Scenario::OobDelete,
    Scenario::LostReplies,
    Scenario::ClientCut,
    Scenario::Latency,
    Scenario::ServerPause,
    Scenario::ServerRestart,
    Scenario::ServerRestartVolatile,
    Scenario::LeaderKill,
    Scenario::FollowerKill,
    Scenario::MemberCut,
    Scenario::LeaderCut,
    Scenario::MemberRestart,
    Scenario::MastersDown(1),
    Scenario::MastersDown(2),
    Scenario::MastersDown(3),
    Scenario::MastersRestart,
    Scenario::MastersRestartVolatile,
    Scenario::SentinelFailover,
    Scenario::SentinelFailoverLagging,
    Scenario::Timing(Timing::ClockSkewSmall),
    Scenario::Timing(Timing::ClockStepBack),
    Scenario::Timing(Timing::OneWayToServer),
    Scenario::Timing(Timing::OneWayFromServer),
];

/// Scenarios that must be flagged where they apply: run only when named (the known-defects
/// gate names them), never by the campaign, whose cells must all be clean.
pub(crate) const NEGATIVE_CONTROLS: &[Scenario] = &[Scenario::Timing(Timing::ClockStepForward)];

impl Scenario {
    /// Its key on the command line and in the report.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Scenario::Baseline => "baseline",
            Scenario::SharedHandle => "shared-handle",
            Scenario::HolderKill => "holder-kill",
            Scenario::HolderPause => "holder-pause",
            Scenario::CancelStorm => "cancel-storm",
            Scenario::LeaseShrink => "lease-shrink",
            Scenario::OobDelete => "oob-delete",
            Scenario::LostReplies => "lost-replies",
            Scenario::ClientCut => "client-cut",
            Scenario::Latency => "latency",
            Scenario::ServerPause => "server-pause",
            Scenario::ServerRestart => "server-restart",
            Scenario::ServerRestartVolatile => "server-restart-volatile",
            Scenario::LeaderKill => "leader-kill",
            Scenario::FollowerKill => "follower-kill",
            Scenario::MemberCut => "member-cut",
            Scenario::LeaderCut => "leader-cut",
            Scenario::MemberRestart => "member-restart",
            Scenario::MastersDown(1) => "masters-down-1",
            Scenario::MastersDown(2) => "masters-down-2",
            Scenario::MastersDown(_) => "masters-down-3",
            Scenario::MastersRestart => "masters-restart",
            Scenario::MastersRestartVolatile => "masters-restart-volatile",
            Scenario::SentinelFailover => "sentinel-failover",
            Scenario::SentinelFailoverLagging => "sentinel-failover-lagging",
            Scenario::Timing(t) => t.key(),
        }
    }

    /// What it does, for the report.
    pub(crate) fn what(self) -> &'static str {
        match self {
            Scenario::Baseline => "no fault; tasks mixed over a shared handle and own handles",
            Scenario::SharedHandle => "no fault; every task of a process on one handle",
            Scenario::HolderKill => "SIGKILL a client process while it holds",
            Scenario::HolderPause => {
                "SIGSTOP a holding client past its lease, then SIGCONT (the zombie must stop \
                 writing or be fenced)"
            }
            Scenario::CancelStorm => "acquire futures dropped at random points",
            Scenario::LeaseShrink => "fixed leases extended to shorter and longer TTLs",
            Scenario::OobDelete => "the lock deleted behind its holder's back on the server",
            Scenario::LostReplies => {
                "one holder's proxy swallows the server's answers for longer than the lease"
            }
            Scenario::ClientCut => {
                "one holder's proxy swallows everything, both ways, past the lease"
            }
            Scenario::Latency => {
                "every client's link slowed for twice the lease: each chunk, both ways, held back \
                 50 to 250 ms (a different delay per client)"
            }
            Scenario::ServerPause => {
                "a private server SIGSTOPped for half the lease, later for twice the lease"
            }
            Scenario::ServerRestart => {
                "a private server killed (-9) and restarted on its data (Redis: fsync-always \
                 append-only file)"
            }
            Scenario::ServerRestartVolatile => {
                "a private Redis without persistence killed (-9) and restarted empty once the \
                 lease has passed, the restart delay a volatile lock server needs: exclusion \
                 must hold; tokens start again at 1 (volatile fencing), which the register refuses"
            }
            Scenario::LeaderKill => {
                "3-member cluster in network namespaces: the leader SIGKILLed, restarted later"
            }
            Scenario::FollowerKill => {
                "3-member cluster: a follower SIGKILLed while a client talks only to it, \
                 restarted later"
            }
            Scenario::MemberCut => {
                "3-member cluster: a follower cut off from its peers (nftables in its namespace) \
                 while a holder talks only to it, past the session; healed"
            }
            Scenario::LeaderCut => {
                "3-member cluster: the leader cut off from its peers (nftables in its namespace) \
                 while a holder talks only to it, past the session; healed (the majority elects \
                 another leader meanwhile)"
            }
            Scenario::MemberRestart => {
                "3-member cluster: each member in turn killed and restarted on its data"
            }
            Scenario::MastersDown(1) => {
                "RedLock over 5 private masters, 1 SIGSTOPped past the lease"
            }
            Scenario::MastersDown(2) => {
                "RedLock over 5 private masters, 2 SIGSTOPped past the lease"
            }
            Scenario::MastersDown(_) => {
                "RedLock over 5 private masters, 3 SIGSTOPped past the lease (no majority: no \
                 grants until they return)"
            }
            Scenario::MastersRestart => {
                "RedLock over 5 private masters, 2 killed (-9) and restarted on their fsync-always \
                 append-only files half a lease later"
            }
            Scenario::MastersRestartVolatile => {
                "RedLock over 5 private masters without persistence, 2 killed (-9) and restarted \
                 empty once the lease has passed (the delayed restart RedLock needs without \
                 persistence)"
            }
            Scenario::SentinelFailover => {
                "Redis through Sentinel (private master, 2 replicas, 3 sentinels in namespaces): \
                 the master killed (-9) while clients hold and contend, a replica promoted, the \
                 old master restarted (Sentinel makes it a replica)"
            }
            Scenario::SentinelFailoverLagging => {
                "as sentinel-failover, but the replicas drop the master's traffic (nftables) for \
                 1 s while clients take locks, and the master is killed at its end: the \
                 promoted replica lacks the last grants (healed once a replica is promoted)"
            }
            Scenario::Timing(t) => t.what(),
        }
    }

    /// Parses a key.
    pub(crate) fn parse(key: &str) -> Option<Scenario> {
        SCENARIOS
            .iter()
            .chain(NEGATIVE_CONTROLS)
            .copied()
            .find(|s| s.key() == key)
    }

    /// How many private servers the run starts: one to pause or restart, RedLock's five
    /// masters, a 3-member cluster; none for the shared server.
    pub(crate) fn members(self) -> usize {
        match self {
            Scenario::ServerPause
            | Scenario::ServerRestart
            | Scenario::ServerRestartVolatile
            | Scenario::Timing(_) => 1,
            Scenario::MastersDown(_)
            | Scenario::MastersRestart
            | Scenario::MastersRestartVolatile => 5,
            s if s.clustered() || s.sentinel() => 3,
            _ => 0,
        }
    }

    /// How many leases the clients run on after the base time: room for the fault and what
    /// follows it.
    pub(crate) fn leases_after(self) -> u32 {
        match self {
            Scenario::Baseline | Scenario::SharedHandle | Scenario::CancelStorm => 0,
            Scenario::LeaseShrink | Scenario::OobDelete => 1,
            Scenario::ServerPause
            | Scenario::ServerRestartVolatile
            | Scenario::LeaderKill
            | Scenario::FollowerKill
            | Scenario::MemberCut
            | Scenario::LeaderCut
            | Scenario::MastersRestartVolatile => 4,
            Scenario::MemberRestart => 6,
            // Of 3 s leases: the failover, then clients on the new master.
            Scenario::SentinelFailover | Scenario::SentinelFailoverLagging => 2,
            Scenario::Timing(t) => t.leases_after(),
            _ => 3,
        }
    }

    /// Whether each client reaches its server through a proxy of its own (to cut or slow).
    pub(crate) fn proxied(self) -> bool {
        matches!(
            self,
            Scenario::LostReplies | Scenario::ClientCut | Scenario::Latency
        )
    }

    /// Whether the nemesis hits a holder (so holds are long, for it to find one).
    pub(crate) fn hits_holders(self) -> bool {
        matches!(
            self,
            Scenario::HolderKill
                | Scenario::HolderPause
                | Scenario::LostReplies
                | Scenario::ClientCut
                | Scenario::OobDelete
                | Scenario::Timing(_)
        )
    }

    /// Whether the quick campaign runs it on `backend` (the full campaign runs every cell).
    pub(crate) fn quick(self, backend: &Backend) -> bool {
        match self {
            Scenario::Timing(t) => t.quick(backend),
            _ => true,
        }
    }

    /// Whether the scenario runs against a cluster the run starts in network namespaces.
    pub(crate) fn clustered(self) -> bool {
        matches!(
            self,
            Scenario::LeaderKill
                | Scenario::FollowerKill
                | Scenario::MemberCut
                | Scenario::LeaderCut
                | Scenario::MemberRestart
        )
    }

    /// Whether it fails over a private Sentinel topology.
    pub(crate) fn sentinel(self) -> bool {
        matches!(
            self,
            Scenario::SentinelFailover | Scenario::SentinelFailoverLagging
        )
    }

    /// Whether it runs on `backend`, or why not.
    pub(crate) fn applies(self, backend: &Backend) -> Result<(), &'static str> {
        let key = backend.key();
        if key == "memory" {
            return Err(
                "in-process only: client processes cannot share an in-memory store \
                        (the conformance suite covers it in one process)",
            );
        }
        if backend.sentinel() != self.sentinel() {
            return Err(if backend.sentinel() {
                "Redis through Sentinel runs on a private topology, in the sentinel-failover \
                 rows (the single-server faults are the redis rows)"
            } else {
                "Redis through Sentinel only"
            });
        }
        match self {
            Scenario::SentinelFailoverLagging if key == "redis-sentinel" => Err(
                "the negative control: without sync_replicas the promoted replica hands the \
                 missed grants out again (the documented hazard); the known-defects gate shows \
                 the checker flags it (defect sentinel-lagging-without-sync)",
            ),
            Scenario::LeaseShrink if !backend.per_lock() => Err(
                "grants share the session's lease: there is no per-lock TTL to extend \
                 (extend is Unsupported)",
            ),
            Scenario::ServerPause | Scenario::ServerRestart if key == "redlock" => {
                Err("a master down is the masters-down-k rows")
            }
            Scenario::ServerRestart if key == "postgres-advisory" => Err(
                "a restart frees session locks at once, before a holder can learn of it: \
                 advisory mode's documented window, where the fencing token protects",
            ),
            Scenario::ServerRestartVolatile if key != "redis" => {
                Err("its server always keeps its data (a restart without persistence is Redis's)")
            }
            s if s.clustered() => match key {
                "etcd" | "zk" => Ok(()),
                _ => Err("etcd and ZooKeeper are the clustered backends"),
            },
            Scenario::MastersDown(_)
            | Scenario::MastersRestart
            | Scenario::MastersRestartVolatile
                if key != "redlock" =>
            {
                Err("RedLock only")
            }
            Scenario::Timing(t) => t.applies(backend),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(key: &str) -> Backend {
        backends()
            .into_iter()
            .find(|b| b.key() == key)
            .expect("a backend")
    }

    #[test]
    fn sentinel_backends_run_only_the_sentinel_rows_and_the_lagging_one_only_with_sync() {
        let plain = backend("redis-sentinel");
        let sync = backend("redis-sentinel-sync");
        for &s in SCENARIOS {
            assert_eq!(
                s.applies(&plain).is_ok(),
                s == Scenario::SentinelFailover,
                "{s:?}"
            );
            assert_eq!(s.applies(&sync).is_ok(), s.sentinel(), "{s:?}");
        }
        assert!(Scenario::SentinelFailover
            .applies(&backend("redis"))
            .is_err());
        assert_eq!(
            sync.with_session("redis+sentinel://h:26379/m"),
            "redis+sentinel://h:26379/m?sync_replicas=1"
        );
        assert_eq!(
            plain.with_session("redis+sentinel://h:26379/m"),
            "redis+sentinel://h:26379/m"
        );
        assert_eq!(sync.ttl(), Duration::from_secs(3));
        assert_eq!(Scenario::SentinelFailoverLagging.members(), 3);
    }
}
