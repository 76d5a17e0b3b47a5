//! Faults: holder processes killed, paused and cut off, servers gone for a while (lost answers: `lost_replies.rs`).

use super::*;

/// A child process of the suite's own test binary holding a lock (see the runner's holder mode).
pub(super) struct HolderProcess {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    /// The token of the child's grant.
    token: u64,
}

impl HolderProcess {
    /// Starts the child (with `mode`, if any) and waits until it holds `name`.
    async fn spawn(name: &str, mode: Option<&str>) -> Self {
        use tokio::io::AsyncBufReadExt;
        let exe = std::env::current_exe().expect("test binary path");
        let mut cmd = tokio::process::Command::new(exe);
        cmd.env(crate::case::HOLDER_CHILD_ENV, name)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        if let Some(mode) = mode {
            cmd.env(crate::case::HOLDER_MODE_ENV, mode);
        }
        let mut child = cmd.spawn().expect("spawn the holder process");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut holder = Self {
            child,
            lines: tokio::io::BufReader::new(stdout).lines(),
            token: 0,
        };
        let line = holder.next_line("take the lock").await;
        holder.token = line
            .strip_prefix("HELD ")
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected line from the holder: {line:?}"));
        holder
    }

    /// The child's next line of output; panics saying it did not `what` within 30 s.
    async fn next_line(&mut self, what: &str) -> String {
        tokio::time::timeout(Duration::from_secs(30), self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("the holder process did not {what} within 30 s"))
            .expect("read the holder's stdout")
            .unwrap_or_else(|| panic!("the holder process exited before it could {what}"))
    }
}

/// Waits for `name`, which only the lease of a holder process that was just `what` (killed,
/// paused) can free, and checks that the new grant's token is greater than that holder's.
pub(super) async fn take_over(
    other: &Arc<dyn DistributedLock>,
    name: &str,
    holder_token: u64,
    what: &str,
) -> LockGuard {
    let since = Instant::now();
    let g = other
        .lock(name, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("the lock of a {what} holder was never freed: {e}"));
    eprintln!("freed {:?} after the holder was {what}", since.elapsed());
    if other.capabilities().fencing_tokens() {
        assert!(
            g.token().0 > holder_token,
            "token {} after the {what} holder's {holder_token}",
            g.token()
        );
    }
    g
}

pub(super) async fn killed_holder_process_frees_the_lock_after_its_lease(cx: Ctx) {
    let name = cx.name("killed");
    let holder = HolderProcess::spawn(&name, None).await;
    let (mut child, child_token) = (holder.child, holder.token);
    let other = cx.client().await;
    assert!(
        other.try_lock(&name).await.unwrap().is_none(),
        "the holder process does not hold it"
    );
    // SIGKILL: no release, no session close, no lease revoke. Only the lease can free it.
    child.start_kill().expect("kill the holder");
    let _ = child.wait().await;
    let g = take_over(&other, &name, child_token, "killed").await;
    assert!(g.release().await.unwrap());
}

/// After an old holder's late release: `other`'s guard `g` still holds `name`.
pub(super) async fn new_holder_still_holds(
    other: &Arc<dyn DistributedLock>,
    name: &str,
    g: &LockGuard,
) {
    assert!(!g.is_lost(), "the new holder's guard says lost");
    let info = other
        .holder(name)
        .await
        .unwrap()
        .expect("the late release freed the new holder's lock");
    assert_eq!(&info.owner, g.owner());
}

/// A holder frozen past its lease (a stop-the-world pause, a suspended VM): the server frees the
/// lock, a new holder gets a greater token, and when the old holder runs again its guard says
/// lost and its late release does not free the new holder's lock.
pub(super) async fn paused_holder_process_learns_it_lost_the_lock_and_cannot_release_it(cx: Ctx) {
    use tokio::io::AsyncWriteExt;
    let name = cx.name("paused");
    let mut holder = HolderProcess::spawn(&name, Some("check")).await;
    let child_token = holder.token;
    let mut stdin = holder.child.stdin.take().expect("piped stdin");
    let pid = holder.child.id().expect("the holder process is running");
    let other = cx.client().await;
    assert!(
        other.try_lock(&name).await.unwrap().is_none(),
        "the holder process does not hold it"
    );
    crate::send_signal(pid, "STOP");
    let g = take_over(&other, &name, child_token, "paused").await;
    crate::send_signal(pid, "CONT");
    stdin.write_all(b"CHECK\n").await.expect("ask the holder");
    stdin.flush().await.expect("ask the holder");
    let line = holder.next_line("report after the pause").await;
    let report = line
        .strip_prefix("AFTER ")
        .unwrap_or_else(|| panic!("unexpected line from the holder: {line:?}"));
    eprintln!("the resumed holder: {report}");
    assert!(
        report.starts_with("lost=true "),
        "the resumed holder's guard does not say lost: {report}"
    );
    assert!(
        !report.ends_with("release=ok:true"),
        "the resumed holder's release claims it still held the lock: {report}"
    );
    let _ = holder.child.wait().await;
    // Whatever the late release did, the new holder still holds the lock.
    new_holder_still_holds(&other, &name, &g).await;
    assert!(g.release().await.unwrap());
}

/// A holder cut off from its server(s) by a partition (a loopback proxy that drops every byte)
/// while its process runs on: its guard reports lost, and its safe-until has passed before the
/// server lets another client have the lock, which gets a greater token. Once the partition
/// heals, the old holder's late release neither claims the lock nor frees it, and the old
/// client works again.
pub(super) async fn partitioned_holder_is_lost_before_anyone_else_acquires(cx: Ctx) {
    let link = Link::new(&cx).await;
    let holder = link.client(&cx).await;
    let h = cx.harness();
    let other = cx.client().await;
    let name = cx.name("partitioned");
    let g = holder.lock(&name, LONG_WAIT).await.unwrap();
    let first = g.token();
    let lost = g.lost();
    // Renewals go through the proxy before the cut.
    tokio::time::sleep(h.short_ttl()).await;
    assert!(!g.is_lost(), "lost before the cut: {:?}", g.lost_reason());
    let waiting = {
        let (other, name) = (other.clone(), name.clone());
        tokio::spawn(async move {
            let g = other.lock(&name, Duration::from_secs(60)).await;
            (Instant::now(), g)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    let cut_at = Instant::now();
    link.cut();
    let reason = tokio::time::timeout(Duration::from_secs(60), lost)
        .await
        .expect("lost() did not fire while the holder was cut off");
    let lost_after = cut_at.elapsed();
    assert_ne!(reason, LostReason::Released);
    let (acquired_at, g2) = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("the server never freed the cut-off holder's lock")
        .expect("waiter task");
    let g2 = g2.expect("the other client's acquire");
    if other.capabilities().fencing_tokens() {
        assert!(
            g2.token() > first,
            "token {} after the cut-off holder's {first}",
            g2.token()
        );
    }
    // The safety promise: the holder stops claiming the lock before anyone else has it.
    let until = g.safe_until().expect("a leased grant has a safe-until");
    assert!(
        until <= acquired_at,
        "the cut-off holder could claim the lock {:?} after another client acquired it",
        until - acquired_at
    );
    assert!(g.is_lost());
    eprintln!(
        "cut at 0: the holder's safe-until {:?}, lost() {lost_after:?} ({reason}), the other \
         client acquired {:?}",
        until.saturating_duration_since(cut_at),
        acquired_at.saturating_duration_since(cut_at)
    );

    link.heal();
    late_release_claims_nothing(g, "cut off").await;
    new_holder_still_holds(&other, &name, &g2).await;

    // The healed client recovers: a fresh lock works within a bound, errors on the way allowed
    // (connections that were cut end and are made anew).
    let fresh = cx.name("partitioned-healed");
    let by = Instant::now() + Duration::from_secs(30);
    let g3 = loop {
        match tokio::time::timeout(Duration::from_secs(5), holder.lock(&fresh, LONG_WAIT)).await {
            Ok(Ok(g3)) => break g3,
            outcome if Instant::now() >= by => {
                panic!("the old client did not recover after the partition healed: {outcome:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert!(g3.release().await.unwrap());
    assert!(g2.release().await.unwrap());
}

/// The cases that put a proxy (a `Link`) between clients and servers: not applicable to a harness
/// whose clients cannot be routed through stand-ins for its servers
/// ([`Harness::not_applicable`](crate::Harness::not_applicable)).
pub static THROUGH_PROXIES: &[&str] = &[
    "partitioned_holder_is_lost_before_anyone_else_acquires",
    "an_acquire_whose_reply_is_lost_is_given_back",
    "an_explicit_owners_acquire_whose_reply_is_lost_is_given_back",
    "a_lost_reentry_is_given_back_and_the_live_hold_kept",
    "a_lost_acquire_by_an_owner_that_holds_leaves_its_hold_alone",
    "a_release_the_server_never_got_is_sent_again",
    "a_release_applied_before_its_connection_closed_is_not_applied_again",
    "a_client_whose_connections_went_silent_works_again_on_new_ones",
    "waiter_outlives_a_server_outage_and_leaves_nothing_behind",
];

/// A proxy in front of every server of a backend: the network between one set of clients and
/// the servers.
pub(super) struct Link {
    proxies: Arc<Vec<Proxy>>,
    addrs: Vec<String>,
}

impl Link {
    pub(super) async fn new(cx: &Ctx) -> Self {
        let h = cx.harness();
        let upstreams = h.upstreams();
        assert!(
            !upstreams.is_empty(),
            "the {} harness names no server address to cut",
            h.backend()
        );
        let mut proxies = Vec::new();
        for upstream in upstreams {
            proxies.push(Proxy::start(upstream).await);
        }
        let addrs = proxies.iter().map(Proxy::addr).collect();
        // Work the case leaves to the background (a release sent again, a hold given back)
        // goes through the proxies: they stay until the leftovers are checked.
        let proxies = Arc::new(proxies);
        cx.keep_until_checked(proxies.clone());
        Link { proxies, addrs }
    }

    /// A client of `cx`'s backend through this link.
    pub(super) async fn client(&self, cx: &Ctx) -> Arc<dyn DistributedLock> {
        let h = cx.harness();
        h.client_via(&self.addrs)
            .await
            .unwrap_or_else(|e| panic!("a {} client through a proxy: {e}", h.backend()))
    }

    pub(super) fn cut(&self) {
        self.proxies.iter().for_each(Proxy::cut);
    }

    pub(super) fn heal(&self) {
        self.proxies.iter().for_each(Proxy::heal);
    }

    pub(super) fn strand(&self) {
        self.proxies.iter().for_each(Proxy::strand);
    }

    pub(super) fn mute(&self) {
        self.proxies.iter().for_each(|p| p.mute(true));
    }
}

/// Awaits `f`, failing the case if it takes a minute: a request without an answer must end.
pub(super) async fn within_a_minute<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("a request without an answer hung for a minute")
}

/// The late release of `g`, a guard whose lock was lost while it was `what`: it must answer
/// within 30 s and must not claim it still held the lock.
pub(super) async fn late_release_claims_nothing(g: LockGuard, what: &str) {
    let late = tokio::time::timeout(Duration::from_secs(30), g.release())
        .await
        .unwrap_or_else(|_| panic!("the old holder's release hung after it was {what}"));
    assert!(
        !matches!(late, Ok(true)),
        "the old holder's late release claims it held the lock while it was {what}"
    );
}

/// The server is out of reach of a holder and a queued waiter alike (as if it were paused or
/// cut off) for longer than the lease, then comes back. The holder's guard reports lost; the
/// waiter's acquire ends within its bound, either with the lock (a greater token, and nobody
/// else can have it meanwhile) or with a temporary error; and whichever it was, nothing is left
/// behind: a third client gets the lock afterwards.
pub(super) async fn waiter_outlives_a_server_outage_and_leaves_nothing_behind(cx: Ctx) {
    const WAIT: Duration = Duration::from_secs(60);
    let link = Link::new(&cx).await;
    let holder = link.client(&cx).await;
    let waiter = link.client(&cx).await;
    let third = cx.client().await;
    let name = cx.name("outage");
    let g = holder.lock(&name, LONG_WAIT).await.unwrap();
    let first = g.token();
    let waiting = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let g = waiter.lock(&name, WAIT).await;
            (started.elapsed(), g)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the waiter did not wait");

    link.cut();
    tokio::time::timeout(Duration::from_secs(60), g.lost())
        .await
        .expect("the holder's guard never said lost while the server was out of reach");
    // Past the holder's lease as the server counts it, too.
    tokio::time::sleep(cx.harness().short_ttl() + Duration::from_millis(500)).await;
    link.heal();

    let (took, outcome) = tokio::time::timeout(WAIT + Duration::from_secs(30), waiting)
        .await
        .expect("the waiter's acquire outran its wait bound")
        .expect("waiter task");
    eprintln!(
        "the waiter's acquire ended after {took:?}: {}",
        match &outcome {
            Ok(g2) => format!("granted, token {}", g2.token()),
            Err(e) => format!("error: {e}"),
        }
    );
    assert!(g.is_lost());
    late_release_claims_nothing(g, "out of reach").await;
    match outcome {
        Ok(g2) => {
            if waiter.capabilities().fencing_tokens() {
                assert!(g2.token() > first, "token {} after {first}", g2.token());
            }
            assert!(
                third.try_lock(&name).await.unwrap().is_none(),
                "a third client got the lock the waiter was granted"
            );
            assert!(
                tokio::time::timeout(Duration::from_secs(30), g2.release())
                    .await
                    .expect("the waiter's release hung")
                    .unwrap(),
                "the waiter's grant was not held at release"
            );
        }
        Err(e) => assert!(
            e.is_temporary(),
            "the waiter failed with a permanent error after a passing outage: {e}"
        ),
    }
    let g3 = tokio::time::timeout(Duration::from_secs(30), third.lock(&name, WAIT))
        .await
        .expect("the lock stayed taken after the outage: something was left behind")
        .unwrap();
    if third.capabilities().fencing_tokens() {
        assert!(g3.token() > first);
    }
    assert!(g3.release().await.unwrap());
}
