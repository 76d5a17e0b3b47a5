//! The MongoDB client handle and its [`DistributedLock`] implementation.

use std::collections::HashSet;
use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::backend::wait::{Attempt, Backoff, HandOver, Notices, Waiting};
use distlock_api::backend::{async_trait, lost, AcquireRequest, ClientCore};
use distlock_api::{
    Blocking, Capabilities, DistributedLock, Error, ErrorKind, Fencing, FencingToken, Grant,
    LeaseKind, LockInfo, LockName, Result, TtlSupport,
};
use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::{
    ClientOptions, CollectionOptions, ReadConcern, ReadPreference, ReturnDocument,
    SelectionCriteria, WriteConcern,
};
use mongodb::{Client, Collection};

use crate::commands::{self, COUNT, GRANTED_AT, OWNER, REMAINING_MS, TOKEN};
use crate::config::{driver_message, MongoConfig};
use crate::error::{command_code, map_err};
use crate::streams::Streams;
use crate::BACKEND;

/// What the MongoDB backend promises.
pub const CAPABILITIES: Capabilities = Capabilities::new()
    .reentrant(true)
    .blocking(Blocking::Signal)
    // BSON dates and `$$NOW` count milliseconds.
    .ttl(TtlSupport::new(
        LeaseKind::PerLock,
        Duration::from_millis(1),
        Duration::from_millis(1),
    ))
    .fair(false)
    .fencing(Fencing::Durable)
    .renewal(true);

/// How long a polling waiter sleeps at most between two attempts by default
/// ([`MongoConfig::backoff`]); the holder's expiry (read from the server with each attempt) wakes
/// it earlier, and so does the change stream where the server has one.
pub const POLL_CAP: Duration = crate::config::DEFAULT_BACKOFF_CAP;

/// The duplicate-key error code: a concurrent upsert inserted the document first.
const DUPLICATE_KEY: i32 = 11000;

/// What the server reported at connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    /// The version `buildInfo` reports.
    pub version: String,
    /// The replica set's name from `hello`, `None` for a standalone server or a mongos.
    pub replica_set: Option<String>,
}

/// A MongoDB client handle: its own connection pool, owner id and watchdog.
///
/// Locks live in one document per name in the configured collection (see the crate docs for
/// the algorithm and the safety model).
pub struct MongoLock {
    core: ClientCore,
    locks: Collection<Document>,
    operation_timeout: Duration,
    server: ServerInfo,
    backoff: Backoff,
    /// The change stream waiters listen to, `None` if turned off.
    streams: Option<Arc<Streams>>,
}

impl MongoLock {
    /// Connects and checks that the server answers, within the configured connect timeout:
    /// an unreachable server is [`ErrorKind::Unavailable`], never a hang. Also refuses a lock
    /// collection whose default collation is not binary (it would merge names that differ
    /// only in case).
    pub async fn connect(config: MongoConfig) -> Result<Self> {
        config.validate()?;
        let endpoint = config.endpoint.clone();
        // The driver's server selection gives up at the connect timeout; the margin only covers
        // the reply of the server it selected.
        let bound = config.client.connect_timeout + Duration::from_millis(500);
        match tokio::time::timeout(bound, Self::connect_inner(config)).await {
            Ok(result) => result,
            Err(_) => Err(Error::new(
                ErrorKind::Unavailable,
                format!("no answer from MongoDB at {endpoint} within {bound:?}"),
            )
            .with_backend(BACKEND)),
        }
    }

    async fn connect_inner(config: MongoConfig) -> Result<Self> {
        let endpoint = config.endpoint.clone();
        let at = |e: mongodb::error::Error, what: &str| map_err(e, &format!("{what} {endpoint}"));
        let client = match &config.given {
            Some(client) => client.clone(),
            None => {
                let mut options = ClientOptions::parse(config.conn.clone())
                    .await
                    .map_err(|e| at(e, "cannot resolve"))?;
                options.connect_timeout = Some(config.client.connect_timeout);
                options.server_selection_timeout = Some(config.client.connect_timeout);
                options.app_name.get_or_insert_with(|| "distlock".into());
                Client::with_options(options).map_err(|e| {
                    Error::invalid(format!(
                        "bad MongoDB client options: {}",
                        driver_message(&e)
                    ))
                    .with_backend(BACKEND)
                })?
            }
        };
        let admin = client.database("admin");
        let hello = admin
            .run_command(doc! { "hello": 1 })
            .await
            .map_err(|e| at(e, "cannot reach"))?;
        let build = admin
            .run_command(doc! { "buildInfo": 1 })
            .await
            .map_err(|e| at(e, "cannot query"))?;
        let server = ServerInfo {
            version: build.get_str("version").unwrap_or("unknown").to_string(),
            replica_set: hello.get_str("setName").ok().map(str::to_string),
        };
        let db = client.database(&config.database);
        check_collation(&db, &config.collection).await?;
        // A grant is acknowledged only once a majority has it in its journal, so a failover
        // cannot roll it back (and with it the fencing counter) after the caller acted on it.
        let mut write_concern = WriteConcern::majority();
        write_concern.journal = Some(true);
        write_concern.w_timeout = Some(config.client.operation_timeout);
        let locks = db.collection_with_options(
            &config.collection,
            CollectionOptions::builder()
                // A secondary may lag; lock state is read where it is written.
                .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
                .write_concern(write_concern)
                .read_concern(ReadConcern::majority())
                .build(),
        );
        let mut core = ClientCore::new(BACKEND).with_default_ttl(config.client.default_ttl)?;
        if let Some(owner) = config.client.owner {
            core = core.with_owner(owner);
        }
        let (base, cap) = config.backoff;
        let backoff = Backoff::new(base, cap);
        let streams = config.change_streams.then(|| {
            Arc::new(Streams::new(
                locks.clone(),
                config.client.operation_timeout,
                backoff.clone(),
            ))
        });
        Ok(Self {
            core,
            locks,
            operation_timeout: config.client.operation_timeout,
            server,
            backoff,
            streams,
        })
    }

    /// What the server reported at connect: its version and replica set.
    pub fn server(&self) -> &ServerInfo {
        &self.server
    }

    /// Whether this client has a change stream open for its waiters (test-only).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn change_stream_open(&self) -> bool {
        self.streams.as_ref().is_some_and(|s| s.is_open())
    }

    /// How many lock names this client's waiters listen for on its change stream (test-only).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn watched_names(&self) -> usize {
        self.streams.as_ref().map_or(0, |s| s.names())
    }

    /// How many change streams this client has opened so far (test-only).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn change_streams_opened(&self) -> u64 {
        self.streams.as_ref().map_or(0, |s| s.opened())
    }

    /// The collection holding the lock documents, with the backend's read and write concerns.
    /// Read it freely; never delete its documents (each holds its lock's fencing counter).
    pub fn collection(&self) -> &Collection<Document> {
        &self.locks
    }

    /// Runs one driver operation bounded by the operation timeout.
    async fn bounded<T>(
        &self,
        name: &LockName,
        what: &'static str,
        op: impl Future<Output = mongodb::error::Result<T>>,
    ) -> Result<T> {
        bounded(self.operation_timeout, what, op)
            .await
            .map_err(|e| e.with_lock(name))
    }

    /// Extends the lease of every lock that one of `grants` (name and token, all of `owner`)
    /// still holds live, then reads back which those are: the (name, token) pairs now renewed.
    /// Two requests for the whole batch.
    async fn renew_held(
        &self,
        grants: &[(&str, &str, i64)],
        ttl_ms: i64,
    ) -> Result<HashSet<(String, i64)>> {
        let filter = commands::held_as(grants);
        let update = self
            .locks
            .update_many(filter.clone(), commands::renew_pipeline(ttl_ms))
            .into_future();
        bounded(self.operation_timeout, "renew failed", update)
            .await
            .map_err(|e| e.error)?;
        let read = async {
            let cursor = self
                .locks
                .find(filter)
                .projection(doc! { TOKEN: 1 })
                .await?;
            cursor.try_collect::<Vec<Document>>().await
        };
        let docs = bounded(self.operation_timeout, "renew failed", read)
            .await
            .map_err(|e| e.error)?;
        Ok(docs
            .iter()
            .filter_map(|d| Some((d.get_str("_id").ok()?.to_owned(), d.get_i64(TOKEN).ok()?)))
            .collect())
    }
}

impl std::fmt::Debug for MongoLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MongoLock")
            .field("owner", self.core.owner())
            .field(
                "namespace",
                &format!(
                    "{}.{}",
                    self.locks.namespace().db,
                    self.locks.namespace().coll
                ),
            )
            .field("server", &self.server)
            .finish()
    }
}

/// Refuses a collection whose default collation is not the binary one.
async fn check_collation(db: &mongodb::Database, collection: &str) -> Result<()> {
    let reply = db
        .run_command(doc! {
            "listCollections": 1,
            "filter": { "name": collection },
            "authorizedCollections": true,
        })
        .await;
    let reply = match reply {
        Ok(r) => r,
        // Without the privilege to list collections the check cannot run; locking still works.
        Err(e) if command_code(&e) == Some(13) => return Ok(()),
        Err(e) => return Err(map_err(e, "cannot list the lock collection")),
    };
    let spec = reply
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get_array("firstBatch").ok())
        .and_then(|b| b.first())
        .and_then(Bson::as_document);
    let Some(spec) = spec else {
        // Created on first use, with the simple (binary) collation.
        return Ok(());
    };
    if spec.get_str("type").is_ok_and(|t| t != "collection") {
        return Err(Error::invalid(format!(
            "{:?} is a {}, not a collection",
            collection,
            spec.get_str("type").unwrap_or("?")
        ))
        .with_backend(BACKEND));
    }
    let locale = spec
        .get_document("options")
        .ok()
        .and_then(|o| o.get_document("collation").ok())
        .and_then(|c| c.get_str("locale").ok());
    match locale {
        None | Some("simple") => Ok(()),
        Some(locale) => Err(Error::invalid(format!(
            "the lock collection {collection:?} has the default collation {locale:?}, which can \
             merge names that differ in case or accents; use a collection with the simple \
             (binary) collation"
        ))
        .with_backend(BACKEND)),
    }
}

/// One acquire request and the collection and time limit it runs with.
struct AcquireJob {
    locks: Collection<Document>,
    req: AcquireRequest,
    timeout: Duration,
}

impl AcquireJob {
    async fn run(&self) -> Result<Attempt> {
        let ttl_ms = ttl_millis(self.req.ttl);
        // A duplicate key means a concurrent upsert created the document first; the next try
        // finds it and decides normally. mongod retries such upserts itself, so a second
        // duplicate key is all but impossible and is answered as "held".
        for _ in 0..2 {
            let sent_at = Instant::now();
            let op = self
                .locks
                .find_one_and_update(
                    commands::by_name(self.req.name.as_str()),
                    commands::acquire_pipeline(&self.req.owner.text(), ttl_ms),
                )
                .upsert(true)
                .return_document(ReturnDocument::After)
                .projection(commands::grant_projection());
            let doc = match bounded(self.timeout, "acquire failed", op.into_future()).await {
                Ok(doc) => doc,
                Err(e) if e.duplicate_key => continue,
                Err(e) => return Err(e.error.with_lock(&self.req.name)),
            };
            // An upsert returning the document after the update always has one on mongod; the
            // test server can answer a racing first upsert of a name with none. Like a
            // duplicate key, that means another contender created the document: try again.
            let Some(doc) = doc else {
                continue;
            };
            let state = State::read(&doc).map_err(|e| e.with_lock(&self.req.name))?;
            if state.owner.as_deref() != Some(&*self.req.owner.text()) {
                // Someone else holds it. The reply carries no server time, so ask how long the
                // holder's lease runs, by the server's clock, to wake no later than its end.
                let expires_in = read_state(&self.locks, self.timeout, &self.req.name)
                    .await?
                    .filter(State::is_held)
                    .and_then(|s| s.remaining);
                return Ok(Attempt::Held { expires_in });
            }
            return Ok(Attempt::Granted(Grant::new(
                self.req.name.clone(),
                self.req.owner.clone(),
                FencingToken(state.token),
                state.count,
                Duration::from_millis(ttl_ms as u64),
                sent_at,
            )));
        }
        Ok(Attempt::Held { expires_in: None })
    }
}

/// The lease in whole milliseconds, rounded up: the server counts milliseconds, and rounding
/// down could turn 1.5 ms into 1 ms (or 0.5 ms into nothing).
fn ttl_millis(ttl: Duration) -> i64 {
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).unwrap_or(i64::MAX).max(1)
}

/// A lock document as the projections return it.
struct State {
    owner: Option<String>,
    count: u32,
    token: u64,
    remaining: Option<Duration>,
    /// When the grant began, in ms since the epoch by the server's clock.
    since_ms: Option<i64>,
}

impl State {
    fn read(doc: &Document) -> Result<Self> {
        let owner = match doc.get(OWNER) {
            Some(Bson::String(s)) => Some(s.clone()),
            None | Some(Bson::Null) => None,
            Some(other) => return Err(malformed(OWNER, other)),
        };
        let int = |field: &str| -> Result<i64> {
            match doc.get(field) {
                None | Some(Bson::Null) => Ok(0),
                Some(Bson::Int64(n)) => Ok(*n),
                Some(Bson::Int32(n)) => Ok(i64::from(*n)),
                Some(other) => Err(malformed(field, other)),
            }
        };
        let count = u32::try_from(int(COUNT)?).map_err(|_| {
            Error::new(
                ErrorKind::Backend,
                "the lock document's hold count is out of range",
            )
        })?;
        let token = u64::try_from(int(TOKEN)?).map_err(|_| {
            Error::new(
                ErrorKind::Backend,
                "the lock document's fencing counter is negative",
            )
        })?;
        // `remaining_ms` is null when there is no expiry (a free lock).
        let remaining = match doc.get(REMAINING_MS) {
            Some(Bson::Int64(ms)) => Some(*ms),
            Some(Bson::Int32(ms)) => Some(i64::from(*ms)),
            Some(Bson::Double(ms)) => Some(*ms as i64),
            _ => None,
        }
        .map(|ms| Duration::from_millis(ms.max(0) as u64));
        let since_ms = match doc.get(GRANTED_AT) {
            Some(Bson::DateTime(at)) => Some(at.timestamp_millis()),
            _ => None,
        };
        Ok(Self {
            owner,
            count,
            token,
            remaining,
            since_ms,
        })
    }

    /// What an operator sees of a held lock.
    fn info(self, name: &LockName) -> Result<LockInfo> {
        let owner = self.owner.as_deref().unwrap_or_default();
        let owner = distlock_api::OwnerId::parse(owner).map_err(|_| {
            Error::new(
                ErrorKind::Backend,
                format!("the lock document's owner {owner:?} is not an owner id"),
            )
            .with_lock(name)
        })?;
        let info = LockInfo::new(owner, self.count, FencingToken(self.token), self.remaining);
        Ok(match self.since_ms {
            Some(ms) => info.with_since_unix_ms(ms),
            None => info,
        })
    }

    /// Held by someone, by the server's clock.
    fn is_held(&self) -> bool {
        self.owner.is_some() && self.remaining.is_some_and(|r| !r.is_zero())
    }
}

fn malformed(field: &str, value: &Bson) -> Error {
    Error::new(
        ErrorKind::Backend,
        format!(
            "the lock document's {field:?} is a {:?}, not what this backend writes; is the \
             collection used for something else?",
            value.element_type()
        ),
    )
}

/// The lock's document with the lease left by the server's clock; `None` if it has none.
async fn read_state(
    locks: &Collection<Document>,
    timeout: Duration,
    name: &LockName,
) -> Result<Option<State>> {
    let read = async {
        let cursor = locks
            .aggregate(commands::inspect_pipeline(name.as_str()))
            .await?;
        cursor.try_collect::<Vec<Document>>().await
    };
    let docs = bounded(timeout, "inspect failed", read)
        .await
        .map_err(|e| e.with_lock(name))?;
    docs.first()
        .map(State::read)
        .transpose()
        .map_err(|e| e.with_lock(name))
}

/// Gives up one hold of `grant`: `true` if it still held the lock. A grant found expired (and
/// not taken over) is cleared so the document shows the lock free; that changes nothing else,
/// since an expired holder already counts as none.
async fn release_grant(
    locks: &Collection<Document>,
    timeout: Duration,
    grant: &Grant,
) -> Result<bool> {
    let owner_text = grant.owner.text();
    let (name, owner) = (grant.name.as_str(), &*owner_text);
    let Ok(token) = i64::try_from(grant.token.0) else {
        return Ok(false);
    };
    let done = bounded(
        timeout,
        "release failed",
        locks
            .update_one(
                commands::held_by(name, owner, token),
                commands::release_pipeline(),
            )
            .into_future(),
    )
    .await
    .map_err(|e| e.error)?;
    if done.matched_count == 1 {
        return Ok(true);
    }
    free_expired(locks, timeout, "release failed", name, owner, token).await?;
    Ok(false)
}

/// Frees the lock document of `name` if its grant `(owner, token)` has expired (by the
/// server's clock) and nobody took it over: what a release or hand-over of a grant that no
/// longer holds leaves tidy. `what` names the operation in an error.
async fn free_expired(
    locks: &Collection<Document>,
    timeout: Duration,
    what: &'static str,
    name: &str,
    owner: &str,
    token: i64,
) -> Result<()> {
    bounded(
        timeout,
        what,
        locks
            .update_one(
                commands::expired_grant(name, owner, token),
                commands::free(),
            )
            .into_future(),
    )
    .await
    .map_err(|e| e.error)?;
    Ok(())
}

/// Hands the lock from `from` to `to` (see [`commands::hand_over_pipeline`]): one
/// `findAndModify` of the lock document, filtered on `from` holding it live, that passes a last
/// hold on with a fresh token or gives up one hold of several. A grant that no longer holds
/// matches nothing; its expired grant is then tidied up as [`release_grant`] tidies it (a
/// second request, as in a release that finds its grant gone).
async fn hand_over_grant(
    locks: &Collection<Document>,
    timeout: Duration,
    from: &Grant,
    to: &AcquireRequest,
) -> Result<HandOver> {
    let owner_text = from.owner.text();
    let (name, owner) = (from.name.as_str(), &*owner_text);
    let Ok(token) = i64::try_from(from.token.0) else {
        return Ok(HandOver::Released(false));
    };
    let ttl_ms = ttl_millis(to.ttl);
    let sent_at = Instant::now();
    let after = bounded(
        timeout,
        "hand-over failed",
        locks
            .find_one_and_update(
                commands::held_by(name, owner, token),
                commands::hand_over_pipeline(&to.owner.text(), ttl_ms),
            )
            .return_document(ReturnDocument::After)
            .projection(commands::grant_projection())
            .into_future(),
    )
    .await
    .map_err(|e| e.error)?;
    if let Some(doc) = after {
        let state = State::read(&doc)?;
        // The token moves only when the lock was passed on.
        if state.token == from.token.0 {
            return Ok(HandOver::Released(true));
        }
        if state.owner.as_deref() != Some(&*to.owner.text()) || state.count != 1 {
            return Err(Error::new(
                ErrorKind::Backend,
                "the hand-over's answer shows neither the old grant nor the new one",
            )
            .with_backend(BACKEND));
        }
        return Ok(HandOver::Handed(Grant::new(
            to.name.clone(),
            to.owner.clone(),
            FencingToken(state.token),
            1,
            Duration::from_millis(ttl_ms as u64),
            sent_at,
        )));
    }
    free_expired(locks, timeout, "hand-over failed", name, owner, token).await?;
    Ok(HandOver::Released(false))
}

#[async_trait]
impl DistributedLock for MongoLock {
    /// [`CAPABILITIES`], with polling only where change streams are turned off.
    fn capabilities(&self) -> Capabilities {
        match self.streams {
            Some(_) => CAPABILITIES,
            None => CAPABILITIES.blocking(Blocking::Poll),
        }
    }

    fn core(&self) -> &ClientCore {
        &self.core
    }

    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        let job = AcquireJob {
            locks: self.locks.clone(),
            req: req.clone(),
            timeout: self.operation_timeout,
        };
        job.run().await
    }

    /// Polls with the configured backoff; where the server has change streams, a waiter that
    /// found the lock held also [`subscribe`](Self::subscribe)s and waits for them instead.
    fn waiting(&self) -> Waiting {
        Waiting::Poll(self.backoff.clone())
    }

    /// Listens on the client's change stream for events that may free `name` (opening the
    /// stream if the client has none open). `Unsupported` when turned off or where the server
    /// refused a stream in the last 30 s, another error when opening failed now: the waiter
    /// then polls.
    async fn subscribe(&self, name: &LockName) -> Result<Box<dyn Notices>> {
        let Some(streams) = &self.streams else {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "change streams are turned off for this client",
            )
            .with_backend(BACKEND));
        };
        let sub = streams.subscribe(name.as_str()).await;
        Ok(Box::new(sub.map_err(|e| e.with_lock(name))?))
    }

    async fn release(&self, grant: &Grant) -> Result<bool> {
        release_grant(&self.locks, self.operation_timeout, grant)
            .await
            .map_err(|e| e.with_lock(&grant.name))
    }

    /// A release through this handle passes the lock straight to a waiting task of the same
    /// handle: one `findAndModify` instead of a release and the waiter's next attempt.
    fn hands_over(&self) -> bool {
        true
    }

    /// One `findAndModify` (built by `commands::hand_over_pipeline`) when `from` still holds the lock,
    /// whether its last hold passes on or one of several is given up; a `from` that no longer
    /// holds costs the tidy-up a release would send too. The owner never becomes `null`, so
    /// the change stream tells other clients' waiters nothing: the lock never came free.
    async fn hand_over(&self, from: &Grant, to: &AcquireRequest) -> Result<HandOver> {
        hand_over_grant(&self.locks, self.operation_timeout, from, to)
            .await
            .map_err(|e| e.with_lock(&from.name))
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Duration> {
        let ttl_ms = ttl_millis(ttl);
        let not_held = || {
            lost(
                &grant.name,
                "the lock is no longer held by this grant (expired, released or taken over)",
            )
        };
        let Ok(token) = i64::try_from(grant.token.0) else {
            return Err(not_held());
        };
        let done = self
            .bounded(
                &grant.name,
                "renew failed",
                self.locks
                    .update_one(
                        commands::held_by(grant.name.as_str(), &grant.owner.text(), token),
                        commands::renew_pipeline(ttl_ms),
                    )
                    .into_future(),
            )
            .await?;
        if done.matched_count == 1 {
            Ok(Duration::from_millis(ttl_ms as u64))
        } else {
            Err(not_held())
        }
    }

    fn renew_batch(&self) -> usize {
        RENEW_BATCH
    }

    async fn renew_many(&self, grants: &[(Grant, Duration)]) -> Vec<Result<Duration>> {
        // Grants renewed for one TTL share a request pair; in practice that is every grant of
        // the client (each has an owner id of its own, which the filter checks per grant).
        let mut groups: Vec<(i64, Vec<usize>)> = Vec::new();
        for (i, (_, ttl)) in grants.iter().enumerate() {
            let key = ttl_millis(*ttl);
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, members)) => members.push(i),
                None => groups.push((key, vec![i])),
            }
        }
        let mut results: Vec<Option<Result<Duration>>> = grants.iter().map(|_| None).collect();
        for (ttl_ms, members) in groups {
            if let [i] = members[..] {
                // One request instead of two.
                results[i] = Some(self.renew(&grants[i].0, grants[i].1).await);
                continue;
            }
            // A token beyond i64 was never issued: such a grant matches nothing, and is lost.
            let owners: Vec<String> = members
                .iter()
                .map(|&i| grants[i].0.owner.to_string())
                .collect();
            let asked: Vec<(&str, &str, i64)> = members
                .iter()
                .zip(&owners)
                .filter_map(|(&i, owner)| {
                    let grant = &grants[i].0;
                    Some((
                        grant.name.as_str(),
                        owner.as_str(),
                        i64::try_from(grant.token.0).ok()?,
                    ))
                })
                .collect();
            match self.renew_held(&asked, ttl_ms).await {
                Ok(held) => {
                    for &i in &members {
                        let grant = &grants[i].0;
                        let renewed = i64::try_from(grant.token.0)
                            .is_ok_and(|t| held.contains(&(grant.name.as_str().to_owned(), t)));
                        results[i] = Some(if renewed {
                            Ok(Duration::from_millis(ttl_ms as u64))
                        } else {
                            Err(lost(
                                &grant.name,
                                "the lock is no longer held by this grant (expired, released \
                                 or taken over)",
                            ))
                        });
                    }
                }
                Err(e) => {
                    for &i in &members {
                        let e = Error::new(e.kind(), e.to_string()).with_lock(&grants[i].0.name);
                        results[i] = Some(Err(e));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::new(ErrorKind::Backend, "no renewal result"))))
            .collect()
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        match read_state(&self.locks, self.operation_timeout, name)
            .await?
            .filter(State::is_held)
        {
            Some(state) => state.info(name).map(Some),
            None => Ok(None),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
        let read = async {
            let mut cursor = self
                .locks
                .aggregate(commands::list_pipeline(prefix))
                .await?;
            let mut docs = Vec::new();
            while let Some(doc) = cursor.try_next().await? {
                // In name order: the first name past the prefix ends the listing.
                match doc.get_str("_id") {
                    Ok(id) if id.starts_with(prefix) => docs.push(doc),
                    Ok(id) if id < prefix => {}
                    _ => break,
                }
            }
            Ok::<_, mongodb::error::Error>(docs)
        };
        let docs = bounded(self.operation_timeout, "listing failed", read)
            .await
            .map_err(|e| e.error)?;
        let mut held = Vec::new();
        for doc in docs {
            let Some(name) = doc.get_str("_id").ok().and_then(|n| LockName::new(n).ok()) else {
                continue;
            };
            let state = State::read(&doc).map_err(|e| e.with_lock(&name))?;
            if state.is_held() {
                held.push((name.clone(), state.info(&name)?));
            }
        }
        Ok(held)
    }
}

/// How many grants one batch renewal confirms: two requests for up to this many locks. The
/// names go in one `$in` list (at most 255 bytes each, so a request stays far below MongoDB's
/// 16 MiB document limit). Large, because a request's cost on the test server is mostly fixed:
/// with 10,000 lock documents it confirmed 3.6k locks a second in batches of 64, 11k in batches
/// of 256 and 23k in batches of 1,024.
const RENEW_BATCH: usize = 512;

/// A driver error mapped to ours, remembering whether it was a duplicate key.
struct OpError {
    error: Error,
    duplicate_key: bool,
}

impl OpError {
    fn with_lock(self, name: &LockName) -> Error {
        self.error.with_lock(name)
    }
}

/// Runs `op` for at most `timeout`: the driver has no per-operation deadline of its own, and
/// a server that accepts a connection but never answers must not hang a caller.
async fn bounded<T>(
    timeout: Duration,
    what: &'static str,
    op: impl Future<Output = mongodb::error::Result<T>>,
) -> std::result::Result<T, OpError> {
    match tokio::time::timeout(timeout, op).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(OpError {
            duplicate_key: command_code(&e) == Some(DUPLICATE_KEY),
            error: map_err(e, what),
        }),
        Err(_) => Err(OpError {
            error: Error::new(
                ErrorKind::Unavailable,
                format!("{what}: no answer from MongoDB within {timeout:?}"),
            )
            .with_backend(BACKEND),
            duplicate_key: false,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_is_whole_milliseconds_rounded_up() {
        assert_eq!(ttl_millis(Duration::from_millis(400)), 400);
        assert_eq!(ttl_millis(Duration::from_micros(1500)), 2);
        assert_eq!(ttl_millis(Duration::from_nanos(1)), 1);
        assert_eq!(ttl_millis(Duration::from_secs(7 * 24 * 3600)), 604_800_000);
    }

    #[test]
    fn docs_show_the_capability_checklist() {
        assert!(include_str!("../docs.md").contains(&CAPABILITIES.checklist()));
    }

    #[test]
    fn state_reads_what_the_projection_returns() {
        let s = State::read(&doc! { "_id": "n", "owner": "me", "count": 2_i64, "token": 7_i64, "remaining_ms": 250_i64 }).unwrap();
        assert_eq!(s.owner.as_deref(), Some("me"));
        assert_eq!((s.count, s.token), (2, 7));
        assert_eq!(s.remaining, Some(Duration::from_millis(250)));
        assert!(s.is_held());
        let expired = State::read(
            &doc! { "owner": "me", "count": 1_i64, "token": 7_i64, "remaining_ms": -5_i64 },
        )
        .unwrap();
        assert!(!expired.is_held());
        let free = State::read(&doc! { "owner": Bson::Null, "count": 0_i64, "token": 7_i64, "remaining_ms": Bson::Null }).unwrap();
        assert!(!free.is_held());
        assert_eq!(
            State::read(&doc! { "owner": 5 }).err().map(|e| e.kind()),
            Some(ErrorKind::Backend)
        );
    }
}
