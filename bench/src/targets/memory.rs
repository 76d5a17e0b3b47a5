//! The in-memory backend. Its "server" is a `Mutex` around a map, so its floor is what that
//! server does for one cycle: two critical sections on a shared map, one inserting the holder
//! (with a fencing-counter bump), one removing it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use distlock_api::{MemoryStore, SharedLock};

use super::{Floor, FloorOps, Kind, Target};
use crate::Res;

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
            what: "two critical sections on a `Mutex<HashMap>`: insert the holder and bump a \
                   counter, then remove the holder",
            round_trips: 2,
        }
    }
}

#[derive(Default)]
struct MemoryFloor {
    state: Arc<Mutex<(HashMap<String, u64>, u64)>>,
}

#[async_trait]
impl Floor for MemoryFloor {
    async fn cycle(&mut self, name: &str) -> Res<()> {
        {
            let mut s = self.state.lock().map_err(|_| "floor mutex poisoned")?;
            s.1 += 1;
            let token = s.1;
            if s.0.insert(name.to_string(), token).is_some() {
                return Err("floor: the name was already held".into());
            }
        }
        let mut s = self.state.lock().map_err(|_| "floor mutex poisoned")?;
        if s.0.remove(name).is_none() {
            return Err("floor: the holder vanished".into());
        }
        Ok(())
    }
}
