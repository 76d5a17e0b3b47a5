//! One name's state in the store: its holders (one for a lock, up to `permits` for a
//! semaphore), its FIFO queue of waiters and its fencing counter.

use std::collections::VecDeque;
use std::sync::{OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::oneshot;

use crate::error::LostReason;
use crate::grant::{FencingToken, Grant, LockInfo};
use crate::keeper::HoldState;
use crate::name::{LockName, OwnerId};

pub(super) struct Slot {
    /// The name, shared by every grant of it: an `Arc` clone, no allocation.
    pub(super) name: LockName,
    /// The grants held now, oldest first: at most `permits` of them.
    pub(super) holders: Vec<Holder>,
    /// How many grants the name admits while any is held: what its first holder asked for.
    pub(super) permits: u32,
    pub(super) waiters: VecDeque<Waiter>,
    /// The last fencing token issued for this name, to any of its holders.
    pub(super) token: u64,
    /// Why recent holders that did not release ended (expired, removed), by token, newest
    /// last, as many as the name has permits: what an in-process guard of one reports as its
    /// lost reason.
    pub(super) ended: VecDeque<(FencingToken, LostReason)>,
    /// The `lost()` futures of in-process guards of the current holders, told when one goes.
    pub(super) watchers: Vec<Weak<HoldState>>,
    /// The owner id of the last holder, kept when it goes: a client that takes the name again
    /// (the usual pattern) gets it back instead of a fresh clone, so a lock cycle costs the
    /// owner's reference count nothing.
    pub(super) last_owner: Option<OwnerId>,
}

pub(super) struct Holder {
    pub(super) owner: OwnerId,
    pub(super) count: u32,
    pub(super) token: FencingToken,
    /// When the lease runs out, unless `kept` is above zero.
    pub(super) expires_at: Instant,
    /// How many of the holds are in-process guards with a watchdog-managed lease. While one is
    /// alive the store keeps the lease itself, as the watchdog would by renewing it; this
    /// backend's "server" lives and dies with its clients, so the renewal cannot fail.
    pub(super) kept: u32,
    /// The lease those guards renew with: what is left when the last of them goes.
    pub(super) kept_ttl: Duration,
    /// What the holder proclaimed, as an election's leader: [`LockInfo::value`].
    pub(super) value: Option<String>,
    /// When the grant was made: [`LockInfo::since`].
    pub(super) granted_at: Instant,
}

impl Holder {
    pub(super) fn live(&self, now: Instant) -> bool {
        self.kept > 0 || self.expires_at > now
    }

    /// Whether this is `grant`'s holder (lease not checked): the one test every conditional
    /// release and renew makes.
    pub(super) fn is(&self, grant: &Grant) -> bool {
        self.token == grant.token && self.owner == grant.owner
    }
}

pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) owner: OwnerId,
    pub(super) ttl: Duration,
    pub(super) permits: u32,
    pub(super) tx: oneshot::Sender<Grant>,
}

/// Why an attempt was not granted.
pub(super) enum Refused {
    /// Every permit is held by others, or others queue first.
    Held,
    /// The name is held with this many permits, not the number asked for.
    Permits(u32),
}

fn grant(
    name: &LockName,
    owner: OwnerId,
    token: FencingToken,
    count: u32,
    ttl: Duration,
    now: Instant,
) -> Grant {
    Grant::new(name.clone(), owner, token, count, ttl, now)
}

/// The wall-clock time of a monotonic instant, for [`LockInfo::since`]: the store's clock is
/// this process's. One anchor per process, so the same instant always maps to the same time.
fn wall_clock(at: Instant) -> SystemTime {
    static ANCHOR: OnceLock<(Instant, SystemTime)> = OnceLock::new();
    let (mono, wall) = *ANCHOR.get_or_init(|| (Instant::now(), SystemTime::now()));
    match at.checked_duration_since(mono) {
        Some(after) => wall + after,
        None => wall - mono.duration_since(at),
    }
}

/// The reason an in-process guard reports for a holder removed behind its back.
pub(super) fn removed() -> LostReason {
    LostReason::Taken("the lock was removed from the store".into())
}

impl Slot {
    pub(super) fn new(name: LockName) -> Self {
        Self {
            name,
            holders: Vec::new(),
            permits: 1,
            waiters: VecDeque::new(),
            token: 0,
            ended: VecDeque::new(),
            watchers: Vec::new(),
            last_owner: None,
        }
    }

    /// `owner`, as the new holder's own: the last holder's copy of the label, retagged, if it
    /// shares the label (each acquisition of a client has an id of its own, on one label).
    fn take_owner(&mut self, owner: &OwnerId) -> OwnerId {
        match self.last_owner.take() {
            Some(last) if last.shares_label(owner) => last.with_tag_of(owner),
            _ => owner.clone(),
        }
    }

    fn fresh_token(&mut self) -> FencingToken {
        self.token += 1;
        FencingToken(self.token)
    }

    /// Whether another grant fits beside the holders.
    fn has_room(&self) -> bool {
        self.holders.len() < self.permits as usize
    }

    /// Ends holder `at` (recording `why`, if it did not simply release) and tells the
    /// in-process guards watching the name, which look again.
    pub(super) fn end_holder(&mut self, at: usize, why: Option<LostReason>) {
        let h = self.holders.remove(at);
        if let Some(why) = why {
            if self.ended.len() >= self.permits as usize {
                self.ended.pop_front();
            }
            self.ended.push_back((h.token, why));
        }
        self.last_owner = Some(h.owner);
        for w in self.watchers.drain(..) {
            if let Some(w) = w.upgrade() {
                w.changed.notify_waiters();
            }
        }
    }

    /// Ends every holder, as removed behind their backs.
    pub(super) fn end_all(&mut self) {
        while !self.holders.is_empty() {
            self.end_holder(0, Some(removed()));
        }
    }

    /// Why `token`'s grant ended, if it ended recently without a release.
    pub(super) fn ended(&self, token: FencingToken) -> Option<&LostReason> {
        self.ended
            .iter()
            .find_map(|(t, why)| (*t == token).then_some(why))
    }

    /// Drops expired holders and, while a permit is free, hands it to the first waiter that
    /// is still listening. Called on every state change that can free a permit.
    pub(super) fn dispatch(&mut self, now: Instant) {
        while let Some(at) = self.holders.iter().position(|h| !h.live(now)) {
            self.end_holder(at, Some(LostReason::Expired));
        }
        while self.holders.is_empty() || self.has_room() {
            let Some(w) = self.waiters.pop_front() else {
                break;
            };
            if self.holders.is_empty() {
                self.permits = w.permits;
            } else if w.permits != self.permits {
                // Refused when it queued; dropping it tells its acquire the store failed it.
                continue;
            }
            let token = self.fresh_token();
            if w.tx
                .send(grant(&self.name, w.owner.clone(), token, 1, w.ttl, now))
                .is_ok()
            {
                self.holders.push(Holder {
                    owner: w.owner,
                    count: 1,
                    token,
                    expires_at: now + w.ttl,
                    kept: 0,
                    kept_ttl: w.ttl,
                    granted_at: now,
                    value: None,
                });
            }
        }
    }

    /// Grants at once if a permit is free or `owner` holds one (a re-entry); refused if every
    /// permit is held by others (or others already queue for one: FIFO), or if the name is
    /// held with another number of permits.
    pub(super) fn try_grant(
        &mut self,
        owner: OwnerId,
        ttl: Duration,
        permits: u32,
        now: Instant,
    ) -> std::result::Result<Grant, Refused> {
        if !self.holders.is_empty() || !self.waiters.is_empty() {
            self.dispatch(now);
        }
        if !self.holders.is_empty() && self.permits != permits {
            return Err(Refused::Permits(self.permits));
        }
        if let Some(h) = self.holders.iter_mut().find(|h| h.owner == owner) {
            h.count += 1;
            h.expires_at = h.expires_at.max(now + ttl);
            return Ok(grant(&self.name, owner, h.token, h.count, ttl, now));
        }
        if !self.waiters.is_empty() || !(self.holders.is_empty() || self.has_room()) {
            return Err(Refused::Held);
        }
        let token = self.fresh_token();
        self.permits = permits;
        let owner_id = self.take_owner(&owner);
        self.holders.push(Holder {
            owner: owner_id,
            count: 1,
            token,
            expires_at: now + ttl,
            kept: 0,
            kept_ttl: ttl,
            granted_at: now,
            value: None,
        });
        Ok(grant(&self.name, owner, token, 1, ttl, now))
    }

    /// What [`DistributedLock::inspect`](crate::DistributedLock::inspect) says of this name at
    /// `now` (its oldest holder, and how many permits are held), expired holders dropped and
    /// waiters served first.
    pub(super) fn info(&mut self, now: Instant) -> Option<LockInfo> {
        self.dispatch(now);
        let h = self.holders.first()?;
        let left = h.expires_at.saturating_duration_since(now);
        // A kept lease is renewed continuously: a full lease is always left.
        let remaining = Some(if h.kept > 0 {
            left.max(h.kept_ttl)
        } else {
            left
        });
        let held = u32::try_from(self.holders.len()).unwrap_or(u32::MAX);
        let mut info = LockInfo::new(h.owner.clone(), h.count, h.token, remaining)
            .with_since(wall_clock(h.granted_at))
            .with_permits(held, self.permits);
        info.value.clone_from(&h.value);
        Some(info)
    }

    /// The holder that is `grant`'s (lease not checked).
    pub(super) fn holder_of(&mut self, grant: &Grant) -> Option<&mut Holder> {
        self.holders.iter_mut().find(|h| h.is(grant))
    }

    /// When the first lease not kept by the store runs out.
    pub(super) fn next_expiry(&self) -> Option<Instant> {
        self.holders
            .iter()
            .filter(|h| h.kept == 0)
            .map(|h| h.expires_at)
            .min()
    }

    /// The store stops keeping `grant`'s lease for one of its guards (let go of, its release
    /// on the way). The last such guard leaves the lease as if renewed just now.
    pub(super) fn unkeep(&mut self, grant: &Grant) {
        if let Some(h) = self.holder_of(grant).filter(|h| h.kept > 0) {
            h.kept -= 1;
            if h.kept == 0 {
                h.expires_at = h.expires_at.max(Instant::now() + h.kept_ttl);
            }
        }
    }

    /// Gives up one hold of `grant`; false if it no longer held its permit.
    pub(super) fn release(&mut self, grant: &Grant) -> bool {
        let Some(at) = self.holders.iter().position(|h| h.is(grant)) else {
            return false;
        };
        let h = &mut self.holders[at];
        // A kept lease is live without a look at the clock.
        if h.kept == 0 && h.expires_at <= Instant::now() {
            return false;
        }
        h.count -= 1;
        if h.count == 0 {
            self.end_holder(at, None);
            if !self.waiters.is_empty() {
                self.dispatch(Instant::now());
            }
        }
        true
    }

    /// Frees the permit `token`'s grant holds, whatever its hold count: false if no holder has
    /// that token.
    pub(super) fn force_release(&mut self, token: FencingToken, now: Instant) -> bool {
        self.dispatch(now);
        let Some(at) = self.holders.iter().position(|h| h.token == token) else {
            return false;
        };
        self.end_holder(
            at,
            Some(LostReason::Taken(
                "force-released by an operator".to_string(),
            )),
        );
        self.dispatch(now);
        true
    }
}
