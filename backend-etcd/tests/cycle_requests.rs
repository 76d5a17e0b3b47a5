//! What one uncontended cycle (`lock(name)` + `release()` of a free name, one client) costs at
//! the server, by the server's own count (`grpc_server_handled_total` of its `/metrics`), not the
//! library's: one transaction (the put-if-absent that also reads the queue) and one plain delete,
//! the two requests etcd's Go `concurrency.Mutex` sends — and nothing else (no watch, no lease
//! work, no second read).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use distlock_conformance::given::unique_name;
use distlock_etcd::{EtcdLock, LockExt, SharedLock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Cycles per measurement.
const CYCLES: u64 = 20;
/// Measurements: the server is shared (other clients' requests add to its counts, never take
/// away), so the test passes if any one of them shows exactly the cycles' requests.
const TRIES: usize = 6;

/// The unary requests the server has handled so far, by method (every code summed).
async fn handled() -> BTreeMap<String, u64> {
    let config = common::config();
    let endpoint = config.endpoints()[0].clone();
    let host = endpoint
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
    let lock: SharedLock = Arc::new(EtcdLock::connect(common::config()).await.unwrap());
    let name = unique_name("cycle-requests");
    let cycle = || async {
        let guard = lock.lock(&name, Duration::from_secs(5)).await.unwrap();
        assert!(guard.release().await.unwrap(), "held until released");
    };
    // Warm: the client's connection and the name's first use behind it.
    for _ in 0..3 {
        cycle().await;
    }
    let mut seen = Vec::new();
    for _ in 0..TRIES {
        let before = handled().await;
        for _ in 0..CYCLES {
            cycle().await;
        }
        let after = handled().await;
        let per_method: BTreeMap<String, u64> = after
            .iter()
            .map(|(m, n)| (m.clone(), n - before.get(m).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect();
        let expected = BTreeMap::from([
            ("DeleteRange".to_string(), CYCLES),
            ("Txn".to_string(), CYCLES),
        ]);
        if per_method == expected {
            return;
        }
        seen.push(per_method);
    }
    panic!(
        "{CYCLES} uncontended cycles should be {CYCLES} Txn + {CYCLES} DeleteRange at the \
         server; in {TRIES} tries it handled {seen:?}"
    );
}
