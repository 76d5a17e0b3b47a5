//! Command-line options, parsed by hand: a handful of flags do not justify an argument-parser crate in
//! the build of every test run.

use std::path::PathBuf;

use crate::model::Kind;
use crate::run::libraries::Library;

pub(crate) const USAGE: &str = "\
usage: distlock-bench [--quick] [--out DIR] [--only NAME,NAME...]

  --quick        a few seconds per backend (what scripts/test runs); the full run takes
                 at most ten minutes for every backend together
  --out DIR      where report.md, report.html and results.json go (default bench/report)
  --render-from FILE
                 write the report of a results.json into --out instead of running anything
  --only NAMES   only these, comma-separated: memory, redis, redis-sentinel,
                 redis-sentinel-sync1, redis-cluster, redis-cluster-sync1 (Redis through
                 Sentinel and as a Cluster, the -sync1 ones with sync_replicas=1), redlock,
                 mysql, postgres, postgres-advisory, mongo, zk, etcd,
                 and the peer libraries rslock, redis-py, python-redis-lock, redis-semaphore
                 (Redis), curator (ZooKeeper), etcd-go (etcd); a peer runs with its server's
                 backend unless --only leaves both out. Peers not installed (scripts/bench
                 installs them into target/peers) are reported as skipped. Sections: locks
                 (sections 1-8), permits (9), failover (10); naming none runs all three,
                 naming only sections runs them on every backend.
  -h, --help     this text

Servers are read from DISTLOCK_REDIS_URL, DISTLOCK_REDIS_SENTINEL_URL,
DISTLOCK_REDIS_CLUSTER_URL, DISTLOCK_REDLOCK_URLS, DISTLOCK_MYSQL_URL, DISTLOCK_POSTGRES_URL, DISTLOCK_MONGO_URL, DISTLOCK_ZK_URL and DISTLOCK_ETCD_URL (default: the loopback ports
scripts/services uses).
";

/// What the user asked for.
#[derive(Debug, Clone)]
pub(crate) struct Cli {
    pub(crate) quick: bool,
    pub(crate) out: PathBuf,
    pub(crate) kinds: Vec<Kind>,
    /// Whether to run the rslock peer.
    pub(crate) peer: bool,
    /// The peer libraries of section 8, in report order.
    pub(crate) libraries: Vec<Library>,
    /// The arguments as given, for the report's header.
    pub(crate) args: Vec<String>,
    /// A results.json to render instead of running the scenarios.
    pub(crate) render_from: Option<PathBuf>,
    pub(crate) sections: Sections,
    /// `--lead KIND NAME VALUE TTL_MS` (internal): be the leader process that section 10 kills.
    pub(crate) lead: Option<Vec<String>>,
}

/// Which parts of the report to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sections {
    /// Sections 1-8: the lock.
    pub(crate) locks: bool,
    /// Section 9: semaphores.
    pub(crate) permits: bool,
    /// Section 10: leader failover.
    pub(crate) failover: bool,
}

impl Sections {
    const ALL: Sections = Sections {
        locks: true,
        permits: true,
        failover: true,
    };
    const NONE: Sections = Sections {
        locks: false,
        permits: false,
        failover: false,
    };

    /// Sets the section called `name`; false if there is none.
    fn set(&mut self, name: &str) -> bool {
        match name {
            "locks" => self.locks = true,
            "permits" => self.permits = true,
            "failover" => self.failover = true,
            _ => return false,
        }
        true
    }
}

impl Cli {
    /// `Ok(None)` when help was asked for.
    pub(crate) fn parse(args: impl Iterator<Item = String>) -> Result<Option<Self>, String> {
        let args: Vec<String> = args.collect();
        let mut cli = Cli {
            quick: false,
            out: PathBuf::from("bench/report"),
            kinds: Kind::ALL.to_vec(),
            peer: true,
            libraries: Library::ALL.to_vec(),
            args: args.clone(),
            render_from: None,
            sections: Sections::ALL,
            lead: None,
        };
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            let mut value = |name: &str| {
                inline
                    .clone()
                    .or_else(|| it.next())
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            match flag.as_str() {
                "-h" | "--help" => return Ok(None),
                "--quick" => cli.quick = true,
                "--out" => cli.out = PathBuf::from(value("--out")?),
                "--render-from" => cli.render_from = Some(PathBuf::from(value("--render-from")?)),
                "--lead" => {
                    let mut words = vec![value("--lead")?];
                    for _ in 0..3 {
                        words.push(it.next().ok_or("--lead needs KIND NAME VALUE TTL_MS")?);
                    }
                    cli.lead = Some(words);
                }
                "--only" => {
                    let list = value("--only")?;
                    cli.kinds.clear();
                    cli.peer = false;
                    cli.libraries.clear();
                    let mut sections = Sections::NONE;
                    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                        if sections.set(name) {
                            continue;
                        }
                        if let Some(lib) = Library::from_id(name) {
                            cli.peer |= lib == Library::Rslock;
                            cli.libraries.push(lib);
                        } else {
                            let kind = Kind::from_id(name)
                                .ok_or_else(|| format!("--only: unknown backend {name:?}"))?;
                            if !cli.kinds.contains(&kind) {
                                cli.kinds.push(kind);
                            }
                        }
                    }
                    if sections != Sections::NONE {
                        cli.sections = sections;
                        if cli.kinds.is_empty() && cli.libraries.is_empty() && !cli.peer {
                            cli.kinds = Kind::ALL.to_vec();
                        }
                    }
                    // The peer is only meaningful next to distlock-redis, and in section 7.
                    cli.peer |= cli.kinds.contains(&Kind::Redis);
                    cli.peer &= cli.sections.locks;
                    // Each library comes with its server's backend.
                    cli.libraries.extend(
                        Library::ALL
                            .into_iter()
                            .filter(|l| cli.kinds.contains(&l.against())),
                    );
                    // Report order stays the canonical one whatever order was typed.
                    cli.kinds.sort();
                    cli.libraries.sort();
                    cli.libraries.dedup();
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(Some(cli))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Option<Cli>, String> {
        Cli::parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn defaults_run_everything_into_bench_report() {
        let cli = parse(&[]).unwrap().unwrap();
        assert!(!cli.quick);
        assert_eq!(cli.out, PathBuf::from("bench/report"));
        assert_eq!(cli.kinds, Kind::ALL.to_vec());
        assert!(cli.peer);
        assert_eq!(cli.libraries, Library::ALL.to_vec());
    }

    #[test]
    fn only_selects_in_canonical_order_and_brings_the_peer_with_redis() {
        let cli = parse(&["--quick", "--only", "etcd,memory,redis", "--out=x"])
            .unwrap()
            .unwrap();
        assert!(cli.quick);
        assert_eq!(cli.out, PathBuf::from("x"));
        assert_eq!(cli.kinds, vec![Kind::Memory, Kind::Redis, Kind::Etcd]);
        assert!(cli.peer);
        assert_eq!(
            cli.libraries,
            vec![
                Library::Rslock,
                Library::RedisPy,
                Library::PythonRedisLock,
                Library::RedisSemaphore,
                Library::EtcdGo
            ]
        );
        let cli = parse(&["--only", "zk"]).unwrap().unwrap();
        assert_eq!(cli.kinds, vec![Kind::Zk]);
        assert!(!cli.peer);
        assert_eq!(cli.libraries, vec![Library::Curator]);
        let cli = parse(&["--only", "rslock"]).unwrap().unwrap();
        assert!(cli.kinds.is_empty());
        assert!(cli.peer);
        assert_eq!(cli.libraries, vec![Library::Rslock]);
    }

    #[test]
    fn only_can_name_libraries_alone() {
        let cli = parse(&["--only", "etcd-go,curator,curator"])
            .unwrap()
            .unwrap();
        assert!(cli.kinds.is_empty());
        assert!(!cli.peer);
        assert_eq!(cli.libraries, vec![Library::Curator, Library::EtcdGo]);
        let cli = parse(&["--only", "memory"]).unwrap().unwrap();
        assert!(cli.libraries.is_empty());
    }

    #[test]
    fn only_can_name_sections() {
        let cli = parse(&["--only", "permits,failover"]).unwrap().unwrap();
        assert_eq!(cli.kinds, Kind::ALL.to_vec());
        assert_eq!(cli.libraries, Library::ALL.to_vec());
        assert!(!cli.peer);
        assert!(!cli.sections.locks && cli.sections.permits && cli.sections.failover);
        let cli = parse(&["--only", "permits,redis"]).unwrap().unwrap();
        assert_eq!(cli.kinds, vec![Kind::Redis]);
        assert!(!cli.sections.failover);
        let cli = parse(&["--lead", "zk", "n", "v", "2000"]).unwrap().unwrap();
        assert_eq!(cli.lead.unwrap(), ["zk", "n", "v", "2000"]);
        assert!(parse(&["--lead", "zk", "n"]).is_err());
    }

    #[test]
    fn bad_arguments_are_refused() {
        assert!(parse(&["--only", "oracle"]).is_err());
        assert!(parse(&["--out"]).is_err());
        assert!(parse(&["--fast"]).is_err());
        assert!(parse(&["--help"]).unwrap().is_none());
        assert!(parse(&["--render-from"]).is_err());
    }
}
