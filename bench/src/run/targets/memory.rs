//! The in-memory backend. Its "server" is a `Mutex` around a map, so its floor is what that
//! server must do for one cycle of a leased, fenced lock: two critical sections on a shared map,
//! one inserting the holder with its lease expiry (a clock read) and a fencing-counter bump, one
//! removing the holder if its lease is still live (a clock read), as the networked floors' servers
//! set and check a lease on every acquire and release.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_api::{MemoryStore, SharedLock};

use super::{Floor, FloorOps, Kind, Target};
use crate::error::Res;

pub(crate) struct MemoryTarget {
    /// Every client of one run locks against one store, as processes share one server.
    store: MemoryStore,
}

impl MemoryTarget {
    pub(crate) fn new() -> Self {
        Self {
            store: MemoryStore::new(),
        }
    }
}

#[async_trait]
impl Target for MemoryTarget {
    fn kind(&self) -> Kind {
        Kind::Memory
    }

    async fn server_version(&self) -> Res<String> {
        Ok(format!(
            "distlock-api {} (in-process)",
            env!("CARGO_PKG_VERSION")
        ))
    }

    async fn client(&self) -> Res<SharedLock> {
        Ok(Arc::new(self.store.client()))
    }

    async fn floor(&self) -> Res<Box<dyn Floor>> {
        Ok(Box::new(MemoryFloor::default()))
    }

    fn floor_ops(&self) -> FloorOps {
        FloorOps {
            what: "two critical sections on a `Mutex<HashMap>`: insert the holder with its lease \
                   expiry (a clock read) and bump a counter, then remove the holder if its lease \
                   is live (a clock read)",
            round_trips: 2,
        }
    }
}

/// The lease the floor's holders get: the backend's default.
const FLOOR_TTL: Duration = distlock_api::DEFAULT_TTL;

/// The floor's "server": holders by name, each with its fencing token and lease expiry, and
/// the fencing counter.
#[derive(Default)]
struct FloorState {
    holders: HashMap<String, (u64, Instant)>,
    counter: u64,
}

#[derive(Default)]
struct MemoryFloor {
    state: Arc<Mutex<FloorState>>,
}

#[async_trait]
impl Floor for MemoryFloor {
    async fn cycle(&mut self, name: &str) -> Res<Duration> {
        let token = {
            let mut s = self.state.lock().map_err(|_| "floor mutex poisoned")?;
            s.counter += 1;
            let token = s.counter;
            let expires = Instant::now() + FLOOR_TTL;
            if s.holders
                .insert(name.to_string(), (token, expires))
                .is_some()
            {
                return Err("floor: the name was already held".into());
            }
            token
        };
        let release = Instant::now();
        let mut s = self.state.lock().map_err(|_| "floor mutex poisoned")?;
        match s.holders.remove(name) {
            Some((t, expires)) if t == token && expires > Instant::now() => Ok(release.elapsed()),
            _ => Err("floor: the holder vanished or its lease ran out".into()),
        }
    }
}
