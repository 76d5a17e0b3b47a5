//! Answers lost between client and server (a `Link` muted or cut, then healed): an acquire whose
//! answer never came is given back, a live hold is never taken with it, and a release the server
//! never got is sent again.

use super::faults::{within_a_minute, Link};
use super::*;

/// The server applies an acquire whose answer is lost on the way back; the client reports
/// `Unavailable`. Once the link is back, the hold nobody has a guard for must be given back,
/// long before its 10-minute lease would end.
pub(super) async fn an_acquire_whose_reply_is_lost_is_given_back(cx: Ctx) {
    let link = Link::new(&cx).await;
    let c = link.client(&cx).await;
    let other = cx.client().await;
    let name = cx.name("lost-reply");
    // A fresh connection first, so the muted request is the acquire itself.
    assert!(holder_of(&c, &name).await.is_none());
    link.mute();
    let long = LockOptions::new().ttl(Duration::from_secs(600));
    let outcome = tokio::time::timeout(Duration::from_secs(60), c.try_lock_with(&name, &long))
        .await
        .expect("an acquire without an answer hung for a minute");
    let e = outcome.expect_err("granted without an answer from the server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    // Where the server applied it (a script or a single statement does; a transaction whose
    // commit was never sent does not), the lock is held by an owner no guard knows of.
    if let Some(ghost) = holder_of(&other, &name).await {
        assert_eq!(ghost.label(), c.core().owner().label(), "held by {ghost}");
    }
    link.heal();
    let started = Instant::now();
    let g = match other.lock(&name, Duration::from_secs(30)).await {
        Ok(g) => g,
        Err(e) => panic!(
            "the lost acquire's hold was never given back ({e}); {}",
            why_not_given_back(&c, &other, &name).await
        ),
    };
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "given back after {:?}",
        started.elapsed()
    );
    assert_eq!(holder_of(&other, &name).await.as_ref(), Some(g.owner()));
    assert!(g.release().await.unwrap());
    // Settled in the background: every master, row or key is clean again, in time.
    cx.until_nothing_is_left(Duration::from_secs(30)).await;
}

/// What a failed give-back case knows when it fails: who holds the name now (read by the
/// other client) and whether the client that lost the answer reaches the server again (the
/// give-back runs on it). Only for the failure message.
async fn why_not_given_back(
    lost: &Arc<dyn DistributedLock>,
    other: &Arc<dyn DistributedLock>,
    name: &str,
) -> String {
    let held = match other.holder(name).await {
        Ok(Some(i)) => format!(
            "held by {} ({} holds, token {:?}, {:?} left)",
            i.owner, i.hold_count, i.token, i.remaining
        ),
        Ok(None) => "free now (so the waiter missed its release)".to_string(),
        Err(e) => format!("holder() failed: {e}"),
    };
    // A name nobody locks: the read only shows whether the client works.
    let probe = format!("{name}-probe");
    let reach = match tokio::time::timeout(Duration::from_secs(10), lost.holder(&probe)).await {
        Ok(Ok(_)) => "the client that lost the answer reaches the server".to_string(),
        Ok(Err(e)) => format!("the client that lost the answer still fails: {e}"),
        Err(_) => "the client that lost the answer got no answer within 10 s".to_string(),
    };
    format!("{held}; {reach}")
}

/// Like [`an_acquire_whose_reply_is_lost_is_given_back`], with an explicit owner: its hold is
/// given back too (this handle has no guard of that owner, so every hold of it is surplus).
pub(super) async fn an_explicit_owners_acquire_whose_reply_is_lost_is_given_back(cx: Ctx) {
    let link = Link::new(&cx).await;
    let c = link.client(&cx).await;
    let other = cx.client().await;
    let name = cx.name("lost-explicit");
    assert!(holder_of(&c, &name).await.is_none());
    link.mute();
    let long = LockOptions::new()
        .ttl(Duration::from_secs(600))
        .owner(OwnerId::new("batch-job").unwrap());
    let e = within_a_minute(c.try_lock_with(&name, &long))
        .await
        .expect_err("granted without an answer from the server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    link.heal();
    let g = match other.lock(&name, Duration::from_secs(30)).await {
        Ok(g) => g,
        Err(e) => panic!(
            "the explicit owner's lost acquire was never given back ({e}); {}",
            why_not_given_back(&c, &other, &name).await
        ),
    };
    assert_eq!(holder_of(&other, &name).await.as_ref(), Some(g.owner()));
    assert!(g.release().await.unwrap());
    // Settled in the background: every master, row or key is clean again, in time.
    cx.until_nothing_is_left(Duration::from_secs(30)).await;
}

/// An explicit owner holds; its second acquire (a re-entry) is applied but the answer is lost.
/// The give-back takes that one hold away and leaves the guard's: the lock stays held by the
/// guard, with one hold, and is free as soon as the guard releases it.
pub(super) async fn a_lost_reentry_is_given_back_and_the_live_hold_kept(cx: Ctx) {
    let link = Link::new(&cx).await;
    let c = link.client(&cx).await;
    let other = cx.client().await;
    let name = cx.name("lost-reentry");
    let long = LockOptions::new()
        .ttl(Duration::from_secs(600))
        .owner(OwnerId::new("ledger").unwrap());
    let held = c.try_lock_with(&name, &long).await.unwrap().expect("free");
    link.mute();
    let e = within_a_minute(c.try_lock_with(&name, &long))
        .await
        .expect_err("re-entered without an answer from the server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    link.heal();
    until_answering(&c, &name).await;
    // The surplus hold goes; the guard's stays.
    let started = Instant::now();
    let holds = loop {
        let info = other
            .holder(&name)
            .await
            .unwrap()
            .expect("the guard's hold ended");
        assert_eq!(&info.owner, held.owner(), "held by another owner");
        if info.hold_count == 1 || started.elapsed() > Duration::from_secs(30) {
            break info.hold_count;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(holds, 1, "the lost re-entry's hold was never given back");
    only_the_guard_holds_until_it_releases(&cx, &other, &name, held).await;
}

/// An explicit owner holds; its second acquire never reaches the server (the link is cut). The
/// give-back that follows must find nothing to give back: the one hold on the server is the
/// guard's, which this handle accounts for, and taking it would free a lock a guard relies on.
pub(super) async fn a_lost_acquire_by_an_owner_that_holds_leaves_its_hold_alone(cx: Ctx) {
    let link = Link::new(&cx).await;
    let c = link.client(&cx).await;
    let other = cx.client().await;
    let name = cx.name("lost-kept");
    let long = LockOptions::new()
        .ttl(Duration::from_secs(600))
        .owner(OwnerId::new("ledger").unwrap());
    let held = c.try_lock_with(&name, &long).await.unwrap().expect("free");
    link.cut();
    let e = within_a_minute(c.try_lock_with(&name, &long))
        .await
        .expect_err("acquired without an answer from the server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    link.heal();
    until_answering(&c, &name).await;
    // The give-back looks at 50, 100, 200, 400, 800 ms: by 2 s it has looked several times
    // with the server answering.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let info = other
        .holder(&name)
        .await
        .unwrap()
        .expect("the guard's hold was taken");
    assert_eq!((&info.owner, info.token), (held.owner(), held.token()));
    assert_eq!(info.hold_count, 1);
    assert!(other.try_lock(&name).await.unwrap().is_none());
    assert!(held.release().await.unwrap(), "the guard no longer held");
    // Settled in the background: every master, row or key is clean again, in time.
    cx.until_nothing_is_left(Duration::from_secs(30)).await;
}

/// A release cut off on its way to the server is `Unavailable` to the caller, and is sent again
/// once the server can be reached: the lock is free long before its 10-minute lease ends.
pub(super) async fn a_release_the_server_never_got_is_sent_again(cx: Ctx) {
    let link = Link::new(&cx).await;
    let c = link.client(&cx).await;
    let other = cx.client().await;
    let name = cx.name("lost-release");
    let long = LockOptions::new().ttl(Duration::from_secs(600));
    let g = c.try_lock_with(&name, &long).await.unwrap().expect("free");
    link.cut();
    let e = within_a_minute(g.release())
        .await
        .expect_err("released without an answer from the server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(
        other.try_lock(&name).await.unwrap().is_none(),
        "freed while cut off"
    );
    link.heal();
    let next = other
        .lock(&name, Duration::from_secs(30))
        .await
        .expect("the release was never sent again");
    assert!(next.release().await.unwrap());
    // Settled in the background: every master, row or key is clean again, in time.
    cx.until_nothing_is_left(Duration::from_secs(30)).await;
}

/// An explicit owner holds twice (a re-entry). One guard's release reaches the server, which
/// applies it, and its answer is lost; then the connection closes (the link heals, and a
/// firewall drops the connection that lost bytes) while the client still waits. Whatever the
/// client does next, on a new connection, must not apply that release again: the owner keeps
/// its other hold, exactly one, and nobody else gets the lock until that guard releases it.
/// A driver that re-sends a request whose connection dropped (as a cluster client may, to follow
/// a moved slot) would take the live guard's hold with it.
pub(super) async fn a_release_applied_before_its_connection_closed_is_not_applied_again(cx: Ctx) {
    let link = Link::new(&cx).await;
    let c = link.client(&cx).await;
    let other = cx.client().await;
    let name = cx.name("closed-release");
    let long = LockOptions::new()
        .ttl(Duration::from_secs(600))
        .owner(OwnerId::new("ledger").unwrap());
    let outer = c.try_lock_with(&name, &long).await.unwrap().expect("free");
    let inner = c
        .try_lock_with(&name, &long)
        .await
        .unwrap()
        .expect("re-entered");
    assert_eq!(holder_of(&other, &name).await.map(|_| ()), Some(()));
    link.mute();
    let releasing = tokio::spawn(async move { inner.release().await });
    // The release is on the server by now, well within the client's operation timeout.
    tokio::time::sleep(Duration::from_millis(300)).await;
    link.heal();
    let released = within_a_minute(releasing).await.expect("the release task");
    if let Err(e) = &released {
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    }
    until_answering(&c, &name).await;
    // Any settling of the lost answer has looked several times by now (see above).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let info = other.holder(&name).await.unwrap().unwrap_or_else(|| {
        panic!(
            "the release ({released:?}) was applied twice: the lock is free while a guard holds it"
        )
    });
    assert_eq!(&info.owner, outer.owner());
    assert_eq!(
        info.hold_count, 1,
        "the owner's holds after one of its two guards released ({released:?})"
    );
    only_the_guard_holds_until_it_releases(&cx, &other, &name, outer).await;
}

/// Every connection the client has goes silent for good without closing (a half-open
/// connection: the server's host rebooted, a NAT entry expired), while new connections would
/// work. The calls that meet the silence may fail `Unavailable`, each within its timeout, but
/// the client must not keep the dead connections: within a minute it acquires and releases
/// again, on new ones.
pub(super) async fn a_client_whose_connections_went_silent_works_again_on_new_ones(cx: Ctx) {
    let link = Link::new(&cx).await;
    let c = link.client(&cx).await;
    let other = cx.client().await;
    let name = cx.name("silent");
    // Connections in use first, so that the silence meets them.
    let g = c.try_lock(&name).await.unwrap().expect("free");
    assert!(g.release().await.unwrap());
    link.strand();
    let started = Instant::now();
    let mut failed = Vec::new();
    let g = loop {
        let call = Instant::now();
        match tokio::time::timeout(Duration::from_secs(30), c.try_lock(&name)).await {
            Ok(Ok(Some(g))) => break g,
            Ok(Ok(None)) => panic!(
                "refused: held by {:?} (the give-back of a lost acquire should free it)",
                holder_of(&other, &name).await
            ),
            Ok(Err(e)) => {
                assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
                failed.push(format!("{:?}: {e}", call.elapsed()));
            }
            Err(_) => panic!("a try_lock on a silent connection got no answer in 30 s"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "still failing a minute after the connections went silent: {failed:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "{}: acquired on new connections {:?} after the silence, {} failed calls first",
        cx.harness().backend(),
        started.elapsed(),
        failed.len()
    );
    assert!(g.release().await.unwrap());
    let again = c
        .try_lock(&name)
        .await
        .unwrap()
        .expect("free after the release");
    assert!(again.release().await.unwrap());
    // Settled in the background: every master, row or key is clean again, in time.
    cx.until_nothing_is_left(Duration::from_secs(30)).await;
}

/// The end of a case where `guard` is left the name's one hold: it still believes, nobody else
/// gets the lock, its release frees it, and nothing is left behind.
async fn only_the_guard_holds_until_it_releases(
    cx: &Ctx,
    other: &Arc<dyn DistributedLock>,
    name: &str,
    guard: LockGuard,
) {
    assert!(!guard.is_lost());
    assert!(other.try_lock(name).await.unwrap().is_none());
    assert!(guard.release().await.unwrap(), "the guard no longer held");
    let g = other
        .try_lock(name)
        .await
        .unwrap()
        .expect("free once the guard released its one hold");
    assert!(g.release().await.unwrap());
    // Settled in the background: every master, row or key is clean again, in time.
    cx.until_nothing_is_left(Duration::from_secs(30)).await;
}

/// Waits until `c`, cut off and healed, answers a read again. A client may reconnect after a
/// cut (a cluster client also reloads its slot map), and what follows must run with the server
/// answering it: a give-back given time to look, a guard's release through `c`.
async fn until_answering(c: &Arc<dyn DistributedLock>, name: &str) {
    within_a_minute(async {
        while c.holder(name).await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}
