//! How waiters hear of a release: `LISTEN` on the lock table's channel, on one connection per
//! client kept for it (a session of its own: `LISTEN` is session state, which a
//! transaction-pooling proxy would not keep). Every release that frees a row runs
//! `pg_notify(channel, name)` in its own statement, delivered at its commit; the listener wakes
//! the client's waiters of that name. A notice is only a hint: the waiter attempts again, and
//! the row decides.
//!
//! While the listener has no session (not yet connected, lost, reconnecting), notices may be
//! missed: it wakes every waiter when it loses the session and again once it listens anew, and
//! in between waiters poll with the configured backoff.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_api::backend::async_trait;
use distlock_api::backend::wait::{Backoff, Notices};
use distlock_api::LockName;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One client's listener: started at the first wait, stopped with the client.
pub(crate) struct Listener {
    channel: String,
    options: PgConnectOptions,
    connect_timeout: Duration,
    backoff: (Duration, Duration),
    shared: Arc<Shared>,
    task: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct Shared {
    /// Per name: the count of notices so far, and how many subscriptions watch it.
    names: Mutex<HashMap<String, (watch::Sender<u64>, usize)>>,
    /// Whether the listener is listening now.
    ready: watch::Sender<bool>,
}

impl Shared {
    fn wake(&self, name: &str) {
        if let Some((tx, _)) = self.names.lock().unwrap().get(name) {
            tx.send_modify(|n| *n += 1);
        }
    }

    fn wake_all(&self) {
        for (tx, _) in self.names.lock().unwrap().values() {
            tx.send_modify(|n| *n += 1);
        }
    }

    fn set_ready(&self, ready: bool) {
        self.ready.send_replace(ready);
        // Either way a notice may have been missed: everyone looks again.
        self.wake_all();
    }
}

impl Listener {
    pub(crate) fn new(
        channel: String,
        options: PgConnectOptions,
        connect_timeout: Duration,
        backoff: (Duration, Duration),
    ) -> Self {
        Self {
            channel,
            options,
            connect_timeout,
            backoff,
            shared: Arc::default(),
            task: Mutex::new(None),
        }
    }

    /// A subscription to `name`'s notices, made once the listener listens (or the connect
    /// timeout ran out: then it polls until the listener listens).
    pub(crate) async fn subscribe(&self, name: &LockName) -> Subscription {
        self.start();
        let rx = {
            let mut names = self.shared.names.lock().unwrap();
            let entry = names
                .entry(name.as_str().to_string())
                .or_insert_with(|| (watch::channel(0).0, 0));
            entry.1 += 1;
            entry.0.subscribe()
        };
        let mut ready = self.shared.ready.subscribe();
        let _ = tokio::time::timeout(self.connect_timeout, ready.wait_for(|r| *r)).await;
        Subscription {
            name: name.as_str().to_string(),
            shared: self.shared.clone(),
            rx: tokio::sync::Mutex::new(rx),
            backoff: Mutex::new(Backoff::new(self.backoff.0, self.backoff.1)),
        }
    }

    /// Whether the listener listens now (test-only).
    #[cfg(feature = "testing")]
    pub(crate) fn listening(&self) -> bool {
        *self.shared.ready.borrow()
    }

    fn start(&self) {
        let mut task = self.task.lock().unwrap();
        if task.is_none() {
            *task = Some(tokio::spawn(listen(
                self.channel.clone(),
                self.options.clone(),
                self.connect_timeout,
                self.backoff,
                self.shared.clone(),
            )));
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(task) = self.task.lock().unwrap().take() {
            task.abort();
        }
    }
}

/// Listens until aborted: connects, `LISTEN`s, dispatches notices by name; on any failure
/// drops the session, wakes everyone and connects again after a backoff.
async fn listen(
    channel: String,
    options: PgConnectOptions,
    connect_timeout: Duration,
    backoff: (Duration, Duration),
    shared: Arc<Shared>,
) {
    let mut retry = Backoff::new(
        backoff.0.max(Duration::from_millis(50)),
        Duration::from_secs(1),
    );
    loop {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(connect_timeout)
            .connect_lazy_with(options.clone());
        let listening = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.ignore_pool_close_event(true);
            listener.listen(&channel).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = match tokio::time::timeout(connect_timeout, listening).await {
            Ok(Ok(listener)) => listener,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "postgres listener: cannot listen");
                tokio::time::sleep(retry.next_delay()).await;
                continue;
            }
            Err(_) => {
                tracing::debug!("postgres listener: no session within the connect timeout");
                tokio::time::sleep(retry.next_delay()).await;
                continue;
            }
        };
        shared.set_ready(true);
        retry = Backoff::new(
            backoff.0.max(Duration::from_millis(50)),
            Duration::from_secs(1),
        );
        loop {
            match listener.try_recv().await {
                Ok(Some(notice)) => shared.wake(notice.payload()),
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "postgres listener: session lost");
                    break;
                }
            }
        }
        shared.set_ready(false);
        drop(listener);
        pool.close().await;
        tokio::time::sleep(retry.next_delay()).await;
    }
}

/// One waiter's subscription to one name's notices.
pub(crate) struct Subscription {
    name: String,
    shared: Arc<Shared>,
    rx: tokio::sync::Mutex<watch::Receiver<u64>>,
    backoff: Mutex<Backoff>,
}

#[async_trait]
impl Notices for Subscription {
    async fn wait(&self, max: Duration) {
        if !*self.shared.ready.borrow() {
            // No session to hear notices on: poll.
            let step = self.backoff.lock().unwrap().next_delay();
            tokio::time::sleep(step.min(max)).await;
            return;
        }
        let mut rx = self.rx.lock().await;
        let _ = tokio::time::timeout(max, rx.changed()).await;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut names = self.shared.names.lock().unwrap();
        if let Some(entry) = names.get_mut(&self.name) {
            entry.1 -= 1;
            if entry.1 == 0 {
                names.remove(&self.name);
            }
        }
    }
}
