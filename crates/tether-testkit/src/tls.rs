//! Certificates for TLS tests: a certificate authority the test makes, and the loopback server
//! certificates it issues, written as PEM files for the processes under test.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A certificate authority of the test's own, trusted by nobody but whoever is given its file.
pub struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A server's certificate and key, as PEM files.
pub struct Issued {
    /// The certificate (issued by the authority).
    pub certificate: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

impl Authority {
    /// A new authority named `name`.
    pub fn new(name: &str) -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("CA key");
        Authority { issuer: CertifiedIssuer::self_signed(params, key).expect("CA certificate") }
    }

    /// Writes the authority's certificate to `path` (what a client is told to trust).
    pub fn write(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.issuer.pem()).expect("write CA certificate");
        path.to_owned()
    }

    /// Issues a certificate for `localhost` and `127.0.0.1`, written as `{stem}.pem` and
    /// `{stem}.key` in `dir`.
    pub fn issue(&self, dir: &Path, stem: &str) -> Issued {
        let params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).expect("server params");
        let key = KeyPair::generate().expect("server key");
        let certificate = params.signed_by(&key, &self.issuer).expect("server certificate");
        let issued = Issued { certificate: dir.join(format!("{stem}.pem")), key: dir.join(format!("{stem}.key")) };
        std::fs::write(&issued.certificate, certificate.pem()).expect("write certificate");
        std::fs::write(&issued.key, key.serialize_pem()).expect("write key");
        issued
    }
}
