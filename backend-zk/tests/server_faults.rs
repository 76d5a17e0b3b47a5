//! Real server faults, on a private throw-away ZooKeeper that each test starts itself (see
//! `private_zk`): the server killed with SIGKILL and restarted on its data directory within
//! the session timeout, and the server frozen with SIGSTOP for longer than the session timeout
//! (a holder's lost signal, and calls that must fail rather than hang).
//!
//! Java and the Debian `zookeeper` package must be installed (`scripts/services up zookeeper`);
//! without them the tests fail and say so. `DISTLOCK_SKIP=zk` skips them, printed.

mod private_zk;

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_conformance::watch_lost;
use distlock_zk::zookeeper_client as zk;
use distlock_zk::{ErrorKind, LockExt, LockGuard, LostReason, ZkConfig, ZkLock};
use private_zk::PrivateZk;
use tokio::task::{block_in_place, JoinHandle};

/// A generous bound on each step that should take a round trip or a few.
const BOUND: Duration = Duration::from_secs(15);

fn skip(test: &str) -> bool {
    let skip = distlock_conformance::skipped_by_env("zk");
    if skip {
        eprintln!("SKIPPING {test}: DISTLOCK_SKIP names zk");
    }
    skip
}

async fn connect(url: &str, session: Duration) -> Arc<ZkLock> {
    let config = ZkConfig::from_url(url)
        .map(|c| c.default_ttl(session))
        .expect("config of the private server");
    Arc::new(
        ZkLock::connect(config)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to the private ZooKeeper: {e}")),
    )
}

fn unique(tag: &str) -> String {
    format!("server-faults-{tag}-{}", uuid::Uuid::new_v4().simple())
}

/// The queue nodes of `name`, read through `via`'s session.
async fn queue(via: &ZkLock, name: &str) -> Vec<String> {
    let path = via.lock_path(name).unwrap();
    match via.client().list_children(&path).await {
        Ok(mut nodes) => {
            nodes.sort();
            nodes
        }
        Err(zk::Error::NoNode) => Vec::new(),
        Err(e) => panic!("cannot list {path}: {e}"),
    }
}

/// Resolves when `client`'s ZooKeeper client is next connected (after a disconnection), with
/// the instant; panics if its session ends instead.
fn reconnected(client: &ZkLock) -> JoinHandle<Instant> {
    let mut states = client.client().state_watcher();
    tokio::spawn(async move {
        loop {
            match states.changed().await {
                zk::SessionState::SyncConnected => return Instant::now(),
                s if s.is_terminated() => panic!("the session ended: {s}"),
                _ => {}
            }
        }
    })
}

fn node_of(g: &LockGuard) -> String {
    g.grant().key.rsplit('/').next().unwrap().to_string()
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// Milliseconds from `from` to `to`, negative if `to` is earlier.
fn signed_ms(from: Instant, to: Instant) -> i128 {
    match to.checked_duration_since(from) {
        Some(d) => d.as_millis() as i128,
        None => -(from.duration_since(to).as_millis() as i128),
    }
}

// ---------------------------------------------------------------------------------------------
// 1. SIGKILL and restart within the session timeout.

/// The backend's default session timeout. The server is killed just after a renewal, so the
/// holder has nearly all of it to get back: a JVM restart (0.3-1.3 s here), the client's
/// reconnect backoff, and, when a reconnect attempt lands in the few milliseconds after the new
/// server binds its port but before it handles connections (it then neither answers nor closes
/// them), the client's connection timeout of 2/5 of the session.
const RESTART_SESSION: Duration = Duration::from_secs(10);
/// How soon a waiter must hear of a release: a watch notice takes a round trip or two, so this
/// is load headroom; a lost watch would leave the waiter waiting for its whole 40 s.
const WAKE_BOUND: Duration = Duration::from_secs(2);

/// ZooKeeper logs every session in its transaction log, so a standalone server killed with
/// SIGKILL and restarted on its data directory within the session timeout still knows the
/// holder's session and its ephemeral queue node. The client reconnects and resumes that
/// session: the holder keeps the lock (its `lost()` never fires and renewals carry on), nobody
/// else can take it meanwhile, and after the release the next holder's token is greater.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_keeps_the_lock_across_a_kill_and_restart_within_the_session_timeout() {
    if skip("holder_keeps_the_lock_across_a_kill_and_restart_within_the_session_timeout") {
        return;
    }
    let test_started = Instant::now();
    let mut server = block_in_place(PrivateZk::start);
    let url = server.url();
    let holder = connect(&url, RESTART_SESSION).await;
    let other = connect(&url, RESTART_SESSION).await;
    let waiter = connect(&url, RESTART_SESSION).await;
    assert_eq!(
        holder.session_timeout(),
        RESTART_SESSION,
        "the server granted another session timeout"
    );
    let name = unique("restart");

    let g = holder.lock(&name, BOUND).await.expect("a free lock");
    let first = g.token();
    let lost = watch_lost(&g);
    assert!(
        other.try_lock(&name).await.unwrap().is_none(),
        "a second client took a held lock"
    );
    // A third client waits in the queue across the restart: its predecessor watch must come
    // back with its session, or it would never hear of the release.
    let waiting = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move {
            let g = waiter.lock(&name, Duration::from_secs(40)).await;
            (Instant::now(), g)
        })
    };
    let queued_by = Instant::now() + BOUND;
    while queue(&other, &name).await.len() < 2 {
        assert!(Instant::now() < queued_by, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let holder_session = holder.session_id();
    let other_session = other.session_id();
    let waiter_session = waiter.session_id();
    // Kill the server just after the holder's first renewal: its next one, due a third of a
    // session later, goes out during the outage if the reconnect takes that long.
    let granted_until = g.safe_until().expect("a leased lock");
    let renewal_by = Instant::now() + BOUND;
    while g.safe_until().unwrap() == granted_until {
        assert!(Instant::now() < renewal_by, "no renewal before the kill");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let safe_until_at_kill = g.safe_until().unwrap();
    assert!(!g.is_lost(), "lost before the server was killed");
    // When each client is connected again after the kill, resuming its session.
    let reconnects = [("holder", &holder), ("other", &other), ("waiter", &waiter)]
        .map(|(who, c)| (who, reconnected(c)));
    let killed_at = Instant::now();
    block_in_place(|| server.kill());
    let restart_took = block_in_place(|| server.restart());
    let serving_at = Instant::now();

    // Each client notices the dead connection at once and reconnects to the restarted server,
    // resuming its session.
    let mut reconnected_after = Vec::new();
    for (who, reconnect) in reconnects {
        let at = tokio::time::timeout(BOUND, reconnect)
            .await
            .unwrap_or_else(|_| panic!("the {who}'s client did not reconnect after the restart"))
            .unwrap();
        reconnected_after.push(format!("{who} {} ms", ms(at - killed_at)));
    }
    assert_eq!(
        holder.session_id(),
        holder_session,
        "the holder's session was replaced, not resumed"
    );

    // A renewal sent after the kill succeeds (the one due in the outage waits for the restarted
    // server): safe-until moves past what only such a renewal can give, before it ran out. (A
    // renewal vouches for the guard's lease, half the session timeout.)
    let renewed_lease = killed_at + g.ttl() - distlock_api::backend::drift(g.ttl());
    let renewed_by = Instant::now() + BOUND;
    while g.safe_until().expect("a leased lock") <= renewed_lease {
        assert!(
            !g.is_lost(),
            "the holder lost the lock {} ms after the kill (reason: {:?}); safe-until was {} ms \
             after the kill",
            ms(killed_at.elapsed()),
            g.lost_reason(),
            signed_ms(killed_at, safe_until_at_kill)
        );
        assert!(Instant::now() < renewed_by, "no renewal after the restart");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let renewed_at = Instant::now();
    assert!(renewed_at < safe_until_at_kill);
    eprintln!(
        "restart: the server served again {} ms after SIGKILL (JVM start {} ms); the clients \
         resumed their sessions after the kill: {reconnected_after:?}; a renewal sent after the \
         kill had moved safe-until on by {} ms after the kill, {} ms before the old safe-until",
        ms(serving_at - killed_at),
        ms(restart_took),
        ms(renewed_at - killed_at),
        ms(safe_until_at_kill - renewed_at),
    );

    // Still the holder, by the server's account and by everyone else's.
    assert!(!g.is_lost(), "{:?}", g.lost_reason());
    assert!(!lost.is_finished(), "lost() fired across the restart");
    assert!(
        other.try_lock(&name).await.unwrap().is_none(),
        "a second client took the lock the holder kept across the restart"
    );
    let info = other.holder(&name).await.unwrap().expect("held");
    assert_eq!(&info.owner, g.owner());
    assert_eq!(info.token, first);
    let nodes = queue(&other, &name).await;
    assert_eq!(nodes.len(), 2, "holder and waiter, nothing else: {nodes:?}");
    assert!(nodes.contains(&node_of(&g)), "{nodes:?}");
    assert!(!waiting.is_finished(), "the waiter gave up or acquired");
    assert_eq!(other.session_id(), other_session, "other's session changed");
    assert_eq!(
        waiter.session_id(),
        waiter_session,
        "the waiter's session changed"
    );

    let released_at = Instant::now();
    assert!(
        g.release().await.expect("release after the restart"),
        "the holder's release found the lock gone"
    );
    let (_, reason) = tokio::time::timeout(BOUND, lost).await.unwrap().unwrap();
    assert_eq!(reason, LostReason::Released);

    // The waiter is told of the release through the watch it re-registered after the restart.
    let (woke_at, g2) = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("the waiter was not woken by the release after the restart")
        .unwrap();
    let g2 = g2.expect("the waiter");
    eprintln!(
        "restart: the waiter acquired {} ms after the release",
        ms(woke_at - released_at)
    );
    assert!(
        woke_at - released_at < WAKE_BOUND,
        "the waiter took {} ms to hear of the release",
        ms(woke_at - released_at)
    );
    assert!(
        g2.token() > first,
        "token {} after the restart, not greater than {first}",
        g2.token()
    );
    assert!(
        other.try_lock(&name).await.unwrap().is_none(),
        "a second client took the waiter's lock"
    );
    let second = g2.token();
    assert!(g2.release().await.unwrap());

    let g3 = other
        .try_lock(&name)
        .await
        .unwrap()
        .expect("the lock is free after the waiter's release");
    assert!(
        g3.token() > second,
        "token {} not greater than {second}",
        g3.token()
    );
    assert!(g3.release().await.unwrap());
    assert!(queue(&other, &name).await.is_empty(), "queue nodes left");
    drop((holder, other, waiter));
    drop(server);
    eprintln!("restart test took {} ms", ms(test_started.elapsed()));
}

// ---------------------------------------------------------------------------------------------
// 2. SIGSTOP for longer than the session timeout, then SIGCONT.

/// Short, as in session_expiry.rs: the server (200 ms tick) grants down to 400 ms.
const PAUSE_SESSION: Duration = Duration::from_secs(1);
/// Three session timeouts: also past the client's own give-up point (7/5 of the session
/// timeout without an answer), so no client can revive its old session when the server thaws.
const PAUSE: Duration = Duration::from_secs(3);
/// How late `lost()` may resolve after safe-until: timer and scheduling delay only.
const LOST_SLACK: Duration = Duration::from_millis(200);

/// A frozen server answers nothing, so the holder cannot renew: its `lost()` must fire by
/// safe-until, while the server still cannot have handed the lock to anyone. Once the server
/// thaws it expires the holder's session and a contender that kept trying acquires with a
/// greater token; the old holder's late release claims nothing and leaves the new holder be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_server_fires_lost_by_safe_until_and_the_next_holder_gets_a_greater_token() {
    if skip("paused_server_fires_lost_by_safe_until_and_the_next_holder_gets_a_greater_token") {
        return;
    }
    let test_started = Instant::now();
    let server = block_in_place(PrivateZk::start);
    let url = server.url();
    let holder = connect(&url, PAUSE_SESSION).await;
    let other = connect(&url, PAUSE_SESSION).await;
    assert_eq!(holder.session_timeout(), PAUSE_SESSION);
    let name = unique("pause");

    let g = holder.lock(&name, BOUND).await.expect("a free lock");
    let first = g.token();
    let lost = watch_lost(&g);
    assert!(
        other.try_lock(&name).await.unwrap().is_none(),
        "a second client took a held lock"
    );

    // The contender waits in the queue from before the pause and keeps trying through it (its
    // own session dies in the pause too) until it holds the lock.
    let contender = {
        let (other, name) = (other.clone(), name.clone());
        tokio::spawn(async move {
            let give_up = Instant::now() + Duration::from_secs(45);
            let mut failures = Vec::new();
            loop {
                match other.lock(&name, Duration::from_secs(2)).await {
                    Ok(g) => return (Instant::now(), g, failures),
                    Err(e) => {
                        assert!(
                            Instant::now() < give_up,
                            "the contender never acquired: {e}"
                        );
                        if e.kind() != ErrorKind::Timeout {
                            failures.push(e.to_string());
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let queued_by = Instant::now() + BOUND;
    while queue(&holder, &name).await.len() < 2 {
        assert!(Instant::now() < queued_by, "the contender never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let paused_at = Instant::now();
    server.pause();
    let (lost_at, reason) = tokio::time::timeout(BOUND, lost)
        .await
        .expect("lost() did not fire while the server was paused")
        .unwrap();
    let safe_until = g.safe_until().expect("a leased lock");
    eprintln!(
        "pause: lost() fired {} ms after SIGSTOP ({reason}); safe-until was {} ms after it, so \
         lost() came {} ms after safe-until",
        ms(lost_at - paused_at),
        signed_ms(paused_at, safe_until),
        signed_ms(safe_until, lost_at),
    );
    assert!(g.is_lost());
    assert!(
        matches!(reason, LostReason::Expired | LostReason::Session(_)),
        "{reason:?}"
    );
    assert!(
        lost_at <= safe_until + LOST_SLACK,
        "lost() fired {} ms after safe-until",
        ms(lost_at - safe_until)
    );
    assert!(
        !contender.is_finished(),
        "the contender acquired while the holder still held the lock"
    );

    tokio::time::sleep_until((paused_at + PAUSE).into()).await;
    assert!(
        !contender.is_finished(),
        "the contender acquired while the server was paused"
    );
    let resumed_at = Instant::now();
    server.resume();
    assert!(lost_at < resumed_at);

    let (acquired_at, g2, failures) = tokio::time::timeout(BOUND, contender)
        .await
        .expect("the contender did not acquire after the server resumed")
        .expect("contender task");
    let mut kinds: Vec<(usize, String)> = Vec::new();
    for f in failures {
        match kinds.iter_mut().find(|(_, k)| *k == f) {
            Some((n, _)) => *n += 1,
            None => kinds.push((1, f)),
        }
    }
    eprintln!(
        "pause: the contender acquired {} ms after SIGCONT ({} ms after the holder's lost()); \
         its failed attempts meanwhile (count, error): {kinds:?}",
        ms(acquired_at - resumed_at),
        ms(acquired_at - lost_at),
    );
    assert!(
        acquired_at > lost_at,
        "acquired {} ms before the holder's lost()",
        ms(lost_at - acquired_at)
    );
    assert!(
        g2.token() > first,
        "token {} of the new holder is not greater than {first}",
        g2.token()
    );
    assert!(!g2.is_lost(), "{:?}", g2.lost_reason());

    // The old holder's late release claims nothing and leaves the new holder alone.
    let late = g.release().await;
    eprintln!("pause: the old holder's late release returned {late:?}");
    assert!(
        !matches!(late, Ok(true)),
        "the old holder's late release claimed a lock it had lost"
    );
    assert!(!g2.is_lost(), "{:?}", g2.lost_reason());
    let info = other
        .holder(&name)
        .await
        .expect("inspect after the pause")
        .expect("held by the new holder");
    assert_eq!(&info.owner, g2.owner());
    assert_eq!(info.token, g2.token());
    assert_eq!(queue(&other, &name).await, [node_of(&g2)], "orphan nodes");
    // The old holder's client carries on in a new session (once it has one), and cannot take
    // the lock from the new holder.
    let retry_by = Instant::now() + BOUND;
    let again = loop {
        match holder.try_lock(&name).await {
            Err(e) if e.kind() == ErrorKind::Unavailable && Instant::now() < retry_by => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other.expect("try_lock in the old holder's new session"),
        }
    };
    assert!(again.is_none(), "the old holder took the lock again");
    assert!(!g2.is_lost(), "{:?}", g2.lost_reason());

    assert!(g2.release().await.unwrap());
    assert!(queue(&other, &name).await.is_empty(), "queue nodes left");
    drop((holder, other));
    drop(server);
    eprintln!("pause test took {} ms", ms(test_started.elapsed()));
}

/// Each request may take the session timeout (or the connect timeout, if longer) before it
/// counts as lost; an acquire that then cleans up its queue node retries the delete for up to
/// three of those (at least 10 s) unless the session ends first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_a_paused_server_fail_with_unavailable_within_their_bounds() {
    if skip("calls_to_a_paused_server_fail_with_unavailable_within_their_bounds") {
        return;
    }
    let server = block_in_place(PrivateZk::start);
    let session = Duration::from_secs(2);
    let config = ZkConfig::from_url(&server.url())
        .map(|c| c.default_ttl(session))
        .map(|c| c.connect_timeout(session))
        .expect("config of the private server");
    let client = Arc::new(ZkLock::connect(config).await.expect("connect"));
    // An open session with its requests answered before the pause.
    let warm = client
        .try_lock(&unique("warm"))
        .await
        .unwrap()
        .expect("free");
    assert!(warm.release().await.unwrap());

    server.pause();
    let op = session; // max(session timeout, connect timeout)
    let bound = (op * 3).max(Duration::from_secs(10)) + op + Duration::from_secs(2);
    let started = Instant::now();
    let attempt = tokio::time::timeout(bound * 2, client.try_lock(&unique("paused"))).await;
    let took = started.elapsed();
    eprintln!("try_lock against the paused server ended after {took:?}");
    let err = match attempt {
        Err(_) => panic!("try_lock hung: no answer after {:?}", bound * 2),
        Ok(Ok(_)) => panic!("try_lock succeeded against a paused server"),
        Ok(Err(e)) => e,
    };
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_temporary(), "{err}");
    assert!(
        took <= bound,
        "try_lock took {took:?}, over its bound of {bound:?}"
    );

    let started = Instant::now();
    let asked = tokio::time::timeout(bound * 2, client.holder("paused-holder")).await;
    let took = started.elapsed();
    eprintln!("holder() against the paused server ended after {took:?}");
    let err = asked
        .expect("holder() hung")
        .expect_err("holder() answered from a paused server");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        took <= op + Duration::from_secs(2),
        "holder() took {took:?}"
    );

    server.resume();
    // The client comes back with a new session and locks again.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match client.try_lock(&unique("after")).await {
            Ok(Some(g)) => {
                assert!(g.release().await.unwrap());
                break;
            }
            other => assert!(
                Instant::now() < deadline,
                "the client did not recover after the resume: {:?}",
                other.map(|g| g.is_some())
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
