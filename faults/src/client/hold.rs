//! How a holder holds: the actions a grant is put through (re-entry, release and drops, fixed
//! leases run out or extended, watchdog holds of several leases, zombies), and the end of belief.

use super::*;

impl Worker {
    pub(super) async fn hold(
        &mut self,
        id: OpId,
        name: &str,
        guard: LockGuard,
        action: Action,
        conn: &mut Conn,
    ) {
        let lost_at: LostAt = Arc::default();
        {
            let lost = guard.lost();
            let (lost_at, out) = (lost_at.clone(), self.out.clone());
            tokio::spawn(async move {
                let reason = lost.await;
                if !matches!(reason, LostReason::Released) {
                    let (at, reason) = (clock::now(), reason.to_string());
                    record(
                        &out,
                        &Rec::Lost {
                            id,
                            at,
                            reason: reason.clone(),
                        },
                    );
                    *lost_at.lock().expect("lost_at") = Some((at, reason));
                }
            });
        }
        // Re-entry (at once, as a holder calling into code that takes the lock again), only
        // where the inner hold cannot keep the lock past what the action measures: its lease
        // is a watchdog lease.
        // One to three of them, each through the guard before it.
        let mut inner: Vec<LockGuard> = Vec::new();
        if matches!(action, Action::Release | Action::Drop | Action::Long)
            && self.handle.capabilities().reentrant
            && self.rng.bool()
        {
            for _ in 0..self.rng.u8(1..=3) {
                let Some(next) = self.reenter(id, inner.last().unwrap_or(&guard)).await else {
                    break;
                };
                inner.push(next);
            }
        }
        self.write(id, name, &guard, conn).await;
        self.increment(id, name, &guard, conn).await;
        if self.rng.u8(..3) == 0 {
            self.read_expiry(id, name, &guard).await;
        }
        let ttl_ms = self.config.ttl_ms;
        match action {
            Action::Release | Action::Drop => {
                let hold = Duration::from_millis(self.rng.u64(0..=self.config.hold_ms));
                sleep_or_lost(&guard, hold).await;
                self.write(id, name, &guard, conn).await;
                self.let_go(id, name, guard, inner, &lost_at, action).await;
            }
            Action::Long => {
                let until = Instant::now() + Duration::from_millis(ttl_ms * self.rng.u64(2..=5));
                let until = until.min(self.deadline.max(Instant::now()));
                self.write_while_held(id, name, &guard, conn, until).await;
                self.let_go(id, name, guard, inner, &lost_at, action).await;
            }
            Action::Expire => {
                // Held, writing now and then, until the lease runs out.
                // Bounded, so a guard that never stops believing (a defect) ends the run.
                let far = Instant::now() + Duration::from_millis(4 * ttl_ms);
                self.write_while_held(id, name, &guard, conn, far).await;
                let until = guard.safe_until().unwrap_or_else(Instant::now);
                tokio::time::sleep_until(until.into()).await;
                self.end(id, name, &guard, &lost_at, clock::now(), action);
                drop(guard);
            }
            Action::Zombie => {
                self.was_zombie = true;
                self.write(id, name, &guard, conn).await;
                let checked = believes(&guard);
                // Stalls here, past the lease, as a paused or swapped-out process would.
                let until = guard.safe_until().unwrap_or_else(Instant::now)
                    + Duration::from_millis(ttl_ms / 4 + 50);
                tokio::time::sleep_until(until.into()).await;
                if checked {
                    self.write_unchecked(id, name, guard.token().0, conn, true)
                        .await;
                    self.proclaim(id, name, &guard, true).await;
                }
                self.end(id, name, &guard, &lost_at, clock::now(), action);
                drop(guard);
            }
            Action::Extend => {
                let hold = Duration::from_millis(self.rng.u64(0..=self.config.hold_ms));
                sleep_or_lost(&guard, hold / 2).await;
                let ttl_ms = if self.rng.bool() {
                    self.rng.u64(ttl_ms / 4..=ttl_ms / 2).max(1)
                } else {
                    self.rng.u64(ttl_ms..=2 * ttl_ms)
                };
                let invoke = clock::now();
                let extended = guard.extend(Duration::from_millis(ttl_ms)).await;
                record(
                    &self.out,
                    &Rec::Extend {
                        id,
                        ttl_ms,
                        invoke,
                        complete: clock::now(),
                        ok: extended.is_ok(),
                        error: extended.err().map(|e| e.to_string()),
                        safe_until: guard.safe_until().map(clock::of_instant),
                    },
                );
                self.read_expiry(id, name, &guard).await;
                // Held to the end of the lease the guard believes in: if the server kept a
                // shorter one, another grant lands inside this belief.
                // Bounded, so a guard that never stops believing (a defect) ends the run.
                let far = Instant::now() + Duration::from_millis(4 * ttl_ms);
                self.write_while_held(id, name, &guard, conn, far).await;
                self.let_go(id, name, guard, Vec::new(), &lost_at, action)
                    .await;
            }
        }
    }

    /// Asks the server who holds `name` and for how long, recording it with the guard's
    /// safe-until read just before (a renewal landing meanwhile only lengthens the server's).
    async fn read_expiry(&self, id: OpId, name: &str, guard: &LockGuard) {
        let safe_until = guard.safe_until().map(clock::of_instant);
        let invoke = clock::now();
        let info = self.handle.holder(name).await;
        let complete = clock::now();
        let info = info.ok().flatten();
        record(
            &self.out,
            &Rec::Expiry {
                id,
                safe_until,
                invoke,
                complete,
                holder_is_grant: info
                    .as_ref()
                    .is_some_and(|i| &i.owner == guard.owner() && i.token == guard.token()),
                remaining_ms: info.and_then(|i| i.remaining).map(|r| r.as_millis() as u64),
            },
        );
    }

    /// Writes now and then while the guard believes it holds, until `until`.
    async fn write_while_held(
        &mut self,
        id: OpId,
        name: &str,
        guard: &LockGuard,
        conn: &mut Conn,
        until: Instant,
    ) {
        // The server's expiry is read about once a lease, so that a renewal that confirms the
        // hold without extending its lease shows as a safe-until past the server's expiry.
        let every = Duration::from_millis(self.config.ttl_ms);
        let mut next_read = Instant::now() + every;
        while believes(guard) && Instant::now() < until {
            let step = Duration::from_millis(self.rng.u64(10..=100));
            let step = step.min(until.saturating_duration_since(Instant::now()));
            sleep_or_lost(guard, step).await;
            self.write(id, name, guard, conn).await;
            if Instant::now() >= next_read && believes(guard) {
                self.read_expiry(id, name, guard).await;
                next_read = Instant::now() + every;
            }
        }
    }

    /// One more hold through the guard, recorded; `None` if refused.
    async fn reenter(&self, id: OpId, guard: &LockGuard) -> Option<LockGuard> {
        // The campaign's lease for the inner hold too (the client's default would be longer,
        // and would keep a killed holder's lock for it).
        let options = if self.config.per_lock {
            LockOptions::new().watchdog_ttl(Duration::from_millis(self.config.ttl_ms))
        } else {
            LockOptions::new()
        };
        let invoke = clock::now();
        let result = guard.reenter_with(&options).await;
        let complete = clock::now();
        let (token, hold_count, error) = match &result {
            Ok(g) => (Some(g.token().0), Some(g.hold_count()), None),
            Err(e) => (None, None, Some(format!("{:?}: {e}", e.kind()))),
        };
        record(
            &self.out,
            &Rec::Reenter {
                id,
                invoke,
                complete,
                token,
                hold_count,
                error,
            },
        );
        result.ok()
    }

    /// Lets go of the grant's holds in a random order (the outer one first, last or between),
    /// each by release, drop, or a drop on a plain thread; the end of belief is recorded
    /// before the last.
    async fn let_go(
        &mut self,
        id: OpId,
        name: &str,
        guard: LockGuard,
        inner: Vec<LockGuard>,
        lost_at: &LostAt,
        action: Action,
    ) {
        let mut guards = vec![guard];
        guards.extend(inner);
        self.rng.shuffle(&mut guards);
        while let Some(g) = guards.pop() {
            if guards.is_empty() {
                // The last hold: belief ends here.
                self.end(id, name, &g, lost_at, clock::now(), action);
            }
            match action {
                Action::Drop if self.rng.bool() => drop(g),
                Action::Drop => {
                    let _ = std::thread::spawn(move || drop(g)).join();
                }
                _ => self.release(id, g).await,
            }
            // Holds are left: the holder works on under them a little, as the code around a
            // nested lock scope does. A release that took more than its own hold shows here.
            if let Some(left) = guards.last() {
                if believes(left) {
                    sleep_or_lost(left, Duration::from_millis(self.rng.u64(0..=20))).await;
                }
            }
        }
    }

    /// Records the end of belief: the earliest of `now` (release or drop), `lost()` and
    /// safe-until.
    fn end(
        &self,
        id: OpId,
        name: &str,
        guard: &LockGuard,
        lost_at: &LostAt,
        now: u64,
        action: Action,
    ) -> u64 {
        let mut end = now;
        let mut why = match action {
            Action::Drop => "drop",
            _ => "release",
        };
        let lost = lost_at.lock().expect("lost_at").clone();
        let mut lost_reason = lost.as_ref().map(|l| l.1.clone());
        if let Some((at, _)) = lost {
            if at < end {
                end = at;
                why = "lost";
            }
        } else if let Some(reason) = guard.lost_reason() {
            // Fired, and the watcher has not run yet.
            lost_reason = Some(reason.to_string());
            let at = clock::now();
            if at < end {
                end = at;
                why = "lost";
            }
        }
        if let Some(until) = guard.safe_until().map(clock::of_instant) {
            if until < end {
                end = until;
                why = "safe_until";
            }
        }
        record(
            &self.out,
            &Rec::End {
                id,
                name: name.to_string(),
                end,
                why: why.into(),
                lost: lost_reason,
            },
        );
        end
    }
}
