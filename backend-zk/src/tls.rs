//! TLS to the ensemble (feature `tls`): the config's TLS options, the driver's options from
//! the configured PEM files, and the rustls crypto provider the driver needs.

use std::path::PathBuf;

use distlock_api::{Error, Result};
use zookeeper_client as zk;

use crate::config::{TlsFiles, ZkConfig};

impl ZkConfig {
    /// Connects to every server over TLS, trusting the CA certificates in the PEM file
    /// `ca_pem` (the driver has no system trust store), and checking that each server's
    /// certificate names the host as the connect string spells it. The file is read when a
    /// session is opened, so a replaced CA file is picked up by the next session. Feature
    /// `tls`; URL option `tls_ca`. The server needs ZooKeeper's Netty connection factory and
    /// a `secureClientPort` (see the crate docs).
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
}

/// The driver's TLS options from the PEM files, read now (each new session reads them again,
/// so replaced files are picked up). A file that cannot be read or holds no usable PEM is
/// `InvalidArgument`, before any connection is tried.
pub(crate) fn options(files: &TlsFiles) -> Result<zk::TlsOptions> {
    distlock_api::backend::ensure_crypto_provider();
    let ca = read(&files.ca, "tls_ca")?;
    let mut options = zk::TlsOptions::new()
        .with_pem_ca(&ca)
        .map_err(|e| bad_file(&files.ca, "tls_ca", e))?;
    if let Some((cert, key)) = &files.identity {
        let (cert_pem, key_pem) = (read(cert, "tls_cert")?, read(key, "tls_key")?);
        options = options
            .with_pem_identity(&cert_pem, &key_pem)
            .map_err(|e| bad_file(cert, "tls_cert/tls_key", e))?;
    }
    Ok(options)
}

fn read(path: &std::path::Path, what: &str) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| {
        Error::invalid(format!(
            "cannot read the {what} file {}: {e}",
            path.display()
        ))
        .with_backend("zk")
    })
}

fn bad_file(path: &std::path::Path, what: &str, e: zk::Error) -> Error {
    Error::invalid(format!(
        "the {what} file {} holds no usable PEM: {e}",
        path.display()
    ))
    .with_backend("zk")
}
