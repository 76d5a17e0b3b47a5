//! Parsing and validating the ZooKeeper backend's configuration, with no I/O (its credentials
//! in `auth.rs`, TLS in `tls.rs`). The shared options and the builder style are those of
//! [`distlock_api::config`].

use std::fmt;
#[cfg(feature = "tls")]
use std::path::PathBuf;
use std::time::Duration;

use distlock_api::config::ConfigUrl;
use distlock_api::{ClientOptions, Result};

use crate::error::invalid;
use crate::path::validate_path;

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
