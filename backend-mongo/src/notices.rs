//! Cross-process wake-ups: one change stream per client on its lock collection, shared by all
//! the client's waiters and fanned out to them by lock name.
//!
//! A waiter that found its lock held subscribes to the name ([`Streams::subscribe`]). The first
//! subscription opens the client's change stream; the others join it. The stream carries only
//! the events that can free a lock — a delete or replacement of a lock document, or an update
//! that sets its `owner` to `null` (a release to zero holds, an operator clearing the holder) or
//! bumps its `freed` counter (a semaphore permit released) — so neither failed attempts (which
//! the server sees as no-op writes) nor renewals wake anyone. Each event wakes the subscribers
//! of its document's `_id`, the lock name; they attempt, and a spurious wake-up costs one
//! attempt. A lease that simply runs out sends no event: the waiter
//! wakes at the holder's expiry, which it reads with every attempt.
//!
//! When the stream breaks (the driver already resumes it across resumable errors, so this is a
//! server refusing to go on, a dropped collection, …) every subscriber is woken, and from then
//! on each of them polls with backoff for the rest of its wait; the next subscription opens a
//! new stream. A stream with no subscribers for [`LINGER`] ends by itself, so a hot lock's
//! waiters find it open and an idle client keeps none.
//!
//! A server without change streams (a standalone `mongod` answers 40573) refuses the stream;
//! the refusal is remembered for [`REFUSAL_MEMORY`], during which subscriptions fail at once
//! and waiters poll as they would without this module.

use std::collections::HashMap;
use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use distlock_api::backend::async_trait;
use distlock_api::backend::wait::{Backoff, Notices};
use distlock_api::{Error, ErrorKind, Result};
use futures::StreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::change_stream::event::ChangeStreamEvent;
use mongodb::change_stream::ChangeStream;
use mongodb::Collection;
use tokio::sync::{watch, OnceCell};

use crate::commands::{FREED, OWNER};
use crate::error::map_err;
use crate::BACKEND;

/// How long a stream stays open with no subscriber: a hot lock's waiters come back well within
/// it, and an idle client keeps no stream (it ends 10–12.5 s after its last subscriber left).
pub(crate) const LINGER: Duration = Duration::from_secs(10);

/// How long a refused stream is not tried again: every wait meanwhile polls without first
/// paying a failed open.
pub(crate) const REFUSAL_MEMORY: Duration = Duration::from_secs(30);

/// The client's change stream, if open, and what the server last said about streams.
pub(crate) struct Streams {
    locks: Collection<Document>,
    /// Bounds opening a stream.
    timeout: Duration,
    /// The polling backoff, for the waits that outlive their stream.
    backoff: Backoff,
    state: Mutex<State>,
    /// Streams opened so far (test-only accessor).
    opened: AtomicU64,
}

#[derive(Default)]
struct State {
    current: Option<Arc<Stream>>,
    refused_until: Option<Instant>,
}

/// One change stream and its subscribers, by lock name.
struct Stream {
    /// Set once the server accepted the stream.
    open: OnceCell<()>,
    /// Cleared when the stream ends; a stream never comes back, a new one replaces it.
    live: AtomicBool,
    names: Mutex<Names>,
}

#[derive(Default)]
struct Names {
    by_name: HashMap<String, Name>,
    /// Since when no name has a subscriber (`None` while one does).
    idle_since: Option<Instant>,
}

struct Name {
    subscribers: usize,
    /// Bumped by every event for the name, and once when the stream ends.
    events: watch::Sender<u64>,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is a few assignments that cannot panic half-way.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Streams {
    pub(crate) fn new(locks: Collection<Document>, timeout: Duration, backoff: Backoff) -> Self {
        Self {
            locks,
            timeout,
            backoff,
            state: Mutex::new(State::default()),
            opened: AtomicU64::new(0),
        }
    }

    /// Subscribes to the events that may free `name`, opening the client's stream if it has
    /// none. When this returns, the stream is open on the server: every later event for the
    /// name reaches the subscription. Dropping the subscription, or this future, unsubscribes.
    pub(crate) async fn subscribe(self: &Arc<Self>, name: &str) -> Result<Subscription> {
        // A stream that ended between being found and being joined is replaced once.
        for _ in 0..2 {
            let stream = {
                let mut state = locked(&self.state);
                let now = Instant::now();
                if let Some(until) = state.refused_until {
                    if now < until {
                        return Err(refused(
                            "the server refused a change stream lately; waiters poll",
                        ));
                    }
                    state.refused_until = None;
                }
                let current = state
                    .current
                    .as_ref()
                    .filter(|s| s.live.load(Ordering::Acquire))
                    .cloned();
                current.unwrap_or_else(|| {
                    let fresh = Arc::new(Stream {
                        open: OnceCell::new(),
                        live: AtomicBool::new(true),
                        names: Mutex::new(Names::default()),
                    });
                    state.current = Some(fresh.clone());
                    fresh
                })
            };
            // Registered before any await, so a cancelled subscribe leaves nothing behind.
            let sub = Subscription::register(stream.clone(), name, self.backoff.clone());
            let opened = stream
                .open
                .get_or_try_init(|| async {
                    let changes = self.open().await?;
                    self.opened.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(run(Arc::downgrade(self), stream.clone(), changes));
                    Ok::<_, Error>(())
                })
                .await;
            if let Err(e) = opened {
                stream.live.store(false, Ordering::Release);
                let mut state = locked(&self.state);
                state.refused_until = Some(Instant::now() + REFUSAL_MEMORY);
                if state
                    .current
                    .as_ref()
                    .is_some_and(|s| Arc::ptr_eq(s, &stream))
                {
                    state.current = None;
                }
                return Err(e);
            }
            if stream.live.load(Ordering::Acquire) {
                return Ok(sub);
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            "the client's change stream ended while subscribing",
        )
        .with_backend(BACKEND))
    }

    /// Opens the stream of the events that can free a lock, bounded by the operation timeout.
    async fn open(&self) -> Result<ChangeStream<ChangeStreamEvent<Document>>> {
        let frees = doc! { "$match": { "$or": [
            { "operationType": { "$in": [
                "delete", "replace", "drop", "rename", "dropDatabase", "invalidate",
            ] } },
            { "operationType": "update", format!("updateDescription.updatedFields.{OWNER}"): { "$type": "null" } },
            { "operationType": "update", "updateDescription.removedFields": OWNER },
            // A permit released (or force-released): `freed` is bumped only then.
            { "operationType": "update", format!("updateDescription.updatedFields.{FREED}"): { "$exists": true } },
        ] } };
        // The driver needs `_id` (the resume token), `operationType` and `ns`; the name is the
        // document key. Nothing else is sent.
        let slim = doc! { "$project": { "operationType": 1, "ns": 1, "documentKey": 1 } };
        let watch = self.locks.watch().pipeline([frees, slim]);
        match tokio::time::timeout(self.timeout, watch.into_future()).await {
            Ok(Ok(changes)) => Ok(changes),
            Ok(Err(e)) => Err(map_err(
                e,
                "cannot open a change stream on the lock collection",
            )),
            Err(_) => Err(Error::new(
                ErrorKind::Unavailable,
                format!("no change stream from MongoDB within {:?}", self.timeout),
            )
            .with_backend(BACKEND)),
        }
    }

    /// Whether the client has an open stream (test-only accessor).
    #[cfg(feature = "testing")]
    pub(crate) fn is_open(&self) -> bool {
        locked(&self.state)
            .current
            .as_ref()
            .is_some_and(|s| s.live.load(Ordering::Acquire) && s.open.initialized())
    }

    /// How many names the open stream has subscribers for (test-only accessor).
    #[cfg(feature = "testing")]
    pub(crate) fn names(&self) -> usize {
        let current = locked(&self.state).current.clone();
        current.map_or(0, |s| locked(&s.names).by_name.len())
    }

    /// How many streams this client has opened (test-only accessor).
    #[cfg(feature = "testing")]
    pub(crate) fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }
}

/// The error of a subscription the server cannot serve; waiters poll instead.
fn refused(message: &str) -> Error {
    Error::new(ErrorKind::Unsupported, message.to_string()).with_backend(BACKEND)
}

/// Hands the stream's events to the subscribers of their names until the stream breaks, or has
/// had no subscriber for [`LINGER`], or the client is gone; then wakes every subscriber left
/// and leaves the client.
async fn run(
    streams: Weak<Streams>,
    stream: Arc<Stream>,
    mut changes: ChangeStream<ChangeStreamEvent<Document>>,
) {
    let mut tick = tokio::time::interval(LINGER / 4);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            change = changes.next() => match change {
                Some(Ok(change)) => {
                    let key = change.document_key.as_ref().and_then(|k| match k.get("_id") {
                        Some(Bson::String(name)) => Some(name.as_str()),
                        _ => None,
                    });
                    match key {
                        Some(name) => stream.notify(name),
                        // Not about one document (a drop, an invalidate): everyone looks.
                        None => stream.notify_all(),
                    }
                }
                // The driver resumed what it could; this stream is over.
                Some(Err(_)) | None => break,
            },
            _ = tick.tick() => {
                let idle = locked(&stream.names)
                    .idle_since
                    .is_some_and(|since| since.elapsed() >= LINGER);
                if idle || streams.strong_count() == 0 {
                    break;
                }
            }
        }
    }
    stream.live.store(false, Ordering::Release);
    stream.notify_all();
    if let Some(streams) = streams.upgrade() {
        let mut state = locked(&streams.state);
        if state
            .current
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, &stream))
        {
            state.current = None;
        }
    }
    // Dropping the stream kills its cursor on the server.
}

impl Stream {
    fn notify(&self, name: &str) {
        if let Some(n) = locked(&self.names).by_name.get(name) {
            n.events.send_modify(|v| *v += 1);
        }
    }

    fn notify_all(&self) {
        for n in locked(&self.names).by_name.values() {
            n.events.send_modify(|v| *v += 1);
        }
    }
}

/// A waiter's subscription to its lock name's events on the client's stream.
pub(crate) struct Subscription {
    stream: Arc<Stream>,
    name: String,
    events: watch::Receiver<u64>,
    /// The last event count a wait returned on.
    seen: AtomicU64,
    /// The steps of a wait that outlived its stream.
    backoff: Mutex<Backoff>,
}

impl Subscription {
    fn register(stream: Arc<Stream>, name: &str, backoff: Backoff) -> Self {
        let events = {
            let mut names = locked(&stream.names);
            names.idle_since = None;
            let entry = names
                .by_name
                .entry(name.to_string())
                .or_insert_with(|| Name {
                    subscribers: 0,
                    events: watch::channel(0).0,
                });
            entry.subscribers += 1;
            entry.events.subscribe()
        };
        let seen = AtomicU64::new(*events.borrow());
        Self {
            stream,
            name: name.to_string(),
            events,
            seen,
            backoff: Mutex::new(backoff),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut names = locked(&self.stream.names);
        if let Some(n) = names.by_name.get_mut(&self.name) {
            n.subscribers -= 1;
            if n.subscribers == 0 {
                names.by_name.remove(&self.name);
            }
        }
        if names.by_name.is_empty() {
            names.idle_since = Some(Instant::now());
        }
    }
}

#[async_trait]
impl Notices for Subscription {
    async fn wait(&self, max: Duration) {
        let seen = self.seen.load(Ordering::Relaxed);
        if !self.stream.live.load(Ordering::Acquire) && *self.events.borrow() == seen {
            // The stream ended (and its last word was taken): poll for the rest of the wait.
            let step = locked(&self.backoff).next_delay();
            tokio::time::sleep(step.min(max)).await;
            return;
        }
        let mut events = self.events.clone();
        let _ = tokio::time::timeout(max, events.wait_for(|&v| v != seen)).await;
        self.seen.store(*events.borrow(), Ordering::Relaxed);
    }
}
