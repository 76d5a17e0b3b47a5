//! A lock cycle (acquire + release of one uncontended lock) in a loop, timed: `cargo run
//! --release -p distlock-postgres --example lock_cycle [rounds]` against
//! `DISTLOCK_POSTGRES_URL` (default: the loopback test server).

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_postgres::{LockExt, PostgresConfig, PostgresLock};

#[tokio::main]
async fn main() -> distlock_postgres::Result<()> {
    let url = std::env::var("DISTLOCK_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://distlock:distlock@127.0.0.1:5432/distlock".into());
    let rounds: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let locks = Arc::new(PostgresLock::connect(PostgresConfig::from_url(&url)?).await?);
    let name = format!("cycle-{}", std::process::id());
    for _ in 0..100 {
        let g = locks.lock(&name, Duration::from_secs(5)).await?;
        g.release().await?;
    }
    let mut each = Vec::with_capacity(rounds as usize);
    let started = Instant::now();
    for _ in 0..rounds {
        let t = Instant::now();
        let g = locks.lock(&name, Duration::from_secs(5)).await?;
        g.release().await?;
        each.push(t.elapsed());
    }
    let total = started.elapsed();
    each.sort();
    let at = |q: f64| each[((each.len() - 1) as f64 * q) as usize];
    println!(
        "{rounds} cycles in {total:?}: mean {:?}, p50 {:?}, p99 {:?}",
        total / rounds,
        at(0.5),
        at(0.99)
    );
    Ok(())
}
