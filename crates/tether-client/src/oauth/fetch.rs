//! OAuth documents fetched over HTTP(S), each bounded in size: an authorization server's
//! metadata (RFC 8414, with the OpenID Connect discovery paths as fallbacks) and the JWK Set it
//! names. `tether serve --auth jwt` verifies tokens with the keys fetched here.

use crate::http::{BodyError, read_bounded};
use serde::Deserialize;

/// The largest metadata document read.
pub(crate) const MAX_METADATA_BYTES: usize = 64 * 1024;

/// Why a document could not be had.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The request failed (connection, TLS, timeout).
    #[error("GET {url}: {reason}")]
    Failed {
        /// What was fetched.
        url: String,
        /// Why.
        reason: String,
    },
    /// The server answered other than 200.
    #[error("GET {url} answered {status}")]
    Status {
        /// What was fetched.
        url: String,
        /// Its status.
        status: u16,
    },
    /// The document is larger than allowed.
    #[error("GET {url}: larger than {limit} bytes")]
    TooLarge {
        /// What was fetched.
        url: String,
        /// The bound.
        limit: usize,
    },
    /// No metadata at any well-known URL of the issuer, or metadata that is not the issuer's.
    #[error("no metadata of issuer {issuer}: {reason}")]
    NoMetadata {
        /// The issuer.
        issuer: String,
        /// What the last URL tried answered.
        reason: String,
    },
}

/// The body of `url`, of at most `limit` bytes, if it answers 200.
pub async fn get_bounded(http: &reqwest::Client, url: &str, limit: usize) -> Result<Vec<u8>, FetchError> {
    let failed = |err: reqwest::Error| FetchError::Failed { url: url.to_owned(), reason: crate::tls::describe(&err) };
    let mut response =
        http.get(url).header(reqwest::header::ACCEPT, "application/json").send().await.map_err(failed)?;
    if response.status() != reqwest::StatusCode::OK {
        return Err(FetchError::Status { url: url.to_owned(), status: response.status().as_u16() });
    }
    read_bounded(&mut response, limit).await.map_err(|err| match err {
        BodyError::TooLarge => FetchError::TooLarge { url: url.to_owned(), limit },
        BodyError::Failed(err) => failed(err),
    })
}

/// The URLs an issuer's metadata may be at, in the order MCP's authorization specification
/// tries them: RFC 8414's (the well-known path inserted before the issuer's path), then OpenID
/// Connect discovery's inserted, then appended to the issuer. The issuer's root is never tried
/// for an issuer with a path: that would be another issuer's metadata.
pub fn metadata_urls(issuer: &str) -> Vec<String> {
    let issuer = issuer.trim_end_matches('/');
    let (origin, path) = split_origin(issuer);
    let mut urls = vec![format!("{origin}/.well-known/oauth-authorization-server{path}")];
    if !path.is_empty() {
        urls.push(format!("{origin}/.well-known/openid-configuration{path}"));
    }
    urls.push(format!("{issuer}/.well-known/openid-configuration"));
    urls
}

/// A URL's origin (`scheme://authority`) and the rest, split as strings: what is sent is what
/// was given, never a parser's rendering of it (which adds a `/` to a bare origin).
pub(crate) fn split_origin(url: &str) -> (&str, &str) {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let end = url[scheme_end..].find(['/', '?', '#']).map_or(url.len(), |i| scheme_end + i);
    url.split_at(end)
}

/// Fetches an issuer's JWK Set: from the URL given, or from the `jwks_uri` of its metadata,
/// found once.
#[derive(Debug)]
pub struct KeySetFetcher {
    http: reqwest::Client,
    issuer: String,
    jwks_uri: tokio::sync::OnceCell<String>,
}

impl KeySetFetcher {
    /// The key set of `issuer`, at `jwks_uri` if given, else where its metadata says; fetched
    /// with `http` (which should time out within seconds).
    pub fn new(http: reqwest::Client, issuer: impl Into<String>, jwks_uri: Option<String>) -> KeySetFetcher {
        KeySetFetcher { http, issuer: issuer.into(), jwks_uri: tokio::sync::OnceCell::new_with(jwks_uri) }
    }

    /// The current key set document, of at most `limit` bytes.
    pub async fn fetch(&self, limit: usize) -> Result<Vec<u8>, FetchError> {
        let uri = self.jwks_uri.get_or_try_init(|| self.discover()).await?;
        get_bounded(&self.http, uri, limit).await
    }

    /// The `jwks_uri` of the issuer's metadata, at the first well-known URL that has it. The
    /// metadata must name the issuer exactly as configured (RFC 8414 §3.3).
    async fn discover(&self) -> Result<String, FetchError> {
        #[derive(Deserialize)]
        struct Metadata {
            issuer: String,
            jwks_uri: Option<String>,
        }
        let mut reason = String::from("no well-known URL");
        for url in metadata_urls(&self.issuer) {
            let metadata = match get_bounded(&self.http, &url, MAX_METADATA_BYTES).await {
                Ok(body) => serde_json::from_slice::<Metadata>(&body),
                Err(err) => {
                    reason = err.to_string();
                    continue;
                }
            };
            let no_metadata = |reason: String| FetchError::NoMetadata { issuer: self.issuer.clone(), reason };
            let metadata = metadata.map_err(|err| no_metadata(format!("{url}: {err}")))?;
            if metadata.issuer != self.issuer {
                return Err(no_metadata(format!("{url} names issuer {:?}", metadata.issuer)));
            }
            return metadata.jwks_uri.ok_or_else(|| no_metadata(format!("{url} names no jwks_uri")));
        }
        Err(FetchError::NoMetadata { issuer: self.issuer.clone(), reason })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_looked_for_where_rfc_8414_then_openid_connect_put_it_never_at_a_tenants_root() {
        assert_eq!(
            metadata_urls("https://as.example.com"),
            [
                "https://as.example.com/.well-known/oauth-authorization-server",
                "https://as.example.com/.well-known/openid-configuration",
            ]
        );
        assert_eq!(
            metadata_urls("https://as.example.com/tenant/1"),
            [
                "https://as.example.com/.well-known/oauth-authorization-server/tenant/1",
                "https://as.example.com/.well-known/openid-configuration/tenant/1",
                "https://as.example.com/tenant/1/.well-known/openid-configuration",
            ]
        );
    }
}
