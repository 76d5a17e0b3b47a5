//! TLS to the server (feature `tls`): the URL's `ssl-mode` and `ssl-ca`, refused by a build
//! without TLS.

use std::path::PathBuf;

use distlock_api::config::UrlQuery;
use distlock_api::Result;
use sqlx::mysql::MySqlSslMode;

/// Takes the TLS parameters out of the URL's query: the mode and the CA, taken only by a build
/// that has TLS.
pub(crate) fn take_from(
    q: &mut UrlQuery<'_>,
    ssl_mode: &mut Option<MySqlSslMode>,
    ssl_ca: &mut Option<PathBuf>,
) -> Result<()> {
    for key in ["ssl-mode", "sslmode", "ssl_mode", "ssl-ca", "ssl_ca"] {
        let Some(v) = q.take_str(key) else { continue };
        if !cfg!(feature = "tls") {
            return Err(q.invalid(
                key,
                &v,
                "asks for TLS, which this build of distlock-mysql lacks: enable its `tls` \
                 feature (or the facade's)",
            ));
        }
        if key.ends_with("ca") {
            *ssl_ca = Some(PathBuf::from(v));
        } else {
            let mode = v.parse::<MySqlSslMode>().map_err(|_| {
                q.invalid(
                    key,
                    &v,
                    "is not disabled, preferred, required, verify_ca or verify_identity",
                )
            })?;
            *ssl_mode = Some(mode);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use distlock_api::ErrorKind;

    use crate::MysqlConfig;

    #[test]
    fn tls_options_are_taken_with_the_feature_and_refused_naming_it_without() {
        let url = "mysql://127.0.0.1/db?ssl-mode=verify_ca&ssl-ca=/etc/ca.pem";
        let parsed = MysqlConfig::from_url(url);
        if cfg!(feature = "tls") {
            let options = parsed
                .expect("TLS options with the feature")
                .connect_options();
            assert!(matches!(
                options.get_ssl_mode(),
                sqlx::mysql::MySqlSslMode::VerifyCa
            ));
        } else {
            let e = parsed.expect_err("no TLS in this build");
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            assert!(e.to_string().contains("`tls` feature"), "{e}");
        }
    }
}
