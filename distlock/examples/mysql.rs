//! MySQL or MariaDB: a row per held lock under a unique index.
//! `cargo run -p distlock --features mysql --example mysql`
//! (`scripts/services up mariadb` creates the `distlock` user and database on 127.0.0.1:3306).

mod common;

use std::sync::Arc;

use distlock::mysql::{MysqlConfig, MysqlLock};

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let url = common::url_or("mysql://distlock:distlock@127.0.0.1:3306/distlock");
    // Tables of their own, created at connect (the user needs CREATE the first time).
    let config = MysqlConfig::from_url(&url)?
        .lock_table("examples_locks")
        .fencing_table("examples_fencing");
    let locks = Arc::new(MysqlLock::connect(config).await?);
    println!("mysql:");
    common::walk_through(locks, &common::run_prefix()).await
}
