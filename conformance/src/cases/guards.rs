//! Guards and scale: dropped guards free their lock, many names at once, exclusion under contention.

use super::*;

pub(super) async fn dropped_guard_frees_the_lock(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("drop");
    let g = a
        .try_lock_with(&name, &watchdog(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("free");
    drop(g);
    // Well inside the 60 s lease: only the drop's background release explains the grant.
    let g2 = b
        .lock(&name, Duration::from_secs(10))
        .await
        .expect("a dropped guard kept the lock");
    assert_eq!(
        a.core().guards_watched(),
        0,
        "the dropped guard is still being renewed"
    );
    assert!(g2.release().await.unwrap());
}

pub(super) async fn many_distinct_names_held_at_once(cx: Ctx) {
    const N: usize = 100;
    let (a, b) = (cx.client().await, cx.client().await);
    let names: Vec<String> = (0..N).map(|i| cx.name(&format!("many-{i}"))).collect();
    let guards: Vec<LockGuard> = join_all(names.iter().map(|n| must_lock(&a, n))).await;
    let mut tokens_seen = std::collections::HashSet::new();
    for (g, n) in guards.iter().zip(&names) {
        assert_eq!(g.name().as_str(), n);
        tokens_seen.insert(g.token());
    }
    for n in names.iter().step_by(10) {
        assert!(b.try_lock(n).await.unwrap().is_none(), "{n} not held");
    }
    let released = join_all(guards.into_iter().map(|g| g.release())).await;
    assert!(
        released.into_iter().all(|r| r.unwrap()),
        "some lock was lost before release"
    );
    for n in names.iter().step_by(10) {
        assert!(holder_of(&b, n).await.is_none(), "{n} still held");
    }
}

pub(super) async fn mutual_exclusion_under_contention(cx: Ctx) {
    const TASKS: usize = 16;
    const ROUNDS: u64 = 5;
    let name = cx.name("mutex");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicU32::new(0));
    let log = Arc::new(Mutex::new(Vec::<(Instant, Instant, FencingToken)>::new()));
    let fencing = cx.harness().capabilities().fencing_tokens();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let c = cx.client().await;
        let (name, counter, inside, log) =
            (name.clone(), counter.clone(), inside.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let g = c
                    .lock(&name, Duration::from_secs(90))
                    .await
                    .expect("acquire");
                let entered = Instant::now();
                let others = inside.fetch_add(1, Ordering::SeqCst);
                // Read, sleep, write: an unsynchronised increment that only the lock protects.
                let v = counter.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                counter.store(v + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                let left = Instant::now();
                log.lock().unwrap().push((entered, left, g.token()));
                assert_eq!(others, 0, "two holders inside the critical section at once");
                assert!(!g.is_lost(), "lost while holding: {:?}", g.lost_reason());
                assert!(
                    g.release().await.unwrap(),
                    "lock lost during the critical section"
                );
            }
        }));
    }
    for t in tasks {
        t.await.expect("contender panicked");
    }
    assert_eq!(
        counter.load(Ordering::SeqCst),
        TASKS as u64 * ROUNDS,
        "lost updates"
    );
    let mut log = log.lock().unwrap().clone();
    assert_eq!(log.len(), TASKS * ROUNDS as usize);
    log.sort_by_key(|e| e.0);
    for w in log.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "critical sections overlap: {:?} and {:?}",
            w[0],
            w[1]
        );
        if fencing {
            assert!(
                w[1].2 > w[0].2,
                "tokens out of order: {} then {}",
                w[0].2,
                w[1].2
            );
        }
    }
}
