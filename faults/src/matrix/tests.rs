//! Which backends run which rows.

use std::time::Duration;

use super::*;

fn backend(key: &str) -> Backend {
    backends()
        .into_iter()
        .find(|b| b.key() == key)
        .expect("a backend")
}

/// The rows a backend of `topology` runs: its topology's, but the failover and the negative
/// control only with `sync_replicas` (without it, a failover may lose a grant: the documented
/// hazard, which the negative control's known defect shows).
fn assert_topology_rows(
    topology: Topology,
    plain: &str,
    sync: &str,
    failover: Scenario,
    control: Scenario,
) {
    let plain = backend(plain);
    let sync = backend(sync);
    for &s in SCENARIOS {
        let mine = s.topology() == Some(topology);
        assert_eq!(
            s.applies(&plain).is_ok(),
            mine && s != control && s != failover,
            "{s:?}"
        );
        assert_eq!(s.applies(&sync).is_ok(), mine, "{s:?}");
        if mine {
            assert!(s.applies(&backend("redis")).is_err(), "{s:?}");
        }
    }
    assert_eq!(plain.topology(), Some(topology));
    assert_eq!(sync.ttl(), Duration::from_secs(3));
    assert_eq!(plain.ttl(), Duration::from_secs(3));
}

#[test]
fn sentinel_backends_run_only_the_sentinel_rows_and_failovers_only_with_sync() {
    assert_topology_rows(
        Topology::Sentinel,
        "redis-sentinel",
        "redis-sentinel-sync",
        Scenario::SentinelFailover,
        Scenario::SentinelFailoverLagging,
    );
    let plain = backend("redis-sentinel");
    let sync = backend("redis-sentinel-sync");
    assert_eq!(
        sync.with_session("redis+sentinel://h:26379/m"),
        "redis+sentinel://h:26379/m?sync_replicas=1"
    );
    assert_eq!(
        plain.with_session("redis+sentinel://h:26379/m"),
        "redis+sentinel://h:26379/m"
    );
    assert_eq!(Scenario::SentinelFailoverLagging.members(), 3);
}

#[test]
fn cluster_backends_run_only_the_cluster_rows_and_failovers_only_with_sync() {
    assert_topology_rows(
        Topology::Cluster,
        "redis-cluster",
        "redis-cluster-sync",
        Scenario::ClusterFailover,
        Scenario::ClusterPrimaryCut,
    );
    let sync = backend("redis-cluster-sync");
    assert_eq!(
        sync.with_session("redis+cluster://h:6379,g:6379"),
        "redis+cluster://h:6379,g:6379?sync_replicas=1"
    );
    assert_eq!(
        backend("redis-cluster").with_session("redis+cluster://h:6379"),
        "redis+cluster://h:6379"
    );
    for s in [
        Scenario::ClusterFailover,
        Scenario::ClusterSlotMigration,
        Scenario::ClusterPrimaryCut,
    ] {
        assert_eq!(s.members(), 6, "{s:?}");
        assert_eq!(Scenario::parse(s.key()), Some(s));
    }
    // The other Redis backends, and the other servers, never run a cluster row.
    for b in backends() {
        if b.topology() != Some(Topology::Cluster) {
            assert!(Scenario::ClusterFailover.applies(&b).is_err(), "{b:?}");
        }
    }
}

#[test]
fn quick_mode_keeps_one_cell_per_cluster_row() {
    for &s in SCENARIOS {
        if s.topology() != Some(Topology::Cluster) {
            continue;
        }
        assert!(s.quick(&backend("redis-cluster-sync")), "{s:?}");
        assert!(!s.quick(&backend("redis-cluster")), "{s:?}");
        assert!(s.applies(&backend("redis-cluster-sync")).is_ok(), "{s:?}");
    }
    assert!(Scenario::SentinelFailover.quick(&backend("redis-sentinel-sync")));
}
