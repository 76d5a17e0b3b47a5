//! etcd: keys attached to the client's lease, each waiter watching the key before it.
//! `cargo run -p distlock --features etcd --example etcd`
//! (`scripts/services up etcd` serves on 127.0.0.1:2379).

mod common;

use std::sync::Arc;

use distlock::etcd::{EtcdConfig, EtcdLock};

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let url = common::url_or("etcd://127.0.0.1:2379/distlock-examples");
    let locks = Arc::new(EtcdLock::connect(EtcdConfig::from_url(&url)?).await?);
    println!("etcd:");
    let result = common::walk_through(locks.clone(), &common::run_prefix()).await;
    // Revoke the client's lease now rather than letting it run out.
    locks.close().await?;
    result
}
