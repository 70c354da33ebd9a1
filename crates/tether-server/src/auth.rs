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
        let token = bearer(authorization?)?;
        equal_in_constant_time(token.as_bytes(), self.token.as_bytes()).then(|| "bearer".to_owned())
    }
}

/// The token of an `Authorization: Bearer <token>` value. The scheme's name is
/// case-insensitive (RFC 9110 §11.1), and one or more spaces follow it (RFC 6750 §2.1).
fn bearer(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim_start())
}

/// Whether `a` and `b` are equal, in a time that depends on their lengths only, not on where
/// they first differ: a token cannot be guessed a byte at a time.
fn equal_in_constant_time(a: &[u8], b: &[u8]) -> bool {
    let longest = a.len().max(b.len());
    let differ = (0..longest).fold(u8::from(a.len() != b.len()), |acc, i| {
        acc | (a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0))
    });
    differ == 0
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
    fn tokens_are_equal_only_when_every_byte_and_the_length_are() {
        assert!(equal_in_constant_time(b"s3cret", b"s3cret"));
        assert!(!equal_in_constant_time(b"s3creT", b"s3cret"));
        assert!(!equal_in_constant_time(b"s3cret", b"s3cret\0"), "a longer token with a NUL tail");
        assert!(!equal_in_constant_time(b"", b"s3cret"));
        let token = BearerToken::new("s3cret");
        assert_eq!(token.authenticate(Some("bearer s3cret")), Some("bearer".to_owned()));
        assert_eq!(token.authenticate(Some("Bearer wrong")), None);
        assert_eq!(token.authenticate(None), None);
    }
}
