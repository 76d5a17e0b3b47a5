//! The client's one lease: what the client knows of it, and how it is granted.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use distlock_api::{Error, ErrorKind, Result};
use etcd_client::{Client, LeaseGrantResponse};
use tokio::sync::Notify;

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

pub(crate) enum State {
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

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
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
    pub(crate) fn confirm(&self, id: i64, sent: Instant) {
        if let State::Live(info) = &mut *self.lock() {
            if info.id == id && sent > info.anchor {
                info.anchor = sent;
            }
        }
    }

    /// Marks lease `id` lost; `false` if it was not the live lease.
    pub(crate) fn lost(&self, id: i64) -> bool {
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
    pub(crate) fn replace(&self, info: LeaseInfo) -> bool {
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

/// Whether the server said the lease is gone.
pub(crate) fn lease_not_found(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::LeaseKeepAliveError(m) => m.contains("not found"),
        etcd_client::Error::GRpcStatus(s) => s.message().contains("lease not found"),
        _ => false,
    }
}
