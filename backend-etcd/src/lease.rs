//! The client's one lease: its state, and the background task that keeps it alive, reports its
//! loss to every guard it backs, and replaces it.

use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use distlock_api::{Error, ErrorKind, LostReason, Result};
use etcd_client::{Client, LeaseGrantResponse};
use tokio::sync::Notify;

use crate::backend::Shared;
use crate::keys;

/// A live lease as the client knows it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeaseInfo {
    /// The server's lease id.
    pub(crate) id: i64,
    /// The TTL the server granted (not the one asked for).
    pub(crate) ttl: Duration,
    /// When the latest request the server acknowledged as keeping this lease alive (the grant
    /// or a keep-alive) was *sent*: the server's expiry is no earlier than `anchor + ttl`.
    pub(crate) anchor: Instant,
}

impl LeaseInfo {
    /// The instant up to which the lease is surely alive on the server, by our clock.
    pub(crate) fn alive_until(&self) -> Instant {
        self.anchor + self.ttl
    }
}

enum State {
    Live(LeaseInfo),
    /// The lease was lost; the keep-alive task is being granted a new one.
    Replacing,
    /// `close()` ran or the client was dropped.
    Closed,
}

/// The current lease, shared by the operations and the keep-alive task.
pub(crate) struct LeaseCell {
    state: Mutex<State>,
    /// Woken on every change of state, for waiters whose queue entry goes with the lease.
    changed: Notify,
}

impl LeaseCell {
    pub(crate) fn new(info: LeaseInfo) -> Self {
        Self {
            state: Mutex::new(State::Live(info)),
            changed: Notify::new(),
        }
    }

    /// Resolves once lease `id` is no longer the live lease (lost, replaced or closed).
    pub(crate) async fn gone(&self, id: i64) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.get(id).is_none() {
                return;
            }
            changed.await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update is one assignment: a poisoned lock still holds a consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The live lease, or why there is none.
    pub(crate) fn current(&self) -> Result<LeaseInfo> {
        match &*self.lock() {
            State::Live(info) => Ok(*info),
            State::Replacing => Err(Error::new(
                ErrorKind::Unavailable,
                "the client's lease was lost and a new one is not granted yet",
            )),
            State::Closed => {
                Err(Error::new(ErrorKind::Unavailable, "the client is closed").temporary(false))
            }
        }
    }

    /// The live lease if it is `id`.
    pub(crate) fn get(&self, id: i64) -> Option<LeaseInfo> {
        match &*self.lock() {
            State::Live(info) if info.id == id => Some(*info),
            _ => None,
        }
    }

    /// Records that the server acknowledged a keep-alive of `id` sent at `sent`.
    fn confirm(&self, id: i64, sent: Instant) {
        if let State::Live(info) = &mut *self.lock() {
            if info.id == id && sent > info.anchor {
                info.anchor = sent;
            }
        }
    }

    /// Marks lease `id` lost; `false` if it was not the live lease.
    fn lost(&self, id: i64) -> bool {
        let mut s = self.lock();
        match &*s {
            State::Live(info) if info.id == id => {
                *s = State::Replacing;
                drop(s);
                self.changed.notify_waiters();
                true
            }
            _ => false,
        }
    }

    /// Installs a replacement lease; `false` if the client was closed meanwhile.
    fn replace(&self, info: LeaseInfo) -> bool {
        let mut s = self.lock();
        if matches!(*s, State::Closed) {
            return false;
        }
        *s = State::Live(info);
        drop(s);
        self.changed.notify_waiters();
        true
    }

    /// Closes the cell and returns the lease that was live, to revoke.
    pub(crate) fn close(&self) -> Option<i64> {
        let was = std::mem::replace(&mut *self.lock(), State::Closed);
        self.changed.notify_waiters();
        match was {
            State::Live(info) => Some(info.id),
            _ => None,
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        matches!(*self.lock(), State::Closed)
    }
}

/// Asks for a lease of `ttl_secs` (the server may raise it to its minimum); with the instant
/// the request was sent, for [`granted`].
pub(crate) async fn grant(
    client: Client,
    ttl_secs: i64,
) -> std::result::Result<(Instant, LeaseGrantResponse), etcd_client::Error> {
    let sent = Instant::now();
    let resp = client.lease_client().grant(ttl_secs, None).await?;
    Ok((sent, resp))
}

/// The lease a [`grant`] answer describes, as the server granted it.
pub(crate) fn granted((sent, resp): (Instant, LeaseGrantResponse)) -> Result<LeaseInfo> {
    if !resp.error().is_empty() || resp.ttl() <= 0 {
        return Err(Error::new(
            ErrorKind::Backend,
            format!(
                "the server refused the lease: {:?} (ttl {})",
                resp.error(),
                resp.ttl()
            ),
        ));
    }
    Ok(LeaseInfo {
        id: resp.id(),
        ttl: Duration::from_secs(resp.ttl().unsigned_abs()),
        anchor: sent,
    })
}

/// How long to wait before opening a broken keep-alive stream again.
const REOPEN_DELAY: Duration = Duration::from_millis(200);
/// The longest pause between attempts to be granted a replacement lease.
const REGRANT_MAX_DELAY: Duration = Duration::from_secs(2);

/// Keeps the client's lease alive until the client is dropped or closed. When the lease is
/// lost (the server says it is gone, or no keep-alive was acknowledged within its TTL), fires
/// `lost()` on every guard it backs and is granted a new lease for later acquires.
pub(crate) async fn keep_alive(shared: Weak<Shared>) {
    loop {
        let Some((info, timeout)) = shared.upgrade().and_then(|s| {
            let info = s.lease.current().ok()?;
            Some((info, s.config.client.operation_timeout))
        }) else {
            return;
        };
        let Some(why) = keep_one(&shared, info, timeout).await else {
            return;
        };
        {
            let Some(s) = shared.upgrade() else { return };
            if !s.lease.lost(info.id) {
                return; // closed meanwhile
            }
            s.core.mark_lost(
                |g| keys::lease_of(&g.key) == Some(info.id),
                LostReason::Session(format!("etcd lease {:x} lost: {why}", info.id)),
            );
            // If only the keep-alives were cut off, the server may still have the lease: its
            // guards are told, so free its locks now rather than at its expiry.
            let s = s.clone();
            tokio::spawn(async move {
                let revoke = |c: Client| async move { c.lease_client().revoke(info.id).await };
                let _ = s.call("revoking the lost lease", revoke).await;
            });
        }
        let mut delay = Duration::from_millis(50);
        loop {
            let Some(s) = shared.upgrade() else { return };
            if s.lease.is_closed() {
                return;
            }
            let ttl_secs = s.config.lease_ttl_secs();
            let new = s
                .call("granting a new lease", |c| grant(c, ttl_secs))
                .await
                .and_then(granted);
            if let Ok(new) = new {
                if !s.lease.replace(new) {
                    // Closed while the grant was in flight: give the new lease straight back.
                    let revoke = |c: Client| async move { c.lease_client().revoke(new.id).await };
                    let _ = s.call("revoking the lease", revoke).await;
                    return;
                }
                break;
            }
            drop(s);
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(REGRANT_MAX_DELAY);
        }
    }
}

/// Keeps lease `info` alive; returns why it was lost, or `None` when the client is gone.
async fn keep_one(shared: &Weak<Shared>, info: LeaseInfo, timeout: Duration) -> Option<String> {
    // Three keep-alives per TTL: one can be lost or late without the lease running out.
    let interval = (info.ttl / 3).max(Duration::from_millis(100));
    let mut alive_until = info.alive_until();
    let confirm = |sent: Instant| -> Option<()> {
        shared.upgrade()?.lease.confirm(info.id, sent);
        Some(())
    };
    'stream: loop {
        let now = Instant::now();
        if now >= alive_until {
            return Some("no keep-alive was acknowledged within the lease's TTL".to_string());
        }
        let sent = now;
        let budget = timeout.min(alive_until - now);
        let (i, opened) = {
            let s = shared.upgrade()?;
            let i = s.endpoints.index();
            let opening = async {
                let client = s.endpoints.client(i).await?;
                client.lease_client().keep_alive(info.id).await
            };
            (i, tokio::time::timeout(budget, opening).await)
        };
        let (mut keeper, mut stream) = match opened {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) if lease_not_found(&e) => {
                return Some("the server no longer knows it (revoked or expired)".to_string())
            }
            Ok(Err(_)) | Err(_) => {
                failed(shared, i);
                let pause = REOPEN_DELAY.min(alive_until.saturating_duration_since(now));
                tokio::time::sleep(pause).await;
                continue 'stream;
            }
        };
        // Opening the stream sent one keep-alive and checked its answer.
        alive_until = sent + info.ttl;
        confirm(sent)?;
        let mut last = sent;
        loop {
            tokio::time::sleep_until((last + interval).into()).await;
            shared.upgrade()?;
            let sent = Instant::now();
            if keeper.keep_alive().await.is_err() {
                failed(shared, i);
                continue 'stream;
            }
            let by = (sent + timeout).min(alive_until);
            match tokio::time::timeout_at(by.into(), stream.message()).await {
                Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                    alive_until = sent + info.ttl;
                    confirm(sent)?;
                    last = sent;
                }
                Ok(Ok(Some(_))) => {
                    return Some("the server no longer knows it (revoked or expired)".to_string())
                }
                Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                    failed(shared, i);
                    continue 'stream;
                }
            }
        }
    }
}

/// Moves the client off endpoint `i`, whose keep-alive stream broke.
fn failed(shared: &Weak<Shared>, i: usize) {
    if let Some(s) = shared.upgrade() {
        s.endpoints.failed(i);
    }
}

fn lease_not_found(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::LeaseKeepAliveError(m) => m.contains("not found"),
        etcd_client::Error::GRpcStatus(s) => s.message().contains("lease not found"),
        _ => false,
    }
}
