//! An OAuth authorization server for tests: ES256 keys minted by the test, their JWK Set, access
//! tokens signed with them, and (served over loopback HTTP) the issuer's metadata, the set, and
//! the code and refresh grants approved without a person.

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

/// An [`Issuer`] served on loopback as an authorization server that approves every request
/// without a person: its metadata (RFC 8414) at `/.well-known/oauth-authorization-server`, its key
/// set at `/jwks`, dynamic registration at `/register`, `/authorize` (a 302 to the redirect URI
/// with a code), and `/token` (the code with its PKCE verifier, or a refresh token, for an access
/// token whose audience is the `resource` asked for). Stops when dropped.
pub struct IssuerServer {
    /// The issuer, named by the server's URL.
    pub issuer: Arc<Issuer>,
    /// What its token endpoint issues, and what it counted.
    pub grants: Arc<Grants>,
    task: tokio::task::JoinHandle<()>,
}

/// The authorization server's side of the code and refresh grants.
#[derive(Default)]
pub struct Grants {
    /// How long access tokens live, in seconds (300 unless set).
    pub lifetime: std::sync::atomic::AtomicI64,
    /// Whether the token answer says the lifetime (`expires_in`): without, a client learns of
    /// expiry only from the resource's refusal.
    pub announce_lifetime: std::sync::atomic::AtomicBool,
    /// Codes issued and not yet exchanged: their PKCE challenge, resource and scope.
    codes: Mutex<std::collections::HashMap<String, (String, String, String)>>,
    /// Refresh tokens issued: their resource and scope.
    refresh_tokens: Mutex<std::collections::HashMap<String, (String, String)>>,
    issued: AtomicUsize,
    exchanged: AtomicUsize,
    refreshed: AtomicUsize,
}

impl Grants {
    /// How many codes were exchanged for tokens: one per authorization.
    pub fn exchanged(&self) -> usize {
        self.exchanged.load(Ordering::SeqCst)
    }

    /// How many refresh tokens were exchanged for new access tokens.
    pub fn refreshed(&self) -> usize {
        self.refreshed.load(Ordering::SeqCst)
    }

    fn next(&self, prefix: &str) -> String {
        format!("{prefix}-{}", self.issued.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// The answer to an authorization request: where to redirect.
    fn authorize(&self, issuer: &str, query: &std::collections::HashMap<String, String>) -> String {
        let get = |name: &str| query.get(name).cloned().unwrap_or_default();
        let code = self.next("code");
        self.codes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(code.clone(), (get("code_challenge"), get("resource"), get("scope")));
        format!(
            "{}?code={code}&state={}&iss={}",
            get("redirect_uri"),
            percent_encode(&get("state")),
            percent_encode(issuer)
        )
    }

    /// The answer of the token endpoint to `form`: status and body.
    fn token(&self, issuer: &Issuer, form: &std::collections::HashMap<String, String>) -> (&'static str, String) {
        let get = |name: &str| form.get(name).cloned().unwrap_or_default();
        let refused = |error: &str| ("400 Bad Request", json!({"error": error}).to_string());
        let (resource, scope) = match get("grant_type").as_str() {
            "authorization_code" => {
                let Some((challenge, resource, scope)) =
                    self.codes.lock().unwrap_or_else(PoisonError::into_inner).remove(&get("code"))
                else {
                    return refused("invalid_grant");
                };
                let digest = ring::digest::digest(&ring::digest::SHA256, get("code_verifier").as_bytes());
                if URL_SAFE_NO_PAD.encode(digest.as_ref()) != challenge {
                    return refused("invalid_grant");
                }
                self.exchanged.fetch_add(1, Ordering::SeqCst);
                (resource, scope)
            }
            "refresh_token" => {
                let known = self
                    .refresh_tokens
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&get("refresh_token"))
                    .cloned();
                let Some(known) = known else { return refused("invalid_grant") };
                self.refreshed.fetch_add(1, Ordering::SeqCst);
                known
            }
            _ => return refused("unsupported_grant_type"),
        };
        let lifetime = match self.lifetime.load(Ordering::SeqCst) {
            0 => 300,
            seconds => seconds,
        };
        let refresh_token = self.next("refresh");
        self.refresh_tokens
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(refresh_token.clone(), (resource.clone(), scope.clone()));
        let mut answer = json!({
            "access_token": issuer.token("alice", &resource, &scope, lifetime),
            "token_type": "Bearer",
            "refresh_token": refresh_token,
        });
        if self.announce_lifetime.load(Ordering::SeqCst) {
            answer["expires_in"] = json!(lifetime);
        }
        ("200 OK", answer.to_string())
    }
}

/// `application/x-www-form-urlencoded` pairs (a query or a form body), decoded.
fn form_pairs(text: &str) -> std::collections::HashMap<String, String> {
    let decode = |part: &str| {
        let bytes = part.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    let hex =
                        std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                    match hex {
                        Some(byte) => {
                            out.push(byte);
                            i += 2;
                        }
                        None => out.push(b'%'),
                    }
                }
                byte => out.push(byte),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    text.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(name), decode(value))
        })
        .collect()
}

/// Percent-encodes all but the unreserved characters.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl IssuerServer {
    /// Starts one on a free loopback port.
    pub async fn start() -> IssuerServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let issuer = Arc::new(Issuer::new(url));
        let grants = Arc::new(Grants::default());
        let (serving, granting) = (Arc::clone(&issuer), Arc::clone(&grants));
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let (issuer, grants) = (Arc::clone(&serving), Arc::clone(&granting));
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    let body_start = loop {
                        if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                            break end + 4;
                        }
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                        if request.len() > 64 * 1024 {
                            return;
                        }
                    };
                    let head = String::from_utf8_lossy(&request[..body_start]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|line| line.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0)
                        .min(64 * 1024);
                    while request.len() < body_start + length {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let line = String::from_utf8_lossy(&request[..body_start]).lines().next().unwrap_or("").to_owned();
                    let target = line.split_whitespace().nth(1).unwrap_or("");
                    let (path, query) = target.split_once('?').unwrap_or((target, ""));
                    let body = String::from_utf8_lossy(&request[body_start..body_start + length]).into_owned();
                    let base = issuer.issuer().to_owned();
                    let mut location = None;
                    let (status, body) = match path {
                        "/jwks" => ("200 OK", issuer.jwks()),
                        "/.well-known/oauth-authorization-server" => {
                            let metadata = json!({
                                "issuer": base,
                                "jwks_uri": format!("{base}/jwks"),
                                "authorization_endpoint": format!("{base}/authorize"),
                                "token_endpoint": format!("{base}/token"),
                                "registration_endpoint": format!("{base}/register"),
                                "response_types_supported": ["code"],
                                "grant_types_supported": ["authorization_code", "refresh_token"],
                                "code_challenge_methods_supported": ["S256"],
                                "token_endpoint_auth_methods_supported": ["none"],
                                "authorization_response_iss_parameter_supported": true,
                            });
                            ("200 OK", metadata.to_string())
                        }
                        "/register" => (
                            "201 Created",
                            json!({"client_id": grants.next("client"), "token_endpoint_auth_method": "none"})
                                .to_string(),
                        ),
                        "/authorize" => {
                            location = Some(grants.authorize(&base, &form_pairs(query)));
                            ("302 Found", String::new())
                        }
                        "/token" => grants.token(&issuer, &form_pairs(&body)),
                        _ => ("404 Not Found", String::new()),
                    };
                    let location = location.map(|to| format!("location: {to}\r\n")).unwrap_or_default();
                    let response = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{location}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(response.as_bytes()).await;
                });
            }
        });
        IssuerServer { issuer, grants, task }
    }
}

impl Drop for IssuerServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
