//! The metrics `docs/observability.md` lists, recorded by the in-memory backend: names, labels
//! and values after a known sequence of lock calls.
#![cfg(feature = "metrics")]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{ErrorKind, LockExt, MemoryStore};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};

/// `name{label=value,…}` → value, for every metric recorded.
fn snapshot(recorder: &DebuggingRecorder) -> HashMap<String, DebugValue> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| (render(&key), value))
        .collect()
}

fn render(key: &CompositeKey) -> String {
    let mut labels: Vec<String> = key
        .key()
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    let kind = match key.kind() {
        MetricKind::Counter => "counter",
        MetricKind::Gauge => "gauge",
        MetricKind::Histogram => "histogram",
    };
    format!("{kind} {}{{{}}}", key.key().name(), labels.join(","))
}

fn counter(m: &HashMap<String, DebugValue>, key: &str) -> u64 {
    match m.get(&format!("counter {key}")) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!("counter {key}: {other:?}; recorded: {:?}", m.keys()),
    }
}

fn samples(m: &HashMap<String, DebugValue>, key: &str) -> usize {
    match m.get(&format!("histogram {key}")) {
        Some(DebugValue::Histogram(v)) => v.len(),
        other => panic!("histogram {key}: {other:?}; recorded: {:?}", m.keys()),
    }
}

fn gauge(m: &HashMap<String, DebugValue>, key: &str) -> f64 {
    match m.get(&format!("gauge {key}")) {
        Some(DebugValue::Gauge(v)) => v.into_inner(),
        other => panic!("gauge {key}: {other:?}; recorded: {:?}", m.keys()),
    }
}

#[test]
fn lock_calls_are_counted_timed_and_guards_gauged() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = MemoryStore::new();
        let (a, b) = (Arc::new(store.client()), Arc::new(store.client()));
        // 3 granted try_locks, one of them released, one dropped, one kept.
        let released = a.try_lock("m-1").await.unwrap().unwrap();
        let dropped = a.try_lock("m-2").await.unwrap().unwrap();
        let kept = a.try_lock("m-3").await.unwrap().unwrap();
        // 1 held try_lock, 1 wait that times out, 1 wait that is granted.
        assert!(b.try_lock("m-3").await.unwrap().is_none());
        let e = b.lock("m-3", Duration::from_millis(20)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout);
        let waited = b.lock("m-4", Duration::from_secs(1)).await.unwrap();
        assert!(released.release().await.unwrap());
        drop(dropped);
        assert!(waited.release().await.unwrap());
        let m = snapshot(&recorder);
        let mem = "backend=memory";
        assert_eq!(
            counter(
                &m,
                &format!("distlock_acquires_total{{{mem},outcome=granted}}")
            ),
            4
        );
        assert_eq!(
            counter(
                &m,
                &format!("distlock_acquires_total{{{mem},outcome=held}}")
            ),
            1
        );
        assert_eq!(
            counter(
                &m,
                &format!("distlock_acquires_total{{{mem},outcome=timeout}}")
            ),
            1
        );
        assert_eq!(
            samples(
                &m,
                &format!("distlock_acquire_seconds{{{mem},outcome=granted}}")
            ),
            3
        );
        assert_eq!(
            samples(
                &m,
                &format!("distlock_acquire_seconds{{{mem},outcome=held}}")
            ),
            1
        );
        assert_eq!(
            samples(
                &m,
                &format!("distlock_wait_seconds{{{mem},outcome=granted}}")
            ),
            1
        );
        assert_eq!(
            samples(
                &m,
                &format!("distlock_wait_seconds{{{mem},outcome=timeout}}")
            ),
            1
        );
        assert_eq!(
            counter(
                &m,
                &format!("distlock_releases_total{{{mem},outcome=released}}")
            ),
            2
        );
        assert_eq!(
            counter(
                &m,
                &format!("distlock_releases_total{{{mem},outcome=dropped}}")
            ),
            1
        );
        // Granted 4, released or dropped 3: the kept guard is the one still held.
        assert_eq!(gauge(&m, &format!("distlock_guards_held{{{mem}}}")), 1.0);
        drop(kept);
    });
}
