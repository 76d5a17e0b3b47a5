//! Round trips per operation, counted by a loopback proxy between one client and the server
//! (a round trip: the client speaks after the server did). A fresh grant of a name the client
//! does not know to be held is one request (the transaction's statements sent together); a
//! name found held costs one more (the transaction rolled back and the row read, together),
//! and from then on the client reads first, one request, until the lease it saw ends or the
//! name is released. None of this may cost a fencing token: a grant whose insert found a row is
//! rolled back with its counter.
//!
//! `DISTLOCK_MYSQL_URL` (default `mysql://distlock:distlock@127.0.0.1:3306/distlock`); skipped
//! when `DISTLOCK_SKIP` names `mysql`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::PrivateTables;
use distlock_conformance::{hosts_of, reroute, Proxy};
use distlock_mysql::{FencingToken, LockExt, LockOptions, MysqlLock};

/// A lease far longer than the test: only releases free a name.
fn long_lease() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(120))
}

/// The round trips `op` made through `proxy`.
async fn trips<T>(proxy: &Proxy, op: impl std::future::Future<Output = T>) -> (T, u64) {
    let before = proxy.round_trips();
    let out = op.await;
    (out, proxy.round_trips() - before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_name_is_granted_in_one_request_and_a_held_one_costs_no_token() {
    if common::skipped() {
        return;
    }
    let tables = PrivateTables::new("trips");
    let url = common::url();
    let proxy = Proxy::start(hosts_of(&url)[0].clone()).await;
    let proxied = reroute(&url, &hosts_of(&url), &[proxy.addr()]);
    // Two connections per pool, so each operation finds the one set aside by the last (a pool
    // of one pings its connection before lending it), and no release signals (their session
    // would add requests of its own): every request counted is the operation's.
    let config = distlock_mysql::MysqlConfig::from_url(&proxied)
        .unwrap()
        .lock_table(&tables.locks)
        .fencing_table(&tables.fencing)
        .pool_size(2)
        .release_signals(false);
    let client = Arc::new(MysqlLock::connect(config).await.unwrap_or_else(|e| {
        panic!("{e}\n  start MariaDB with `scripts/services up` or skip with DISTLOCK_SKIP=mysql")
    }));
    let other = Arc::new(MysqlLock::connect(tables.config()).await.unwrap());
    let opts = long_lease();

    // Warm up: every statement prepared once on each pool's connection.
    for name in ["warm-a", "warm-b"] {
        let g = client.try_lock_with(name, &opts).await.unwrap().unwrap();
        g.release().await.unwrap();
    }
    let held = other.try_lock_with("warm-c", &opts).await.unwrap().unwrap();
    for _ in 0..2 {
        assert!(client
            .try_lock_with("warm-c", &opts)
            .await
            .unwrap()
            .is_none());
    }
    held.release().await.unwrap();

    // A free name: one request, and one for its release.
    let (g, n) = trips(&proxy, client.try_lock_with("free", &opts)).await;
    let g = g.unwrap().expect("a free name is granted");
    assert_eq!(n, 1, "a fresh grant of a free name is one request");
    let first = g.token();
    let (released, n) = trips(&proxy, g.release()).await;
    released.unwrap();
    assert_eq!(n, 1, "a release is one request");
    // Released by this client: the next grant is one request again, with the next token.
    let (g, n) = trips(&proxy, client.try_lock_with("free", &opts)).await;
    let g = g.unwrap().expect("granted again");
    assert_eq!(
        n, 1,
        "a grant after the client's own release is one request"
    );
    assert_eq!(g.token(), FencingToken(first.0 + 1));
    g.release().await.unwrap();

    // Held by another client: the first attempt finds the row (two requests), the next ones
    // read first (one each); neither issues a token.
    let holder = other.try_lock_with("held", &opts).await.unwrap().unwrap();
    let (got, n) = trips(&proxy, client.try_lock_with("held", &opts)).await;
    assert!(got.unwrap().is_none(), "held by another client");
    assert_eq!(
        n, 2,
        "the one-request grant found the row: rolled back and read together"
    );
    let (got, n) = trips(&proxy, client.try_lock_with("held", &opts)).await;
    assert!(got.unwrap().is_none());
    assert_eq!(n, 1, "a name seen held is read first");
    let token = holder.token();
    holder.release().await.unwrap();
    // Released by the other client (no signal to tell this one): read, then the transaction.
    let g = client
        .try_lock_with("held", &opts)
        .await
        .unwrap()
        .expect("free after the holder's release");
    assert_eq!(
        g.token(),
        FencingToken(token.0 + 1),
        "the attempts that found the name held issued no token"
    );
    g.release().await.unwrap();

    drop(client);
    drop(other);
    tables.drop_all().await;
}
