//! Which https servers the client trusts, and the one place its HTTP clients are built.
//!
//! TLS is rustls with the ring provider. A server's certificate must chain to the platform's
//! roots (on Linux the system bundle, which `SSL_CERT_FILE` and `SSL_CERT_DIR` replace, as they
//! do for OpenSSL) or to a certificate authority given here, for servers behind a private CA.
//! HTTP/2 is offered by ALPN.

use std::path::Path;

/// The certificate authorities an https server's certificate may chain to: the platform's, and
/// those added.
#[derive(Debug, Clone, Default)]
pub struct Trust {
    added: Vec<reqwest::Certificate>,
}

/// Why a certificate authority could not be added.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file holds no PEM certificate, or one that does not parse.
    #[error("{path} holds no readable PEM certificate{}", .reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default())]
    Unreadable {
        /// The file.
        path: String,
        /// What the parser said, if it said something.
        reason: Option<String>,
    },
}

impl Trust {
    /// The platform's roots only.
    pub fn platform() -> Trust {
        Trust::default()
    }

    /// Also trusts the certificate authorities in the PEM file at `path` (one or several
    /// certificates), besides the platform's roots.
    pub fn with_ca_file(mut self, path: &Path) -> Result<Trust, TlsError> {
        let shown = path.display().to_string();
        let pem = std::fs::read(path).map_err(|source| TlsError::Read { path: shown.clone(), source })?;
        let certificates = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|err| TlsError::Unreadable { path: shown.clone(), reason: Some(err.to_string()) })?;
        if certificates.is_empty() {
            return Err(TlsError::Unreadable { path: shown, reason: None });
        }
        self.added.extend(certificates);
        Ok(self)
    }

    /// An HTTP client builder that trusts these authorities: every HTTP client of tether's
    /// client side (the client, the gateway's upstream, the probe) starts here.
    pub fn http_client(&self) -> reqwest::ClientBuilder {
        install_provider();
        reqwest::Client::builder().tls_certs_merge(self.added.iter().cloned())
    }
}

/// Makes ring the process's rustls provider, unless the application installed one first: an
/// HTTP client takes the process's provider, and there is none by default. Call it before
/// building an HTTP client other than through [`Trust::http_client`].
pub fn install_provider() {
    // An error only says a provider is installed already, which is what this ensures.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// What a failed HTTP exchange says, with every cause under it: the top error only names the
/// URL, and the reason a connection failed (refused, a certificate from an unknown issuer) is
/// below it.
pub fn describe(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Whether `err` failed because the server's certificate is not trusted: a failure no retry
/// mends. The TLS error sits inside the connection's I/O errors, whose
/// [`source`](std::error::Error::source) skips the error they wrap.
pub(crate) fn is_untrusted(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(err);
    while let Some(err) = cause {
        let tls = err.downcast_ref::<rustls::Error>();
        if matches!(tls, Some(rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented)) {
            return true;
        }
        cause = match err.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref) {
            Some(wrapped) => Some(wrapped),
            None => err.source(),
        };
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_without_a_certificate_is_refused_with_its_name() {
        let dir = std::env::temp_dir().join(format!("tether-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let err = Trust::platform().with_ca_file(&empty).expect_err("no certificate");
        assert!(err.to_string().contains("empty.pem"), "{err}");
        let missing = Trust::platform().with_ca_file(&dir.join("missing.pem")).expect_err("no file");
        assert!(matches!(missing, TlsError::Read { .. }), "{missing}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failure_is_described_with_its_causes() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("error sending request")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let err = Outer(std::io::Error::other("invalid peer certificate: UnknownIssuer"));
        assert_eq!(describe(&err), "error sending request: invalid peer certificate: UnknownIssuer");
    }

    #[test]
    fn only_a_certificate_the_client_cannot_trust_is_untrusted() {
        let certificate = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        // As the HTTP client reports it: an I/O error around the handshake's I/O error.
        let handshake = std::io::Error::new(std::io::ErrorKind::InvalidData, certificate);
        assert!(is_untrusted(&std::io::Error::other(handshake)), "under the connection's I/O errors");
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(!is_untrusted(&refused));
        let handshake = std::io::Error::other(rustls::Error::HandshakeNotComplete);
        assert!(!is_untrusted(&handshake), "a broken handshake may mend");
    }
}
