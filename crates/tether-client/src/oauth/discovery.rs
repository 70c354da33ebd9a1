//! Finding who authorizes a resource: its protected resource metadata (RFC 9728), then its
//! authorization server's metadata (RFC 8414), as MCP's authorization specification orders the
//! look-ups. Identifiers are kept as the strings received and compared as strings.

use serde::Deserialize;

use super::AuthError;
use super::challenge::Challenge;
use super::fetch::{FetchError, MAX_METADATA_BYTES, get_bounded, metadata_urls, split_origin};

/// The protected resource's metadata, as much as the client uses.
#[derive(Debug, Clone, Deserialize)]
pub struct ResourceMetadata {
    /// The resource's identifier: sent as `resource` (RFC 8707) exactly as given here.
    pub resource: String,
    /// The authorization servers that issue its tokens; the first is used.
    #[serde(default)]
    pub authorization_servers: Vec<String>,
    /// The scopes it knows of.
    #[serde(default)]
    pub scopes_supported: Vec<String>,
}

/// An authorization server's metadata, as much as the client uses.
#[derive(Debug, Clone, Deserialize)]
pub struct ServerMetadata {
    /// Its issuer identifier.
    pub issuer: String,
    /// Where a person authorizes the client.
    #[serde(default)]
    pub authorization_endpoint: Option<String>,
    /// Where codes, refresh tokens and client credentials become access tokens.
    pub token_endpoint: String,
    /// Where clients register (RFC 7591).
    #[serde(default)]
    pub registration_endpoint: Option<String>,
    /// The scopes it issues.
    #[serde(default)]
    pub scopes_supported: Option<Vec<String>>,
    /// The PKCE methods it accepts.
    #[serde(default)]
    pub code_challenge_methods_supported: Option<Vec<String>>,
    /// How clients may authenticate at the token endpoint.
    #[serde(default)]
    pub token_endpoint_auth_methods_supported: Option<Vec<String>>,
    /// Whether a client may name itself by the URL of its metadata document.
    #[serde(default)]
    pub client_id_metadata_document_supported: bool,
    /// Whether every authorization response names the issuer (RFC 9207).
    #[serde(default)]
    pub authorization_response_iss_parameter_supported: bool,
    /// The algorithms it takes DPoP proofs in (RFC 9449 §5.1): where ES256 is one, tokens are
    /// bound to the client's key.
    #[serde(default)]
    pub dpop_signing_alg_values_supported: Option<Vec<String>>,
}

impl ServerMetadata {
    /// Whether it lists `method` for the token endpoint, or lists none (then `client_secret_basic`
    /// is its default, RFC 8414 §2, and the others are tried as offered).
    pub fn accepts_auth_method(&self, method: &str) -> bool {
        self.token_endpoint_auth_methods_supported.as_ref().is_none_or(|methods| methods.iter().any(|m| m == method))
    }
}

/// Who authorizes a resource, found.
#[derive(Debug, Clone)]
pub struct Discovered {
    /// The resource's metadata; none for a 2025-03-26 server, which has none (then no
    /// `resource` is sent).
    pub resource: Option<ResourceMetadata>,
    /// The authorization server's identifier: the first of the resource's, or the MCP server's
    /// origin for a 2025-03-26 server.
    pub authorization_server: String,
    /// Its metadata.
    pub server: ServerMetadata,
}

/// Finds who authorizes `endpoint`, which answered `challenge`.
pub async fn discover(http: &reqwest::Client, endpoint: &str, challenge: &Challenge) -> Result<Discovered, AuthError> {
    let (origin, path) = split_origin(endpoint);
    let path = path.split(['?', '#']).next().unwrap_or("").trim_end_matches('/');
    let mut candidates: Vec<String> = challenge.resource_metadata.iter().cloned().collect();
    if !path.is_empty() {
        candidates.push(format!("{origin}/.well-known/oauth-protected-resource{path}"));
    }
    candidates.push(format!("{origin}/.well-known/oauth-protected-resource"));
    let Some(resource) = first_document::<ResourceMetadata>(http, &candidates).await? else {
        return legacy(http, origin).await;
    };
    if !resource_covers(&resource.resource, endpoint) {
        return Err(AuthError::ResourceMismatch { resource: resource.resource, endpoint: endpoint.to_owned() });
    }
    let authorization_server = resource.authorization_servers.first().cloned().ok_or_else(|| {
        AuthError::Discovery(format!("the metadata of {} names no authorization server", resource.resource))
    })?;
    let server = first_document::<ServerMetadata>(http, &metadata_urls(&authorization_server))
        .await?
        .ok_or_else(|| AuthError::Discovery(format!("no metadata of authorization server {authorization_server}")))?;
    if server.issuer != authorization_server {
        return Err(AuthError::IssuerMismatch { expected: authorization_server, named: server.issuer });
    }
    Ok(Discovered { resource: Some(resource), authorization_server, server })
}

/// A 2025-03-26 server: no resource metadata; its origin is the authorization server, with its
/// metadata at the root well-known URL, else the default endpoints. The issuer the metadata names
/// is not checked: that revision did not tie it to the origin, and servers of it differ.
async fn legacy(http: &reqwest::Client, origin: &str) -> Result<Discovered, AuthError> {
    let urls = [format!("{origin}/.well-known/oauth-authorization-server")];
    let server = first_document::<ServerMetadata>(http, &urls).await?.unwrap_or_else(|| ServerMetadata {
        issuer: origin.to_owned(),
        authorization_endpoint: Some(format!("{origin}/authorize")),
        token_endpoint: format!("{origin}/token"),
        registration_endpoint: Some(format!("{origin}/register")),
        scopes_supported: None,
        code_challenge_methods_supported: None,
        token_endpoint_auth_methods_supported: None,
        client_id_metadata_document_supported: false,
        authorization_response_iss_parameter_supported: false,
        dpop_signing_alg_values_supported: None,
    });
    Ok(Discovered { resource: None, authorization_server: origin.to_owned(), server })
}

/// The first of `urls` that answers with the document; `None` if each is refused with a 4xx.
async fn first_document<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    urls: &[String],
) -> Result<Option<T>, AuthError> {
    for url in urls {
        match get_bounded(http, url, MAX_METADATA_BYTES).await {
            Ok(body) => {
                return serde_json::from_slice(&body)
                    .map(Some)
                    .map_err(|err| AuthError::Discovery(format!("{url}: not the metadata expected: {err}")));
            }
            Err(FetchError::Status { status: 400..=499, .. }) => continue,
            Err(err) => return Err(AuthError::Discovery(err.to_string())),
        }
    }
    Ok(None)
}

/// Whether a token for `resource` may be sent to `endpoint`: the same origin, and a path that is
/// the endpoint's or one of its parents (RFC 9728 §3.3 asks that the identifier be the resource's;
/// a server's metadata may name its origin).
pub fn resource_covers(resource: &str, endpoint: &str) -> bool {
    let (Ok(resource), Ok(endpoint)) = (reqwest::Url::parse(resource), reqwest::Url::parse(endpoint)) else {
        return false;
    };
    if resource.origin() != endpoint.origin() || resource.fragment().is_some() {
        return false;
    }
    let parent = resource.path().trim_end_matches('/');
    let path = endpoint.path();
    path.strip_prefix(parent).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resource_covers_its_own_path_and_those_below_it_on_its_origin_only() {
        let endpoint = "http://localhost:8080/mcp";
        assert!(resource_covers("http://localhost:8080", endpoint));
        assert!(resource_covers("http://localhost:8080/", endpoint));
        assert!(resource_covers("http://localhost:8080/mcp", endpoint));
        assert!(!resource_covers("http://localhost:8080/mc", endpoint));
        assert!(!resource_covers("http://localhost:8080/mcp/x", endpoint));
        assert!(!resource_covers("https://evil.example.com/mcp", endpoint));
        assert!(!resource_covers("http://localhost:8081/mcp", endpoint));
        assert!(!resource_covers("http://localhost:8080/mcp#f", endpoint));
    }
}
