//! The ZooKeeper session a client's locks live and die with: opening it, and watching it so
//! that its end (expiry, or a disconnection longer than the session timeout) fires `lost()` on
//! every guard it held and a fresh session takes its place.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Weak;
use std::time::{Duration, Instant};

use distlock_api::{Error, ErrorKind, Result};
use tokio::sync::{oneshot, watch};
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::error::{in_doubt, no_answer, zk_error};

/// The first delay between reconnect attempts after a session ended; it doubles to
/// [`RECONNECT_BACKOFF_CAP`].
const RECONNECT_BACKOFF: Duration = Duration::from_millis(50);
const RECONNECT_BACKOFF_CAP: Duration = Duration::from_secs(5);
/// Pause before repeating a request whose answer was lost (the client is reconnecting).
pub(crate) const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// One ZooKeeper session, as the locks acquired in it see it.
pub(crate) struct Session {
    pub(crate) client: zk::Client,
    /// The session id, as ephemeral nodes record their owner.
    pub(crate) id: i64,
    /// The negotiated session timeout. The lease a grant or renewal reports is [`lease`] of it.
    pub(crate) timeout: Duration,
    /// Counts the sessions of one client handle, so a hold knows which one it belongs to.
    pub(crate) epoch: u64,
    /// Set once the session is known to be over (or given up on); operations then fail fast
    /// instead of queueing behind a connection that will not come back.
    lost: AtomicBool,
    /// Turns `true` with `lost`, to wake acquires waiting in this session.
    pub(crate) ended: watch::Sender<bool>,
    /// How long one request may take before it counts as lost in transit.
    pub(crate) op_timeout: Duration,
}

/// The lease a confirmation from the ensemble vouches for, counted from the moment its request
/// was sent: half the negotiated session timeout `T`.
///
/// Only the leader expires sessions. The server a client talks to (a follower, say) records the
/// session's requests and pings and reports them to the leader in its answer to the leader's
/// ping; the leader then moves the session's expiry to the moment it heard the report plus `T`.
/// A follower cut off from the leader keeps answering reads and pings from its stale copy until
/// it notices (`syncLimit × tickTime`), so its answer alone says nothing about the leader's
/// clock: the leader may already be counting down from a report it had long before. What
/// does vouch for the session is a request, sent at `s`, that went through the leader and came
/// back: a `sync`, or a write (the create of a queue node, a release's delete). The server
/// forwarded it at or after `s`, on the connection that had carried its earlier reports to
/// the leader, so the leader had heard every report that server sent before `s`. With
/// ZooKeeper's defaults those come at least every `T/4` (the leader pings its followers every
/// `tickTime/2`, and a session timeout is at least `minSessionTimeout = 2 × tickTime`), and
/// the client touches its session at least every `T/5` (the driver pings after `3/20 × T` of
/// silence, looking every `T/20`; an application's connector whose connection timeout lies
/// between `2T/5` and `3T/5` makes it look less often). So the leader had heard of a touch no
/// older than `s − T/4 − T/5`, and will not expire the session before `s + 11T/20`.
///
/// `11T/20` leaves nothing over: it holds only if every timer fires on time and every answer
/// is instant. The driver sends no ping while the previous one is unanswered, and the server
/// answers a session's requests (pings included) in order, so a ping queued behind a `sync`
/// waits for the leader: a busy ensemble stretches the client's `T/5`. Half the timeout keeps
/// `T/20` for such delays and for network latency; the drift margin lock-api takes off is for
/// clock rates. The bound assumes the ensemble's `tickTime` is at most `T/2` (ZooKeeper's own
/// floor unless an operator sets `minSessionTimeout` below `2 × tickTime`).
pub(crate) fn lease(timeout: Duration) -> Duration {
    timeout / 2
}

impl Session {
    /// The lease a request of this session that went through the leader vouches for.
    pub(crate) fn lease(&self) -> Duration {
        lease(self.timeout)
    }

    /// Sends a `sync` and then the read `read` sends, at once, and resolves when both are
    /// answered: with the read's answer if the sync succeeded too. The server answers a
    /// session's requests in order and holds the read back until the leader has answered the
    /// sync, so the read is as new as the leader's state then, and its success proves that the
    /// server still followed the leader after the moment this was called (see [`lease`]). Both
    /// requests are on the wire before this returns; the caller bounds the wait.
    pub(crate) fn behind_sync<'a, T: 'a, F>(
        &'a self,
        read: impl FnOnce(&'a zk::Client) -> F,
    ) -> impl Future<Output = std::result::Result<T, zk::Error>> + 'a
    where
        F: Future<Output = std::result::Result<T, zk::Error>> + 'a,
    {
        let synced = self.client.sync("/");
        let read = read(&self.client);
        async move {
            let (synced, read) = tokio::join!(synced, read);
            let value = read?;
            synced.map(|()| value)
        }
    }

    /// Whether the session is over or given up on.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst) || self.client.state().is_terminated()
    }

    pub(crate) fn mark_lost(&self) {
        self.lost.store(true, Ordering::SeqCst);
        self.ended.send_replace(true);
    }

    /// Fails with `Unavailable` if the session is over, before any request is queued on it.
    pub(crate) fn check_live(&self) -> Result<()> {
        if self.is_lost() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                "the ZooKeeper session ended; a new one is being established",
            ));
        }
        Ok(())
    }

    /// Runs one request with the per-request bound. `Err(None)` means no answer in time: the
    /// request may or may not have been applied.
    pub(crate) async fn call<T>(
        &self,
        request: impl Future<Output = std::result::Result<T, zk::Error>>,
    ) -> std::result::Result<T, Option<zk::Error>> {
        match tokio::time::timeout(self.op_timeout, request).await {
            Ok(r) => r.map_err(Some),
            Err(_) => Err(None),
        }
    }

    /// Runs a request that is safe to repeat (a read, a watch, an idempotent write), again
    /// while its answers get lost, for up to the per-request bound: a connection that drops
    /// and comes back within the session fails nothing.
    pub(crate) async fn call_again<T, F>(
        &self,
        mut request: impl FnMut() -> F,
    ) -> std::result::Result<T, Option<zk::Error>>
    where
        F: Future<Output = std::result::Result<T, zk::Error>>,
    {
        let give_up = Instant::now() + self.op_timeout;
        loop {
            let left = give_up.saturating_duration_since(Instant::now());
            let outcome = match tokio::time::timeout(left, request()).await {
                Ok(r) => r.map_err(Some),
                Err(_) => Err(None),
            };
            match outcome {
                Err(e) if in_doubt(&e) && !self.is_lost() && Instant::now() < give_up => {
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                outcome => return outcome,
            }
        }
    }
}

/// Connects to the ensemble and makes sure the chroot and base path exist, all within the
/// connect timeout.
pub(crate) async fn open(config: &ZkConfig, epoch: u64) -> Result<Session> {
    let limit = config.client.connect_timeout;
    let mut connector = (config.connector.clone())
        .unwrap_or_else(zk::Client::connector)
        .with_session_timeout(config.client.default_ttl);
    if let Some((user, password)) = &config.digest {
        connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
    }
    #[cfg(feature = "sasl")]
    if let Some((user, password)) = &config.sasl {
        let options = zk::SaslOptions::digest_md5(user.clone(), password.clone());
        connector = connector.with_sasl(options);
    }
    #[cfg(feature = "tls")]
    let secure = match &config.tls {
        Some(files) => {
            connector = connector.with_tls(crate::tls::options(files)?);
            true
        }
        None => false,
    };
    let connect = async {
        #[cfg(feature = "tls")]
        let client = match secure {
            true => connector.secure_connect(&config.hosts).await,
            false => connector.connect(&config.hosts).await,
        };
        #[cfg(not(feature = "tls"))]
        let client = connector.connect(&config.hosts).await;
        let client = client.map_err(|e| session_refused(config, e))?;
        let base = config.absolute_base();
        if base != "/" {
            let persistent = zk::CreateMode::Persistent.with_acls(config.get_node_acl().acls());
            client
                .mkdir(&base, &persistent)
                .await
                .map_err(|e| zk_error(e, &format!("cannot create the base path {base:?}")))?;
        }
        let client = match &config.chroot {
            None => client,
            Some(root) => client.chroot(root.as_str()).map_err(|_| {
                Error::invalid(format!("chroot {root:?} is not a valid ZooKeeper path"))
            })?,
        };
        Ok::<_, Error>(client)
    };
    let client = tokio::time::timeout(limit, connect).await.map_err(|_| {
        Error::new(
            ErrorKind::Unavailable,
            format!(
                "no ZooKeeper session with {} within the connect timeout of {limit:?}{}",
                config.hosts,
                if config.uses_tls() {
                    " (over TLS: a server that is not listening for TLS there, or whose \
                     certificate the tls_ca does not sign or does not name the host as the \
                     URL spells it, looks the same)"
                } else {
                    ""
                }
            ),
        )
    })??;
    let timeout = client.session_timeout();
    Ok(Session {
        id: client.session_id().0,
        timeout,
        epoch,
        lost: AtomicBool::new(false),
        ended: watch::channel(false).0,
        op_timeout: timeout.max(config.client.operation_timeout),
        client,
    })
}

/// The error of a session the client could not establish. `AuthFailed` while connecting is
/// the server refusing the session's authentication: the SASL exchange failed (a wrong user or
/// password, or a server without the user or without SASL), or the server requires SASL
/// (`sessionRequireClientSASLAuth`, `enforce.auth.enabled`) of a session that has none.
/// Retrying cannot cure either, so it stays `Backend`, with a message that says which.
fn session_refused(config: &ZkConfig, e: zk::Error) -> Error {
    if e != zk::Error::AuthFailed {
        return zk_error(e, "cannot establish a session");
    }
    let what = match config.get_sasl_user() {
        Some(user) => format!(
            "SASL authentication failed: ZooKeeper at {} refused the DIGEST-MD5 credentials of \
             user {user:?} (a wrong user name or password, or a server whose JAAS `Server` \
             section does not know the user or that has no SASL authentication provider)",
            config.hosts
        ),
        None => format!(
            "ZooKeeper at {} refused the session: it requires an authentication the session \
             does not have (a server with sessionRequireClientSASLAuth=true or \
             enforce.auth.enabled=true wants SASL: give SASL credentials with \
             sasl=digest-md5 in the URL, or sasl_digest_md5, feature `sasl`)",
            config.hosts
        ),
    };
    zk_error(e, &what)
}

/// The client a session monitor reports to.
pub(crate) trait Sessions: Send + Sync + 'static {
    /// The session of `epoch` is over, for `reason`: every hold in it is gone.
    fn session_ended(&self, epoch: u64, reason: &str);
    /// `session` replaces the one that ended.
    fn install(&self, session: Session);
}

/// Watches the client's current session; when it ends, fires `lost()` on its guards, then
/// opens a new session (with backoff) and installs it. Ends when the client handle is dropped
/// (`stop` closes).
pub(crate) async fn monitor<S: Sessions>(
    inner: Weak<S>,
    config: ZkConfig,
    mut stop: oneshot::Receiver<()>,
    mut states: zk::StateWatcher,
    mut timeout: Duration,
    mut epoch: u64,
) {
    loop {
        let reason = tokio::select! {
            _ = &mut stop => return,
            reason = session_end(&mut states, timeout) => reason,
        };
        tracing::warn!(epoch, %reason, "ZooKeeper session ended; locks held in it are lost");
        match inner.upgrade() {
            Some(inner) => inner.session_ended(epoch, &reason),
            None => return,
        }
        let mut backoff = RECONNECT_BACKOFF;
        let session = loop {
            let attempt = tokio::select! {
                _ = &mut stop => return,
                attempt = open(&config, epoch + 1) => attempt,
            };
            match attempt {
                Ok(session) => break session,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot open a new ZooKeeper session; retrying");
                    tokio::select! {
                        _ = &mut stop => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(RECONNECT_BACKOFF_CAP);
                }
            }
        };
        epoch = session.epoch;
        timeout = session.timeout;
        states = session.client.state_watcher();
        match inner.upgrade() {
            Some(inner) => inner.install(session),
            None => return,
        }
    }
}

/// Resolves, with the reason, when the session is over: expired, closed, refused, or
/// disconnected for longer than the session timeout. By then the server has expired it (or
/// will when it hears from us again, which dropping the client arranges), so no lock it held
/// can be trusted.
async fn session_end(states: &mut zk::StateWatcher, timeout: Duration) -> String {
    let mut disconnected_since = match states.peek_state() {
        zk::SessionState::Disconnected => Some(Instant::now()),
        s if s.is_terminated() => return terminal_reason(s),
        _ => None,
    };
    loop {
        let state = match disconnected_since {
            None => states.changed().await,
            Some(since) => tokio::select! {
                state = states.changed() => state,
                _ = tokio::time::sleep_until((since + timeout).into()) => {
                    return format!(
                        "disconnected from ZooKeeper for longer than the session timeout \
                         ({timeout:?})"
                    );
                }
            },
        };
        match state {
            zk::SessionState::Disconnected => {
                disconnected_since.get_or_insert_with(Instant::now);
            }
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                disconnected_since = None;
            }
            terminal => return terminal_reason(terminal),
        }
    }
}

fn terminal_reason(state: zk::SessionState) -> String {
    match state {
        zk::SessionState::Closed => "ZooKeeper session closed".into(),
        zk::SessionState::AuthFailed => "ZooKeeper session refused: authentication failed".into(),
        _ => "ZooKeeper session expired".into(),
    }
}

/// Maps a failed request: a lost answer is `Unavailable`, and so is any error once the
/// session is over (whatever the client reports then).
pub(crate) fn request_error(e: Option<zk::Error>, what: &str, s: &Session) -> Error {
    match e {
        None => no_answer(what, s.op_timeout),
        Some(e) if s.is_lost() => {
            zk_error(e, &format!("{what}: the session ended")).temporary(true)
        }
        Some(e) => zk_error(e, what),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_confirmation_vouches_for_half_the_session_timeout() {
        let ms = Duration::from_millis;
        assert_eq!(lease(ms(2000)), ms(1000));
        assert_eq!(lease(ms(400)), ms(200));
        assert_eq!(lease(Duration::from_secs(10)), Duration::from_secs(5));
        assert_eq!(lease(ms(401)), Duration::from_micros(200_500));
    }

    #[test]
    fn the_lease_ends_before_the_leader_can_expire_the_session() {
        // From a confirmation sent at 0, the leader's latest touch of the session is at most
        // T/4 (its ping period to a follower, at most tickTime/2 with tickTime <= T/2) plus T/5
        // (the client's longest silence) old, so it expires the session at T - T/4 - T/5 at
        // the earliest; the lease ends before that, with room for late timers.
        for ms in [400, 401, 2000, 4000, 10_000, 30_000, 40_000] {
            let t = Duration::from_millis(ms);
            let leader_expiry_at_the_earliest = t - t / 4 - t / 5;
            assert_eq!(leader_expiry_at_the_earliest, t * 11 / 20, "T = {t:?}");
            assert!(
                lease(t) <= leader_expiry_at_the_earliest - t / 20,
                "T = {t:?}"
            );
        }
    }
}
