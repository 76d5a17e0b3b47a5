//! How waiters hear of a release: one pub/sub connection per client, shared by all its waiters.
//!
//! A waiter calls [`Hub::subscribe`] for its lock's release channel and gets a [`Subscription`]
//! once the server has confirmed the channel (so a release published after that is never
//! missed). Channels are reference-counted: the first waiter of a channel subscribes it, the last
//! one to leave — done, timed out or cancelled — unsubscribes it.
//!
//! Two tasks per client do the work. The *manager* owns the connection and is the only one that
//! sends SUBSCRIBE/UNSUBSCRIBE: it compares the channels waiters want with those the connection
//! has and fixes the difference, one batch at a time, so a leave and a re-join of one channel
//! can never reach the server out of order. The *reader* hands each message to the channel's
//! waiters. When the connection drops, every waiter is woken (a release may have been missed)
//! and the manager resubscribes on a new connection.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use distlock_api::{Error, ErrorKind, Result};
use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::endpoint::{ClusterSpec, Endpoint, Options};
use crate::ops::driver_error;
use crate::sentinel::Sentinel;

mod sentinel;
mod shard;

/// How long the manager waits before reconnecting after a failed connect, at first and at most.
const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(2);
const SENTINEL_RECONNECT_MAX: Duration = Duration::from_millis(250);

/// A client's pub/sub hub. Cheap to share; the tasks end when the last handle and subscription
/// are gone.
pub(crate) struct Hub {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Tells the manager that the wanted channels changed or the connection dropped.
    kick: mpsc::UnboundedSender<Kick>,
}

#[derive(Default)]
struct State {
    channels: HashMap<String, Channel>,
}

struct Channel {
    /// Live subscriptions.
    refs: usize,
    /// Bumped on every message, and when the connection drops (a message may have been lost).
    events: watch::Sender<u64>,
    /// Confirmed on the current connection.
    ready: bool,
    /// Subscribers waiting for the confirmation.
    pending: Vec<oneshot::Sender<Result<()>>>,
}

enum Kick {
    Changed,
    Disconnected(u64),
    /// The server dropped a shard channel's subscription (its slot moved to another node).
    Dropped(String),
    /// The sentinels named another master (see `sentinel.rs`).
    MasterMoved,
}

/// Connection settings the manager needs.
pub(crate) struct HubConfig {
    pub(crate) endpoint: Endpoint,
    pub(crate) backend: &'static str,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    /// A Redis Cluster's seeds and options: release notices come through shard channels
    /// (`SSUBSCRIBE`) on the driver's cluster connection, which sends each to the node that
    /// owns the channel's slot and subscribes again after a reconnect.
    pub(crate) cluster: Option<(ClusterSpec, Options)>,
    /// A master found through Sentinel: the notices' connection goes to the master the
    /// sentinels name, and moves when the command connection moves.
    pub(crate) sentinel: Option<Arc<Sentinel>>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // Every update under this lock is a few assignments that cannot panic half-way.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Hub {
    /// A hub that connects on first use. Must be called inside a Tokio runtime.
    pub(crate) fn new(config: HubConfig) -> Self {
        let (kick, kicks) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            kick,
        });
        let master_moves = config.sentinel.as_ref().map(|s| s.master_moves());
        let manager = Manager {
            shared: Arc::downgrade(&shared),
            master_moves,
            conn_master: None,
            wake_when_subscribed: false,
            config,
            kicks,
            conn: None,
            generation: 0,
            subscribed: HashSet::new(),
            retry_in: None,
        };
        tokio::spawn(manager.run());
        Self { shared }
    }

    /// Subscribes to `channel` and returns once the server confirmed it (at once if another
    /// waiter of this client already has). Dropping the returned subscription, or this future,
    /// gives the channel up.
    pub(crate) async fn subscribe(&self, channel: &str) -> Result<Subscription> {
        let (events, confirmed) = {
            let mut st = lock(&self.shared.state);
            let ch = st
                .channels
                .entry(channel.to_string())
                .or_insert_with(|| Channel {
                    refs: 0,
                    events: watch::channel(0).0,
                    ready: false,
                    pending: Vec::new(),
                });
            ch.refs += 1;
            let events = ch.events.subscribe();
            let confirmed = (!ch.ready).then(|| {
                let (tx, rx) = oneshot::channel();
                ch.pending.push(tx);
                rx
            });
            (events, confirmed)
        };
        // Built before any await, so that cancellation gives the channel back.
        let seen = AtomicU64::new(*events.borrow());
        let sub = Subscription {
            shared: self.shared.clone(),
            channel: channel.to_string(),
            events,
            seen,
        };
        if let Some(confirmed) = confirmed {
            let _ = self.shared.kick.send(Kick::Changed);
            match confirmed.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        "the client's pub/sub task has stopped",
                    ))
                }
            }
        }
        Ok(sub)
    }
}

/// One waiter's interest in one channel.
pub(crate) struct Subscription {
    shared: Arc<Shared>,
    channel: String,
    events: watch::Receiver<u64>,
    /// The event count this waiter has seen: a message that arrives between two waits (while
    /// the waiter retries) is still noticed by the next wait.
    seen: AtomicU64,
}

#[distlock_api::backend::async_trait]
impl distlock_api::backend::wait::Notices for Subscription {
    async fn wait(&self, max: Duration) {
        Subscription::wait(self, max).await
    }
}

impl Subscription {
    /// Takes every message that has arrived so far as seen: the next [`wait`](Self::wait)
    /// returns only at a later one.
    pub(crate) fn mark_seen(&self) {
        self.seen.store(*self.events.borrow(), Ordering::Relaxed);
    }

    /// Whether a message arrived since the last [`mark_seen`](Self::mark_seen) or wait.
    pub(crate) fn moved(&self) -> bool {
        *self.events.borrow() != self.seen.load(Ordering::Relaxed)
    }

    /// The channel's message count, to await the next message with.
    pub(crate) fn receiver(&self) -> watch::Receiver<u64> {
        self.events.clone()
    }

    /// Returns when a message arrived on the channel since the last call (or since subscribing),
    /// or after `max`.
    pub(crate) async fn wait(&self, max: Duration) {
        let seen = self.seen.load(Ordering::Relaxed);
        let mut events = self.events.clone();
        let changed = async { events.wait_for(|&n| n != seen).await.map(|n| *n) };
        match tokio::time::timeout(max, changed).await {
            Ok(Ok(n)) => self.seen.store(n, Ordering::Relaxed),
            Err(_) => {}
            // The sender lives as long as any subscription of the channel, so this does not
            // happen; should it, sleep rather than spin.
            Ok(Err(_)) => tokio::time::sleep(max).await,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut st = lock(&self.shared.state);
        let last = match st.channels.get_mut(&self.channel) {
            Some(ch) => {
                ch.refs -= 1;
                ch.refs == 0
            }
            None => false,
        };
        if last {
            st.channels.remove(&self.channel);
            drop(st);
            let _ = self.shared.kick.send(Kick::Changed);
        }
    }
}

struct Conn {
    sink: Sink,
    reader: JoinHandle<()>,
}

enum Sink {
    Single(PubSubSink),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Sink {
    async fn subscribe(&mut self, channels: &[String]) -> redis::RedisResult<()> {
        match self {
            Sink::Single(sink) => sink.subscribe(channels).await,
            // One channel per command: channels of different names live in different slots.
            Sink::Cluster(c) => {
                for channel in channels {
                    c.ssubscribe(channel).await?;
                }
                Ok(())
            }
        }
    }

    async fn unsubscribe(&mut self, channels: &[String]) -> redis::RedisResult<()> {
        match self {
            Sink::Single(sink) => sink.unsubscribe(channels).await,
            Sink::Cluster(c) => {
                for channel in channels {
                    c.sunsubscribe(channel).await?;
                }
                Ok(())
            }
        }
    }
}

struct Manager {
    shared: Weak<Shared>,
    config: HubConfig,
    kicks: mpsc::UnboundedReceiver<Kick>,
    conn: Option<Conn>,
    /// Tells a stale reader's disconnect notice from the current one's.
    generation: u64,
    /// What the current connection is subscribed to.
    subscribed: HashSet<String>,
    /// Set after a failed connect or command: when to try again.
    retry_in: Option<Duration>,
    /// With Sentinel: the master the command connection uses, and the one this hub's
    /// connection goes to.
    master_moves: Option<watch::Receiver<String>>,
    conn_master: Option<String>,
    /// With Sentinel: the connection dropped, and its waiters are to be woken once their
    /// channels are subscribed again.
    wake_when_subscribed: bool,
}

impl Manager {
    async fn run(mut self) {
        loop {
            let kick = self.next_kick().await;
            // `None`: the hub and every subscription are gone.
            let Some(kick) = kick else { break };
            self.absorb(kick);
            while let Ok(k) = self.kicks.try_recv() {
                self.absorb(k);
            }
            let Some(shared) = self.shared.upgrade() else {
                break;
            };
            self.reconcile(&shared).await;
        }
        if let Some(conn) = self.conn.take() {
            conn.reader.abort();
        }
    }

    fn absorb(&mut self, kick: Kick) {
        match kick {
            Kick::Disconnected(generation) if generation == self.generation => {
                self.drop_connection();
            }
            // Subscribed again by the next reconcile if a waiter still wants it.
            Kick::Dropped(channel) => {
                self.subscribed.remove(&channel);
            }
            Kick::MasterMoved => self.follow_master(),
            _ => {}
        }
    }

    /// Forgets the connection and wakes every waiter: messages may have been lost with it.
    fn drop_connection(&mut self) {
        if let Some(conn) = self.conn.take() {
            conn.reader.abort();
        }
        self.conn_master = None;
        self.subscribed.clear();
        if self.config.sentinel.is_some() {
            // The master may be failing over: a waiter woken now would find no master to ask.
            // Its channels are marked unconfirmed, and it is woken once they are subscribed on
            // the master the sentinels name (see `confirm`).
            self.wake_when_subscribed = true;
            if let Some(shared) = self.shared.upgrade() {
                for ch in lock(&shared.state).channels.values_mut() {
                    ch.ready = false;
                }
            }
            return;
        }
        if let Some(shared) = self.shared.upgrade() {
            let mut st = lock(&shared.state);
            for ch in st.channels.values_mut() {
                ch.ready = false;
                ch.events.send_modify(|n| *n += 1);
            }
        }
    }

    /// Makes the connection's subscriptions equal the wanted channels.
    async fn reconcile(&mut self, shared: &Arc<Shared>) {
        let (to_sub, to_unsub) = {
            let st = lock(&shared.state);
            let to_sub: Vec<String> = st
                .channels
                .keys()
                .filter(|c| !self.subscribed.contains(*c))
                .cloned()
                .collect();
            let to_unsub: Vec<String> = self
                .subscribed
                .iter()
                .filter(|c| !st.channels.contains_key(*c))
                .cloned()
                .collect();
            (to_sub, to_unsub)
        };
        let mut failed = false;
        if !to_unsub.is_empty() {
            if let Some(conn) = &mut self.conn {
                match command(&self.config, conn.sink.unsubscribe(&to_unsub)).await {
                    Ok(()) => {
                        for c in &to_unsub {
                            self.subscribed.remove(c);
                        }
                    }
                    Err(_) => {
                        // The server drops a broken connection's subscriptions by itself.
                        self.drop_connection();
                        failed = true;
                    }
                }
            }
        }
        if !to_sub.is_empty() {
            if let Err(e) = self.subscribe(&to_sub).await {
                self.fail_pending(shared, &to_sub, &e);
                failed = true;
            }
        }
        if failed {
            self.schedule_retry();
        } else {
            self.retry_in = None;
        }
        self.confirm(shared);
    }

    async fn subscribe(&mut self, channels: &[String]) -> Result<()> {
        if self.conn.is_none() {
            self.connect().await?;
        }
        let Some(conn) = &mut self.conn else {
            return Ok(());
        };
        match command(&self.config, conn.sink.subscribe(channels)).await {
            Ok(()) => {
                self.subscribed.extend(channels.iter().cloned());
                Ok(())
            }
            Err(e) => {
                self.drop_connection();
                Err(e)
            }
        }
    }

    async fn connect(&mut self) -> Result<()> {
        if self.config.cluster.is_some() {
            return self.connect_cluster().await;
        }
        if self.config.sentinel.is_some() {
            return self.connect_sentinel().await;
        }
        let endpoint = self.config.endpoint.clone();
        self.connect_to(&endpoint).await
    }

    /// A pub/sub connection to one server, and its reader.
    async fn connect_to(&mut self, endpoint: &Endpoint) -> Result<()> {
        let c = &self.config;
        let pubsub =
            match tokio::time::timeout(c.connect_timeout, endpoint.client.get_async_pubsub()).await
            {
                Ok(Ok(p)) => p,
                Ok(Err(e)) => return Err(driver_error(c.backend, endpoint, "pub/sub connect", e)),
                Err(_) => {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!(
                            "pub/sub connect to {} took longer than {:?}",
                            endpoint.display, c.connect_timeout
                        ),
                    )
                    .with_backend(c.backend))
                }
            };
        let (sink, stream) = pubsub.split();
        self.generation += 1;
        let reader = tokio::spawn(read(
            self.shared.clone(),
            stream,
            self.generation,
            self.kick_sender(),
        ));
        self.conn = Some(Conn {
            sink: Sink::Single(sink),
            reader,
        });
        Ok(())
    }

    fn kick_sender(&self) -> Option<mpsc::WeakUnboundedSender<Kick>> {
        self.shared.upgrade().map(|s| s.kick.downgrade())
    }

    fn schedule_retry(&mut self) {
        // Through Sentinel, a new master is found as soon as the sentinels name it.
        let max = if self.config.sentinel.is_some() {
            SENTINEL_RECONNECT_MAX
        } else {
            RECONNECT_MAX
        };
        self.retry_in = Some(match self.retry_in {
            None => RECONNECT_MIN,
            Some(d) => (d * 2).min(max),
        });
    }

    /// Marks subscribed channels ready and tells their pending subscribers.
    fn confirm(&mut self, shared: &Arc<Shared>) {
        // After a reconnect with Sentinel: a release may have been missed meanwhile.
        let wake = self.conn.is_some() && std::mem::take(&mut self.wake_when_subscribed);
        let mut st = lock(&shared.state);
        for (name, ch) in st.channels.iter_mut() {
            if self.subscribed.contains(name) {
                if wake {
                    ch.events.send_modify(|n| *n += 1);
                }
                ch.ready = true;
                for tx in ch.pending.drain(..) {
                    let _ = tx.send(Ok(()));
                }
            }
        }
    }

    fn fail_pending(&self, shared: &Arc<Shared>, channels: &[String], e: &Error) {
        let mut st = lock(&shared.state);
        for name in channels {
            if let Some(ch) = st.channels.get_mut(name) {
                for tx in ch.pending.drain(..) {
                    let err = Error::new(e.kind(), e.message().to_string())
                        .with_backend(self.config.backend)
                        .temporary(e.is_temporary());
                    let _ = tx.send(Err(err));
                }
            }
        }
    }
}

/// Bounds a subscribe/unsubscribe by the response timeout.
async fn command(
    c: &HubConfig,
    fut: impl std::future::Future<Output = redis::RedisResult<()>>,
) -> Result<()> {
    match tokio::time::timeout(c.response_timeout, fut).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(driver_error(c.backend, &c.endpoint, "pub/sub command", e)),
        Err(_) => Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "pub/sub command on {} unanswered after {:?}",
                c.endpoint.display, c.response_timeout
            ),
        )
        .with_backend(c.backend)),
    }
}

/// Hands messages to their channel's waiters until the connection ends, then tells the manager.
async fn read(
    shared: Weak<Shared>,
    mut stream: PubSubStream,
    generation: u64,
    kick: Option<mpsc::WeakUnboundedSender<Kick>>,
) {
    while let Some(msg) = stream.next().await {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let st = lock(&shared.state);
        if let Some(ch) = st.channels.get(msg.get_channel_name()) {
            ch.events.send_modify(|n| *n += 1);
        }
    }
    if let Some(kick) = kick.and_then(|k| k.upgrade()) {
        let _ = kick.send(Kick::Disconnected(generation));
    }
}
