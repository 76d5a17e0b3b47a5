//! Advisory mode beyond the conformance suite: a key held under another name is refused
//! (never silently shared), and the key row a holder writes is what `holder` shows.

mod common;

use std::time::Duration;

use distlock_postgres::sqlx::{self, Connection};
use distlock_postgres::{advisory_key, ErrorKind, LockExt, Mode};

/// Another session holds the key of `name` and its row records a different name (what a
/// SHA-256 prefix collision would look like): the request is `InvalidArgument`, naming both.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_held_under_another_name_is_refused() {
    let client = common::client_with(|c| {
        c.mode(Mode::Advisory)
            .session_timeout(Duration::from_secs(3))
    })
    .await;
    let name = common::name("collide");
    let key = advisory_key(name.as_str());
    let mut other = sqlx::PgConnection::connect(&common::url()).await.unwrap();
    assert!(
        sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock($1)")
            .bind(key)
            .fetch_one(&mut other)
            .await
            .unwrap()
    );
    sqlx::query(
        "INSERT INTO distlock_locks_advisory (key, name, owner, token, hold_count, pid, since) \
         VALUES ($1, $2, 'someone-else', 1, 1, pg_backend_pid(), now()) \
         ON CONFLICT (key) DO UPDATE SET name = EXCLUDED.name, pid = EXCLUDED.pid",
    )
    .bind(key)
    .bind(format!("{}-colliding", name.as_str()))
    .execute(&mut other)
    .await
    .unwrap();

    let e = client.try_lock(name.as_str()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("-colliding"), "{e}");

    // The other session lets go: the name is free, and its row is this client's.
    sqlx::query("DELETE FROM distlock_locks_advisory WHERE key = $1")
        .bind(key)
        .execute(&mut other)
        .await
        .unwrap();
    other.close().await.unwrap();
    let g = client
        .lock(name.as_str(), Duration::from_secs(10))
        .await
        .expect("free once the other session is gone");
    let info = client.holder(name.as_str()).await.unwrap().expect("held");
    assert_eq!((&info.owner, info.token), (g.owner(), g.token()));
    assert!(g.release().await.unwrap());
    assert!(client.holder(name.as_str()).await.unwrap().is_none());
}
