//! The client commands' OAuth flags (`tether call|watch|task|connect --oauth`).

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use tether_client::oauth::{ClientIdentity, LoopbackRedirect, MachineCredential, OAuthConfig, SigningAlgorithm};

/// How long a person has to approve in the browser.
const BROWSER_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// MCP authorization for a client command.
#[derive(Debug, Args)]
pub struct OAuthArgs {
    /// Authorize with OAuth when the server asks for it: the authorization URL is printed on
    /// standard error for a person to open, and the browser comes back to a listener on a
    /// loopback port. Tokens are kept (and refreshed) in the token file.
    #[arg(long)]
    oauth: bool,
    /// Where tokens are kept across runs, one entry per MCP endpoint, in a file only its owner
    /// may read [default: $XDG_CONFIG_HOME/tether/tokens.json, else ~/.config/tether/tokens.json].
    #[arg(long, value_name = "FILE", requires = "oauth")]
    oauth_token_file: Option<PathBuf>,
    /// A client id registered beforehand with the authorization server (without one, tether
    /// registers itself dynamically, or names itself by --oauth-client-metadata).
    #[arg(long, value_name = "ID", requires = "oauth")]
    oauth_client_id: Option<String>,
    /// The secret of --oauth-client-id.
    #[arg(
        long,
        value_name = "SECRET",
        env = "TETHER_OAUTH_CLIENT_SECRET",
        hide_env_values = true,
        requires = "oauth_client_id"
    )]
    oauth_client_secret: Option<String>,
    /// The URL of tether's client-id metadata document, used as its client id where the
    /// authorization server supports them.
    #[arg(long, value_name = "URL", requires = "oauth")]
    oauth_client_metadata: Option<String>,
    /// Authorize as a machine, with no person: the client credentials grant, proven by
    /// --oauth-client-secret or by assertions signed with --oauth-client-key.
    #[arg(long, requires = "oauth_client_id")]
    oauth_client_credentials: bool,
    /// A PKCS#8 PEM EC private key (P-256) that signs the client's assertions (private_key_jwt),
    /// with --oauth-client-credentials.
    #[arg(long, value_name = "FILE", requires = "oauth_client_credentials")]
    oauth_client_key: Option<PathBuf>,
}

impl OAuthArgs {
    /// The client's OAuth settings, if `--oauth`; binds the loopback redirect listener, so call
    /// it within the runtime.
    pub fn config(&self) -> Result<Option<OAuthConfig>, String> {
        if !self.oauth {
            return Ok(None);
        }
        let agent = LoopbackRedirect::bind(BROWSER_WAIT).map_err(|err| err.to_string())?;
        let mut config = OAuthConfig::new(Arc::new(agent));
        config.token_file = Some(match &self.oauth_token_file {
            Some(path) => path.clone(),
            None => default_token_file()?,
        });
        config.identity = match (&self.oauth_client_id, self.oauth_client_credentials) {
            (Some(client_id), true) => {
                let credential = match (&self.oauth_client_key, &self.oauth_client_secret) {
                    (Some(path), _) => MachineCredential::PrivateKey {
                        pem: std::fs::read_to_string(path)
                            .map_err(|err| format!("--oauth-client-key {}: {err}", path.display()))?,
                        algorithm: SigningAlgorithm::ES256,
                    },
                    (None, Some(secret)) => MachineCredential::Secret(secret.clone()),
                    (None, None) => {
                        return Err(
                            "--oauth-client-credentials needs --oauth-client-secret or --oauth-client-key".into()
                        );
                    }
                };
                ClientIdentity::Machine { client_id: client_id.clone(), credential }
            }
            (Some(client_id), false) => ClientIdentity::Registered {
                client_id: client_id.clone(),
                client_secret: self.oauth_client_secret.clone(),
                issuer: None,
            },
            (None, _) => ClientIdentity::Dynamic { metadata_document: self.oauth_client_metadata.clone() },
        };
        Ok(Some(config))
    }
}

/// `$XDG_CONFIG_HOME/tether/tokens.json`, else `~/.config/tether/tokens.json`.
fn default_token_file() -> Result<PathBuf, String> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))
        .ok_or("no home directory for the token file: give --oauth-token-file")?;
    Ok(base.join("tether").join("tokens.json"))
}
