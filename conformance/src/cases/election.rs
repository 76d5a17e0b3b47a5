//! Leader election: a campaign is a grant of the election's name, its token the epoch, and the
//! leader's value is written under that grant only.

use distlock_api::{Leader, Observer, MAX_VALUE_LEN};

use super::*;

/// How long an observer may take to see a change: many of its reads.
const SEEN_WITHIN: Duration = Duration::from_secs(10);

pub(super) async fn elections_are_unsupported_without_a_value_store(cx: Ctx) {
    let c = cx.client().await;
    let e = c.election(&cx.name("elect-none")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
}

/// The leader's value is what it proclaimed, under its epoch, as another client reads it; a
/// second proclaim replaces it under the same epoch; bad input is refused before any I/O.
pub(super) async fn a_leaders_value_is_what_it_proclaimed_under_its_epoch(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("elect-value");
    let opts = LockOptions::new();
    let mut leading = a
        .election(&name)
        .unwrap()
        .campaign("one", &opts)
        .await
        .unwrap();
    let seen = leader_of(&b, &name).await.expect("a leader");
    assert_eq!(
        (&seen.owner, seen.epoch, seen.value.as_deref()),
        (leading.guard().owner(), leading.epoch(), Some("one"))
    );
    leading.proclaim("two").await.unwrap();
    let seen = leader_of(&b, &name).await.expect("a leader");
    assert_eq!(
        (seen.epoch, seen.value.as_deref()),
        (leading.epoch(), Some("two"))
    );
    // Bad input: a value too long, a bad name; nothing written, the server not asked.
    let long = "x".repeat(MAX_VALUE_LEN + 1);
    let e = leading.proclaim(&long).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert_eq!(
        leader_of(&b, &name).await.unwrap().value.as_deref(),
        Some("two")
    );
    let e = b.election("").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    if let Some(Ok(dead)) = cx.harness().unreachable_client().await {
        let e = dead
            .election(&name)
            .unwrap()
            .try_campaign(&long, &opts)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "before any I/O: {e}");
    }
    // Exactly MAX_VALUE_LEN bytes are fine.
    let longest = "y".repeat(MAX_VALUE_LEN);
    leading.proclaim(&longest).await.unwrap();
    let seen = leader_of(&b, &name).await.unwrap();
    assert_eq!(seen.value.as_deref(), Some(longest.as_str()));
    assert!(leading.resign().await.unwrap());
    assert!(
        leader_of(&b, &name).await.is_none(),
        "resigned: nobody leads"
    );
}

/// Separate clients and tasks sharing one handle campaign over and over: a count of who
/// believes it leads (from its campaign's return to just before it resigns) never passes one,
/// and the epochs, in the order the leaderships began, only rise.
pub(super) async fn at_most_one_campaigner_believes_it_leads(cx: Ctx) {
    const CLIENTS: usize = 3;
    const TASKS_PER_CLIENT: usize = 2;
    const ROUNDS: usize = 5;
    let name = cx.name("elect-one");
    let leading_now = Arc::new(AtomicU32::new(0));
    let epochs = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let c = cx.client().await;
        for j in 0..TASKS_PER_CLIENT {
            let election = c.election(&name).unwrap();
            let (leading_now, epochs) = (leading_now.clone(), epochs.clone());
            tasks.push(tokio::spawn(async move {
                let opts = LockOptions::new().wait(LONG_WAIT);
                let me = format!("campaigner {i}.{j}");
                for _ in 0..ROUNDS {
                    let leading = election.campaign(&me, &opts).await.expect("campaign");
                    let now = leading_now.fetch_add(1, Ordering::SeqCst) + 1;
                    epochs.lock().unwrap().push(leading.epoch());
                    assert_eq!(now, 1, "{now} campaigners believe they lead at once");
                    let seen = election.leader().await.unwrap().expect("a leader");
                    assert_eq!(
                        (seen.epoch, seen.value.as_deref()),
                        (leading.epoch(), Some(me.as_str()))
                    );
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    assert!(
                        !leading.is_lost(),
                        "lost while leading: {:?}",
                        leading.guard().lost_reason()
                    );
                    leading_now.fetch_sub(1, Ordering::SeqCst);
                    assert!(
                        leading.resign().await.unwrap(),
                        "leadership lost before resigning"
                    );
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("campaigner panicked");
    }
    let epochs = epochs.lock().unwrap().clone();
    assert_eq!(epochs.len(), CLIENTS * TASKS_PER_CLIENT * ROUNDS);
    if cx.harness().capabilities().fencing_tokens() {
        assert!(
            epochs.windows(2).all(|w| w[0] < w[1]),
            "epochs did not rise from one leadership to the next: {epochs:?}"
        );
    }
}

/// Two observers on separate clients see the first leader, its new value, a vacancy after it
/// resigns, and the next leader with a higher epoch; never an epoch older than one they showed.
pub(super) async fn every_observer_sees_a_takeover_and_a_vacancy(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("elect-watch");
    let mut watchers = Vec::new();
    for _ in 0..2 {
        let c = cx.client().await;
        let mut o = Watch::new(
            c.election(&name)
                .unwrap()
                .observe()
                .every(Duration::from_millis(50)),
        );
        o.until(|l| l.is_none()).await; // nobody leads yet
        watchers.push(o);
    }
    let opts = LockOptions::new();
    let mut first = a
        .election(&name)
        .unwrap()
        .campaign("a", &opts)
        .await
        .unwrap();
    for o in &mut watchers {
        o.until(|l| l.is_some_and(|l| l.epoch == first.epoch() && l.value.as_deref() == Some("a")))
            .await;
    }
    first.proclaim("a, moved").await.unwrap();
    for o in &mut watchers {
        o.until(|l| l.is_some_and(|l| l.value.as_deref() == Some("a, moved")))
            .await;
    }
    let old = first.epoch();
    assert!(first.resign().await.unwrap());
    for o in &mut watchers {
        o.until(|l| l.is_none()).await;
    }
    let next = b
        .election(&name)
        .unwrap()
        .campaign("b", &opts)
        .await
        .unwrap();
    for o in &mut watchers {
        o.until(|l| l.is_some_and(|l| l.epoch == next.epoch() && l.value.as_deref() == Some("b")))
            .await;
    }
    if cx.harness().capabilities().fencing_tokens() {
        assert!(next.epoch() > old, "epoch {} after {old}", next.epoch());
    }
    // A takeover with no vacancy in between (the lock handed straight on) is seen too.
    let c = cx.client().await;
    let waiting = {
        let election = c.election(&name).unwrap();
        tokio::spawn(async move {
            election
                .campaign("c", &LockOptions::new().wait(LONG_WAIT))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(next.resign().await.unwrap());
    let third = waiting.await.unwrap().unwrap();
    for o in &mut watchers {
        o.until(|l| l.is_some_and(|l| l.epoch == third.epoch() && l.value.as_deref() == Some("c")))
            .await;
    }
    assert!(third.resign().await.unwrap());
}

/// A leader deposed by an operator's force-release cannot proclaim: refused with `Lost`, and
/// its value is not shown, neither then nor under the next leader.
pub(super) async fn a_deposed_leaders_proclaim_is_refused(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("elect-deposed");
    let opts = LockOptions::new();
    let mut deposed = a
        .election(&name)
        .unwrap()
        .campaign("old", &opts)
        .await
        .unwrap();
    assert!(b.force_release(&name, deposed.epoch()).await.unwrap());
    let e = deposed.proclaim("still me").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
    assert!(
        leader_of(&b, &name).await.is_none(),
        "force-released: nobody leads"
    );
    let next = b
        .election(&name)
        .unwrap()
        .campaign("new", &opts)
        .await
        .unwrap();
    let e = deposed.proclaim("me again").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
    let seen = leader_of(&a, &name).await.expect("a leader");
    assert_eq!(
        (seen.epoch, seen.value.as_deref()),
        (next.epoch(), Some("new"))
    );
    assert!(next.resign().await.unwrap());
    let _ = deposed.resign().await;
}

/// A grant of the election's name that has proclaimed nothing shows no value, though the
/// leader before it proclaimed one.
pub(super) async fn a_new_leader_never_shows_an_old_leaders_value(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("elect-stale");
    let old = a
        .election(&name)
        .unwrap()
        .campaign("old", &LockOptions::new())
        .await
        .unwrap();
    let old_epoch = old.epoch();
    assert!(old.resign().await.unwrap());
    let plain = must_lock(&b, &name).await;
    let seen = leader_of(&a, &name).await.expect("held");
    assert_eq!((seen.epoch, seen.value), (plain.token(), None));
    if cx.harness().capabilities().fencing_tokens() {
        assert!(plain.token() > old_epoch);
    }
    assert!(plain.release().await.unwrap());
}

/// `run` hands the work its epoch, stops the work when leadership is lost, campaigns again
/// and runs the work anew under a higher epoch; it returns the work's output and resigns.
pub(super) async fn run_stops_the_work_when_leadership_is_lost_and_campaigns_again(cx: Ctx) {
    let (a, operator) = (cx.client().await, cx.client().await);
    let name = cx.name("elect-run");
    let calls = Arc::new(Mutex::new(Vec::new()));
    let running = {
        let (election, calls) = (a.election(&name).unwrap(), calls.clone());
        tokio::spawn(async move {
            let opts = watchdog(Duration::from_secs(1));
            election
                .run("worker", &opts, move |epoch| {
                    let first = {
                        let mut calls = calls.lock().unwrap();
                        calls.push(epoch);
                        calls.len() == 1
                    };
                    async move {
                        if first {
                            std::future::pending::<()>().await;
                        }
                        epoch
                    }
                })
                .await
        })
    };
    let deadline = Instant::now() + SEEN_WITHIN;
    let first = loop {
        if let Some(&epoch) = calls.lock().unwrap().first() {
            break epoch;
        }
        assert!(Instant::now() < deadline, "the work never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(operator.force_release(&name, first).await.unwrap());
    let done = tokio::time::timeout(SEEN_WITHIN, running)
        .await
        .expect("run did not campaign again after losing leadership")
        .unwrap()
        .unwrap();
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2, "work calls: {calls:?}");
    assert_eq!(done, calls[1]);
    assert_ne!(done, first);
    if cx.harness().capabilities().fencing_tokens() {
        assert!(done > first, "epoch {done} after {first}");
    }
    assert!(leader_of(&operator, &name).await.is_none(), "run resigned");
}

async fn leader_of(c: &Arc<dyn DistributedLock>, name: &str) -> Option<Leader> {
    c.election(name)
        .unwrap()
        .leader()
        .await
        .unwrap_or_else(|e| panic!("leader({name:?}) failed: {e}"))
}

/// An observer under test: its answers, checked as they come never to go back in epoch.
struct Watch {
    observer: Observer,
    newest: FencingToken,
}

impl Watch {
    fn new(observer: Observer) -> Self {
        Self {
            observer,
            newest: FencingToken(0),
        }
    }

    /// Reads answers until one satisfies `wanted`, within [`SEEN_WITHIN`].
    async fn until(&mut self, wanted: impl Fn(Option<&Leader>) -> bool) {
        let deadline = Instant::now() + SEEN_WITHIN;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(next) = tokio::time::timeout(left, self.observer.next()).await else {
                panic!(
                    "the observer did not see the change within {SEEN_WITHIN:?}; it saw {seen:?}"
                );
            };
            let leader = next.expect("observe");
            if let Some(l) = &leader {
                assert!(
                    l.epoch >= self.newest,
                    "epoch {} shown after {}",
                    l.epoch,
                    self.newest
                );
                self.newest = l.epoch;
            }
            if wanted(leader.as_ref()) {
                return;
            }
            seen.push(leader);
        }
    }
}
