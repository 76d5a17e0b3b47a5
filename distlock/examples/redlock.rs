//! RedLock over independent Redis masters: a grant needs a majority of them.
//! `cargo run -p distlock --features redis --example redlock`
//! (`scripts/services up redis` starts three masters on 127.0.0.1:6380-6382).

mod common;

use std::sync::Arc;

use distlock::redis::{RedLock, RedLockConfig};

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let url = common::url_or("redlock://127.0.0.1:6380,127.0.0.1:6381,127.0.0.1:6382");
    let locks = Arc::new(RedLock::connect(RedLockConfig::from_url(&url)?).await?);
    println!("redlock:");
    common::walk_through(locks, &common::run_prefix()).await
}
