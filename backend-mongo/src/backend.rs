//! The MongoDB client handle, its connect, and its [`DistributedLock`] implementation, which
//! forwards to the server operations of [`crate::ops`].

use std::sync::Arc;
use std::time::Duration;

use distlock_api::backend::wait::{Attempt, Backoff, HandOver, Notices, Waiting};
use distlock_api::backend::{async_trait, AcquireRequest, ClientCore};
use distlock_api::Profile;
use distlock_api::{
    Blocking, Capabilities, DistributedLock, Error, ErrorKind, Fencing, Grant, LeaseKind, LockInfo,
    LockName, Result, TtlSupport,
};
use mongodb::bson::{doc, Document};
use mongodb::options::{
    ClientOptions, CollectionOptions, ReadConcern, ReadPreference, SelectionCriteria, WriteConcern,
};
use mongodb::{Client, Collection};

use crate::config::{driver_message, MongoConfig};
use crate::error::map_err;
use crate::notices::Streams;
use crate::ops::{self, RENEW_BATCH};
use crate::schema::check_collation;
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
    .renewal(true)
    .semaphore(true)
    .election(true);

/// How long a polling waiter sleeps at most between two attempts by default
/// ([`MongoConfig::backoff`]); the holder's expiry (read from the server with each attempt) wakes
/// it earlier, and so does the change stream where the server has one.
pub const POLL_CAP: Duration = crate::config::DEFAULT_BACKOFF_CAP;

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

#[async_trait]
impl DistributedLock for MongoLock {
    fn profile(&self) -> Profile {
        let capabilities = match self.streams {
            Some(_) => CAPABILITIES,
            None => CAPABILITIES.blocking(Blocking::Poll),
        };
        // Polls with the configured backoff; where the server has change streams, a waiter
        // that found the lock held also subscribes and waits for them instead. A release
        // through this handle passes the lock straight to a waiting task of the same handle:
        // one `findAndModify` instead of a release and the waiter's next attempt.
        Profile::new(capabilities)
            .waiting(Waiting::Poll(self.backoff.clone()))
            .hands_over(true)
            .renew_batch(RENEW_BATCH)
    }

    async fn force_release(
        &self,
        name: &distlock_api::LockName,
        token: distlock_api::FencingToken,
    ) -> distlock_api::Result<bool> {
        // A permit goes by one conditional update; a lock by its releases.
        if ops::permit::force_release(&self.locks, self.operation_timeout, name, token).await? {
            return Ok(true);
        }
        distlock_api::backend::force_release_by_releases(self, name, token).await
    }

    async fn give_back(
        &self,
        surplus: &distlock_api::backend::Surplus,
    ) -> distlock_api::Result<bool> {
        // By the owner's own permit, which inspect (the oldest permit) may not show.
        let (name, owner, ttl) = (&surplus.name, &surplus.owner, surplus.ttl);
        let own = ops::permit::own_permit(&self.locks, self.operation_timeout, name, owner, ttl);
        match own.await? {
            Some(g) if self.core.has_surplus(surplus, g.hold_count) => self.release(&g).await,
            Some(_) => Ok(false),
            None => distlock_api::backend::give_back_by_release(self, surplus).await,
        }
    }

    fn core(&self) -> &ClientCore {
        &self.core
    }

    async fn attempt(&self, req: &AcquireRequest) -> Result<Attempt> {
        ops::acquire(&self.locks, self.operation_timeout, req).await
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
        let released = if grant.permits > 1 {
            ops::permit::release(&self.locks, self.operation_timeout, grant).await
        } else {
            ops::release_grant(&self.locks, self.operation_timeout, grant).await
        };
        released.map_err(|e| e.with_lock(&grant.name))
    }

    /// One `findAndModify` (built by `commands::hand_over_pipeline`) when `from` still holds the lock,
    /// whether its last hold passes on or one of several is given up; a `from` that no longer
    /// holds costs the tidy-up a release would send too. The owner never becomes `null`, so
    /// the change stream tells other clients' waiters nothing: the lock never came free.
    async fn hand_over(&self, from: &Grant, to: &AcquireRequest) -> Result<HandOver> {
        ops::hand_over_grant(&self.locks, self.operation_timeout, from, to)
            .await
            .map_err(|e| e.with_lock(&from.name))
    }

    async fn renew(&self, grant: &Grant, ttl: Duration) -> Result<Duration> {
        if grant.permits > 1 {
            return ops::permit::renew(&self.locks, self.operation_timeout, grant, ttl).await;
        }
        ops::renew_grant(&self.locks, self.operation_timeout, grant, ttl).await
    }

    async fn renew_many(&self, grants: &[(Grant, Duration)]) -> Vec<Result<Duration>> {
        ops::permit::renew_all(&self.locks, self.operation_timeout, grants).await
    }

    /// One `updateOne` filtered as renew is (owner, token, lease live by `$$NOW`) that sets the
    /// document's `value` to `{ epoch: token, text }`.
    async fn proclaim(&self, grant: &Grant, value: &str) -> Result<bool> {
        ops::elect::proclaim(&self.locks, self.operation_timeout, grant, value).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        ops::inspect(&self.locks, self.operation_timeout, name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
        ops::list(&self.locks, self.operation_timeout, prefix).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_show_the_capability_checklist() {
        assert!(include_str!("../docs.md").contains(&CAPABILITIES.checklist()));
    }
}
