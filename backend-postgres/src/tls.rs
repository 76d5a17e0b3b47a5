//! TLS to the server (feature `tls`): the URL's `sslmode` and `sslrootcert`, as libpq spells
//! them, refused by a build without TLS.

use std::path::PathBuf;

use distlock_api::config::UrlQuery;
use distlock_api::Result;
use sqlx::postgres::{PgConnectOptions, PgSslMode};

/// The URL's TLS settings; the driver's defaults (`prefer`, the system's roots) where unset.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tls {
    mode: Option<PgSslMode>,
    root_cert: Option<PathBuf>,
}

impl Tls {
    /// Takes `sslmode` and `sslrootcert` out of the URL's query, only in a build with TLS.
    pub(crate) fn take_from(&mut self, q: &mut UrlQuery<'_>) -> Result<()> {
        for key in ["sslmode", "sslrootcert"] {
            let Some(v) = q.take_str(key) else { continue };
            let plain = key == "sslmode" && v == "disable";
            if !cfg!(feature = "tls") && !plain {
                return Err(q.invalid(
                    key,
                    &v,
                    "asks for TLS, which this build of distlock-postgres lacks: enable its `tls` \
                     feature (or the facade's)",
                ));
            }
            if key == "sslrootcert" {
                self.root_cert = Some(PathBuf::from(v));
            } else {
                let mode = v.parse::<PgSslMode>().map_err(|_| {
                    q.invalid(
                        key,
                        &v,
                        "is not disable, allow, prefer, require, verify-ca or verify-full",
                    )
                })?;
                self.mode = Some(mode);
            }
        }
        Ok(())
    }

    /// The options with these settings.
    pub(crate) fn apply(&self, mut o: PgConnectOptions) -> PgConnectOptions {
        if let Some(mode) = self.mode {
            o = o.ssl_mode(mode);
        }
        if let Some(ca) = &self.root_cert {
            o = o.ssl_root_cert(ca);
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use distlock_api::ErrorKind;

    use crate::PostgresConfig;

    #[test]
    fn tls_options_are_taken_with_the_feature_and_refused_naming_it_without() {
        let url = "postgres://127.0.0.1/db?sslmode=verify-ca&sslrootcert=/etc/ca.pem";
        let parsed = PostgresConfig::from_url(url);
        if cfg!(feature = "tls") {
            let options = parsed
                .expect("TLS options with the feature")
                .connect_options();
            assert!(matches!(
                options.get_ssl_mode(),
                sqlx::postgres::PgSslMode::VerifyCa
            ));
        } else {
            let e = parsed.expect_err("no TLS in this build");
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            assert!(e.to_string().contains("`tls` feature"), "{e}");
        }
        let plain = PostgresConfig::from_url("postgres://127.0.0.1/db?sslmode=disable").unwrap();
        assert!(matches!(
            plain.connect_options().get_ssl_mode(),
            sqlx::postgres::PgSslMode::Disable
        ));
    }
}
