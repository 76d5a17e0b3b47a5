//! Fencing tokens: they only go up, across releases and owners.

use super::*;

pub(super) async fn tokens_increase_across_release(cx: Ctx) {
    let c = cx.client().await;
    let name = cx.name("tok");
    let mut last = FencingToken(0);
    for i in 0..10 {
        let g = must_lock(&c, &name).await;
        assert!(
            g.token() > last,
            "cycle {i}: token {} after {last}",
            g.token()
        );
        last = g.token();
        assert!(g.release().await.unwrap());
    }
}

pub(super) async fn tokens_increase_across_owners(cx: Ctx) {
    let clients = [cx.client().await, cx.client().await, cx.client().await];
    let name = cx.name("toko");
    let mut last = FencingToken(0);
    for i in 0..12 {
        let c = &clients[i % clients.len()];
        let owner = OwnerId::new(format!("owner-{}", i % 5)).unwrap();
        let g = c
            .lock_with(
                &name,
                &LockOptions::new().owner(owner).wait(Duration::from_secs(5)),
            )
            .await
            .unwrap();
        assert!(
            g.token() > last,
            "grant {i}: token {} after {last}",
            g.token()
        );
        last = g.token();
        assert!(g.release().await.unwrap());
    }
}
