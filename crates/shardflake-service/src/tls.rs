//! TLS on our own listeners (`tls_cert_file`, `tls_key_file`): rustls with
//! the `ring` provider. HTTP is served through a [`TlsAcceptor`] in the
//! hand-rolled server (`server.rs`), gRPC through tonic's server TLS; both
//! from the same PEM files, read and checked once at start.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::config::TlsFiles;

/// How long a client may take to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The listeners' TLS, ready to serve.
#[derive(Clone)]
pub struct ListenerTls {
    /// For the HTTP listener (ALPN `http/1.1`).
    pub http: TlsAcceptor,
    /// For the gRPC listener (tonic sets ALPN `h2`).
    pub grpc: tonic::transport::ServerTlsConfig,
}

impl std::fmt::Debug for ListenerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ListenerTls")
    }
}

/// TLS files that cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading TLS {what} {}: {error}", path.display())]
    Read {
        /// `certificate` or `key`.
        what: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// The read failure (missing file, permissions).
        error: std::io::Error,
    },
    /// A file without a PEM block of the expected kind, or a broken one.
    #[error("TLS {what} {}: {error} (expected PEM: {expected})", path.display())]
    Pem {
        /// `certificate` or `key`.
        what: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// The PEM reader's message.
        error: String,
        /// What the file should hold.
        expected: &'static str,
    },
    /// rustls refused the pair (say, a key that is not the certificate's).
    #[error("TLS certificate and key do not make a server identity: {0}")]
    Identity(rustls::Error),
}

impl ListenerTls {
    /// Reads and checks the certificate chain and key.
    pub fn read(files: &TlsFiles) -> Result<ListenerTls, TlsError> {
        let cert_pem = read("certificate", &files.cert)?;
        let key_pem = read("key", &files.key)?;
        let pem_error = |what, path: &Path, expected, error: String| TlsError::Pem {
            what,
            path: path.to_owned(),
            error,
            expected,
        };
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem_error("certificate", &files.cert, "CERTIFICATE", e.to_string()))?;
        if chain.is_empty() {
            return Err(pem_error(
                "certificate",
                &files.cert,
                "CERTIFICATE",
                "no certificate found".into(),
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            pem_error(
                "key",
                &files.key,
                "PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY",
                e.to_string(),
            )
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        // tonic builds its server config from the process-wide provider;
        // make it ring whatever else is linked in. (An error means one is
        // installed already, which is the caller's choice.)
        let _ = rustls::crypto::CryptoProvider::install_default((*provider).clone());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Identity)?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(TlsError::Identity)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let grpc = tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(&cert_pem, &key_pem))
            .timeout(HANDSHAKE_TIMEOUT);
        Ok(ListenerTls {
            http: TlsAcceptor::from(Arc::new(config)),
            grpc,
        })
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|error| TlsError::Read {
        what,
        path: path.to_owned(),
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate for 127.0.0.1 and its key, as PEM.
    fn self_signed() -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn files(dir: &Path, cert: &str, key: &str) -> TlsFiles {
        let files = TlsFiles {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        };
        std::fs::write(&files.cert, cert).unwrap();
        std::fs::write(&files.key, key).unwrap();
        files
    }

    #[test]
    fn reads_a_pair_and_refuses_what_cannot_serve() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed();
        assert!(ListenerTls::read(&files(dir.path(), &cert, &key)).is_ok());

        let err = |cert: &str, key: &str| {
            ListenerTls::read(&files(dir.path(), cert, key))
                .unwrap_err()
                .to_string()
        };
        // The key of another certificate.
        let (_, other_key) = self_signed();
        let e = err(&cert, &other_key);
        assert!(e.contains("do not make a server identity"), "{e}");
        // The two files swapped, or not PEM at all.
        assert!(err(&key, &cert).contains("expected PEM: CERTIFICATE"));
        assert!(err(&cert, "not a key").contains("expected PEM: PRIVATE KEY"));
        let missing = TlsFiles {
            cert: dir.path().join("none.pem"),
            key: dir.path().join("key.pem"),
        };
        let e = ListenerTls::read(&missing).unwrap_err().to_string();
        assert!(e.starts_with("reading TLS certificate"), "{e}");
    }
}
