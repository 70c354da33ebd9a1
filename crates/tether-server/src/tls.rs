//! TLS on the server's own listener, for a server or gateway that faces a network without a
//! proxy in front: rustls with the ring provider, HTTP/2 and HTTP/1.1 offered by ALPN.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The certificate chain and key the server proves its name with, ready to accept connections.
#[derive(Clone)]
pub struct ServerTls {
    acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

/// Why the server's certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file holds no readable PEM certificate.
    #[error("{path} holds no readable PEM certificate: {reason}")]
    Certificate {
        /// The file.
        path: String,
        /// What the parser said.
        reason: String,
    },
    /// The key file holds no readable PEM private key.
    #[error("{path} holds no readable PEM private key: {reason}")]
    Key {
        /// The file.
        path: String,
        /// What the parser said.
        reason: String,
    },
    /// The key does not match the certificate, or TLS refused them.
    #[error("the certificate and key cannot serve TLS: {0}")]
    Refused(String),
}

impl ServerTls {
    /// The chain in the PEM file `certificate` (the server's certificate first, then any
    /// intermediates) with the private key in the PEM file `key`.
    pub fn from_pem_files(certificate: &Path, key: &Path) -> Result<ServerTls, TlsError> {
        let shown = |path: &Path| path.display().to_string();
        let chain = CertificateDer::pem_file_iter(certificate)
            .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
            .map_err(|err| TlsError::Certificate { path: shown(certificate), reason: err.to_string() })?;
        if chain.is_empty() {
            return Err(TlsError::Certificate { path: shown(certificate), reason: "no certificate in it".into() });
        }
        let key = PrivateKeyDer::from_pem_file(key)
            .map_err(|err| TlsError::Key { path: shown(key), reason: err.to_string() })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|err| TlsError::Refused(err.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|err| TlsError::Refused(err.to_string()))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ServerTls { acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)) })
    }

    /// The acceptor that performs a connection's handshake.
    pub(crate) fn acceptor(&self) -> &tokio_rustls::TlsAcceptor {
        &self.acceptor
    }
}
