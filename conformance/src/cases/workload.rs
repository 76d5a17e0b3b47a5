//! A mixed workload the way users run one: separate clients and tasks sharing a handle, on one
//! name, mixing every way in to a lock (try, wait, a wait cancelled part-way) with every way of
//! holding and letting go (extends shorter and longer, re-entry, releases in either order, drops
//! in place and on plain threads). What the tasks believed is checked afterwards, over the whole
//! history, without taking the library's word for when a hold ended. The same workload runs on
//! a semaphore's permits, where at most `max` holds may be believed at once.

use super::*;

/// Client handles, tasks on each, and rounds per task; `DISTLOCK_WORKLOAD_ROUNDS` sets the
/// rounds for a longer run.
const HANDLES: usize = 3;
const TASKS_PER_HANDLE: usize = 4;
const DEFAULT_ROUNDS: u32 = 60;
/// No task starts a round after this: a lock that stays stuck (a defect) ends the case soon,
/// not after every round has waited out its bound. Far beyond what the rounds take.
const ROUNDS_WITHIN: Duration = Duration::from_secs(40);

/// One believed hold: from the moment the grant was returned to the first of letting go, the
/// guard's safe-until, and the moment `lost()` was seen.
#[derive(Debug, Clone)]
struct Held {
    task: usize,
    round: u32,
    owner: OwnerId,
    /// How the hold was taken and let go, for a failure's report.
    story: String,
    token: u64,
    from: Instant,
    to: Instant,
}

/// A small deterministic generator, so a failing run can be told apart by its seed.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, sides: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % sides
    }
}

/// The earliest instant the guard stopped being entitled to believe it holds, if before `now`:
/// its safe-until, or when its lost signal was seen.
fn believed_end(g: &LockGuard, lost_at: &Mutex<Option<Instant>>, now: Instant) -> Instant {
    let mut end = now;
    if let Some(until) = g.safe_until() {
        end = end.min(until);
    }
    if let Some(at) = *lost_at.lock().unwrap() {
        end = end.min(at);
    }
    end
}

/// A guard whose lease has at least `margin` left and which has not been told it lost.
fn surely_held(g: &LockGuard, margin: Duration) -> bool {
    g.lost_reason().is_none() && g.safe_until().is_none_or(|u| u > Instant::now() + margin)
}

pub(super) async fn a_mixed_workload_with_reentry_never_has_two_holders(cx: Ctx) {
    mixed_workload(cx, 1).await;
}

pub(super) async fn a_mixed_workload_of_permits_never_has_more_than_max_holders(cx: Ctx) {
    mixed_workload(cx, 3).await;
}

/// The workload on `name`, taken as a lock (`permits` 1) or as permits of a semaphore of
/// `permits`.
async fn mixed_workload(cx: Ctx, permits: u32) {
    let rounds: u32 = std::env::var("DISTLOCK_WORKLOAD_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_ROUNDS);
    let seed = u64::from(crate::case::unique_suffix()) | 1;
    let name = cx.name("mixed");
    let mut handles = Vec::new();
    for _ in 0..HANDLES {
        handles.push(cx.client().await);
    }
    let caps = handles[0].capabilities();
    let history: Arc<Mutex<Vec<Held>>> = Arc::default();
    let stop_at = Instant::now() + ROUNDS_WITHIN;
    let mut tasks = Vec::new();
    for task in 0..HANDLES * TASKS_PER_HANDLE {
        let c = handles[task % HANDLES].clone();
        let (name, history) = (name.clone(), history.clone());
        let mut dice = Dice(seed.wrapping_mul(task as u64 + 1) | 1);
        tasks.push(tokio::spawn(async move {
            for round in 0..rounds {
                if Instant::now() > stop_at {
                    break;
                }
                let what = format!("seed {seed}, task {task}, round {round}");
                let mut opts = if caps.per_lock_ttl() && dice.roll(2) == 0 {
                    LockOptions::new().ttl(Duration::from_secs(3))
                } else {
                    LockOptions::new()
                };
                let got = match dice.roll(3) {
                    0 => c.try_permit(&name, permits, &opts).await,
                    1 => {
                        opts = opts.wait(Duration::from_secs(2));
                        c.permit(&name, permits, &opts).await.map(Some)
                    }
                    _ => {
                        opts = opts.wait(Duration::from_secs(2));
                        let cancel_after = Duration::from_millis(1 + dice.roll(30));
                        let wait = c.permit(&name, permits, &opts);
                        match tokio::time::timeout(cancel_after, wait).await {
                            Ok(r) => r.map(Some),
                            Err(_) => Ok(None),
                        }
                    }
                };
                let g = match got {
                    Ok(Some(g)) => g,
                    Ok(None) => continue,
                    Err(e) if e.kind() == ErrorKind::Timeout => continue,
                    Err(e) => panic!("{what}: acquire failed: {e}"),
                };
                let from = Instant::now();
                let owner = g.owner().clone();
                let mut story = String::new();
                let lost_at = Arc::new(Mutex::new(None));
                {
                    let (lost, lost_at) = (g.lost(), lost_at.clone());
                    tokio::spawn(async move {
                        if !matches!(lost.await, LostReason::Released) {
                            *lost_at.lock().unwrap() = Some(Instant::now());
                        }
                    });
                }
                if dice.roll(4) == 0 && surely_held(&g, Duration::from_millis(500)) {
                    let info = c.holder(&name).await;
                    if surely_held(&g, Duration::from_millis(500)) {
                        let info = info
                            .unwrap_or_else(|e| panic!("{what}: holder failed: {e}"))
                            .unwrap_or_else(|| {
                                panic!("{what}: holder() says free while {} holds", g.token())
                            });
                        // A semaphore's holder() shows its oldest permit: maybe another's.
                        if permits == 1 {
                            assert_eq!(
                                (&info.owner, info.token),
                                (g.owner(), g.token()),
                                "{what}: holder() disagrees with the guard that holds"
                            );
                        }
                        assert!(
                            info.permits.1 == permits && (1..=permits).contains(&info.permits.0),
                            "{what}: holder() says {:?} permits held of a semaphore of {permits}",
                            info.permits
                        );
                    }
                }
                if caps.per_lock_ttl() && dice.roll(4) == 0 {
                    let ttl =
                        [Duration::from_millis(200), Duration::from_secs(4)][dice.roll(2) as usize];
                    if let Err(e) = g.extend(ttl).await {
                        assert!(
                            g.is_lost(),
                            "{what}: extend failed on a guard that holds: {e}"
                        );
                    }
                }
                let inner = if caps.reentrant && dice.roll(3) == 0 {
                    let sure = surely_held(&g, Duration::from_millis(150));
                    match g.reenter().await {
                        Ok(inner) => {
                            story.push_str("re-entered; ");
                            assert_eq!(
                                (inner.token(), inner.hold_count()),
                                (g.token(), g.hold_count() + 1),
                                "{what}: a re-entry is the same grant, one hold more"
                            );
                            Some(inner)
                        }
                        Err(e) => {
                            assert!(
                                !sure,
                                "{what}: re-entry of a guard that holds (token {}, lost {:?}) \
                                 failed: {e}; holder() says {:?}",
                                g.token(),
                                g.lost_reason(),
                                c.holder(&name).await
                            );
                            None
                        }
                    }
                } else {
                    None
                };
                tokio::time::sleep(Duration::from_millis(dice.roll(5))).await;
                let token = g.token().0;
                let mut to = from;
                // Let go: the inner hold first or last, each by release, drop, or a drop on a
                // plain thread. The belief lasts until the last hold is let go.
                let mut guards = vec![g];
                guards.extend(inner);
                if dice.roll(2) == 0 {
                    guards.reverse();
                }
                let inner_first = guards.len() == 2 && guards[0].hold_count() == 2;
                if inner_first {
                    story.push_str("inner first; ");
                }
                for g in guards {
                    to = to.max(believed_end(&g, &lost_at, Instant::now()));
                    match dice.roll(3) {
                        0 => {
                            let r = g.release().await;
                            story.push_str(&format!("released: {r:?}; "));
                        }
                        1 => {
                            drop(g);
                            story.push_str("dropped; ");
                        }
                        _ => {
                            std::thread::spawn(move || drop(g)).join().unwrap();
                            story.push_str("dropped on a thread; ");
                        }
                    }
                }
                history.lock().unwrap().push(Held {
                    task,
                    round,
                    owner,
                    story,
                    token,
                    from,
                    to,
                });
            }
        }));
    }
    for t in tasks {
        t.await.expect("a task of the workload failed");
    }
    let mut held = history.lock().unwrap().clone();
    check_history(&mut held, permits, caps.fencing_tokens(), seed);
    // Nothing leaked: every hold let go, every cancelled wait left nothing, so every permit
    // is free for a newcomer at once (a leak would hold one for a whole lease or forever).
    let newcomer = cx.client().await;
    let mut newcomers = Vec::new();
    for _ in 0..permits {
        let wait = LockOptions::new().wait(Duration::from_secs(5));
        match newcomer.permit(&name, permits, &wait).await {
            Ok(g) => newcomers.push(g),
            Err(e) => {
                let holder = newcomer.holder(&name).await;
                let story: Vec<_> = held
                    .iter()
                    .filter(|h| {
                        holder
                            .as_ref()
                            .is_ok_and(|i| i.as_ref().is_some_and(|i| i.owner == h.owner))
                    })
                    .map(|h| format!("task {} round {}: {}", h.task, h.round, h.story))
                    .collect();
                panic!(
                "seed {seed}: a permit stayed taken after the workload ({} of {permits} free): \
                 {e}; holder {holder:?} (its holds in the workload: {story:?}); on the server \
                 {:?}",
                newcomers.len(),
                cx.harness().leftovers(cx.prefix()).await
            )
            }
        }
    }
    for g in newcomers {
        assert!(g.release().await.unwrap());
    }
    cx.until_nothing_is_left(Duration::from_secs(10)).await;
}

/// Over the believed holds: never more than `permits` at once (for a lock, no two overlap),
/// and, with fencing, a token of its own for every hold, strictly increasing in the order the
/// holds began where they cannot overlap (a lock).
fn check_history(held: &mut [Held], permits: u32, fencing: bool, seed: u64) {
    assert!(
        held.len() >= HANDLES * TASKS_PER_HANDLE,
        "seed {seed}: only {} grants in the whole workload",
        held.len()
    );
    held.sort_by_key(|h| h.from);
    // The holds still believed when the next one began.
    let mut open: Vec<&Held> = Vec::new();
    let mut previous: Option<&Held> = None;
    for h in held.iter() {
        open.retain(|p| p.to > h.from);
        if let Some(p) = open
            .iter()
            .max_by_key(|p| p.to)
            .filter(|_| open.len() >= permits as usize)
        {
            panic!(
                "seed {seed}: task {} was granted token {} while {} holds were believed (task \
                 {} held token {} for {:?} more); at most {permits} may be",
                h.task,
                h.token,
                open.len(),
                p.task,
                p.token,
                p.to - h.from
            );
        }
        if let (true, 1, Some(p)) = (fencing, permits, previous) {
            assert!(
                h.token > p.token,
                "seed {seed}: token {} (task {}) granted after token {} (task {})",
                h.token,
                h.task,
                p.token,
                p.task
            );
        }
        open.push(h);
        previous = Some(h);
    }
    if fencing {
        let mut tokens: Vec<u64> = held.iter().map(|h| h.token).collect();
        tokens.sort_unstable();
        tokens.dedup();
        assert_eq!(
            tokens.len(),
            held.len(),
            "seed {seed}: two grants shared a token"
        );
    }
}
