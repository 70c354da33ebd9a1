//! Authentication (who calls) and authorization (which tools they may call). A session, a task
//! and an idempotency key belong to the principal that made them, and no other principal reads,
//! cancels or resumes them.

mod bearer;
mod jwt;
mod resource;

use std::future::Future;
use std::pin::Pin;

pub use bearer::{BearerToken, TokensError};
pub use jwt::{FetchFuture, Jwt, JwtConfig, KeySetSource, MAX_KEY_SET_BYTES};
pub use resource::{ProtectedResource, ResourceError};

/// Who a request comes from, and what they were granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The principal sessions, tasks and idempotency keys are bound to.
    pub principal: String,
    /// What the credentials allow.
    pub grant: Grant,
}

/// What a principal's credentials allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    /// Every tool: credentials that carry no scopes (a static bearer token).
    Everything,
    /// The tools whose required scopes are all among these (an OAuth access token's `scope`).
    Scopes(Vec<String>),
}

impl Grant {
    /// Those of `required` this grant lacks (none when it allows what needs them).
    pub fn lacks<'a>(&self, required: &'a [String]) -> Vec<&'a str> {
        match self {
            Grant::Everything => Vec::new(),
            Grant::Scopes(granted) => {
                required.iter().filter(|scope| !granted.contains(scope)).map(String::as_str).collect()
            }
        }
    }
}

/// Why a request is not authenticated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unauthenticated {
    /// No credentials: 401, with where to get some.
    #[error("no bearer token")]
    Missing,
    /// Credentials that are not valid here, and why: 401 `invalid_token`.
    #[error("{0}")]
    Invalid(String),
    /// The keys that would verify the credentials could not be fetched: 503, since another try
    /// may succeed with the same token.
    #[error("the authorization server's keys are unavailable: {0}")]
    KeysUnavailable(String),
}

/// What [`Authenticator::authenticate`] answers, once it has looked (a JWT's keys may have to
/// be fetched first).
pub type Authentication<'a> = Pin<Box<dyn Future<Output = Result<Identity, Unauthenticated>> + Send + 'a>>;

/// Maps the `Authorization` header to an identity, or refuses it.
pub trait Authenticator: Send + Sync + 'static {
    /// The identity for these credentials (the header's value, if any).
    fn authenticate<'a>(&'a self, authorization: Option<&'a str>) -> Authentication<'a>;

    /// The resource this server is to an OAuth authorization server, when it is one: its
    /// metadata is served (RFC 9728), a 401 says where it is, and tools may require scopes.
    fn protected_resource(&self) -> Option<&ProtectedResource> {
        None
    }
}

/// An authenticator chosen at run time (by a command line's flags).
impl Authenticator for Box<dyn Authenticator> {
    fn authenticate<'a>(&'a self, authorization: Option<&'a str>) -> Authentication<'a> {
        (**self).authenticate(authorization)
    }

    fn protected_resource(&self) -> Option<&ProtectedResource> {
        (**self).protected_resource()
    }
}

/// The token of an `Authorization: Bearer <token>` value. The scheme's name is
/// case-insensitive (RFC 9110 §11.1), and one or more spaces follow it (RFC 6750 §2.1).
fn bearer(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim_start())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_other_schemes_are_refused() {
        for header in ["Bearer s3cret", "bearer s3cret", "BEARER  s3cret", " Bearer s3cret "] {
            assert_eq!(bearer(header), Some("s3cret"), "{header:?}");
        }
        for header in ["Basic czNjcmV0", "Bearers3cret", "s3cret", ""] {
            assert_eq!(bearer(header), None, "{header:?}");
        }
    }

    #[test]
    fn a_grant_lacks_the_required_scopes_it_does_not_hold() {
        let required = vec!["read".to_owned(), "write".to_owned()];
        assert!(Grant::Everything.lacks(&required).is_empty());
        assert_eq!(Grant::Scopes(vec!["read".into()]).lacks(&required), ["write"]);
        assert!(Grant::Scopes(vec!["write".into(), "read".into(), "x".into()]).lacks(&required).is_empty());
        assert!(Grant::Scopes(Vec::new()).lacks(&[]).is_empty());
    }
}
