//! OAuth access tokens as JWTs (RFC 9068): signed by a key of the issuer's JWK Set, issued by
//! the configured issuer, for this resource, and not expired. The token's subject is the
//! principal; its `scope` is what it grants.
//!
//! The key set is fetched when a token names a key the server does not hold (the first token,
//! and each key rotation), at most once per [`JwtConfig::refetch_after`], one fetch at a time: a
//! flood of tokens naming unknown keys costs the issuer one fetch per interval, not one per token.

use std::future::Future;
use std::pin::Pin;
use std::str::FromStr as _;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use tokio::time::Instant;

use super::{Authentication, Authenticator, Grant, Identity, ProtectedResource, Unauthenticated, bearer};

/// The longest token looked at: a real access token is a few kilobytes at most.
const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// The most keys a key set may hold; an issuer rotates two or three at a time.
const MAX_KEYS: usize = 64;
/// How long after a failed fetch the next may be tried.
const RETRY_FAILED_FETCH: Duration = Duration::from_secs(1);

/// The largest key set document a [`KeySetSource`] should return.
pub const MAX_KEY_SET_BYTES: usize = 256 * 1024;

/// What [`KeySetSource::fetch`] answers: the document, or why it could not be had.
pub type FetchFuture<'a> = Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + Send + 'a>>;

/// Where the issuer's JWK Set (RFC 7517 §5) comes from: its `jwks_uri` over HTTPS in `tether
/// serve`, keys a test minted in tests.
pub trait KeySetSource: Send + Sync + 'static {
    /// The current key set document, of at most [`MAX_KEY_SET_BYTES`]; a fetch should give up
    /// within seconds, since tokens naming unknown keys wait for it.
    fn fetch(&self) -> FetchFuture<'_>;
}

/// Which tokens [`Jwt`] accepts.
#[derive(Debug, Clone)]
pub struct JwtConfig {
    /// The `iss` a token must carry, compared as a string (RFC 9068 §4).
    pub issuer: String,
    /// How far past `exp` (and before `nbf`) a token is still taken, for clocks that differ.
    pub leeway: Duration,
    /// The least time between two fetches of the key set for an unknown key.
    pub refetch_after: Duration,
}

impl JwtConfig {
    /// Tokens of `issuer`, with a minute's leeway, refetching keys at most every 30 seconds.
    pub fn new(issuer: impl Into<String>) -> JwtConfig {
        JwtConfig { issuer: issuer.into(), leeway: Duration::from_secs(60), refetch_after: Duration::from_secs(30) }
    }
}

/// Why a key set document cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum KeySetError {
    /// Over [`MAX_KEY_SET_BYTES`].
    #[error("the key set is larger than {MAX_KEY_SET_BYTES} bytes")]
    KeySetTooLarge,
    /// Not a JSON object with a `keys` array.
    #[error("not a JWK Set: {0}")]
    NotAKeySet(String),
    /// More than the most keys held.
    #[error("the key set has more than {MAX_KEYS} keys")]
    TooManyKeys,
}

/// Authenticates OAuth access tokens that are JWTs signed by the issuer's keys.
pub struct Jwt {
    config: JwtConfig,
    resource: ProtectedResource,
    source: Box<dyn KeySetSource>,
    keys: RwLock<Arc<[Key]>>,
    fetches: tokio::sync::Mutex<Fetches>,
}

impl std::fmt::Debug for Jwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwt").field("config", &self.config).field("resource", &self.resource).finish_non_exhaustive()
    }
}

/// One verification key of the issuer's.
struct Key {
    kid: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

/// When the key set was last fetched, and how that went.
#[derive(Default)]
struct Fetches {
    succeeded: Option<Instant>,
    failed: Option<(Instant, String)>,
}

/// The claims read from a verified token; the registered ones are checked by the validation.
#[derive(Deserialize)]
struct Claims {
    sub: String,
    #[serde(default)]
    scope: Option<String>,
}

impl Jwt {
    /// Accepts tokens `config` describes, for `resource`, verified with keys from `source`.
    pub fn new(config: JwtConfig, resource: ProtectedResource, source: impl KeySetSource) -> Jwt {
        Jwt {
            config,
            resource,
            source: Box::new(source),
            keys: RwLock::new(Arc::from(Vec::new())),
            fetches: tokio::sync::Mutex::default(),
        }
    }

    async fn verify(&self, authorization: Option<&str>) -> Result<Identity, Unauthenticated> {
        let invalid = |why: &str| Unauthenticated::Invalid(why.to_owned());
        let token =
            bearer(authorization.ok_or(Unauthenticated::Missing)?).ok_or_else(|| invalid("not a bearer token"))?;
        if token.len() > MAX_TOKEN_BYTES {
            return Err(invalid("the token is longer than 16 KiB"));
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| invalid("the token is not a JWT"))?;
        let key = self.key(header.kid.as_deref()).await?;
        let mut validation = Validation::new(key.algorithm);
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&[self.resource.resource()]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.validate_nbf = true;
        validation.leeway = self.config.leeway.as_secs();
        let claims = jsonwebtoken::decode::<Claims>(token, &key.key, &validation)
            .map_err(|err| Unauthenticated::Invalid(refused(err.kind())))?
            .claims;
        if claims.sub.is_empty() {
            return Err(invalid("the token's subject is empty"));
        }
        let scopes = claims.scope.unwrap_or_default().split_ascii_whitespace().map(str::to_owned).collect();
        Ok(Identity { principal: claims.sub, grant: Grant::Scopes(scopes) })
    }

    /// The key a token names, fetching the key set once if it is not held.
    async fn key(&self, kid: Option<&str>) -> Result<KeyRef, Unauthenticated> {
        if let Some(key) = self.held(kid) {
            return Ok(key);
        }
        let mut fetches = self.fetches.lock().await;
        // Another request may have fetched the set while this one waited.
        if let Some(key) = self.held(kid) {
            return Ok(key);
        }
        let now = Instant::now();
        if let Some((at, why)) = &fetches.failed
            && now.duration_since(*at) < RETRY_FAILED_FETCH
        {
            return Err(Unauthenticated::KeysUnavailable(why.clone()));
        }
        let unknown = || Unauthenticated::Invalid("the token names no key of its issuer's".into());
        if fetches.succeeded.is_some_and(|at| now.duration_since(at) < self.config.refetch_after) {
            return Err(unknown());
        }
        let fetched = self.source.fetch().await.and_then(|document| key_set(&document).map_err(|e| e.to_string()));
        match fetched {
            Ok(keys) => {
                *fetches = Fetches { succeeded: Some(now), failed: None };
                *self.keys.write().unwrap_or_else(PoisonError::into_inner) = Arc::from(keys);
            }
            Err(why) => {
                tracing::warn!(%why, "could not fetch the issuer's key set");
                fetches.failed = Some((now, why.clone()));
                return Err(Unauthenticated::KeysUnavailable(why));
            }
        }
        self.held(kid).ok_or_else(unknown)
    }

    /// The held key `kid` names; without a `kid`, the only key, if there is one.
    fn held(&self, kid: Option<&str>) -> Option<KeyRef> {
        let keys = Arc::clone(&self.keys.read().unwrap_or_else(PoisonError::into_inner));
        let index = match kid {
            Some(kid) => keys.iter().position(|key| key.kid.as_deref() == Some(kid))?,
            None if keys.len() == 1 => 0,
            None => return None,
        };
        Some(KeyRef { keys, index })
    }
}

/// A held key, kept alive while a token is verified with it even if the set is replaced.
struct KeyRef {
    keys: Arc<[Key]>,
    index: usize,
}

impl std::ops::Deref for KeyRef {
    type Target = Key;

    fn deref(&self) -> &Key {
        &self.keys[self.index]
    }
}

impl Authenticator for Jwt {
    fn authenticate<'a>(&'a self, authorization: Option<&'a str>) -> Authentication<'a> {
        Box::pin(self.verify(authorization))
    }

    fn protected_resource(&self) -> Option<&ProtectedResource> {
        Some(&self.resource)
    }
}

/// Why a token was refused, as the 401's `error_description` says it.
fn refused(kind: &ErrorKind) -> String {
    match kind {
        ErrorKind::ExpiredSignature => "the token has expired".into(),
        ErrorKind::ImmatureSignature => "the token is not valid yet".into(),
        ErrorKind::InvalidAudience => "the token is not for this resource".into(),
        ErrorKind::InvalidIssuer => "the token is from another issuer".into(),
        ErrorKind::InvalidSignature => "the token's signature does not verify".into(),
        ErrorKind::InvalidAlgorithm => "the token is signed with an algorithm its key is not for".into(),
        ErrorKind::MissingRequiredClaim(claim) => format!("the token has no {claim} claim"),
        _ => "the token is not valid".into(),
    }
}

/// The verification keys of a JWK Set document: keys for encryption, symmetric keys and keys of
/// algorithms that cannot be verified here are left out.
fn key_set(document: &[u8]) -> Result<Vec<Key>, KeySetError> {
    #[derive(Deserialize)]
    struct Document {
        keys: Vec<serde_json::Value>,
    }
    if document.len() > MAX_KEY_SET_BYTES {
        return Err(KeySetError::KeySetTooLarge);
    }
    let document: Document = serde_json::from_slice(document).map_err(|e| KeySetError::NotAKeySet(e.to_string()))?;
    if document.keys.len() > MAX_KEYS {
        return Err(KeySetError::TooManyKeys);
    }
    Ok(document
        .keys
        .into_iter()
        .filter_map(|value| {
            let jwk: Jwk = serde_json::from_value(value).ok()?;
            if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
                return None;
            }
            let algorithm = algorithm(&jwk)?;
            let key = DecodingKey::from_jwk(&jwk).ok()?;
            Some(Key { kid: jwk.common.key_id, algorithm, key })
        })
        .collect())
}

/// The one algorithm a key verifies: its `alg`, or the usual one of its type. Never an HMAC: a
/// shared secret has no place in a published key set, and taking one would let anyone who read
/// the set sign tokens.
fn algorithm(jwk: &Jwk) -> Option<Algorithm> {
    let algorithm = match (&jwk.algorithm, jwk.common.key_algorithm) {
        (AlgorithmParameters::OctetKey(_), _) => return None,
        (_, Some(named)) => Algorithm::from_str(&named.to_string()).ok()?,
        (AlgorithmParameters::RSA(_), None) => Algorithm::RS256,
        (AlgorithmParameters::EllipticCurve(ec), None) => match ec.curve {
            EllipticCurve::P256 => Algorithm::ES256,
            EllipticCurve::P384 => Algorithm::ES384,
            _ => return None,
        },
        (AlgorithmParameters::OctetKeyPair(okp), None) => match okp.curve {
            EllipticCurve::Ed25519 => Algorithm::EdDSA,
            _ => return None,
        },
    };
    (!matches!(algorithm, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512)).then_some(algorithm)
}
