//! Where tokens outlive the process: one JSON file the user owns (mode 0600), with one entry
//! per MCP endpoint, written whole to a temporary file and renamed over the old.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::AuthError;

/// How a client authenticates at the token endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum AuthMethod {
    /// A public client: its id in the body, no secret.
    #[serde(rename = "none")]
    None,
    /// The id and secret with HTTP Basic authentication.
    #[serde(rename = "client_secret_basic")]
    Basic,
    /// The id and secret in the body.
    #[serde(rename = "client_secret_post")]
    Post,
}

impl AuthMethod {
    /// The method RFC 7591 names `name`, if the client has it.
    pub fn named(name: &str) -> Option<AuthMethod> {
        match name {
            "none" => Some(AuthMethod::None),
            "client_secret_basic" => Some(AuthMethod::Basic),
            "client_secret_post" => Some(AuthMethod::Post),
            _ => None,
        }
    }

    /// Its RFC 7591 name.
    pub fn name(self) -> &'static str {
        match self {
            AuthMethod::None => "none",
            AuthMethod::Basic => "client_secret_basic",
            AuthMethod::Post => "client_secret_post",
        }
    }
}

/// The client as one authorization server knows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Registration {
    /// The authorization server it is registered with.
    pub authorization_server: String,
    /// Its id there.
    pub client_id: String,
    /// Its secret, for a confidential client.
    pub client_secret: Option<String>,
    /// How it authenticates at the token endpoint.
    pub auth_method: AuthMethod,
}

/// Tokens an authorization server issued for one resource.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct Grant {
    /// The access token.
    pub access_token: String,
    /// The refresh token, if one was issued.
    pub refresh_token: Option<String>,
    /// When the access token expires, in seconds since the Unix epoch, if said.
    pub expires_at: Option<u64>,
    /// Where it is refreshed.
    pub token_endpoint: String,
    /// The resource it is for (`resource` when refreshing); none for a 2025-03-26 server.
    pub resource: Option<String>,
    /// The scopes asked for.
    pub scopes: Vec<String>,
    /// Whether the token is bound to the client's DPoP key (then it is never written to the
    /// file: the key does not outlive the process).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dpop: bool,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("expires_at", &self.expires_at)
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}

/// One endpoint's entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Saved {
    /// The registration the tokens were issued to.
    pub registration: Registration,
    /// The tokens.
    pub grant: Grant,
}

/// The largest token file read.
const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Every entry of the file; none if it does not exist.
fn read_all(path: &Path) -> Result<BTreeMap<String, Saved>, AuthError> {
    let failed = |err: &dyn std::fmt::Display| AuthError::TokenFile(format!("{}: {err}", path.display()));
    match std::fs::metadata(path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(err) => return Err(failed(&err)),
        Ok(meta) if meta.len() > MAX_FILE_BYTES => return Err(failed(&"larger than 1 MiB")),
        Ok(_) => {}
    }
    let text = std::fs::read(path).map_err(|err| failed(&err))?;
    serde_json::from_slice(&text).map_err(|err| failed(&err))
}

/// The entry of `endpoint`.
pub(crate) fn load(path: &Path, endpoint: &str) -> Result<Option<Saved>, AuthError> {
    Ok(read_all(path)?.remove(endpoint))
}

/// Replaces the entry of `endpoint`, keeping the others.
pub(crate) fn store(path: &Path, endpoint: &str, saved: &Saved) -> Result<(), AuthError> {
    let failed = |err: &dyn std::fmt::Display| AuthError::TokenFile(format!("{}: {err}", path.display()));
    let mut all = read_all(path)?;
    all.insert(endpoint.to_owned(), saved.clone());
    let text = serde_json::to_vec_pretty(&all).map_err(|err| failed(&err))?;
    if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(parent).map_err(|err| failed(&err))?;
    }
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = std::path::PathBuf::from(temporary);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&temporary).map_err(|err| failed(&err))?;
    std::io::Write::write_all(&mut file, &text).map_err(|err| failed(&err))?;
    file.sync_all().map_err(|err| failed(&err))?;
    std::fs::rename(&temporary, path).map_err(|err| failed(&err))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(token: &str) -> Saved {
        Saved {
            registration: Registration {
                authorization_server: "https://as.example".into(),
                client_id: "c".into(),
                client_secret: None,
                auth_method: AuthMethod::None,
            },
            grant: Grant {
                access_token: token.into(),
                refresh_token: Some("r".into()),
                expires_at: Some(1),
                token_endpoint: "https://as.example/token".into(),
                resource: Some("https://mcp.example/mcp".into()),
                scopes: vec![],
                dpop: false,
            },
        }
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("tether-tokens-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn entries_of_other_endpoints_are_kept_and_the_file_and_its_directory_are_the_users_alone() {
        let dir = scratch("kept");
        let path = dir.join("config").join("tokens.json");
        store(&path, "https://a.example/mcp", &saved("a")).expect("stored");
        store(&path, "https://b.example/mcp", &saved("b")).expect("stored");
        store(&path, "https://a.example/mcp", &saved("a2")).expect("stored");
        assert_eq!(load(&path, "https://a.example/mcp").expect("readable").expect("an entry").grant.access_token, "a2");
        assert_eq!(load(&path, "https://b.example/mcp").expect("readable").expect("an entry").grant.access_token, "b");
        assert!(load(&path, "https://c.example/mcp").expect("readable").is_none());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| std::fs::metadata(p).expect("there").permissions().mode() & 0o777;
            assert_eq!(mode(&path), 0o600);
            assert_eq!(mode(&dir.join("config")), 0o700);
        }
        std::fs::remove_dir_all(&dir).expect("removed");
    }

    #[test]
    fn a_missing_file_holds_nothing_an_unreadable_or_oversized_one_is_an_error() {
        let dir = scratch("bounds");
        std::fs::create_dir_all(&dir).expect("a directory");
        assert!(load(&dir.join("none.json"), "e").expect("no file, no entry").is_none());
        let not_a_directory = dir.join("file");
        std::fs::write(&not_a_directory, b"x").expect("written");
        assert!(load(&not_a_directory.join("tokens.json"), "e").is_err(), "a path that cannot be a file");
        let path = dir.join("tokens.json");
        let large = "t".repeat(100 * 1024);
        store(&path, "e", &saved(&large)).expect("stored");
        assert_eq!(load(&path, "e").expect("under the bound").expect("an entry").grant.access_token, large);
        let mut at_the_bound = serde_json::to_vec(&BTreeMap::from([("e", saved("t"))])).expect("json");
        at_the_bound.resize(MAX_FILE_BYTES as usize, b' ');
        std::fs::write(&path, &at_the_bound).expect("written");
        assert!(load(&path, "e").expect("at the bound").is_some());
        at_the_bound.push(b' ');
        std::fs::write(&path, &at_the_bound).expect("written");
        assert!(matches!(load(&path, "e"), Err(AuthError::TokenFile(why)) if why.contains("1 MiB")));
        std::fs::remove_dir_all(&dir).expect("removed");
    }

    #[test]
    fn methods_are_named_as_rfc_7591_names_them_and_a_grant_shows_no_token() {
        for method in [AuthMethod::None, AuthMethod::Basic, AuthMethod::Post] {
            assert_eq!(AuthMethod::named(method.name()), Some(method));
        }
        assert_eq!(AuthMethod::named("private_key_jwt"), None);
        let shown = format!("{:?}", saved("secret-token").grant);
        assert!(shown.starts_with("Grant") && !shown.contains("secret-token") && !shown.contains("\"r\""), "{shown}");
    }
}
