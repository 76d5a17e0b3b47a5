//! Throw-away certificates for the TLS tests of the backends: a CA of the test's own and a
//! server certificate it signed for `127.0.0.1` and `localhost`, made with the `openssl`
//! command (which `scripts/services` installs) in a temp dir that goes when the value drops.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A test CA and one server certificate, as PEM files.
#[derive(Debug)]
pub struct TestCerts {
    dir: PathBuf,
}

impl TestCerts {
    /// Makes a CA and a server key and certificate for `127.0.0.1` and `localhost`, valid for a
    /// day. Panics (the test fails) if `openssl` is missing or refuses.
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "distlock-tls-{tag}-{}-{:08x}",
            std::process::id(),
            crate::unique_suffix()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir for certificates");
        let certs = Self { dir };
        let p = |f: &str| certs.dir.join(f).display().to_string();
        certs.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=distlock test CA",
            "-keyout",
            &p("ca.key"),
            "-out",
            &p("ca.crt"),
        ]);
        certs.openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            &p("server.key"),
            "-out",
            &p("server.csr"),
        ]);
        std::fs::write(
            certs.dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
        .expect("write the extensions file");
        certs.openssl(&[
            "x509",
            "-req",
            "-days",
            "1",
            "-in",
            &p("server.csr"),
            "-CA",
            &p("ca.crt"),
            "-CAkey",
            &p("ca.key"),
            "-CAcreateserial",
            "-extfile",
            &p("server.ext"),
            "-out",
            &p("server.crt"),
        ]);
        // Servers running as another user (MariaDB's mysqld) must be able to read them.
        for f in ["ca.crt", "server.crt", "server.key"] {
            let _ = Command::new("chmod")
                .arg("644")
                .arg(certs.dir.join(f))
                .status();
        }
        let _ = Command::new("chmod").arg("755").arg(&certs.dir).status();
        certs
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run openssl ({e}): `scripts/services` installs it"));
        assert!(
            out.status.success(),
            "openssl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA certificate (PEM file).
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The server certificate (PEM file), signed by the CA.
    pub fn cert(&self) -> PathBuf {
        self.dir.join("server.crt")
    }

    /// The server's private key (PEM file).
    pub fn key(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    /// The CA certificate's PEM text.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.ca()).expect("read the CA certificate")
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
