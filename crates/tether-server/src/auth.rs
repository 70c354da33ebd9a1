//! Authentication: who is calling. A session belongs to the principal that created it.

/// Maps the `Authorization` header to a principal, or refuses it.
pub trait Authenticator: Send + Sync + 'static {
    /// The principal for these credentials (the header's value, if any), or `None` to answer 401.
    fn authenticate(&self, authorization: Option<&str>) -> Option<String>;
}

/// One shared bearer token; every holder is the same principal.
#[derive(Clone)]
pub struct BearerToken {
    token: String,
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(..)")
    }
}

impl BearerToken {
    /// Accepts `Authorization: Bearer <token>`.
    pub fn new(token: impl Into<String>) -> BearerToken {
        BearerToken { token: token.into() }
    }
}

impl Authenticator for BearerToken {
    fn authenticate(&self, authorization: Option<&str>) -> Option<String> {
        let presented = authorization?.strip_prefix("Bearer ")?;
        // Compare in constant time so the token cannot be guessed byte by byte.
        let equal = presented.len() == self.token.len()
            && presented.bytes().zip(self.token.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
        equal.then(|| "bearer".to_owned())
    }
}
