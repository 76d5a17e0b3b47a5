//! MongoDB: a document per held lock, taken with findAndModify.
//! `cargo run -p distlock --features mongo --example mongo`
//! (`scripts/services up mongo` serves on 127.0.0.1:27017).

mod common;

use std::sync::Arc;

use distlock::mongo::{MongoConfig, MongoLock};

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let url = common::url_or("mongodb://127.0.0.1:27017");
    let config = MongoConfig::from_url(&url)?
        .database("distlock")
        .collection("examples");
    let locks = Arc::new(MongoLock::connect(config).await?);
    println!("mongo:");
    common::walk_through(locks, &common::run_prefix()).await
}
