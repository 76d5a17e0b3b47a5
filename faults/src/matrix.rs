//! The one list of backends and the one list of scenarios, and which scenario applies where.

use std::time::Duration;

/// A backend the campaign runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backend {
    /// Its key on the command line and in the report.
    pub(crate) key: &'static str,
    /// The environment variable naming its server.
    pub(crate) env: &'static str,
    /// The default URL of the shared server.
    pub(crate) default_url: &'static str,
    /// Whether each grant has its own lease (else it lives as long as the session/lease).
    pub(crate) per_lock: bool,
}

/// Every backend, in report order.
pub(crate) const BACKENDS: &[Backend] = &[
    Backend {
        key: "redis",
        env: "DISTLOCK_REDIS_URL",
        default_url: "redis://127.0.0.1:6379",
        per_lock: true,
    },
    Backend {
        key: "redlock",
        env: "DISTLOCK_REDLOCK_URL",
        default_url: "redlock://127.0.0.1:6380,127.0.0.1:6381,127.0.0.1:6382",
        per_lock: true,
    },
    Backend {
        key: "mysql",
        env: "DISTLOCK_MYSQL_URL",
        default_url: "mysql://distlock:distlock@127.0.0.1:3306/distlock",
        per_lock: true,
    },
    Backend {
        key: "mongo",
        env: "DISTLOCK_MONGO_URL",
        default_url: "mongodb://127.0.0.1:27017",
        per_lock: true,
    },
    Backend {
        key: "zk",
        env: "DISTLOCK_ZK_URL",
        default_url: "zk://127.0.0.1:2181",
        per_lock: false,
    },
    Backend {
        key: "etcd",
        env: "DISTLOCK_ETCD_URL",
        default_url: "etcd://127.0.0.1:2379",
        per_lock: false,
    },
    Backend {
        key: "memory",
        env: "",
        default_url: "memory://",
        per_lock: true,
    },
];

impl Backend {
    /// The shared server's URL.
    pub(crate) fn shared_url(&self) -> String {
        if self.env.is_empty() {
            return self.default_url.to_string();
        }
        std::env::var(self.env).unwrap_or_else(|_| self.default_url.to_string())
    }

    /// The lease the campaign's locks get: short, so that runs are short; session backends
    /// take theirs from the URL (etcd's minimum is 2 s).
    pub(crate) fn ttl(&self) -> Duration {
        if self.per_lock {
            Duration::from_millis(1000)
        } else {
            Duration::from_millis(2000)
        }
    }

    /// `url` with the session settings the campaign needs.
    pub(crate) fn with_session(&self, url: &str) -> String {
        let sep = if url.contains('?') { '&' } else { '?' };
        match self.key {
            "zk" => format!("{url}{sep}session_timeout_ms={}", self.ttl().as_millis()),
            "etcd" => format!("{url}{sep}lease_ttl_ms={}", self.ttl().as_millis()),
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
    ServerPause,
    ServerRestart,
}

/// Every scenario, in priority order.
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
    Scenario::ServerPause,
    Scenario::ServerRestart,
];

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
            Scenario::ServerPause => "server-pause",
            Scenario::ServerRestart => "server-restart",
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
            Scenario::ClientCut => "one holder's proxy swallows everything, both ways, past the lease",
            Scenario::ServerPause => {
                "a private server SIGSTOPped for half the lease, later for twice the lease"
            }
            Scenario::ServerRestart => "a private server killed (-9) and restarted on its data",
        }
    }

    /// Parses a key.
    pub(crate) fn parse(key: &str) -> Option<Scenario> {
        SCENARIOS.iter().copied().find(|s| s.key() == key)
    }

    /// Whether it runs on `backend`, or why not.
    pub(crate) fn applies(self, backend: &Backend) -> Result<(), &'static str> {
        if backend.key == "memory" {
            return Err("in-process only: client processes cannot share an in-memory store \
                        (the conformance suite covers it in one process)");
        }
        match self {
            Scenario::LeaseShrink if !backend.per_lock => Err(
                "grants share the session's lease: there is no per-lock TTL to extend \
                 (extend is Unsupported)",
            ),
            Scenario::OobDelete if !matches!(backend.key, "redis" | "etcd") => {
                Err("not done this session: deleting behind the holder is written for Redis and etcd only")
            }
            Scenario::ServerPause | Scenario::ServerRestart => match backend.key {
                "redis" | "etcd" => Ok(()),
                "mysql" | "mongo" => Err(
                    "only the shared server is available here, and it must not be faulted \
                     (other sessions' tests use it)",
                ),
                "zk" => Err(
                    "not done this session: needs a private ZooKeeper (a JVM start per run); \
                     backend-zk/tests/server_faults covers pause and restart case by case",
                ),
                _ => Err(
                    "not done this session: RedLock with k of N private masters down is the \
                     cluster follow-up",
                ),
            },
            _ => Ok(()),
        }
    }
}
