//! ZooKeeper: an ephemeral-sequential node per contender, each watching its predecessor; the
//! lease is the client's session. `cargo run -p distlock --features zk --example zk`
//! (`scripts/services up zookeeper` serves on 127.0.0.1:2181).

mod common;

use std::sync::Arc;

use distlock::zk::{ZkConfig, ZkLock};

#[tokio::main]
async fn main() -> distlock::Result<()> {
    // The path is the chroot the lock nodes live under.
    let url = common::url_or("zk://127.0.0.1:2181/distlock-examples");
    let locks = Arc::new(ZkLock::connect(ZkConfig::from_url(&url)?).await?);
    println!("zk:");
    common::walk_through(locks, &common::run_prefix()).await
}
