//! OAuth 2.1 as MCP's authorization specification has a client use it: a refusal's challenge
//! leads to the resource's metadata and its authorization server's; the client registers
//! (dynamically, by a metadata document, or pre-registered), authorizes with PKCE, and gets a
//! token bound to the resource, which it refreshes; or, between machines, it uses client
//! credentials. The flows are the `oauth2` crate's; the documents are fetched bounded.
//!
//! A request refused for its credentials (401, or 403 `insufficient_scope`) was refused before
//! the server acted on it, so the HTTP layer sends it again once a token is had: no request is
//! lost or repeated for a token that expired mid-stream.

mod agent;
mod authorizer;
mod challenge;
mod discovery;
mod dpop;
mod fetch;
mod token_file;

pub use agent::{FollowRedirect, LoopbackRedirect, Redirected, UserAgent};
pub use authorizer::{Authorizer, Credential};
pub use challenge::{Challenge, Refusal};
pub use discovery::{Discovered, ResourceMetadata, ServerMetadata, discover, resource_covers};
pub use fetch::{FetchError, KeySetFetcher, get_bounded, metadata_urls};
/// The algorithms a client assertion may be signed with.
pub use jsonwebtoken::Algorithm as SigningAlgorithm;

use std::path::PathBuf;
use std::sync::Arc;

/// How the client names itself to an authorization server.
#[derive(Debug, Clone)]
pub enum ClientIdentity {
    /// Registered as the server allows: by the URL of a client-id metadata document when it
    /// supports them and one is given, else dynamically (RFC 7591).
    Dynamic {
        /// The URL of the client's metadata document, its client id where supported.
        metadata_document: Option<String>,
    },
    /// Registered beforehand with one authorization server.
    Registered {
        /// The client id.
        client_id: String,
        /// The secret, for a confidential client.
        client_secret: Option<String>,
        /// The issuer the registration is with: the credentials go to no other.
        issuer: Option<String>,
    },
    /// A machine acting for itself: the client credentials grant, no person involved.
    Machine {
        /// The client id.
        client_id: String,
        /// How it proves it is that client.
        credential: MachineCredential,
    },
    /// A workload whose platform vouches for it (workload identity federation, SEP-1933): a
    /// JWT its identity provider issued, presented with the JWT bearer grant (RFC 7523 §2.1).
    Workload {
        /// The client id, if the authorization server knows the workload by one.
        client_id: Option<String>,
        /// The JWT.
        assertion: String,
    },
    /// A person signed in at their enterprise's identity provider (enterprise-managed
    /// authorization, SEP-990): the provider's ID token is exchanged there for an identity
    /// assertion grant (RFC 8693 token exchange), which the authorization server takes with the
    /// JWT bearer grant.
    Enterprise {
        /// The client's id at the authorization server.
        client_id: String,
        /// Its secret there.
        client_secret: String,
        /// The identity provider's token endpoint.
        idp_token_endpoint: String,
        /// The client's id at the identity provider, if it has one.
        idp_client_id: Option<String>,
        /// The ID token the identity provider issued for the person.
        id_token: String,
    },
}

/// How a machine client proves its identity at the token endpoint.
#[derive(Clone)]
pub enum MachineCredential {
    /// A shared secret, sent with HTTP Basic authentication.
    Secret(String),
    /// A JWT assertion (RFC 7523) signed with this PKCS#8 PEM private key (ES256 or RS256).
    PrivateKey {
        /// The key, PEM.
        pem: String,
        /// The signing algorithm.
        algorithm: SigningAlgorithm,
    },
}

impl std::fmt::Debug for MachineCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MachineCredential::Secret(_) => f.write_str("Secret(..)"),
            MachineCredential::PrivateKey { algorithm, .. } => write!(f, "PrivateKey({algorithm:?})"),
        }
    }
}

/// How the client gets its tokens.
#[derive(Debug, Clone)]
pub struct OAuthConfig {
    /// How it names itself.
    pub identity: ClientIdentity,
    /// `client_name` in a dynamic registration.
    pub client_name: String,
    /// What takes a person (or a program) through authorization.
    pub user_agent: Arc<dyn UserAgent>,
    /// Where tokens are kept across runs (the file is the user's own, mode 0600), per MCP
    /// endpoint; nowhere if `None`.
    pub token_file: Option<PathBuf>,
    /// How many authorizations a client may run in all before it gives up: a resource that
    /// keeps refusing does not get an endless stream of them.
    pub max_authorizations: u32,
}

impl OAuthConfig {
    /// Dynamic registration (or the metadata document, if given), authorizing through `user_agent`.
    pub fn new(user_agent: Arc<dyn UserAgent>) -> OAuthConfig {
        OAuthConfig {
            identity: ClientIdentity::Dynamic { metadata_document: None },
            client_name: "tether".into(),
            user_agent,
            token_file: None,
            max_authorizations: 3,
        }
    }
}

/// Why the client has no token to send.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuthError {
    /// An HTTP exchange with the authorization server failed.
    #[error("authorization server: {0}")]
    Http(String),
    /// The resource's or the authorization server's metadata could not be had.
    #[error("discovery: {0}")]
    Discovery(String),
    /// The resource's metadata names another resource than the one asked: its tokens are not
    /// for this server.
    #[error("the resource metadata names {resource}, which does not cover {endpoint}")]
    ResourceMismatch {
        /// The identifier in the metadata.
        resource: String,
        /// The MCP endpoint.
        endpoint: String,
    },
    /// The authorization server's metadata names another issuer than the one it was found as
    /// (RFC 8414 §3.3), or its authorization response does (RFC 9207).
    #[error("issuer mismatch: expected {expected:?}, named {named:?}")]
    IssuerMismatch {
        /// The issuer expected.
        expected: String,
        /// The one named (empty when none was).
        named: String,
    },
    /// The client cannot register with this authorization server.
    #[error("registration: {0}")]
    Registration(String),
    /// The authorization did not give a code.
    #[error("authorization: {0}")]
    Denied(String),
    /// The token endpoint refused.
    #[error("token endpoint: {0}")]
    Token(String),
    /// The resource asks for scopes already asked for and not granted: asking again cannot help.
    #[error("the resource requires scope {0:?}, which was requested and not granted")]
    ScopeNotGranted(String),
    /// The client ran as many authorizations as it may.
    #[error("gave up after {0} authorizations")]
    TooManyAuthorizations(u32),
    /// The token file could not be read or written.
    #[error("token file: {0}")]
    TokenFile(String),
}
