//! Who a client's sessions authenticate as, and who may touch the nodes they create: the
//! digest and SASL credentials and the node ACL of [`ZkConfig`].

use crate::config::{NodeAcl, ZkConfig};

impl ZkConfig {
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
    pub(crate) fn has_credentials(&self) -> bool {
        self.digest.is_some() || self.get_sasl_user().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_api::ErrorKind;

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
}
