//! Bad options, owners and servers: `InvalidArgument` before any I/O, `Unavailable` within the connect timeout.

use super::*;

pub(super) async fn zero_ttl_is_invalid_argument(cx: Ctx) {
    rejects_options(&cx, LockOptions::new().ttl(Duration::ZERO)).await;
    rejects_options(&cx, LockOptions::new().watchdog_ttl(Duration::ZERO)).await;
    rejects_options(&cx, LockOptions::new().ttl(Duration::from_micros(999))).await;
}

pub(super) async fn ttl_over_limit_is_invalid_argument(cx: Ctx) {
    rejects_options(
        &cx,
        LockOptions::new().ttl(MAX_TTL + Duration::from_secs(1)),
    )
    .await;
    rejects_options(&cx, LockOptions::new().watchdog_ttl(Duration::MAX)).await;
}

pub(super) async fn wait_over_limit_is_invalid_argument(cx: Ctx) {
    rejects_options(
        &cx,
        LockOptions::new().wait(MAX_WAIT + Duration::from_secs(1)),
    )
    .await;
    rejects_options(&cx, LockOptions::new().wait(Duration::MAX)).await;
    let c = cx.client().await;
    let e = c.lock(&cx.name("w"), Duration::MAX).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}

pub(super) async fn malformed_owner_id_is_invalid_argument(cx: Ctx) {
    for bad in ["", "has space", "slash/y", "ünï", &"o".repeat(65)] {
        let e = OwnerId::new(bad).expect_err(bad);
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }
    // A well-formed caller-chosen owner works (checked in caller_supplied_owner_is_the_holder).
    let c = cx.client().await;
    let g = c
        .try_lock_with(
            &cx.name("o"),
            &LockOptions::new().owner(OwnerId::new("ok-owner_1.x:y").unwrap()),
        )
        .await
        .unwrap()
        .expect("free");
    assert_eq!(g.owner().label(), "ok-owner_1.x:y");
    assert!(g.release().await.unwrap());
}

pub(super) async fn unreachable_server_is_unavailable_within_connect_timeout(cx: Ctx) {
    let limit = cx.harness().connect_timeout() + Duration::from_secs(3);
    let started = Instant::now();
    let outcome = match cx.harness().unreachable_client().await {
        None => panic!("a remote backend must provide an unreachable client"),
        Some(Err(e)) => Err(e),
        Some(Ok(dead)) => dead.try_lock(&cx.name("u")).await.map(|_| ()),
    };
    let took = started.elapsed();
    let e = outcome.expect_err("an unreachable server cannot grant a lock");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.is_temporary(), "Unavailable should be retryable: {e}");
    assert!(
        took <= limit,
        "took {took:?}, more than the connect timeout + 3 s"
    );
}
