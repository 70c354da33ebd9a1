//! The server as an OAuth 2.1 protected resource: the metadata a client discovers it by
//! (RFC 9728), and the scopes each tool requires.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// Where RFC 9728 puts a resource's metadata, before the resource's own path.
const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

/// The resource this server is: its identifier (the audience its tokens must name), the
/// authorization servers that issue them, and the scopes each tool requires.
#[derive(Debug, Clone)]
pub struct ProtectedResource {
    resource: String,
    authorization_servers: Vec<String>,
    tool_scopes: BTreeMap<String, Vec<String>>,
    metadata_path: String,
    metadata_url: String,
}

/// Why a resource identifier cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// RFC 8707 §2: an absolute `https` (or, for loopback and tests, `http`) URI without a
    /// fragment.
    #[error("the resource {0:?} is not an absolute http(s) URI without a query or fragment")]
    NotAnAbsoluteUri(String),
}

impl ProtectedResource {
    /// The resource `resource` (the URL clients reach the MCP endpoint at, and the audience of
    /// its tokens), whose tokens `authorization_server` issues.
    pub fn new(resource: &str, authorization_server: impl Into<String>) -> Result<ProtectedResource, ResourceError> {
        let invalid = || ResourceError::NotAnAbsoluteUri(resource.to_owned());
        let rest =
            resource.strip_prefix("https://").or_else(|| resource.strip_prefix("http://")).ok_or_else(invalid)?;
        if resource.contains(['#', '?']) || resource.bytes().any(|b| b.is_ascii_whitespace() || b == b'"') {
            return Err(invalid());
        }
        let (authority, path) = rest.find('/').map_or((rest, ""), |slash| rest.split_at(slash));
        if authority.is_empty() {
            return Err(invalid());
        }
        let origin = &resource[..resource.len() - rest.len() + authority.len()];
        let metadata_path = format!("{WELL_KNOWN}{}", path.trim_end_matches('/'));
        Ok(ProtectedResource {
            resource: resource.to_owned(),
            authorization_servers: vec![authorization_server.into()],
            tool_scopes: BTreeMap::new(),
            metadata_url: format!("{origin}{metadata_path}"),
            metadata_path,
        })
    }

    /// Requires every scope of `scopes` to call `tool`.
    pub fn require_scopes(mut self, tool: impl Into<String>, scopes: impl IntoIterator<Item = String>) -> Self {
        self.tool_scopes.entry(tool.into()).or_default().extend(scopes);
        self
    }

    /// The resource identifier: tokens must name it as their audience.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The scopes a call of `tool` requires.
    pub fn scopes_for(&self, tool: &str) -> &[String] {
        self.tool_scopes.get(tool).map_or(&[], Vec::as_slice)
    }

    /// The path the metadata is served at, on the resource's own origin.
    pub fn metadata_path(&self) -> &str {
        &self.metadata_path
    }

    /// The metadata's URL, as a 401's `WWW-Authenticate` names it.
    pub fn metadata_url(&self) -> &str {
        &self.metadata_url
    }

    /// The metadata document (RFC 9728 §2).
    pub fn document(&self) -> Value {
        let mut scopes: Vec<&String> = self.tool_scopes.values().flatten().collect();
        scopes.sort();
        scopes.dedup();
        let mut document = json!({
            "resource": self.resource,
            "authorization_servers": self.authorization_servers,
            "bearer_methods_supported": ["header"],
        });
        if !scopes.is_empty() {
            document["scopes_supported"] = json!(scopes);
        }
        document
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metadata_sits_between_the_origin_and_the_resource_path() {
        let cases = [
            ("https://mcp.example.com/mcp", "/.well-known/oauth-protected-resource/mcp"),
            ("https://mcp.example.com", "/.well-known/oauth-protected-resource"),
            ("https://mcp.example.com/", "/.well-known/oauth-protected-resource"),
            ("http://127.0.0.1:8808/a/mcp", "/.well-known/oauth-protected-resource/a/mcp"),
        ];
        for (resource, path) in cases {
            let metadata = ProtectedResource::new(resource, "https://as.example.com").expect(resource);
            assert_eq!(metadata.metadata_path(), path, "{resource}");
            let origin = resource.splitn(4, '/').take(3).collect::<Vec<_>>().join("/");
            assert_eq!(metadata.metadata_url(), format!("{origin}{path}"), "{resource}");
        }
        for bad in ["mcp.example.com/mcp", "https:///mcp", "https://a/mcp#x", "https://a/mcp?x=1", "ftp://a/"] {
            assert!(ProtectedResource::new(bad, "https://as").is_err(), "{bad}");
        }
    }

    #[test]
    fn the_document_names_the_resource_its_issuer_and_every_scope_a_tool_requires() {
        let metadata = ProtectedResource::new("https://mcp.example.com/mcp", "https://as.example.com")
            .expect("valid")
            .require_scopes("write", ["files:write".to_owned(), "files:read".to_owned()])
            .require_scopes("read", ["files:read".to_owned()]);
        assert_eq!(
            metadata.document(),
            json!({
                "resource": "https://mcp.example.com/mcp",
                "authorization_servers": ["https://as.example.com"],
                "bearer_methods_supported": ["header"],
                "scopes_supported": ["files:read", "files:write"],
            })
        );
        assert_eq!(metadata.scopes_for("read"), ["files:read"]);
        assert!(metadata.scopes_for("echo").is_empty());
    }
}
