//! The promises of [`DistributedLock::hand_over`], for a backend that
//! [hands locks over](distlock_api::Profile::hands_over), checked by calling it directly against the
//! backend's real server: the releasing grant comes from `attempt`, the waiting task's request
//! has an owner id of its own, and what the request did is read back with `inspect`, `release`
//! and `renew`. For backends whose fencing tokens come from one counter per name, bumped once
//! per grant (Redis, MySQL/MariaDB, MongoDB): a token the checks do not see issued shows up as
//! a gap between two tokens.

use std::time::{Duration, Instant};

use distlock_api::backend::wait::HandOver;
use distlock_api::backend::AcquireRequest;
use distlock_api::{DistributedLock, ErrorKind, Grant, LockInfo, LockName};

/// A request for `name` under a fresh owner id of `lock`'s.
pub fn request<L: DistributedLock + ?Sized>(
    lock: &L,
    name: &LockName,
    ttl: Duration,
) -> AcquireRequest {
    AcquireRequest::new(name.clone(), lock.core().next_owner(), ttl)
        .unwrap_or_else(|e| panic!("a request for {name}: {e}"))
}

/// `req`'s grant, by one attempt at a free name.
pub async fn granted<L: DistributedLock + ?Sized>(lock: &L, req: &AcquireRequest) -> Grant {
    lock.attempt(req)
        .await
        .unwrap_or_else(|e| panic!("attempt: {e}"))
        .into_grant()
        .expect("the name is free")
}

async fn held<L: DistributedLock + ?Sized>(lock: &L, name: &LockName) -> LockInfo {
    lock.inspect(name)
        .await
        .unwrap_or_else(|e| panic!("inspect: {e}"))
        .expect("the name is held")
}

/// A last hold passes to the waiting task's owner with the next token, hold count 1 and the
/// task's own lease (shorter, then longer, than the releasing grant's), judged from the
/// request's send; the old grant holds nothing any more (release, renew and another hand-over
/// find nothing), the new one is a grant like any other, and the next fresh grant's token
/// follows the last hand-over's. `name` must be free and unused by anyone else.
pub async fn a_last_hold_passes<L: DistributedLock + ?Sized>(lock: &L, name: &LockName) {
    let mut from = granted(lock, &request(lock, name, Duration::from_secs(20))).await;
    for ttl in [Duration::from_secs(5), Duration::from_secs(60)] {
        let to = request(lock, name, ttl);
        let before = Instant::now();
        let HandOver::Handed(g) = lock.hand_over(&from, &to).await.unwrap() else {
            panic!("a last hold was not handed over");
        };
        assert_eq!(g.token.0, from.token.0 + 1, "the counter's next value");
        assert_eq!(
            (&g.name, &g.owner, g.hold_count, g.ttl),
            (name, &to.owner, 1, ttl)
        );
        assert!(g.sent_at >= before && g.sent_at <= Instant::now());
        let info = held(lock, name).await;
        assert_eq!(
            (&info.owner, info.hold_count, info.token),
            (&to.owner, 1, g.token)
        );
        let left = info.remaining.expect("a lease");
        assert!(
            left <= ttl && left + Duration::from_secs(2) > ttl,
            "{left:?} left of a {ttl:?} lease"
        );
        // The old grant: nothing to release, renew or hand over.
        assert!(!lock.release(&from).await.unwrap());
        let renewed = lock.renew(&from, Duration::from_secs(5)).await;
        assert_eq!(renewed.map_err(|e| e.kind()), Err(ErrorKind::Lost));
        let again = lock
            .hand_over(&from, &request(lock, name, ttl))
            .await
            .unwrap();
        assert!(matches!(again, HandOver::Released(false)), "{again:?}");
        assert_eq!(held(lock, name).await.token, g.token, "nothing changed");
        // The new one renews like any grant.
        lock.renew(&g, Duration::from_secs(30)).await.unwrap();
        from = g;
    }
    // The last new grant releases, and the next fresh grant's token follows it.
    assert!(lock.release(&from).await.unwrap());
    assert!(lock.inspect(name).await.unwrap().is_none());
    next_grant_follows(lock, name, &from).await;
}

/// A grant with two holds gives one up and keeps the lock, token and lease; a grant that no
/// longer holds (a wrong token; expired and taken over by `other`, another client) changes
/// nothing. Neither issues a token: the grants after them have the next ones. `name` must be
/// free and unused by anyone else. Returns the last stale grant: one of `lock`'s that expired
/// and was not taken over, which the hand-over found not holding. The name is free then, for
/// the backend's own checks, and [`next_grant_follows`] it.
pub async fn only_a_last_hold_of_a_holding_grant_passes<L: DistributedLock + ?Sized>(
    lock: &L,
    other: &L,
    name: &LockName,
) -> Grant {
    only_a_last_hold_of_a_holding_grant_passes_with(lock, other, name, |g| {
        let mut wrong = g.clone();
        wrong.token.0 += 1;
        wrong
    })
    .await
}

/// [`only_a_last_hold_of_a_holding_grant_passes`] for a backend whose grants are told apart by
/// more than their token: `wrong` makes, of a holding grant, one of the same name and owner
/// that the server does not know (RedLock's per-master tokens are in the grant's key).
pub async fn only_a_last_hold_of_a_holding_grant_passes_with<L: DistributedLock + ?Sized>(
    lock: &L,
    other: &L,
    name: &LockName,
    wrong: impl Fn(&Grant) -> Grant,
) -> Grant {
    let first = request(lock, name, Duration::from_secs(30));
    let from = granted(lock, &first).await;
    let twice = granted(lock, &first).await;
    assert_eq!((twice.token, twice.hold_count), (from.token, 2));

    let to = request(lock, name, Duration::from_secs(5));
    let kept = lock.hand_over(&twice, &to).await.unwrap();
    assert!(matches!(kept, HandOver::Released(true)), "{kept:?}");
    let info = held(lock, name).await;
    assert_eq!(
        (&info.owner, info.hold_count, info.token),
        (&first.owner, 1, from.token)
    );
    assert!(
        info.remaining.unwrap() > Duration::from_secs(20),
        "lease kept"
    );

    // A wrong token: nothing changes.
    let stale = lock.hand_over(&wrong(&from), &to).await.unwrap();
    assert!(matches!(stale, HandOver::Released(false)), "{stale:?}");
    let info = held(lock, name).await;
    assert_eq!(
        (&info.owner, info.hold_count, info.token),
        (&first.owner, 1, from.token)
    );
    assert!(lock.release(&from).await.unwrap());

    // Expired and taken over by another client: nothing changes.
    let short = granted(lock, &request(lock, name, Duration::from_millis(200))).await;
    assert_eq!(short.token.0, from.token.0 + 1, "a token issued unseen");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let taker = request(other, name, Duration::from_secs(30));
    let taken = granted(other, &taker).await;
    assert_eq!(taken.token.0, short.token.0 + 1);
    let stale = lock.hand_over(&short, &to).await.unwrap();
    assert!(matches!(stale, HandOver::Released(false)), "{stale:?}");
    let info = held(lock, name).await;
    assert_eq!(
        (&info.owner, info.hold_count, info.token),
        (&taker.owner, 1, taken.token)
    );
    assert!(other.release(&taken).await.unwrap());

    // Expired and not taken over: not held either.
    let short = granted(lock, &request(lock, name, Duration::from_millis(200))).await;
    assert_eq!(short.token.0, taken.token.0 + 1, "a token issued unseen");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let stale = lock.hand_over(&short, &to).await.unwrap();
    assert!(matches!(stale, HandOver::Released(false)), "{stale:?}");
    assert!(lock.inspect(name).await.unwrap().is_none());
    short
}

/// The next fresh grant of the free `name` has the token after `last`'s: nothing since issued
/// one unseen.
pub async fn next_grant_follows<L: DistributedLock + ?Sized>(
    lock: &L,
    name: &LockName,
    last: &Grant,
) {
    let next = granted(lock, &request(lock, name, Duration::from_secs(5))).await;
    assert_eq!(next.token.0, last.token.0 + 1, "a token issued unseen");
    assert!(lock.release(&next).await.unwrap());
}
