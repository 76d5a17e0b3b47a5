//! How waiters hear of a release: shared delete watches, one per lock directory per client,
//! which every waiter of the client on that lock listens to, kept for a while after the last
//! one leaves.
//!
//! A watch per wait is not live often enough. etcd registers a watch that starts "now" one past
//! the store revision it read when the request arrived; a write that lands between that read
//! and the registration leaves the watch behind the store, in the "unsynced" group, which etcd
//! catches up only every 100 ms. Under contention every wait raced other clients' writes, and
//! about one watch in a hundred lost: measured with 8 contenders on one name, release-to-event
//! 0.55 ms at p50 and 65–90 ms for those, the whole 100 ms tail of hot-lock hand-offs. A watch
//! that outlives many waits pays that at most once, when it is made, and the waiter's second
//! read of its predecessor (after subscribing) still covers a delete the watch came too late for.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use etcd_client::{EventType, WatchFilterType, WatchOptions, WatchStream};
use tokio::sync::{broadcast, OnceCell};

use crate::endpoints::Endpoints;

/// The pause after a failed watch before the waiter looks again, so a broken watch cannot spin.
pub(crate) const WATCH_RETRY: Duration = Duration::from_millis(50);

/// How often a directory's watch checks for waiters: it ends at the first check that finds
/// none, and no new one since the check before (10–20 s after the last wait began). A hot
/// lock's waiters come back well within this, and an idle client keeps no watches.
const LINGER: Duration = Duration::from_secs(10);

/// Events a subscriber may fall behind by before it is told it lagged (and looks again).
const BACKLOG: usize = 1024;

/// What a directory's watch saw.
#[derive(Clone, Debug)]
pub(crate) enum Seen {
    /// An entry was deleted: its key, the delete's revision, and the entry's create-revision
    /// (0 if the server could not say: its previous version was compacted away).
    Deleted {
        key: Vec<u8>,
        rev: i64,
        created: i64,
    },
    /// The watch ended (its stream broke or the server cancelled it): look again.
    Broken,
}

/// The client's watches, by lock directory.
#[derive(Default)]
pub(crate) struct Watches {
    dirs: Mutex<HashMap<String, Arc<DirWatch>>>,
}

struct DirWatch {
    /// The endpoint it runs on: a waiter that finds the client moved to another endpoint makes
    /// a new watch there.
    endpoint: usize,
    /// Set once the server confirmed the watch.
    events: OnceCell<broadcast::Sender<Seen>>,
    live: AtomicBool,
    /// Subscriptions made, so the lingering watch tells a quiet spell from a busy one.
    subscribed: AtomicU64,
}

/// A waiter's subscription to its lock directory's deletes.
pub(crate) struct Subscription {
    pub(crate) events: broadcast::Receiver<Seen>,
    /// The endpoint the watch runs on.
    pub(crate) endpoint: usize,
}

impl Watches {
    fn dirs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<DirWatch>>> {
        // Each update is one insert or remove: a poisoned map is still consistent.
        self.dirs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many directories have a live watch.
    #[cfg(feature = "testing")]
    pub(crate) fn live(&self) -> usize {
        self.dirs()
            .values()
            .filter(|w| w.live.load(Ordering::Acquire) && w.events.initialized())
            .count()
    }

    /// Subscribes to the deletes under `dir` if the client has a live watch of it on the
    /// endpoint in use, without asking the server for anything: every delete from then on
    /// reaches the subscription, in order. `None` if there is no such watch.
    pub(crate) fn subscribe_if_live(
        &self,
        endpoints: &Endpoints,
        dir: &str,
    ) -> Option<Subscription> {
        let endpoint = endpoints.index();
        let watch = self
            .dirs()
            .get(dir)
            .filter(|w| w.live.load(Ordering::Acquire) && w.endpoint == endpoint)
            .cloned()?;
        let tx = watch.events.get()?;
        watch.subscribed.fetch_add(1, Ordering::Relaxed);
        let events = tx.subscribe();
        // Ended meanwhile: its last word may have gone out before this subscription.
        watch
            .live
            .load(Ordering::Acquire)
            .then_some(Subscription { events, endpoint })
    }

    /// Subscribes to the deletes under `dir` on the endpoint in use, making the watch if the
    /// client has none there. When this returns, the watch is in place on the server: every
    /// delete from then on reaches the subscription, in order.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        endpoints: &Endpoints,
        dir: &str,
    ) -> Result<Subscription, etcd_client::Error> {
        let endpoint = endpoints.index();
        let watch = {
            let mut dirs = self.dirs();
            let current = dirs
                .get(dir)
                .filter(|w| w.live.load(Ordering::Acquire) && w.endpoint == endpoint)
                .cloned();
            current.unwrap_or_else(|| {
                let fresh = Arc::new(DirWatch {
                    endpoint,
                    events: OnceCell::new(),
                    live: AtomicBool::new(true),
                    subscribed: AtomicU64::new(0),
                });
                if let Some(old) = dirs.insert(dir.to_string(), fresh.clone()) {
                    old.live.store(false, Ordering::Release);
                }
                fresh
            })
        };
        watch.subscribed.fetch_add(1, Ordering::Relaxed);
        let events = watch
            .events
            .get_or_try_init(|| async {
                let stream = open(endpoints, endpoint, dir).await?;
                let (tx, _) = broadcast::channel(BACKLOG);
                tokio::spawn(run(
                    Arc::downgrade(self),
                    dir.to_string(),
                    watch.clone(),
                    tx.clone(),
                    stream,
                ));
                Ok::<_, etcd_client::Error>(tx)
            })
            .await;
        match events {
            Ok(tx) => {
                let events = tx.subscribe();
                // Ended meanwhile: its last word may have gone out before this subscription.
                if !watch.live.load(Ordering::Acquire) {
                    return Err(etcd_client::Error::WatchError("the watch ended".into()));
                }
                Ok(Subscription { events, endpoint })
            }
            Err(e) => {
                watch.live.store(false, Ordering::Release);
                Err(e)
            }
        }
    }
}

/// Opens the watch of `dir`'s deletes on `endpoint` and waits for the server to confirm it.
async fn open(
    endpoints: &Endpoints,
    endpoint: usize,
    dir: &str,
) -> Result<WatchStream, etcd_client::Error> {
    let client = endpoints.client(endpoint).await?;
    // With each delete, the entry as it was: its create-revision tells a semaphore's waiter
    // whether the entry was older than its own.
    let options = WatchOptions::new()
        .with_prefix()
        .with_prev_key()
        .with_filters([WatchFilterType::NoPut]);
    let mut stream = client.watch_client().watch(dir, Some(options)).await?;
    match stream.message().await? {
        Some(resp) if resp.created() && !resp.canceled() => Ok(stream),
        _ => Err(etcd_client::Error::WatchError(
            "the server did not confirm the watch".into(),
        )),
    }
}

/// Hands the watch's deletes to its subscribers until it breaks, is replaced, or has had no
/// subscriber for a whole [`LINGER`]; then tells the subscribers left and leaves the client's
/// table.
async fn run(
    watches: Weak<Watches>,
    dir: String,
    watch: Arc<DirWatch>,
    tx: broadcast::Sender<Seen>,
    mut stream: WatchStream,
) {
    let mut idle = tokio::time::interval(LINGER);
    idle.tick().await;
    let mut seen_subscriptions = watch.subscribed.load(Ordering::Relaxed);
    loop {
        tokio::select! {
            message = stream.message() => match message {
                Ok(Some(resp)) if !resp.canceled() => {
                    for event in resp.events() {
                        if event.event_type() != EventType::Delete {
                            continue;
                        }
                        if let Some(kv) = event.kv() {
                            let _ = tx.send(Seen::Deleted {
                                key: kv.key().to_vec(),
                                rev: kv.mod_revision(),
                                created: event.prev_kv().map_or(0, |p| p.create_revision()),
                            });
                        }
                    }
                }
                _ => break,
            },
            _ = idle.tick() => {
                let subscriptions = watch.subscribed.load(Ordering::Relaxed);
                let quiet = tx.receiver_count() == 0 && subscriptions == seen_subscriptions;
                seen_subscriptions = subscriptions;
                if quiet || !watch.live.load(Ordering::Acquire) || watches.strong_count() == 0 {
                    break;
                }
            }
        }
    }
    watch.live.store(false, Ordering::Release);
    let _ = tx.send(Seen::Broken);
    if let Some(watches) = watches.upgrade() {
        let mut dirs = watches.dirs();
        if dirs.get(&dir).is_some_and(|w| Arc::ptr_eq(w, &watch)) {
            dirs.remove(&dir);
        }
    }
    // Dropping the stream ends the watch on the server.
}
