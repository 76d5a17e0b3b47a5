//! What an operator sees and does: listing held locks, when a grant began, freeing a stuck one.

use super::*;

pub(super) async fn list_shows_exactly_the_held_locks_under_a_prefix(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let prefix = cx.name("ls/");
    // Names a backend must encode (a slash, dots, non-ASCII) come back as the user wrote them.
    let names = [
        format!("{prefix}a"),
        format!("{prefix}b/c"),
        format!("{prefix}.."),
        format!("{prefix}zürich"),
    ];
    let outside = cx.name("lt/a");
    let mut guards = Vec::new();
    for n in &names {
        guards.push(must_lock(&a, n).await);
    }
    let other = must_lock(&b, &outside).await;

    let listed = b.list(&prefix).await.expect("list");
    let got: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
    let mut want: Vec<&str> = names.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(
        got, want,
        "list({prefix:?}) must show exactly the held names, in order"
    );
    for (name, info) in &listed {
        let g = guards.iter().find(|g| g.name() == name).expect("listed");
        assert_eq!(&info.owner, g.owner(), "{name}");
        assert_eq!(info.token, g.token(), "{name}");
        assert_eq!(info.hold_count, 1, "{name}");
    }
    // The whole case prefix takes in the name outside the listing prefix too.
    let all = a.list(cx.prefix()).await.expect("list");
    assert_eq!(all.len(), names.len() + 1, "{all:?}");

    // A released lock leaves the listing at once.
    let first = guards.remove(0);
    assert!(first.release().await.unwrap());
    let listed = b.list(&prefix).await.expect("list");
    assert_eq!(listed.len(), names.len() - 1, "{listed:?}");
    assert!(listed.iter().all(|(n, _)| n.as_str() != names[0]));
    for g in guards {
        assert!(g.release().await.unwrap());
    }
    assert!(other.release().await.unwrap());
    assert!(a.list(cx.prefix()).await.expect("list").is_empty());
}

pub(super) async fn bad_list_prefix_is_invalid_argument(cx: Ctx) {
    let c = cx.client().await;
    for bad in ["a\nb".to_string(), "\0".to_string(), "x".repeat(256)] {
        let e = c.list(&bad).await.expect_err("bad prefix accepted");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad:?}: {e}");
        if let Some(Ok(dead)) = cx.harness().unreachable_client().await {
            let e = dead.list(&bad).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "before any I/O: {e}");
        }
    }
    let e = c.force_release("", FencingToken(1)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
}

pub(super) async fn force_release_frees_only_the_grant_of_its_token(cx: Ctx) {
    let (a, b, op) = (cx.client().await, cx.client().await, cx.client().await);
    let name = cx.name("force");
    assert!(
        !op.force_release(&name, FencingToken(1)).await.unwrap(),
        "free lock"
    );
    let held = must_lock(&a, &name).await;
    // A stuck holder may hold more than once.
    let again = match a.capabilities().reentrant {
        true => Some(held.reenter().await.expect("re-enter")),
        false => None,
    };
    let token = op.holder(&name).await.unwrap().expect("held").token;
    assert_eq!(token, held.token());

    let wrong = FencingToken(token.0.wrapping_add(1));
    assert!(
        !op.force_release(&name, wrong).await.unwrap(),
        "another token"
    );
    assert_eq!(holder_of(&op, &name).await.as_ref(), Some(held.owner()));

    let waiter = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move { b.lock(&name, LONG_WAIT).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        op.force_release(&name, token).await.unwrap(),
        "the holder's token"
    );
    let next = tokio::time::timeout(LONG_WAIT, waiter)
        .await
        .expect("the waiter was granted after the forced release")
        .unwrap()
        .expect("granted");
    assert_eq!(holder_of(&op, &name).await.as_ref(), Some(next.owner()));

    // The old token no longer frees anything: the lock changed hands.
    assert!(
        !op.force_release(&name, token).await.unwrap(),
        "a newer holder"
    );
    assert_eq!(holder_of(&op, &name).await.as_ref(), Some(next.owner()));
    // The freed holder's releases answer "not held" and leave the new holder alone.
    if let Some(g) = again {
        assert!(!g.release().await.unwrap());
    }
    assert!(!held.release().await.unwrap());
    assert_eq!(holder_of(&op, &name).await.as_ref(), Some(next.owner()));
    assert!(next.release().await.unwrap());
}

pub(super) async fn holder_tells_when_the_grant_began(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let name = cx.name("since");
    // The server's clock is this machine's in the suite (loopback), up to its own resolution.
    let slack = Duration::from_secs(2);
    let before = SystemTime::now();
    let first = must_lock(&a, &name).await;
    let after = SystemTime::now();
    let info = b.holder(&name).await.unwrap().expect("held");
    let Some(since) = info.since else {
        // Not every server keeps a time with a lock (etcd keys carry none): it must then say
        // nothing, never a made-up time, for every grant.
        assert!(first.release().await.unwrap());
        let g = must_lock(&a, &name).await;
        assert_eq!(b.holder(&name).await.unwrap().expect("held").since, None);
        assert!(g.release().await.unwrap());
        return;
    };
    assert!(
        since + slack >= before && since <= after + slack,
        "since {since:?} is not between {before:?} and {after:?}"
    );
    if a.capabilities().reentrant {
        let inner = first.reenter().await.unwrap();
        let info = b.holder(&name).await.unwrap().expect("held");
        assert_eq!(info.since, Some(since), "a re-entry does not move it");
        assert!(inner.release().await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(first.release().await.unwrap());
    let second = must_lock(&b, &name).await;
    let later = b.holder(&name).await.unwrap().expect("held").since;
    assert!(
        later.is_some_and(|t| t > since),
        "a later grant began later: {later:?} after {since:?}"
    );
    assert!(second.release().await.unwrap());
}

/// A re-entry that finds its hold gone (an operator freed it; on a long lease the holder would
/// learn of that only at its next renewal) fails with `Lost`, and the guard reports lost at
/// once: the library never says "ended" to the re-entry while the guard still claims the lock.
pub(super) async fn a_reentry_that_finds_its_hold_gone_reports_the_guard_lost(cx: Ctx) {
    let (a, op) = (cx.client().await, cx.client().await);
    let name = cx.name("reenter-gone");
    let held = a
        .try_lock_with(&name, &LockOptions::new().watchdog_ttl(LONG_LEASE))
        .await
        .unwrap()
        .expect("free");
    assert!(op.force_release(&name, held.token()).await.unwrap());
    let e = held
        .reenter()
        .await
        .expect_err("re-entered a hold an operator freed");
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
    assert!(
        held.is_lost(),
        "the re-entry found the hold gone, yet the guard still claims it"
    );
    let reason = tokio::time::timeout(Duration::from_secs(1), held.lost())
        .await
        .expect("lost() resolves at once");
    assert!(
        !matches!(reason, LostReason::Released),
        "lost, not released: {reason}"
    );
    assert!(!held.release().await.unwrap());
    assert_eq!(op.holder(&name).await.unwrap(), None, "nothing left held");
}

/// A lease long beside any test step: the holder's first renewal is a third of it away.
const LONG_LEASE: Duration = Duration::from_secs(60);
