//! [`RedLock`]: one lock over N independent Redis masters.
//!
//! **Rounds end at a majority.** Every operation (acquire, fence write-back, renew, release)
//! sends its script to the masters at once and decides as soon as a strict majority has said
//! yes, or as soon as a majority can no longer say yes, or at the round's deadline: the
//! per-master deadline ([`master_deadline`], small against the TTL) after the first answer
//! and, for acquire and renew, the validity left. A dead or paused master therefore costs a
//! round at most that deadline, never the connection's response timeout. The requests still in flight at the decision keep
//! running in a background task, which reconciles their late answers:
//!
//! - a late grant of a round that failed is released at once;
//! - a late grant of a round that succeeded *joins* the grant: the derived fencing token is
//!   written on it (so every master that holds the grant reports the same token) and it is
//!   recorded in the client's late table under the grant's id, so release and renew reach it
//!   like any other master of the grant. If the grant was released meanwhile, the late grant is
//!   released instead. Keeping (rather than dropping) it means a healthy client still holds all
//!   N masters and survives losing one of them later, though its round ended at N/2 + 1.
//!
//! An acquire is granted when a majority granted it and the validity left — TTL minus the time
//! since the requests were sent minus the drift margin — is still positive when that majority
//! is reached (and again once the token is written back); otherwise what was granted is given
//! back.
//!
//! **Fencing tokens are derived**, not taken from one counter. Each master keeps the usual
//! per-name counter. A fresh grant's token is `T = max` of the counters the granting majority
//! returned; before the grant counts, `T` is written back (counter := max(counter, T)) to a
//! majority of masters *while the grant still holds each of them*. Any later grant's majority
//! shares a master with that write-back majority; on that master the later grant's `INCR`
//! happens after the write-back (the write-back finished before the earlier grant was returned,
//! and the master was locked by the earlier grant until then), so it returns more than `T`, and
//! the later token, a maximum that includes it, is greater than `T`. This needs no clock
//! assumption; it fails only if a master loses its counters (restart without persistence).
//! Late grants joined afterwards get `T` written too, which only raises counters.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use distlock_api::backend::wait::{Attempt, Backoff, Waiting};
use distlock_api::backend::{async_trait, drift, lost, safe_until, AcquireRequest, ClientCore};
use distlock_api::{
    Blocking, Capabilities, DistributedLock, Error, ErrorKind, Fencing, FencingToken, Grant,
    LeaseKind, LockInfo, LockName, OwnerId, Result, TtlSupport,
};
use futures::future::{join_all, BoxFuture};
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;

use crate::config::RedLockConfig;
use crate::server::{Acquired, Holder, Server};

/// What [`RedLock`] promises.
pub const REDLOCK_CAPABILITIES: Capabilities = Capabilities {
    reentrant: true,
    blocking: Blocking::Poll,
    ttl: TtlSupport {
        kind: LeaseKind::PerLock,
        min: Duration::from_millis(1),
        granularity: Duration::from_millis(1),
    },
    fair: false,
    fencing: Fencing::Volatile,
    renewal: true,
};

/// The least a round waits for the masters that have not answered, whatever the TTL. Loopback
/// answers in well under a millisecond, but on a loaded machine the answers of healthy masters
/// straggle: on the 2-core test machine under the parallel test load, the conformance suite
/// over five masters saw stragglers more than 50 ms behind the first answer (3 failing runs of
/// 8 with a 50 ms floor, none of 5 with 100 ms). A deadline below that counts healthy masters
/// as dead, and a grant held on a bare majority then cannot renew.
pub const MIN_MASTER_DEADLINE: Duration = Duration::from_millis(100);

/// How long one round waits for the masters that have not answered yet: TTL/200, at least
/// [`MIN_MASTER_DEADLINE`], but never more than a quarter of the TTL (most of the lease must
/// be left to use) nor more than the response timeout. Leases up to 20 s give 100 ms, 30 s
/// gives 150 ms, 200 ms gives 50 ms. It runs from the first master's answer, so this is all a
/// dead or paused master costs an operation over the quickest master's round trip.
pub fn master_deadline(ttl: Duration, response_timeout: Duration) -> Duration {
    (ttl / 200)
        .max(MIN_MASTER_DEADLINE)
        .min(ttl / 4)
        .min(response_timeout)
}

/// A client of N independent Redis masters running the RedLock algorithm: one multiplexed
/// connection per master and one watchdog. Waiters poll with capped exponential backoff and
/// jitter (a release on N masters is N messages; a split vote needs randomized retries anyway).
///
/// Build it with [`RedLock::connect`], wrap it in an `Arc` and use
/// [`LockExt`](crate::LockExt) on it.
pub struct RedLock {
    core: ClientCore,
    shared: Arc<Shared>,
}

struct Shared {
    servers: Vec<Server>,
    quorum: usize,
    response_timeout: Duration,
    default_ttl: Duration,
    late: Mutex<LateTable>,
}

/// Grants that finished at a majority while some masters had not answered yet: grant id →
/// per-master tokens of the late grants that joined it (0: none there). Release takes the
/// entry out; an entry whose lease ran out unreleased and unrenewed is swept.
struct LateTable {
    next_id: u64,
    joined: HashMap<u64, Joined>,
    sweep_at: usize,
}

struct Joined {
    tokens: Vec<u64>,
    /// After this, no master can still hold the grant: its last lease plus the longest a late
    /// answer can take (the response timeout).
    until: Instant,
}

impl Default for LateTable {
    fn default() -> Self {
        Self {
            next_id: 0,
            joined: HashMap::new(),
            sweep_at: 64,
        }
    }
}

impl LateTable {
    fn open(&mut self, n: usize, until: Instant) -> u64 {
        if self.joined.len() >= self.sweep_at {
            // Guards are always released, so only a caller of the raw trait that drops grants
            // leaves entries behind; sweeping at doubling sizes keeps that bounded and cheap.
            let now = Instant::now();
            self.joined.retain(|_, j| j.until > now);
            self.sweep_at = (self.joined.len() * 2).max(64);
        }
        self.next_id += 1;
        let id = self.next_id;
        self.joined.insert(
            id,
            Joined {
                tokens: vec![0; n],
                until,
            },
        );
        id
    }
}

impl fmt::Debug for RedLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedLock")
            .field(
                "endpoints",
                &self
                    .shared
                    .servers
                    .iter()
                    .map(|s| &s.endpoint)
                    .collect::<Vec<_>>(),
            )
            .field("quorum", &self.shared.quorum)
            .field("owner", self.core.owner())
            .finish_non_exhaustive()
    }
}

impl RedLock {
    /// The backend's name, as errors and `DISTLOCK_SKIP` show it.
    pub const BACKEND: &'static str = "redlock";

    /// The masters, for the test-only admin.
    #[cfg(feature = "testing")]
    pub(crate) fn servers(&self) -> &[Server] {
        &self.shared.servers
    }

    /// Validates `config` (before any I/O) and connects to every master at once. A master that
    /// cannot be reached is tolerated as long as a majority can (it is retried on every call);
    /// fewer than a majority is [`Unavailable`](ErrorKind::Unavailable) within the connect
    /// timeout.
    pub async fn connect(config: RedLockConfig) -> Result<Self> {
        config
            .validate()
            .map_err(|e| e.with_backend(Self::BACKEND))?;
        let mut core =
            ClientCore::new(Self::BACKEND).with_default_ttl(config.options.client.default_ttl)?;
        if let Some(owner) = &config.options.client.owner {
            core = core.with_owner(owner.clone());
        }
        let quorum = config.quorum();
        let connected = join_all(
            config
                .endpoints
                .iter()
                .map(|e| Server::connect(e, &config.options, Self::BACKEND)),
        )
        .await;
        let mut servers = Vec::new();
        let mut errors = Vec::new();
        for (endpoint, r) in config.endpoints.iter().zip(connected) {
            match r {
                Ok(s) => servers.push(s),
                Err(e) => {
                    errors.push(e.to_string());
                    // Tolerated while a majority is up: it connects on first use later.
                    servers.push(Server::lazy(endpoint, &config.options, Self::BACKEND)?);
                }
            }
        }
        let up = config.endpoints.len() - errors.len();
        if up < quorum {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "only {up} of {} RedLock masters reachable, {quorum} needed: {}",
                    config.endpoints.len(),
                    errors.join("; ")
                ),
            )
            .with_backend(Self::BACKEND));
        }
        Ok(Self {
            core,
            shared: Arc::new(Shared {
                servers,
                quorum,
                response_timeout: config.options.client.operation_timeout,
                default_ttl: config.options.client.default_ttl,
                late: Mutex::default(),
            }),
        })
    }

    /// Uses `core` (owner id, default TTL) instead of the one built from the config.
    pub fn with_core(mut self, core: ClientCore) -> Self {
        self.core = core;
        self
    }

    /// How many masters must agree.
    pub fn quorum(&self) -> usize {
        self.shared.quorum
    }

    /// How long a round of this client waits for unanswered masters for a lease of `ttl`
    /// ([`master_deadline`] with the configured response timeout).
    pub fn master_deadline(&self, ttl: Duration) -> Duration {
        master_deadline(ttl, self.shared.response_timeout)
    }
}

/// The per-master tokens of a grant, kept in [`Grant::key`] as `t1,t2,…` (0: not held there),
/// so release and renew check each master's own token, followed by `;id` when late grants may
/// join it (see [`LateTable`]).
fn encode_key(tokens: &[u64], id: Option<u64>) -> String {
    let mut key = tokens
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    if let Some(id) = id {
        key.push(';');
        key.push_str(&id.to_string());
    }
    key
}

fn decode_key(key: &str, n: usize) -> Option<(Vec<u64>, Option<u64>)> {
    let (tokens, id) = match key.split_once(';') {
        Some((t, id)) => (t, Some(id.parse().ok()?)),
        None => (key, None),
    };
    let tokens = tokens
        .split(',')
        .map(|t| t.parse().ok())
        .collect::<Option<Vec<u64>>>()?;
    (tokens.len() == n).then_some((tokens, id))
}

/// The `k`-th largest value (1-based), if there are that many.
fn kth_largest<T: Ord + Copy>(mut values: Vec<T>, k: usize) -> Option<T> {
    values.sort_unstable_by(|a, b| b.cmp(a));
    k.checked_sub(1).and_then(|i| values.get(i).copied())
}

/// The requests of one round still in flight: master index and answer.
type Pending<T> = FuturesUnordered<BoxFuture<'static, (usize, Result<T>)>>;

/// The next answer that arrives before `deadline`; `None` once none is in flight or the
/// deadline passed (the requests stay in `pending`).
async fn next_before<T>(pending: &mut Pending<T>, deadline: Instant) -> Option<(usize, Result<T>)> {
    if pending.is_empty() {
        return None;
    }
    tokio::time::timeout_at(deadline.into(), pending.next())
        .await
        .ok()
        .flatten()
}

/// When a round stops waiting for the masters that have not answered: `per_master` after the
/// *first* answer, and never after `limit`. Counting from the first answer rather than from
/// the send means a stall of the client itself (a busy runtime or machine delays every answer
/// alike) is not taken for dead masters, while a master that is really down or paused costs
/// only `per_master` more than the quickest one.
struct Deadline {
    per_master: Duration,
    limit: Instant,
    anchored: bool,
}

impl Deadline {
    fn new(per_master: Duration, limit: Instant) -> Self {
        Self {
            per_master,
            limit,
            anchored: false,
        }
    }

    fn answered(&mut self) {
        if !self.anchored {
            self.anchored = true;
            self.limit = self.limit.min(Instant::now() + self.per_master);
        }
    }
}

/// Lets the requests a round did not wait for finish in a task of their own, handing each
/// answer to `late`. Outside a runtime they are dropped: what they may still cause on a master
/// ends with its lease.
fn finish_late<T, F>(pending: Pending<T>, mut late: F)
where
    T: Send + 'static,
    F: FnMut(usize, Result<T>) -> Option<BoxFuture<'static, ()>> + Send + 'static,
{
    if pending.is_empty() {
        return;
    }
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            let mut pending = pending;
            while let Some((i, r)) = pending.next().await {
                if let Some(reconcile) = late(i, r) {
                    reconcile.await;
                }
            }
        });
    }
}

fn no_answer(server: &Server, within: Duration) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!("{}: no answer within {within:?}", server.endpoint.display),
    )
    .with_backend(server.backend)
}

fn join_errors(errors: &[Error]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// What a round of conditional writes (release, renew, fence) counted.
struct Tally {
    yes: usize,
    errors: Vec<Error>,
    /// The masters that answered with an error before the decision.
    failed: Vec<usize>,
}

impl Shared {
    fn n(&self) -> usize {
        self.servers.len()
    }

    fn deadline(&self, ttl: Duration) -> Duration {
        master_deadline(ttl, self.response_timeout)
    }

    fn late(&self) -> std::sync::MutexGuard<'_, LateTable> {
        self.late.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts `op` on every master in `targets` at once.
    fn launch<T, F, Fut>(self: &Arc<Self>, targets: &[usize], op: F) -> Pending<T>
    where
        T: Send + 'static,
        F: Fn(Arc<Self>, usize) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        targets
            .iter()
            .map(|&i| {
                let fut = op(self.clone(), i);
                async move { (i, fut.await) }.boxed()
            })
            .collect()
    }

    /// Runs a conditional write (`Ok(true)`: it applied) on `targets` until a majority applied
    /// it, a majority can no longer apply it, or the deadline; the rest finish in the
    /// background. Masters that did not answer in time count among the errors.
    async fn majority_round<F, Fut>(
        self: &Arc<Self>,
        targets: &[usize],
        deadline: Deadline,
        op: F,
    ) -> Tally
    where
        F: Fn(Arc<Self>, usize) -> Fut,
        Fut: Future<Output = Result<bool>> + Send + 'static,
    {
        self.majority_round_then(targets, deadline, op, |_, _| None)
            .await
    }

    /// [`majority_round`](Self::majority_round), handing each outcome that lands after the
    /// decision to `late`, whose future (if any) finishes in the background.
    async fn majority_round_then<F, Fut, L>(
        self: &Arc<Self>,
        targets: &[usize],
        mut deadline: Deadline,
        op: F,
        late: L,
    ) -> Tally
    where
        F: Fn(Arc<Self>, usize) -> Fut,
        Fut: Future<Output = Result<bool>> + Send + 'static,
        L: FnMut(usize, Result<bool>) -> Option<BoxFuture<'static, ()>> + Send + 'static,
    {
        let started = Instant::now();
        let mut pending = self.launch(targets, op);
        let mut answered = vec![false; self.n()];
        let mut tally = Tally {
            yes: 0,
            errors: Vec::new(),
            failed: Vec::new(),
        };
        while tally.yes < self.quorum
            && tally.yes + tally.errors.len() + pending.len() >= self.quorum
        {
            let Some((i, r)) = next_before(&mut pending, deadline.limit).await else {
                break;
            };
            answered[i] = true;
            deadline.answered();
            match r {
                Ok(true) => tally.yes += 1,
                Ok(false) => {}
                Err(e) => {
                    tally.errors.push(e);
                    tally.failed.push(i);
                }
            }
        }
        let waited = started.elapsed();
        for &i in targets {
            if !answered[i] {
                tally.errors.push(no_answer(&self.servers[i], waited));
            }
        }
        // A conditional write that lands late changes nothing the decision relied on.
        finish_late(pending, late);
        tally
    }

    async fn attempt(self: &Arc<Self>, req: &AcquireRequest) -> Result<Attempt> {
        let (name, owner, ttl) = (&req.name, &req.owner, req.ttl);
        let n = self.n();
        let sent_at = Instant::now();
        let valid_until = safe_until(sent_at, ttl);
        let per_master = self.deadline(ttl);
        let mut deadline = Deadline::new(per_master, valid_until);
        let all: Vec<usize> = (0..n).collect();
        let mut pending = {
            let (name, owner) = (name.clone(), owner.clone());
            self.launch(&all, move |s, i| {
                let (name, owner) = (name.clone(), owner.clone());
                async move { s.servers[i].acquire(&name, &owner, ttl).await }
            })
        };

        let mut tokens = vec![0u64; n];
        let mut answered = vec![false; n];
        let mut granted = Vec::new(); // (index, token, count, fence)
        let mut held_pttls = Vec::new();
        let mut errors = Vec::new();
        loop {
            let won = granted.len() >= self.quorum;
            let lost = n - held_pttls.len() - errors.len() < self.quorum;
            // A lost round still waits (within the deadline) until it can tell contention
            // (a majority answered) from unavailability (a majority cannot answer).
            let told =
                granted.len() + held_pttls.len() >= self.quorum || errors.len() > n - self.quorum;
            if won || (lost && told) {
                break;
            }
            let Some((i, r)) = next_before(&mut pending, deadline.limit).await else {
                break;
            };
            answered[i] = true;
            deadline.answered();
            match r {
                Ok(Acquired::Granted {
                    token,
                    count,
                    fence,
                }) => {
                    tokens[i] = token;
                    granted.push((i, token, count, fence));
                }
                Ok(Acquired::Held { pttl }) => held_pttls.push(pttl),
                Err(e) => errors.push(e),
            }
        }
        let waited = sent_at.elapsed();
        for (i, _) in answered.iter().enumerate().filter(|(_, a)| !**a) {
            if granted.len() < self.quorum {
                errors.push(no_answer(&self.servers[i], waited));
            }
        }

        let outcome = if granted.len() >= self.quorum && Instant::now() < valid_until {
            self.settle(req, &granted, valid_until).await
        } else {
            None
        };
        match outcome {
            Some(token) => {
                let id = (!pending.is_empty())
                    .then(|| self.late().open(n, sent_at + ttl + self.response_timeout));
                if let Some(id) = id {
                    self.settle_late(pending, name, owner, ttl, Some((id, token)));
                }
                // Releases needed before fewer than a majority hold it: the quorum-th largest
                // count.
                let hold_count =
                    kth_largest(granted.iter().map(|g| g.2).collect(), self.quorum).unwrap_or(1);
                Ok(Attempt::Granted(Grant {
                    name: name.clone(),
                    owner: owner.clone(),
                    token: FencingToken(token),
                    hold_count,
                    ttl,
                    sent_at,
                    key: encode_key(&tokens, id),
                }))
            }
            None => {
                self.settle_late(pending, name, owner, ttl, None);
                if !granted.is_empty() {
                    let got: Vec<(usize, u64)> = granted.iter().map(|g| (g.0, g.1)).collect();
                    self.give_back(name, owner, &got, ttl, per_master).await;
                }
                self.contended(errors, held_pttls, ttl)
            }
        }
    }

    /// Decides the token of a round a majority granted, writing a fresh one back to a majority;
    /// `None` when that failed or the validity ran out meanwhile.
    async fn settle(
        self: &Arc<Self>,
        req: &AcquireRequest,
        granted: &[(usize, u64, u32, u64)],
        valid_until: Instant,
    ) -> Option<u64> {
        let joins_a_held_grant = granted.iter().filter(|g| g.2 > 1).count() >= self.quorum;
        let token = if joins_a_held_grant {
            // A re-entry by an owner that held a majority already: its existing token.
            granted
                .iter()
                .filter(|g| g.2 > 1)
                .map(|g| if g.3 > 0 { g.3 } else { g.1 })
                .max()
                .unwrap_or(0)
        } else {
            let derived = granted.iter().map(|g| g.1.max(g.3)).max().unwrap_or(0);
            let targets: Vec<usize> = granted.iter().map(|g| g.0).collect();
            let mine: Vec<u64> = {
                let mut t = vec![0; self.n()];
                for g in granted {
                    t[g.0] = g.1;
                }
                t
            };
            let (name, owner) = (req.name.clone(), req.owner.clone());
            let deadline = Deadline::new(self.deadline(req.ttl), valid_until);
            let tally = self
                .majority_round(&targets, deadline, move |s, i| {
                    let (name, owner, t) = (name.clone(), owner.clone(), mine[i]);
                    async move { s.servers[i].fence(&name, &owner, t, derived).await }
                })
                .await;
            if tally.yes < self.quorum {
                return None;
            }
            derived
        };
        (Instant::now() < valid_until).then_some(token)
    }

    /// Hands the acquires of a round still in flight to the background. With `join` (the
    /// round's grant id and token), each late grant gets the token written and joins the grant,
    /// or is released if the grant is gone by then; without, every late grant is released. A
    /// release is sent until it is answered or the lease (`ttl`) has run out, so a late grant
    /// never outlives its round's decision by a whole lease.
    fn settle_late(
        self: &Arc<Self>,
        pending: Pending<Acquired>,
        name: &LockName,
        owner: &OwnerId,
        ttl: Duration,
        join: Option<(u64, u64)>,
    ) {
        let until = Instant::now() + ttl + drift(ttl);
        let (s, name, owner) = (self.clone(), name.clone(), owner.clone());
        finish_late(pending, move |i, r| {
            let Ok(Acquired::Granted { token: t, .. }) = r else {
                return None;
            };
            let (s, name, owner) = (s.clone(), name.clone(), owner.clone());
            Some(
                async move {
                    if let Some((id, token)) = join {
                        if s.join_until(i, &name, &owner, t, (id, token), until).await {
                            return;
                        }
                    }
                    s.release_until(i, &name, &owner, t, until).await;
                }
                .boxed(),
            )
        });
    }

    /// Releases the holds (master, token) a failed round got, waiting up to `within` for every
    /// one of those masters (they answered a moment ago), so a refusal leaves nothing behind on
    /// them; a release that fails or is late is sent again in the background until it is
    /// answered or the lease (`ttl`) has run out.
    async fn give_back(
        self: &Arc<Self>,
        name: &LockName,
        owner: &OwnerId,
        got: &[(usize, u64)],
        ttl: Duration,
        within: Duration,
    ) {
        let until = Instant::now() + ttl + drift(ttl);
        let targets: Vec<usize> = got.iter().map(|g| g.0).collect();
        let mut tokens = vec![0; self.n()];
        for &(i, t) in got {
            tokens[i] = t;
        }
        let retry = {
            let (s, name, owner, tokens) =
                (self.clone(), name.clone(), owner.clone(), tokens.clone());
            move |i: usize| -> BoxFuture<'static, ()> {
                let (s, name, owner, t) = (s.clone(), name.clone(), owner.clone(), tokens[i]);
                async move { s.release_until(i, &name, &owner, t, until).await }.boxed()
            }
        };
        let (name, owner) = (name.clone(), owner.clone());
        let mut pending = self.launch(&targets, move |s, i| {
            let (name, owner, t) = (name.clone(), owner.clone(), tokens[i]);
            async move { s.servers[i].release(&name, &owner, t).await }
        });
        let deadline = Instant::now() + within;
        while let Some((i, r)) = next_before(&mut pending, deadline).await {
            if r.is_err() {
                tokio::spawn(retry(i));
            }
        }
        finish_late(pending, move |i, r| r.is_err().then(|| retry(i)));
    }

    /// The outcome of a failed attempt: `Held` while a majority answered, else the errors.
    fn contended(
        &self,
        errors: Vec<Error>,
        held_pttls: Vec<Option<Duration>>,
        ttl: Duration,
    ) -> Result<Attempt> {
        let answered = self.n() - errors.len();
        if answered < self.quorum {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "only {answered} of {} RedLock masters answered, {} needed: {}",
                    self.n(),
                    self.quorum,
                    join_errors(&errors)
                ),
            ));
        }
        // The lock is free on a majority once enough holders expire: every master that did not
        // report a holder counts as free now. If a majority is free already (a split vote with
        // other contenders), give no expiry, so the backoff spaces the retries out.
        let free_now = self.n() - errors.len() - held_pttls.len();
        let expires_in = match self.quorum.saturating_sub(free_now) {
            0 => None,
            need => {
                let mut pttls: Vec<Duration> =
                    held_pttls.into_iter().map(|p| p.unwrap_or(ttl)).collect();
                pttls.sort_unstable();
                pttls.get(need - 1).copied()
            }
        };
        Ok(Attempt::Held { expires_in })
    }

    /// Releases one hold on every master that holds the grant (late joiners included).
    /// `Ok(true)` as soon as a majority still held it; `Ok(false)` once a majority cannot.
    /// Joins master `i`'s late grant (token `t`) to grant `id` by writing the grant's `token`
    /// there, sending the write until it is answered or `until`: a write whose answer was lost
    /// may have been applied, and a hold the grant does not count would outlive its release.
    /// `false` if the grant is gone, the write was refused, or no answer came in time.
    async fn join_until(
        &self,
        i: usize,
        name: &LockName,
        owner: &OwnerId,
        t: u64,
        (id, token): (u64, u64),
        until: Instant,
    ) -> bool {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            if !self.late().joined.contains_key(&id) {
                return false;
            }
            match self.servers[i].fence(name, owner, t, token).await {
                Ok(true) => {
                    return match self.late().joined.get_mut(&id) {
                        Some(j) => {
                            j.tokens[i] = t;
                            true
                        }
                        None => false,
                    }
                }
                Ok(false) => return false,
                Err(_) => {}
            }
            let pause = backoff.next_delay();
            if Instant::now() + pause >= until {
                return false;
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// Sends master `i`'s release of `owner`'s hold (token `t`) until it answers or `until`.
    async fn release_until(
        &self,
        i: usize,
        name: &LockName,
        owner: &OwnerId,
        t: u64,
        until: Instant,
    ) {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        while self.servers[i].release(name, owner, t).await.is_err() {
            let pause = backoff.next_delay();
            if Instant::now() + pause >= until {
                return;
            }
            tokio::time::sleep(pause).await;
        }
    }

    async fn release(self: &Arc<Self>, grant: &Grant) -> Result<bool> {
        let (mut tokens, id) = self.decode(grant)?;
        // Taken out, so a grant arriving late from now on releases itself instead of joining.
        let joined = id.and_then(|id| self.late().joined.remove(&id));
        if let Some(joined) = &joined {
            for (t, &j) in tokens.iter_mut().zip(&joined.tokens) {
                if *t == 0 {
                    *t = j;
                }
            }
        }
        let targets: Vec<usize> = (0..self.n()).filter(|&i| tokens[i] != 0).collect();
        // Releases have no validity to respect; the driver's response timeout ends them anyway.
        let deadline = Deadline::new(
            self.deadline(grant.ttl),
            Instant::now() + self.response_timeout,
        );
        let (name, owner) = (grant.name.clone(), grant.owner.clone());
        // A master whose release failed keeps the hold for its whole lease, and counts as held
        // when a later round needs a majority without it: its release is sent again until it
        // answers or the lease has run out, whatever the round decided.
        let until = Instant::now() + grant.ttl + drift(grant.ttl);
        let retry = {
            let (s, name, owner, tokens) =
                (self.clone(), name.clone(), owner.clone(), tokens.clone());
            move |i: usize| {
                let (s, name, owner, t) = (s.clone(), name.clone(), owner.clone(), tokens[i]);
                async move { s.release_until(i, &name, &owner, t, until).await }.boxed()
            }
        };
        let late_retry = retry.clone();
        let tally = self
            .majority_round_then(
                &targets,
                deadline,
                {
                    let tokens = tokens.clone();
                    move |s, i| {
                        let (name, owner, t) = (name.clone(), owner.clone(), tokens[i]);
                        async move { Ok(s.servers[i].release(&name, &owner, t).await?.is_some()) }
                    }
                },
                move |i, r| r.is_err().then(|| late_retry(i)),
            )
            .await;
        for &i in &tally.failed {
            tokio::spawn(retry(i));
        }
        if tally.yes >= self.quorum || tally.yes + tally.errors.len() < self.quorum {
            return Ok(tally.yes >= self.quorum);
        }
        if let (Some(id), Some(joined)) = (id, joined) {
            // Undecided: a retry of this release must reach the late joiners too.
            self.late().joined.insert(id, joined);
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "release reached {} of {} masters; {} failed: {}",
                tally.yes,
                self.n(),
                tally.errors.len(),
                join_errors(&tally.errors)
            ),
        ))
    }

    /// Extends the grant on every master that holds it (late joiners included); granted once
    /// a majority renewed within the renewal's own validity.
    async fn renew(self: &Arc<Self>, grant: &Grant, ttl: Duration) -> Result<Duration> {
        let (mut tokens, id) = self.decode(grant)?;
        let joined = id.and_then(|id| self.late().joined.get(&id).map(|j| j.tokens.clone()));
        if let Some(joined) = joined {
            for (t, j) in tokens.iter_mut().zip(joined) {
                if *t == 0 {
                    *t = j;
                }
            }
        }
        let sent_at = Instant::now();
        let valid_until = safe_until(sent_at, ttl);
        let deadline = Deadline::new(self.deadline(ttl), valid_until);
        let targets: Vec<usize> = (0..self.n()).filter(|&i| tokens[i] != 0).collect();
        let (name, owner) = (grant.name.clone(), grant.owner.clone());
        let tally = self
            .majority_round(&targets, deadline, move |s, i| {
                let (name, owner, t) = (name.clone(), owner.clone(), tokens[i]);
                async move { s.servers[i].renew(&name, &owner, t, ttl).await }
            })
            .await;
        if tally.yes >= self.quorum && Instant::now() < valid_until {
            if let Some(id) = id {
                if let Some(j) = self.late().joined.get_mut(&id) {
                    j.until = j.until.max(sent_at + ttl + self.response_timeout);
                }
            }
            return Ok(ttl);
        }
        if tally.yes + tally.errors.len() < self.quorum {
            return Err(lost(
                &grant.name,
                format!(
                    "only {} of {} masters still hold the grant of owner {}, {} needed",
                    tally.yes,
                    self.n(),
                    grant.owner,
                    self.quorum
                ),
            ));
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "renewal reached {} of {} masters ({} failed) within its validity: {}",
                tally.yes,
                self.n(),
                tally.errors.len(),
                join_errors(&tally.errors)
            ),
        ))
    }

    fn decode(&self, grant: &Grant) -> Result<(Vec<u64>, Option<u64>)> {
        decode_key(&grant.key, self.n()).ok_or_else(|| {
            Error::invalid(format!(
                "grant key {:?} is not a RedLock grant of {} masters",
                grant.key,
                self.n()
            ))
            .with_lock(&grant.name)
        })
    }
}

#[async_trait]
impl DistributedLock for RedLock {
    fn capabilities(&self) -> Capabilities {
        REDLOCK_CAPABILITIES
    }

    fn core(&self) -> &ClientCore {
        &self.core
    }

    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        self.shared.attempt(req).await
    }

    /// Rounds are retried after a random delay ([`Backoff::default`]'s jittered steps), as the
    /// RedLock description asks of a client that failed to get a majority.
    fn waiting(&self) -> Waiting {
        Waiting::Poll(Backoff::default())
    }

    async fn release(&self, grant: &Grant) -> Result<bool> {
        self.shared.release(grant).await
    }

    /// Master by master: a lost answer may have left holds on any of them, each with its own
    /// token, so each is found and released on its own — where the master counts more holds of
    /// `owner` than this handle accounts for (read after the master's count).
    async fn give_back(&self, name: &LockName, owner: &OwnerId, _ttl: Duration) -> Result<bool> {
        let s = &self.shared;
        let core = &self.core;
        let undone = join_all(s.servers.iter().map(|srv| async move {
            match srv.inspect(name).await? {
                Some(h) if h.owner == *owner && h.count > core.holds_accounted(name, owner) => {
                    srv.release(name, owner, h.token).await.map(|r| r.is_some())
                }
                _ => Ok(false),
            }
        }))
        .await;
        let failed = undone.iter().filter(|r| r.is_err()).count();
        if undone.iter().any(|r| matches!(r, Ok(true))) && failed == 0 {
            return Ok(true);
        }
        if failed > 0 {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("{failed} of {} masters did not answer", s.n()),
            ));
        }
        Ok(false)
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Duration> {
        self.shared.renew(grant, ttl).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let s = &self.shared;
        let started = Instant::now();
        let all: Vec<usize> = (0..s.n()).collect();
        let mut pending = {
            let name = name.clone();
            s.launch(&all, move |s, i| {
                let name = name.clone();
                async move { s.servers[i].inspect(&name).await }
            })
        };
        let mut deadline = Deadline::new(s.deadline(s.default_ttl), started + s.response_timeout);
        let mut replies: Vec<Result<Option<Holder>>> = Vec::new();
        let mut answered = vec![false; s.n()];
        while let Some((i, r)) = next_before(&mut pending, deadline.limit).await {
            answered[i] = true;
            deadline.answered();
            replies.push(r);
        }
        // A read changes nothing: an answer that is late is simply not waited for.
        for i in (0..s.n()).filter(|&i| !answered[i]) {
            replies.push(Err(no_answer(&s.servers[i], started.elapsed())));
        }
        let failed = replies.iter().filter(|r| r.is_err()).count();
        let holders: Vec<Holder> = replies
            .into_iter()
            .filter_map(|r| r.ok().flatten())
            .collect();
        let mut owners: Vec<&OwnerId> = holders.iter().map(|h| &h.owner).collect();
        owners.sort();
        owners.dedup();
        for owner in owners {
            let mine: Vec<&Holder> = holders.iter().filter(|h| &h.owner == owner).collect();
            if mine.len() < s.quorum {
                continue;
            }
            let token = mine
                .iter()
                .map(|h| if h.fence > 0 { h.fence } else { h.token })
                .max()
                .unwrap_or(0);
            return Ok(Some(LockInfo {
                owner: owner.clone(),
                hold_count: kth_largest(mine.iter().map(|h| h.count).collect(), s.quorum)
                    .unwrap_or(1),
                token: FencingToken(token),
                remaining: kth_largest(mine.iter().filter_map(|h| h.pttl).collect(), s.quorum),
            }));
        }
        // Nobody holds a majority; unless unanswered masters could hide one, the lock is free.
        let best = holders.len();
        if failed > 0 && best + failed >= s.quorum {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "{failed} of {} masters did not answer; cannot tell who holds the lock",
                    s.n()
                ),
            ));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_keys_round_trip() {
        assert_eq!(encode_key(&[3, 0, 7], None), "3,0,7");
        assert_eq!(encode_key(&[3, 0, 7], Some(12)), "3,0,7;12");
        assert_eq!(decode_key("3,0,7", 3), Some((vec![3, 0, 7], None)));
        assert_eq!(decode_key("3,0,7;12", 3), Some((vec![3, 0, 7], Some(12))));
        assert_eq!(decode_key("3,0,7;x", 3), None);
        assert_eq!(decode_key("3,0", 3), None);
        assert_eq!(decode_key("", 3), None);
        assert_eq!(decode_key("a,b,c", 3), None);
    }

    #[test]
    fn late_table_sweeps_only_entries_past_their_lease() {
        let mut table = LateTable::default();
        let past = Instant::now() - Duration::from_secs(1);
        let future = Instant::now() + Duration::from_secs(60);
        let live: Vec<u64> = (0..10).map(|_| table.open(3, future)).collect();
        for _ in 0..200 {
            table.open(3, past);
        }
        assert!(
            table.joined.len() < 80,
            "{} entries kept",
            table.joined.len()
        );
        assert!(live.iter().all(|id| table.joined.contains_key(id)));
    }

    #[test]
    fn master_deadline_is_small_against_the_ttl() {
        let rt = Duration::from_secs(3);
        let ms = Duration::from_millis;
        assert_eq!(master_deadline(Duration::from_secs(10), rt), ms(100));
        assert_eq!(master_deadline(Duration::from_secs(2), rt), ms(100));
        assert_eq!(master_deadline(ms(200), rt), ms(50));
        assert_eq!(master_deadline(Duration::from_secs(30), rt), ms(150));
        assert_eq!(master_deadline(ms(100), rt), ms(25));
        assert_eq!(master_deadline(Duration::from_secs(3600), rt), rt);
    }

    #[test]
    fn kth_largest_is_the_majority_bound() {
        assert_eq!(kth_largest(vec![1, 3, 2], 2), Some(2));
        assert_eq!(kth_largest(vec![5], 2), None);
        assert_eq!(kth_largest(Vec::<u32>::new(), 1), None);
    }
}
