//! The `WWW-Authenticate` challenge of a 401 or 403 (RFC 6750 §3, RFC 9728 §5.1): what the
//! protected resource says a request lacks.

use reqwest::header::{HeaderMap, WWW_AUTHENTICATE};

/// Why the resource refused the request's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 401: no token, or one it does not accept (expired, revoked, of another server).
    Unauthenticated,
    /// 403 `insufficient_scope`: the token is good but lacks scopes.
    InsufficientScope,
}

/// A refusal and what its challenge names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// What was refused.
    pub refusal: Refusal,
    /// `resource_metadata`: where the resource's metadata (RFC 9728) is.
    pub resource_metadata: Option<String>,
    /// `scope`: the scopes the request needs, space-separated.
    pub scope: Option<String>,
    /// `error`, as given (`invalid_token`, `insufficient_scope`, `use_dpop_nonce`).
    pub error: Option<String>,
    /// The nonce the resource asks DPoP proofs to carry (the `DPoP-Nonce` header).
    pub dpop_nonce: Option<String>,
}

impl Challenge {
    /// The challenge of a response: a 401, or a 403 whose challenge says `insufficient_scope`.
    /// Other responses carry none.
    pub fn of(status: u16, headers: &HeaderMap) -> Option<Challenge> {
        let params = headers
            .get_all(WWW_AUTHENTICATE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .find_map(bearer_params)
            .unwrap_or_default();
        let param = |name: &str| params.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone());
        let error = param("error");
        let refusal = match status {
            401 => Refusal::Unauthenticated,
            403 if error.as_deref() == Some("insufficient_scope") => Refusal::InsufficientScope,
            _ => return None,
        };
        let dpop_nonce = headers.get("dpop-nonce").and_then(|value| value.to_str().ok()).map(str::to_owned);
        Some(Challenge {
            refusal,
            resource_metadata: param("resource_metadata"),
            scope: param("scope"),
            error,
            dpop_nonce,
        })
    }

    /// The scopes the challenge names.
    pub fn scopes(&self) -> impl Iterator<Item = &str> {
        self.scope.as_deref().unwrap_or("").split_ascii_whitespace()
    }
}

/// The parameters of a `Bearer` (or `DPoP`) challenge in one header value.
fn bearer_params(value: &str) -> Option<Vec<(String, String)>> {
    let value = value.trim_start();
    let (scheme, rest) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") && !scheme.eq_ignore_ascii_case("dpop") {
        return None;
    }
    Some(auth_params(rest))
}

/// `name=value` or `name="quoted value"` pairs separated by commas (RFC 9110 §11.2).
fn auth_params(mut rest: &str) -> Vec<(String, String)> {
    let mut params = Vec::new();
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        let Some(eq) = rest.find('=') else { return params };
        let name = rest[..eq].trim().to_owned();
        rest = rest[eq + 1..].trim_start();
        let value = if let Some(quoted) = rest.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, escaped)) = chars.next() {
                            value.push(escaped);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => value.push(c),
                }
            }
            rest = &quoted[end..];
            value
        } else {
            let end = rest.find(',').unwrap_or(rest.len());
            let value = rest[..end].trim().to_owned();
            rest = &rest[end..];
            value
        };
        params.push((name, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn challenge(status: u16, value: &str) -> Option<Challenge> {
        let mut headers = HeaderMap::new();
        headers.insert(WWW_AUTHENTICATE, value.parse().expect("a header value"));
        Challenge::of(status, &headers)
    }

    #[test]
    fn a_bearer_challenge_gives_its_parameters_quoted_or_not_in_any_order() {
        let c = challenge(
            401,
            r#"Bearer error="invalid_token", error_description="a \"quoted\", word", scope="a b",resource_metadata=https://r.example/.well-known/oauth-protected-resource/mcp"#,
        )
        .expect("a challenge");
        assert_eq!(c.refusal, Refusal::Unauthenticated);
        assert_eq!(c.error.as_deref(), Some("invalid_token"));
        assert_eq!(c.scopes().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(c.resource_metadata.as_deref(), Some("https://r.example/.well-known/oauth-protected-resource/mcp"));
    }

    #[test]
    fn only_a_401_or_a_403_for_scope_is_a_challenge() {
        assert_eq!(
            challenge(403, r#"Bearer error="insufficient_scope", scope="w""#).expect("a challenge").refusal,
            Refusal::InsufficientScope
        );
        assert!(challenge(403, r#"Bearer error="invalid_request""#).is_none());
        assert!(challenge(404, r#"Bearer error="invalid_token""#).is_none());
        let bare = Challenge::of(401, &HeaderMap::new()).expect("a challenge");
        assert_eq!((bare.resource_metadata, bare.scope), (None, None));
        assert!(challenge(401, r#"Basic realm="x", scope="s""#).expect("a challenge").scope.is_none());
    }
}
