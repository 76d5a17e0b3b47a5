//! PostgreSQL: a row per held lock, judged by the server's clock, and `LISTEN/NOTIFY` for
//! waiters. `cargo run -p distlock --features postgres --example postgres`
//! (`scripts/services up postgres` creates the `distlock` user and database on 127.0.0.1:5432).

mod common;

use std::sync::Arc;

use distlock::postgres::{PostgresConfig, PostgresLock};

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let url = common::url_or("postgres://distlock:distlock@127.0.0.1:5432/distlock");
    // Tables of their own, created at connect (the user needs CREATE the first time).
    let config = PostgresConfig::from_url(&url)?
        .lock_table("examples_locks")
        .fencing_table("examples_fencing");
    let locks = Arc::new(PostgresLock::connect(config).await?);
    println!("postgres:");
    common::walk_through(locks, &common::run_prefix()).await
}
