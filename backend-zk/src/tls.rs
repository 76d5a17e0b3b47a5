//! TLS to the ensemble (feature `tls`): the driver's options from the configured PEM files,
//! and the rustls crypto provider the driver needs.

use distlock_api::{Error, Result};
use zookeeper_client as zk;

use crate::config::TlsFiles;

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
