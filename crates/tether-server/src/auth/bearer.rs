//! Static bearer tokens, each naming a principal: the simple setup, with no authorization server.

use super::{Authentication, Authenticator, Grant, Identity, Unauthenticated, bearer};

/// Bearer tokens, each naming a principal: sessions and tasks belong to the principal whose
/// token created them, and no other principal reads, cancels or resumes them.
#[derive(Clone)]
pub struct BearerToken {
    /// Each principal with its token.
    tokens: Vec<(String, String)>,
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let principals: Vec<&str> = self.tokens.iter().map(|(principal, _)| principal.as_str()).collect();
        f.debug_struct("BearerToken").field("principals", &principals).finish_non_exhaustive()
    }
}

/// Why a set of bearer tokens cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokensError {
    /// No token at all.
    #[error("no bearer token")]
    Empty,
    /// A token that is empty, or a principal without a name.
    #[error("an empty token or principal name")]
    Blank,
    /// Two principals with one name.
    #[error("principal {0:?} is named twice")]
    DuplicatePrincipal(String),
    /// One token for two principals: it could not say which one calls.
    #[error("two principals share a token")]
    SharedToken,
}

impl BearerToken {
    /// Accepts `Authorization: Bearer <token>`; every holder is one principal, `bearer`.
    pub fn new(token: impl Into<String>) -> BearerToken {
        BearerToken { tokens: vec![("bearer".to_owned(), token.into())] }
    }

    /// Accepts each principal's token, as that principal.
    pub fn with_principals(tokens: impl IntoIterator<Item = (String, String)>) -> Result<BearerToken, TokensError> {
        let tokens: Vec<(String, String)> = tokens.into_iter().collect();
        if tokens.is_empty() {
            return Err(TokensError::Empty);
        }
        for (i, (principal, token)) in tokens.iter().enumerate() {
            if principal.is_empty() || token.is_empty() {
                return Err(TokensError::Blank);
            }
            for (other, other_token) in &tokens[..i] {
                if other == principal {
                    return Err(TokensError::DuplicatePrincipal(principal.clone()));
                }
                if other_token == token {
                    return Err(TokensError::SharedToken);
                }
            }
        }
        Ok(BearerToken { tokens })
    }
}

impl BearerToken {
    /// The principal whose token `authorization` carries.
    fn principal(&self, authorization: Option<&str>) -> Result<Identity, Unauthenticated> {
        let token = bearer(authorization.ok_or(Unauthenticated::Missing)?)
            .ok_or_else(|| Unauthenticated::Invalid("not a bearer token".into()))?;
        // Every token is compared, so the time taken says nothing of which one matched.
        let found = self.tokens.iter().fold(None, |found, (principal, expected)| {
            let matches = equal_in_constant_time(token.as_bytes(), expected.as_bytes());
            found.or_else(|| matches.then(|| principal.clone()))
        });
        let principal = found.ok_or_else(|| Unauthenticated::Invalid("unknown bearer token".into()))?;
        Ok(Identity { principal, grant: Grant::Everything })
    }
}

impl Authenticator for BearerToken {
    fn authenticate<'a>(&'a self, authorization: Option<&'a str>) -> Authentication<'a> {
        Box::pin(std::future::ready(self.principal(authorization)))
    }
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

    fn name(tokens: &BearerToken, authorization: Option<&str>) -> Option<String> {
        tokens.principal(authorization).ok().map(|identity| identity.principal)
    }

    #[test]
    fn tokens_are_equal_only_when_every_byte_and_the_length_are() {
        assert!(equal_in_constant_time(b"s3cret", b"s3cret"));
        assert!(!equal_in_constant_time(b"s3creT", b"s3cret"));
        assert!(!equal_in_constant_time(b"s3cret", b"s3cret\0"), "a longer token with a NUL tail");
        assert!(!equal_in_constant_time(b"", b"s3cret"));
        let token = BearerToken::new("s3cret");
        assert_eq!(name(&token, Some("bearer s3cret")), Some("bearer".to_owned()));
        assert_eq!(name(&token, Some("Bearer wrong")), None);
        assert_eq!(token.principal(None), Err(Unauthenticated::Missing));
    }

    #[test]
    fn each_token_names_its_principal_and_a_set_is_checked() {
        let pair = |p: &str, t: &str| (p.to_owned(), t.to_owned());
        let tokens = BearerToken::with_principals([pair("alice", "a1"), pair("bob", "b2")]).expect("valid");
        assert_eq!(name(&tokens, Some("Bearer a1")), Some("alice".to_owned()));
        assert_eq!(name(&tokens, Some("Bearer b2")), Some("bob".to_owned()));
        assert_eq!(name(&tokens, Some("Bearer c3")), None);
        assert_eq!(BearerToken::with_principals([]).err(), Some(TokensError::Empty));
        assert_eq!(BearerToken::with_principals([pair("", "x")]).err(), Some(TokensError::Blank));
        let twice = BearerToken::with_principals([pair("a", "x"), pair("a", "y")]);
        assert_eq!(twice.err(), Some(TokensError::DuplicatePrincipal("a".into())));
        let shared = BearerToken::with_principals([pair("a", "x"), pair("b", "x")]);
        assert_eq!(shared.err(), Some(TokensError::SharedToken));
    }
}
