//! What one uncontended cycle (`lock(name)` + `release()` of a free name, one client) costs at
//! the server, by the server's own count (`grpc_server_handled_total` of its `/metrics`), not the
//! library's: one transaction (the put-if-absent that also reads the queue) and one plain delete,
//! the two requests etcd's Go `concurrency.Mutex` sends — and nothing else (no watch, no lease
//! work, no second read). On a private cluster, so that no other client's request is counted.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use cluster::Cluster;
use distlock_conformance::given::unique_name;
use distlock_etcd::{LockExt, SharedLock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Cycles per measurement.
const CYCLES: u64 = 20;

/// The unary requests the members have handled so far, by method (every code summed over
/// every member: a request counts at the member the client sent it to).
async fn handled(urls: &[String]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for url in urls {
        for (method, n) in handled_by(url).await {
            *out.entry(method).or_default() += n;
        }
    }
    out
}

/// The unary requests one member has handled so far, by method.
async fn handled_by(url: &str) -> BTreeMap<String, u64> {
    let host = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let mut stream = tokio::net::TcpStream::connect(&host)
        .await
        .unwrap_or_else(|e| panic!("cannot reach {host}/metrics: {e}"));
    let ask = format!("GET /metrics HTTP/1.0\r\nHost: {host}\r\n\r\n");
    stream.write_all(ask.as_bytes()).await.unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("grpc_server_handled_total{") else {
            continue;
        };
        if !rest.contains("grpc_type=\"unary\"") {
            continue;
        }
        let (labels, value) = rest.rsplit_once(' ').expect("a value");
        let method = labels
            .split(',')
            .find_map(|l| l.strip_prefix("grpc_method=\""))
            .expect("a method label")
            .trim_end_matches('"');
        *out.entry(method.to_string()).or_default() += value.parse::<f64>().unwrap() as u64;
    }
    assert!(!out.is_empty(), "no grpc_server_handled_total in /metrics");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_cycle_is_one_transaction_and_one_delete_at_the_server() {
    if common::skip() {
        return;
    }
    let cluster = Cluster::start(20461);
    let leader = cluster.leader().await;
    let lock: SharedLock = cluster
        .client([leader, (leader + 1) % 3, (leader + 2) % 3])
        .await;
    let name = unique_name("cycle-requests");
    let cycle = || async {
        let guard = lock.lock(&name, Duration::from_secs(5)).await.unwrap();
        assert!(guard.release().await.unwrap(), "held until released");
    };
    // Warm: the client's connection and the name's first use behind it.
    for _ in 0..3 {
        cycle().await;
    }
    let before = handled(&cluster.urls).await;
    for _ in 0..CYCLES {
        cycle().await;
    }
    let after = handled(&cluster.urls).await;
    let per_method: BTreeMap<String, u64> = after
        .iter()
        .map(|(m, n)| (m.clone(), n - before.get(m).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    let expected = BTreeMap::from([
        ("DeleteRange".to_string(), CYCLES),
        ("Txn".to_string(), CYCLES),
    ]);
    assert_eq!(
        per_method, expected,
        "{CYCLES} uncontended cycles should be {CYCLES} Txn + {CYCLES} DeleteRange at the server"
    );
}
