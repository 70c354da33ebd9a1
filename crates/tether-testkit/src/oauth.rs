//! The signing side of an OAuth authorization server, for tests: ES256 keys minted by the test,
//! their JWK Set, access tokens signed with them, and the set (with the issuer's metadata)
//! served over loopback HTTP.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

/// One signing key.
struct SigningKey {
    kid: String,
    pkcs8: Vec<u8>,
    /// The public point's coordinates, base64url.
    x: String,
    y: String,
}

impl SigningKey {
    fn mint(kid: String) -> SigningKey {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("a P-256 key");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).expect("its pair");
        // Uncompressed: 0x04, then x and y of 32 bytes each.
        let point = pair.public_key().as_ref();
        let (x, y) = (URL_SAFE_NO_PAD.encode(&point[1..33]), URL_SAFE_NO_PAD.encode(&point[33..65]));
        SigningKey { kid, pkcs8: pkcs8.as_ref().to_vec(), x, y }
    }
}

/// An issuer of access tokens: its identifier and its keys, the newest signing.
pub struct Issuer {
    issuer: String,
    keys: Mutex<Vec<SigningKey>>,
    minted: AtomicUsize,
    fetches: AtomicUsize,
}

impl Issuer {
    /// An issuer named `issuer` with one key.
    pub fn new(issuer: impl Into<String>) -> Issuer {
        let issuer = Issuer {
            issuer: issuer.into(),
            keys: Mutex::new(Vec::new()),
            minted: AtomicUsize::new(0),
            fetches: AtomicUsize::new(0),
        };
        issuer.rotate();
        issuer
    }

    /// The issuer's identifier, the `iss` of its tokens.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Mints a new key that signs from now on, and drops every older one; answers its `kid`.
    pub fn rotate(&self) -> String {
        let kid = format!("k{}", self.minted.fetch_add(1, Ordering::SeqCst) + 1);
        *self.keys.lock().unwrap_or_else(PoisonError::into_inner) = vec![SigningKey::mint(kid.clone())];
        kid
    }

    /// The JWK Set document of the current keys; counted as a fetch.
    pub fn jwks(&self) -> String {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let keys: Vec<Value> = keys
            .iter()
            .map(|key| json!({"kty": "EC", "crv": "P-256", "x": key.x, "y": key.y, "kid": key.kid, "use": "sig", "alg": "ES256"}))
            .collect();
        json!({ "keys": keys }).to_string()
    }

    /// How many times the key set was read.
    pub fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    /// A token with exactly `claims`, signed by the newest key.
    pub fn sign(&self, claims: &Value) -> String {
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let key = keys.last().expect("a key");
        let header = Header { kid: Some(key.kid.clone()), ..Header::new(Algorithm::ES256) };
        jsonwebtoken::encode(&header, claims, &EncodingKey::from_ec_der(&key.pkcs8)).expect("a signed token")
    }

    /// A token of this issuer for `subject`, with `audience`, granting `scope`, expiring in
    /// `expires_in` seconds (negative: expired that long ago).
    pub fn token(&self, subject: &str, audience: &str, scope: &str, expires_in: i64) -> String {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs() as i64;
        self.sign(&json!({
            "iss": self.issuer, "sub": subject, "aud": audience, "scope": scope,
            "iat": now, "exp": now + expires_in, "client_id": "tests",
        }))
    }
}

/// An [`Issuer`] whose key set and metadata (RFC 8414) are served on loopback:
/// `/.well-known/oauth-authorization-server` and `/jwks`. Stops when dropped.
pub struct IssuerServer {
    /// The issuer, named by the server's URL.
    pub issuer: Arc<Issuer>,
    task: tokio::task::JoinHandle<()>,
}

impl IssuerServer {
    /// Starts one on a free loopback port.
    pub async fn start() -> IssuerServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let issuer = Arc::new(Issuer::new(url));
        let serving = Arc::clone(&issuer);
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let issuer = Arc::clone(&serving);
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let line = String::from_utf8_lossy(&head);
                    let path = line.split_whitespace().nth(1).unwrap_or("");
                    let (status, body) = match path {
                        "/jwks" => ("200 OK", issuer.jwks()),
                        "/.well-known/oauth-authorization-server" => {
                            let metadata = json!({
                                "issuer": issuer.issuer(),
                                "jwks_uri": format!("{}/jwks", issuer.issuer()),
                                "response_types_supported": ["code"],
                            });
                            ("200 OK", metadata.to_string())
                        }
                        _ => ("404 Not Found", String::new()),
                    };
                    let response = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(response.as_bytes()).await;
                });
            }
        });
        IssuerServer { issuer, task }
    }
}

impl Drop for IssuerServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
