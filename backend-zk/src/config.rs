//! Parsing and validating the ZooKeeper backend's configuration, with no I/O. The shared
//! options and the builder style are those of [`distlock_api::config`].

use std::fmt;
#[cfg(feature = "tls")]
use std::path::PathBuf;
use std::time::Duration;

use distlock_api::config::ConfigUrl;
use distlock_api::{ClientOptions, Error, Result};

/// The port a host without one is reached on.
pub const DEFAULT_PORT: u16 = 2181;
/// The session timeout asked of the server unless the URL or [`ZkConfig::default_ttl`] say
/// otherwise. The server clamps it to its own `[minSessionTimeout, maxSessionTimeout]` (by
/// default 2 and 20 times its `tickTime`, 4 s and 40 s with the stock 2 s tick).
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `connect` may take to establish a session, unless the URL or
/// [`ZkConfig::connect_timeout`] say otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The shortest bound of one request (each is bounded by the longer of this and the session
/// timeout: a request may take as long as the session survives without the server).
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(5);
/// Where lock nodes live (under the chroot, if the URL names one).
pub const DEFAULT_BASE_PATH: &str = "/distlock";

/// The longest session timeout a client may ask for: ZooKeeper carries it as an `int` of
/// milliseconds, and no stock server grants more than its `maxSessionTimeout` anyway.
const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

const BACKEND: &str = "zk";

/// The ACL every node the backend creates gets: lock nodes, queue nodes, and the chroot and
/// base path where they are missing. Nodes that already exist keep the ACL they have.
///
/// The default is [`NodeAcl::Creator`] when the config has digest credentials
/// ([`ZkConfig::digest_auth`] or `user:password@` in the URL) or SASL credentials
/// (`ZkConfig::sasl_digest_md5`, or `user:password@` with `sasl=digest-md5`; feature `sasl`),
/// and [`NodeAcl::Open`] otherwise; [`ZkConfig::node_acl`] (URL option `acl=open|creator`)
/// chooses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NodeAcl {
    /// `world:anyone` with every permission: any client of the ensemble may read, queue on and
    /// delete the nodes (ZooKeeper's `OPEN_ACL_UNSAFE`).
    Open,
    /// Every permission for the identities the creating session authenticated as (the `auth`
    /// scheme, ZooKeeper's `CREATOR_ALL_ACL`), none for anyone else: only clients with the
    /// same credentials can see a lock, queue on it or delete its holder's node. The session
    /// must have an identity (digest or SASL credentials, or one its connector or a TLS client
    /// certificate gives); without one the server refuses the create. A session with digest
    /// and SASL credentials grants the nodes to both identities (`digest:user:<hash>` and
    /// `sasl:user`).
    Creator,
}

impl NodeAcl {
    /// The driver's ACL list.
    pub(crate) fn acls(self) -> zookeeper_client::Acls<'static> {
        match self {
            NodeAcl::Open => zookeeper_client::Acls::anyone_all(),
            NodeAcl::Creator => zookeeper_client::Acls::creator_all(),
        }
    }
}

/// The PEM files of a TLS connection: the CA that signed the servers' certificates and,
/// optionally, a client certificate and its key.
#[cfg(feature = "tls")]
#[derive(Clone, Debug)]
pub(crate) struct TlsFiles {
    pub(crate) ca: PathBuf,
    pub(crate) identity: Option<(PathBuf, PathBuf)>,
}

/// How to reach the ensemble and where the lock nodes live.
///
/// ```
/// use std::time::Duration;
/// use distlock_zk::ZkConfig;
///
/// let config = ZkConfig::from_url("zk://zk1:2181,zk2:2181,zk3/apps?default_ttl=6s")?
///     .base_path("/locks")
///     .connect_timeout(Duration::from_secs(3));
/// config.validate()?;
/// assert_eq!(config.hosts(), "zk1:2181,zk2:2181,zk3:2181");
/// assert_eq!(config.chroot(), Some("/apps"));
/// assert_eq!(config.get_base_path(), "/locks");
/// assert_eq!(config.get_default_ttl(), Duration::from_secs(6));
/// # Ok::<_, distlock_zk::Error>(())
/// ```
#[derive(Clone)]
pub struct ZkConfig {
    pub(crate) hosts: String,
    pub(crate) chroot: Option<String>,
    pub(crate) base_path: String,
    /// `default_ttl` is the session timeout asked for: the lease of every lock.
    pub(crate) client: ClientOptions,
    /// The application's session builder (see [`ZkConfig::connector`]).
    pub(crate) connector: Option<zookeeper_client::Connector>,
    /// Digest credentials (user, password) every session authenticates with.
    pub(crate) digest: Option<(String, String)>,
    /// SASL DIGEST-MD5 credentials (user, password) every session authenticates with.
    #[cfg(feature = "sasl")]
    pub(crate) sasl: Option<(String, String)>,
    /// The ACL chosen for created nodes; `None`: by whether there are credentials.
    pub(crate) acl: Option<NodeAcl>,
    /// TLS to every server (feature `tls`).
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<TlsFiles>,
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("ZkConfig");
        d.field("hosts", &self.hosts)
            .field("chroot", &self.chroot)
            .field("base_path", &self.base_path)
            .field("client", &self.client)
            .field("own_connector", &self.connector.is_some())
            // Never the password.
            .field("digest_user", &self.digest.as_ref().map(|(user, _)| user))
            .field("sasl_user", &self.get_sasl_user())
            .field("node_acl", &self.get_node_acl());
        #[cfg(feature = "tls")]
        d.field("tls", &self.tls);
        d.finish()
    }
}

impl ZkConfig {
    /// A configuration for the ensemble at `hosts` (`host[:port]`, comma-separated), with the
    /// defaults for everything else.
    pub fn new(hosts: &str) -> Result<Self> {
        Self::from_url(&format!("zk://{hosts}"))
    }

    /// Parses `zk://[user:password@]host1[:port],host2[:port]/chroot?option=value&…`.
    ///
    /// The chroot is optional; it is created (as persistent nodes) if missing. `user:password`
    /// (percent-encoded where needed) are digest credentials, as
    /// [`digest_auth`](Self::digest_auth) sets them, or, with `sasl=digest-md5`, SASL
    /// DIGEST-MD5 credentials, as `sasl_digest_md5` sets them (feature `sasl`). Options: the
    /// shared ones of [`distlock_api::config`] (`default_ttl` is the session timeout asked
    /// for; `session_timeout` is accepted as its older name), `base_path` (URL-escaped where
    /// needed), `acl` (`open` or `creator`, see [`NodeAcl`]), `sasl` (`digest-md5`, the only
    /// mechanism a URL can ask for) and, with the `tls` feature, `tls_ca` (a PEM file: TLS to
    /// every host, trusting that CA) with `tls_cert` and `tls_key` (PEM files of a client
    /// certificate). A user without a password, an unknown option, a bad host, port or path,
    /// TLS options in a build without the `tls` feature, and `sasl` with another mechanism,
    /// without credentials or in a build without the `sasl` feature are
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument).
    pub fn from_url(raw: &str) -> Result<Self> {
        let url = ConfigUrl::parse(BACKEND, raw)?;
        if !url.scheme.eq_ignore_ascii_case("zk") {
            return Err(url.invalid("not a zk:// URL"));
        }
        let credentials = match url.user {
            None => None,
            Some(user) => {
                let password = url.password.ok_or_else(|| {
                    url.invalid("the user needs a password: zk://user:password@host")
                })?;
                let user = url.decode(user, "user name")?;
                let password = url.decode(password, "password")?;
                Some((user, password))
            }
        };
        let hosts: Vec<String> = (url.hosts(DEFAULT_PORT)?.iter())
            .map(ToString::to_string)
            .collect();
        let mut config = Self {
            hosts: hosts.join(","),
            chroot: None,
            base_path: DEFAULT_BASE_PATH.to_string(),
            client: ClientOptions::new(
                DEFAULT_SESSION_TIMEOUT,
                DEFAULT_CONNECT_TIMEOUT,
                DEFAULT_OPERATION_TIMEOUT,
            ),
            connector: None,
            digest: None,
            #[cfg(feature = "sasl")]
            sasl: None,
            acl: None,
            #[cfg(feature = "tls")]
            tls: None,
        };
        match url.path {
            None | Some("/") => {}
            Some(chroot) => config.chroot = Some(url.decode(chroot, "chroot")?),
        }
        let mut query = url.options()?;
        if let Some(ttl) = query.take_duration(&["session_timeout"])? {
            config.client.default_ttl = ttl;
        }
        config.client.take_from(&mut query)?;
        if let Some(base) = query.take_str("base_path") {
            config.base_path = base;
        }
        if let Some(acl) = query.take_str("acl") {
            config.acl = Some(match acl.as_str() {
                "open" => NodeAcl::Open,
                "creator" => NodeAcl::Creator,
                _ => return Err(query.invalid("acl", &acl, "is not open or creator")),
            });
        }
        // `sasl=digest-md5` makes the URL's credentials SASL ones instead of digest ones.
        match query.take_str("sasl") {
            None => {
                if let Some((user, password)) = credentials {
                    check_digest(&user, &password).map_err(|why| url.invalid(why))?;
                    config.digest = Some((user, password));
                }
            }
            Some(mechanism) => {
                if !mechanism.eq_ignore_ascii_case("digest-md5") {
                    return Err(query.invalid(
                        "sasl",
                        &mechanism,
                        "is not a SASL mechanism a URL can ask for: only digest-md5 (for \
                         GSSAPI, give a connector with the driver's SASL options)",
                    ));
                }
                if !cfg!(feature = "sasl") {
                    return Err(query.invalid(
                        "sasl",
                        &mechanism,
                        "asks for SASL, which this build of distlock-zk lacks: enable its \
                         `sasl` feature (or the facade's `zk-sasl`)",
                    ));
                }
                let Some((user, password)) = credentials else {
                    return Err(url.invalid(
                        "sasl=digest-md5 needs the credentials in the URL: \
                         zk://user:password@host/?sasl=digest-md5",
                    ));
                };
                check_sasl(&user, &password).map_err(|why| url.invalid(why))?;
                #[cfg(feature = "sasl")]
                {
                    config.sasl = Some((user, password));
                }
            }
        }
        let tls_ca = query.take_str("tls_ca");
        let tls_cert = query.take_str("tls_cert");
        let tls_key = query.take_str("tls_key");
        let asked = [
            ("tls_ca", &tls_ca),
            ("tls_cert", &tls_cert),
            ("tls_key", &tls_key),
        ];
        if let Some((key, Some(value))) = asked.iter().find(|(_, v)| v.is_some()) {
            if !cfg!(feature = "tls") {
                return Err(query.invalid(
                    key,
                    value,
                    "asks for TLS, which this build of distlock-zk lacks: enable its `tls` \
                     feature (or the facade's)",
                ));
            }
            if tls_ca.is_none() {
                return Err(url.invalid(
                    "tls_cert and tls_key need tls_ca: the CA that signed the servers' \
                     certificates (the client has no system trust store)",
                ));
            }
            if tls_cert.is_some() != tls_key.is_some() {
                return Err(url.invalid("tls_cert and tls_key go together"));
            }
        }
        #[cfg(feature = "tls")]
        if let Some(ca) = tls_ca {
            config.tls = Some(TlsFiles {
                ca: ca.into(),
                identity: tls_cert.zip(tls_key).map(|(c, k)| (c.into(), k.into())),
            });
        }
        query.finish(&["base_path", "acl", "sasl", "tls_ca", "tls_cert", "tls_key"])?;
        config.validate()?;
        Ok(config)
    }

    distlock_api::client_option_methods!(client);

    /// Keeps lock nodes under `path` (absolute, under the chroot; default `/distlock`). It is
    /// created as persistent nodes if missing; each lock is a container node below it.
    pub fn base_path(mut self, path: impl Into<String>) -> Self {
        self.base_path = path.into();
        self
    }

    /// Opens every session with the application's own driver `Connector`: its authentication
    /// (`with_auth`, SASL) and connection timeout. A ZooKeeper lock lives and dies with its
    /// session, and the client opens a fresh session after one ends, so it takes the recipe
    /// for a session rather than one `Client`. The session timeout asked for is still
    /// [`default_ttl`](Self::default_ttl) (the lease of every lock), set on each session; the
    /// config's [`digest_auth`](Self::digest_auth) credentials are added, and its SASL
    /// credentials (`sasl_digest_md5`, feature `sasl`), if any, replace the connector's SASL
    /// options. TLS comes from the config (`tls_ca`, feature `tls`), not from the connector:
    /// without it the hosts are dialled in plaintext. With the connector's own `with_auth` or
    /// SASL, the nodes stay open ([`NodeAcl::Open`]) unless [`node_acl`](Self::node_acl) asks
    /// for [`NodeAcl::Creator`].
    ///
    /// ```
    /// use distlock_zk::{zookeeper_client, ZkConfig};
    ///
    /// let connector = zookeeper_client::Client::connector().with_auth("digest", b"app:secret");
    /// let config = ZkConfig::new("127.0.0.1:2181")?.connector(connector);
    /// # Ok::<_, distlock_zk::Error>(())
    /// ```
    pub fn connector(mut self, connector: zookeeper_client::Connector) -> Self {
        self.connector = Some(connector);
        self
    }

    /// Authenticates every session this client opens (the first and each one replacing an
    /// expired session) with ZooKeeper's `digest` scheme as `user` with `password`, and makes
    /// [`NodeAcl::Creator`] the default ACL of the nodes it creates. The user must be non-empty
    /// without `:`, the password non-empty; [`validate`](Self::validate) checks.
    ///
    /// ZooKeeper accepts any digest credentials (it does not keep a user list): wrong ones are
    /// another identity, which the ACL of nodes made with the right ones refuses (`NoAuth`).
    ///
    /// ```
    /// use distlock_zk::{NodeAcl, ZkConfig};
    ///
    /// let config = ZkConfig::new("127.0.0.1:2181")?.digest_auth("app", "s3cret");
    /// assert_eq!(config.get_node_acl(), NodeAcl::Creator);
    /// assert_eq!(config.get_digest_user(), Some("app"));
    /// // The same from a URL:
    /// let config = ZkConfig::from_url("zk://app:s3cret@127.0.0.1:2181")?;
    /// assert_eq!(config.get_digest_user(), Some("app"));
    /// # Ok::<_, distlock_zk::Error>(())
    /// ```
    pub fn digest_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.digest = Some((user.into(), password.into()));
        self
    }

    /// Authenticates every session this client opens (the first and each one replacing an
    /// expired session) with SASL, mechanism DIGEST-MD5, as `user` with `password`, and makes
    /// [`NodeAcl::Creator`] the default ACL of the nodes it creates: they are granted to the
    /// identity `sasl:<user>`. Feature `sasl`; in a URL, `user:password@` with
    /// `sasl=digest-md5`. The user must be non-empty, without `"`, `\` or control
    /// characters, the password non-empty, and neither may have a character in
    /// U+0080..=U+00FF such as `é` (the driver and ZooKeeper's server hash those differently);
    /// [`validate`](Self::validate) checks.
    ///
    /// Unlike digest credentials, the server checks these: it needs a SASL authentication
    /// provider (`authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider`)
    /// and a JAAS `Server` section that knows the user (see the crate docs), and a wrong user or
    /// password makes [`ZkLock::connect`](crate::ZkLock::connect) fail with
    /// [`ErrorKind::Backend`](crate::ErrorKind::Backend) ("SASL authentication failed"), which
    /// retrying does not cure. Digest credentials ([`digest_auth`](Self::digest_auth)) may be
    /// set too: the session then has both identities, and the creator ACL grants both. These
    /// SASL options replace any a [`connector`](Self::connector) has.
    ///
    /// ```
    /// use distlock_zk::{NodeAcl, ZkConfig};
    ///
    /// let config = ZkConfig::new("127.0.0.1:2181")?.sasl_digest_md5("app", "s3cret");
    /// assert_eq!(config.get_node_acl(), NodeAcl::Creator);
    /// assert_eq!(config.get_sasl_user(), Some("app"));
    /// assert_eq!(config.get_digest_user(), None);
    /// // The same from a URL:
    /// let config = ZkConfig::from_url("zk://app:s3cret@127.0.0.1:2181?sasl=digest-md5")?;
    /// assert_eq!(config.get_sasl_user(), Some("app"));
    /// assert_eq!(config.get_digest_user(), None);
    /// # Ok::<_, distlock_zk::Error>(())
    /// ```
    #[cfg(feature = "sasl")]
    pub fn sasl_digest_md5(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.sasl = Some((user.into(), password.into()));
        self
    }

    /// The SASL DIGEST-MD5 user every session authenticates as, if any (always `None` without
    /// the `sasl` feature).
    pub fn get_sasl_user(&self) -> Option<&str> {
        #[cfg(feature = "sasl")]
        return self.sasl.as_ref().map(|(user, _)| user.as_str());
        #[cfg(not(feature = "sasl"))]
        None
    }

    /// Chooses the ACL of the nodes this client creates (see [`NodeAcl`] for the default).
    pub fn node_acl(mut self, acl: NodeAcl) -> Self {
        self.acl = Some(acl);
        self
    }

    /// The digest user every session authenticates as, if any.
    pub fn get_digest_user(&self) -> Option<&str> {
        self.digest.as_ref().map(|(user, _)| user.as_str())
    }

    /// The ACL of the nodes this client creates: the one chosen, else
    /// [`NodeAcl::Creator`] with digest or SASL credentials and [`NodeAcl::Open`] without.
    pub fn get_node_acl(&self) -> NodeAcl {
        self.acl.unwrap_or(match self.has_credentials() {
            true => NodeAcl::Creator,
            false => NodeAcl::Open,
        })
    }

    /// Whether the config itself authenticates sessions: digest or SASL credentials.
    fn has_credentials(&self) -> bool {
        self.digest.is_some() || self.get_sasl_user().is_some()
    }

    /// Connects to every server over TLS, trusting the CA certificates in the PEM file
    /// `ca_pem` (the driver has no system trust store), and checking that each server's
    /// certificate names the host as the connect string spells it. The file is read when a
    /// session is opened, so a replaced CA file is picked up by the next session. Feature
    /// `tls`; URL option `tls_ca`. The server needs ZooKeeper's Netty connection factory and
    /// a `secureClientPort` (see the crate docs).
    #[cfg(feature = "tls")]
    pub fn tls_ca(mut self, ca_pem: impl Into<PathBuf>) -> Self {
        match &mut self.tls {
            Some(tls) => tls.ca = ca_pem.into(),
            None => {
                self.tls = Some(TlsFiles {
                    ca: ca_pem.into(),
                    identity: None,
                })
            }
        }
        self
    }

    /// Presents the client certificate `cert_pem` with its private key `key_pem` (PEM files)
    /// in the TLS handshake, for a server that asks for one (`ssl.clientAuth`) or
    /// authenticates clients by certificate (ZooKeeper's `x509` scheme). Needs
    /// [`tls_ca`](Self::tls_ca). Feature `tls`; URL options `tls_cert` and `tls_key`.
    #[cfg(feature = "tls")]
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<PathBuf>,
        key_pem: impl Into<PathBuf>,
    ) -> Self {
        let identity = Some((cert_pem.into(), key_pem.into()));
        match &mut self.tls {
            Some(tls) => tls.identity = identity,
            None => {
                self.tls = Some(TlsFiles {
                    ca: PathBuf::new(),
                    identity,
                })
            }
        }
        self
    }

    /// Whether the TLS handshake presents a client certificate (an `x509` identity).
    fn has_client_cert(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.as_ref().is_some_and(|t| t.identity.is_some());
        #[cfg(not(feature = "tls"))]
        false
    }

    /// Whether sessions are opened over TLS.
    pub fn uses_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// Checks every option; [`ZkLock::connect`](crate::ZkLock::connect) calls it before any
    /// I/O. The TTL ([`default_ttl`](ZkConfig::default_ttl)) is the session timeout to ask for,
    /// 1 ms ..= 24 h: the lease of every lock this client holds. The server clamps it to its
    /// limits; [`ZkLock::session_timeout`](crate::ZkLock::session_timeout) reports what it
    /// granted. The connect timeout also bounds each reconnect attempt after a session is lost.
    pub fn validate(&self) -> Result<()> {
        if let Some(chroot) = &self.chroot {
            validate_path("chroot", chroot)?;
        }
        validate_path("base path", &self.base_path)?;
        if let Some((user, password)) = &self.digest {
            check_digest(user, password).map_err(invalid)?;
        }
        #[cfg(feature = "sasl")]
        if let Some((user, password)) = &self.sasl {
            check_sasl(user, password).map_err(invalid)?;
        }
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            if tls.ca.as_os_str().is_empty() {
                return Err(invalid(
                    "a TLS client certificate needs tls_ca: the CA that signed the servers' \
                     certificates (the client has no system trust store)",
                ));
            }
        }
        let has_identity =
            self.has_credentials() || self.connector.is_some() || self.has_client_cert();
        if self.get_node_acl() == NodeAcl::Creator && !has_identity {
            return Err(invalid(
                "acl=creator needs an identity to grant the nodes to: digest credentials \
                 (user:password@ in the URL, or digest_auth), SASL credentials (with \
                 sasl=digest-md5, or sasl_digest_md5), a connector that authenticates, or a \
                 TLS client certificate",
            ));
        }
        let ttl = self.client.default_ttl;
        if ttl > MAX_SESSION_TIMEOUT {
            return Err(invalid(format!(
                "session timeout {ttl:?} is out of range: 1ms ..= {MAX_SESSION_TIMEOUT:?}"
            )));
        }
        self.client.validate(BACKEND)
    }

    /// The ensemble, as the connect string the client uses (`host:port,…`).
    pub fn hosts(&self) -> &str {
        &self.hosts
    }

    /// The chroot every path is under, if any.
    pub fn chroot(&self) -> Option<&str> {
        self.chroot.as_deref()
    }

    /// The base path lock nodes live under (below the chroot).
    pub fn get_base_path(&self) -> &str {
        &self.base_path
    }

    /// The base path as the server sees it: chroot plus base path.
    pub(crate) fn absolute_base(&self) -> String {
        match &self.chroot {
            None => self.base_path.clone(),
            Some(root) if self.base_path == "/" => root.clone(),
            Some(root) => format!("{root}{}", self.base_path),
        }
    }
}

/// Checks digest credentials: ZooKeeper splits `user:password` at the first `:`.
fn check_digest(user: &str, password: &str) -> std::result::Result<(), String> {
    if user.is_empty() {
        return Err("the digest user name is empty".into());
    }
    if user.contains(':') {
        return Err(
            "the digest user name contains ':', which ZooKeeper cannot tell from \
                    the password"
                .into(),
        );
    }
    if user.chars().any(char::is_control) {
        return Err("the digest user name contains a control character".into());
    }
    if password.is_empty() {
        return Err(format!("the digest user {user:?} has an empty password"));
    }
    Ok(())
}

/// Checks SASL DIGEST-MD5 credentials: the driver puts the user name between double quotes in
/// its digest response without escaping it, so `"` and `\` would break the exchange; and it
/// hashes the credentials as UTF-8, while ZooKeeper's (Java) server hashes a string whose
/// characters all fit in ISO-8859-1 as ISO-8859-1 (RFC 2831), so a character in
/// U+0080..=U+00FF (`é`, `ä`) makes the digests differ: tried against ZooKeeper 3.8.0, such a
/// user or password is always refused, while ASCII and, say, CJK ones work.
fn check_sasl(user: &str, password: &str) -> std::result::Result<(), String> {
    let latin1 = |c: &char| ('\u{80}'..='\u{ff}').contains(c);
    if user.is_empty() {
        return Err("the SASL user name is empty".into());
    }
    if let Some(c) = user.chars().find(|&c| c == '"' || c == '\\') {
        return Err(format!(
            "the SASL user name contains {c:?}, which DIGEST-MD5 cannot carry here"
        ));
    }
    if user.chars().any(char::is_control) {
        return Err("the SASL user name contains a control character".into());
    }
    if password.is_empty() {
        return Err(format!("the SASL user {user:?} has an empty password"));
    }
    const LATIN1: &str = "a character in U+0080..=U+00FF, which the driver's DIGEST-MD5 hashes \
                          as UTF-8 and ZooKeeper's server as ISO-8859-1: it would never \
                          authenticate";
    if let Some(c) = user.chars().find(latin1) {
        return Err(format!("the SASL user name {user:?} has {c:?}, {LATIN1}"));
    }
    // Never the password's character: it would give part of the password away.
    if password.chars().any(|c| latin1(&c)) {
        return Err(format!("the SASL password of {user:?} has {LATIN1}"));
    }
    Ok(())
}

fn invalid(message: impl Into<String>) -> Error {
    Error::invalid(message).with_backend(BACKEND)
}

/// Checks an absolute ZooKeeper path the way the server would, so a bad one is
/// `InvalidArgument` here rather than a server error later.
fn validate_path(what: &str, path: &str) -> Result<()> {
    if !path.starts_with('/') {
        return Err(invalid(format!("{what} {path:?} must start with '/'")));
    }
    if path == "/" {
        return Ok(());
    }
    if path.ends_with('/') {
        return Err(invalid(format!("{what} {path:?} must not end with '/'")));
    }
    for segment in path[1..].split('/') {
        if segment.is_empty() {
            return Err(invalid(format!("{what} {path:?} has an empty segment")));
        }
        if segment == "." || segment == ".." {
            return Err(invalid(format!("{what} {path:?} has a relative segment")));
        }
        if let Some(c) = segment.chars().find(|&c| crate::path::unstorable(c)) {
            return Err(invalid(format!(
                "{what} {path:?} has U+{:04X}, which ZooKeeper does not accept in paths",
                c as u32
            )));
        }
    }
    if path == "/zookeeper" || path.starts_with("/zookeeper/") {
        return Err(invalid(format!(
            "{what} {path:?} is inside ZooKeeper's reserved /zookeeper tree"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_api::ErrorKind;

    #[test]
    fn urls_with_hosts_chroot_and_options() {
        let c = ZkConfig::from_url("zk://127.0.0.1:2181").unwrap();
        assert_eq!(c.hosts(), "127.0.0.1:2181");
        assert_eq!(c.chroot(), None);
        assert_eq!(c.get_base_path(), DEFAULT_BASE_PATH);
        assert_eq!(c.absolute_base(), "/distlock");
        assert_eq!(c.get_default_ttl(), DEFAULT_SESSION_TIMEOUT);

        let c = ZkConfig::from_url(
            "zk://a,b:2182,[::1]:2183,[fe80::1]/app/x?session_timeout_ms=1500&connect_timeout_ms=250&base_path=%2Flocks%2Fv1",
        )
        .unwrap();
        assert_eq!(c.hosts(), "a:2181,b:2182,[::1]:2183,[fe80::1]:2181");
        assert_eq!(c.chroot(), Some("/app/x"));
        assert_eq!(c.get_base_path(), "/locks/v1");
        assert_eq!(c.absolute_base(), "/app/x/locks/v1");
        assert_eq!(c.get_default_ttl(), Duration::from_millis(1500));
        assert_eq!(c.get_connect_timeout(), Duration::from_millis(250));

        let c = ZkConfig::from_url("zk://h/?base_path=/").unwrap();
        assert_eq!(c.chroot(), None);
        assert_eq!(c.absolute_base(), "/");
        let c = ZkConfig::from_url("zk://h/r?base_path=/").unwrap();
        assert_eq!(c.absolute_base(), "/r");
    }

    #[test]
    fn bad_urls_are_invalid_argument() {
        for bad in [
            "",
            "zk:/h",
            "redis://h:6379",
            "zk://",
            "zk:///chroot",
            "zk://h:0",
            "zk://h:65536",
            "zk://h:port",
            "zk://h,,g",
            "zk://[::1",
            "zk://[::1]x",
            "zk://user@h",
            "zk://:pw@h",
            "zk://user:@h",
            "zk://us%3Aer:pw@h",
            "zk://us%0Aer:pw@h",
            "zk://user:p%ZZ@h",
            "zk://h?acl=closed",
            "zk://h?acl=creator",
            "zk://h?tls_cert=/c.pem&tls_key=/k.pem",
            "zk://h?tls_ca=/ca.pem&tls_cert=/c.pem",
            "zk://h?tls_ca=/ca.pem&tls_key=/k.pem",
            "zk://h/a//b",
            "zk://h/a/",
            "zk://h/a/../b",
            "zk://h/zookeeper",
            "zk://h/a%",
            "zk://h#frag",
            "zk://h?nope=1",
            "zk://h?session_timeout_ms",
            "zk://h?session_timeout_ms=abc",
            "zk://h?session_timeout_ms=0",
            "zk://h?connect_timeout_ms=-5",
            "zk://h?base_path=relative",
            "zk://h?base_path=/a/./b",
        ] {
            let e = ZkConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}: {e}");
            assert_eq!(e.backend(), Some("zk"));
        }
    }

    #[test]
    fn digest_credentials_from_the_url_choose_the_creator_acl_and_stay_out_of_debug() {
        let c = ZkConfig::from_url("zk://app:p%3Ass%40w@h:2181/r").unwrap();
        assert_eq!(c.get_digest_user(), Some("app"));
        assert_eq!(
            c.digest,
            Some(("app".to_string(), "p:ss@w".to_string())),
            "percent-decoded, ':' allowed in the password"
        );
        assert_eq!(c.get_node_acl(), NodeAcl::Creator);
        assert_eq!(c.hosts(), "h:2181");
        let debug = format!("{c:?}");
        assert!(!debug.contains("p:ss"), "password in Debug: {debug}");
        assert!(debug.contains("app"), "{debug}");

        let c = ZkConfig::from_url("zk://app:pw@h?acl=open").unwrap();
        assert_eq!(
            c.get_node_acl(),
            NodeAcl::Open,
            "acl= overrides the default"
        );
        let c = ZkConfig::from_url("zk://h").unwrap();
        assert_eq!(c.get_node_acl(), NodeAcl::Open);
        assert_eq!(c.get_digest_user(), None);

        let e = ZkConfig::from_url("zk://user:secret-pw@h?acl=bad").unwrap_err();
        assert!(
            !e.to_string().contains("secret-pw"),
            "password in error: {e}"
        );
    }

    #[test]
    fn tls_options_are_taken_with_the_feature_and_refused_naming_it_without() {
        let url = "zk://h:2281?tls_ca=/etc/zk/ca.pem&tls_cert=/c.pem&tls_key=/k.pem";
        let parsed = ZkConfig::from_url(url);
        #[cfg(feature = "tls")]
        {
            let c = parsed.expect("TLS options with the feature");
            assert!(c.uses_tls());
            let tls = c.tls.expect("tls files");
            assert_eq!(tls.ca, std::path::Path::new("/etc/zk/ca.pem"));
            assert_eq!(tls.identity, Some(("/c.pem".into(), "/k.pem".into())));
            let c = ZkConfig::new("h")
                .unwrap()
                .tls_client_cert("/c.pem", "/k.pem");
            assert_eq!(c.validate().unwrap_err().kind(), ErrorKind::InvalidArgument);
            assert!(c.tls_ca("/ca.pem").validate().is_ok());
        }
        #[cfg(not(feature = "tls"))]
        {
            let e = parsed.expect_err("no TLS in this build");
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.to_string().contains("`tls` feature"), "{e}");
        }
        assert!(!ZkConfig::from_url("zk://h").unwrap().uses_tls());
    }

    #[test]
    fn sasl_option_is_checked_before_any_io_and_names_the_feature() {
        for (bad, says) in [
            ("zk://u:pw@h?sasl=gssapi", "only digest-md5"),
            ("zk://u:pw@h?sasl=plain", "only digest-md5"),
            ("zk://u:pw@h?sasl=", "only digest-md5"),
            ("zk://u:pw@h?sasl", "has no value"),
            ("zk://h?sasl=digest-md5", "needs the credentials"),
        ] {
            let e = ZkConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}: {e}");
            assert_eq!(e.backend(), Some("zk"));
            // Without the feature the mechanism is refused first; with it, the credentials.
            if cfg!(feature = "sasl") || says != "needs the credentials" {
                assert!(e.to_string().contains(says), "{bad}: {e}");
            }
        }
        let parsed = ZkConfig::from_url("zk://app:p%3Ass@h:2181/r?sasl=DIGEST-MD5");
        #[cfg(feature = "sasl")]
        {
            let c = parsed.expect("SASL credentials with the feature");
            assert_eq!(c.get_sasl_user(), Some("app"));
            assert_eq!(c.sasl, Some(("app".to_string(), "p:ss".to_string())));
            assert_eq!(c.get_digest_user(), None, "SASL instead of digest");
            assert_eq!(c.get_node_acl(), NodeAcl::Creator);
            let debug = format!("{c:?}");
            assert!(!debug.contains("p:ss"), "password in Debug: {debug}");
            assert!(debug.contains("sasl_user: Some(\"app\")"), "{debug}");
            let open = ZkConfig::from_url("zk://app:pw@h?sasl=digest-md5&acl=open").unwrap();
            assert_eq!(open.get_node_acl(), NodeAcl::Open);
            // A SASL user may hold ':' (a digest user may not), but not what DIGEST-MD5's
            // quoted user name cannot carry.
            let colon = ZkConfig::from_url("zk://a%3Ab:pw@h?sasl=digest-md5").unwrap();
            assert_eq!(colon.get_sasl_user(), Some("a:b"));
            for bad in [
                "zk://a%22b:pw@h?sasl=digest-md5",
                "zk://a%5Cb:pw@h?sasl=digest-md5",
                "zk://a%0Ab:pw@h?sasl=digest-md5",
                "zk://user:@h?sasl=digest-md5",
            ] {
                let e = ZkConfig::from_url(bad).expect_err(bad);
                assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}: {e}");
            }
        }
        #[cfg(not(feature = "sasl"))]
        {
            let e = parsed.expect_err("no SASL in this build");
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.to_string().contains("`sasl` feature"), "{e}");
            assert!(!e.to_string().contains("p:ss"), "password in error: {e}");
            assert_eq!(ZkConfig::new("h").unwrap().get_sasl_user(), None);
        }
    }

    #[cfg(feature = "sasl")]
    #[test]
    fn sasl_setter_validates_and_goes_with_digest_credentials() {
        let c = ZkConfig::new("h").unwrap();
        for (user, password) in [
            ("", "pw"),
            ("a\"b", "pw"),
            ("a\\b", "pw"),
            ("u\n", "pw"),
            ("user", ""),
            ("cé", "pw"),
            ("user", "pässwort"),
        ] {
            let e = (c.clone().sasl_digest_md5(user, password).validate()).unwrap_err();
            assert_eq!(
                e.kind(),
                ErrorKind::InvalidArgument,
                "{user:?}/{password:?}"
            );
            assert!(e.to_string().contains("SASL"), "{e}");
        }
        let e = (c.clone().sasl_digest_md5("user", "pässwort").validate()).unwrap_err();
        assert!(e.to_string().contains("ISO-8859-1"), "{e}");
        assert!(!e.to_string().contains('ä'), "part of the password in: {e}");
        // Characters beyond ISO-8859-1 are hashed as UTF-8 on both sides, and work.
        assert!(c
            .clone()
            .sasl_digest_md5("app", "日本語pw")
            .validate()
            .is_ok());
        let sasl = c.clone().sasl_digest_md5("app", "pw");
        assert!(sasl.validate().is_ok());
        assert_eq!(sasl.get_node_acl(), NodeAcl::Creator);
        assert_eq!(sasl.get_sasl_user(), Some("app"));
        // Both identities on one config: allowed, each validated on its own.
        let both = sasl.clone().digest_auth("other", "pw2");
        assert!(both.validate().is_ok());
        assert_eq!(both.get_digest_user(), Some("other"));
        assert_eq!(both.get_sasl_user(), Some("app"));
        assert_eq!(both.get_node_acl(), NodeAcl::Creator);
        let bad_digest = sasl.digest_auth("a:b", "pw");
        assert_eq!(
            bad_digest.validate().unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        let debug = format!("{:?}", c.sasl_digest_md5("app", "s3cret-pw"));
        assert!(!debug.contains("s3cret-pw"), "password in Debug: {debug}");
    }

    #[test]
    fn digest_and_acl_setters_validate() {
        let c = ZkConfig::new("h").unwrap();
        for (user, password) in [("", "pw"), ("a:b", "pw"), ("user", ""), ("u\n", "pw")] {
            let e = (c.clone().digest_auth(user, password).validate()).unwrap_err();
            assert_eq!(
                e.kind(),
                ErrorKind::InvalidArgument,
                "{user:?}/{password:?}"
            );
        }
        let ok = c.clone().digest_auth("user", "pw");
        assert!(ok.validate().is_ok());
        assert_eq!(ok.get_node_acl(), NodeAcl::Creator);
        assert_eq!(
            ok.clone().node_acl(NodeAcl::Open).get_node_acl(),
            NodeAcl::Open
        );
        // The creator ACL needs an identity: credentials, or a connector that may have one.
        let creator = c.clone().node_acl(NodeAcl::Creator);
        assert_eq!(
            creator.validate().unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        let with_connector = c
            .node_acl(NodeAcl::Creator)
            .connector(zookeeper_client::Client::connector().with_auth("digest", b"app:pw"));
        assert!(with_connector.validate().is_ok());
    }

    #[test]
    fn setters_validate() {
        let c = ZkConfig::new("h").unwrap();
        assert!(c.clone().default_ttl(Duration::ZERO).validate().is_err());
        assert!(c
            .clone()
            .default_ttl(MAX_SESSION_TIMEOUT + Duration::from_secs(1))
            .validate()
            .is_err());
        assert!(c
            .clone()
            .connect_timeout(Duration::from_secs(601))
            .validate()
            .is_err());
        assert!(c.clone().base_path("").validate().is_err());
        assert!(c.clone().base_path("/a\u{1}").validate().is_err());
        assert!(c.clone().base_path("/🔒").validate().is_err());
        let c = c.base_path("/ok/é");
        assert!(c.validate().is_ok());
        assert_eq!(c.get_base_path(), "/ok/é");
    }
}
