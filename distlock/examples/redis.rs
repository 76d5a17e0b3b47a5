//! A single Redis server. `cargo run -p distlock --features redis --example redis`
//! (`scripts/services up redis` starts one on 127.0.0.1:6379; `DISTLOCK_URL` picks another).

mod common;

use std::sync::Arc;
use std::time::Duration;

use distlock::redis::{RedisConfig, RedisLock};

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let config = RedisConfig::from_url(&common::url_or("redis://127.0.0.1:6379"))?
        .key_prefix("examples")
        .default_ttl(Duration::from_secs(10));
    let locks = Arc::new(RedisLock::connect(config).await?);
    println!("redis:");
    common::walk_through(locks, &common::run_prefix()).await
}
