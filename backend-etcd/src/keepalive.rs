//! The background task that keeps the client's lease alive, reports its loss to every guard it
//! backs, and has a new one granted.

use std::sync::Weak;
use std::time::{Duration, Instant};

use distlock_api::LostReason;
use etcd_client::Client;

use crate::holds::Shared;
use crate::keys;
use crate::lease::{grant, granted, lease_not_found, LeaseInfo};

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
