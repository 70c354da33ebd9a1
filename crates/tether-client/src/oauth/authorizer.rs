//! The client's side of authorization: which token a request carries, and what a refusal's
//! challenge leads to (a refresh, a step-up, a new authorization, or giving up).

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use oauth2::basic::{BasicClient, BasicTokenResponse};
use oauth2::{
    AuthType, AuthUrl, AuthorizationCode, ClientId, ClientSecret, CsrfToken, EndpointNotSet, EndpointSet,
    PkceCodeChallenge, RedirectUrl, RefreshToken, Scope, TokenResponse, TokenUrl,
};
use serde_json::{Value, json};

use super::challenge::{Challenge, Refusal};
use super::discovery::{Discovered, ServerMetadata, discover};
use super::dpop::{self, Dpop};
use super::token_file::{self, AuthMethod, Grant, Registration, Saved};
use super::{AuthError, ClientIdentity, MachineCredential, OAuthConfig};
use crate::http::read_bounded;
use crate::tls::Trust;

/// The largest answer read from an authorization server.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// How long one exchange with an authorization server may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long before its expiry a token is refreshed rather than sent (or a quarter of the time
/// it has left, if that is less).
const RENEW_BEFORE: Duration = Duration::from_secs(10);
/// The JWT bearer grant (RFC 7523 §2.1).
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// The scope that asks for a refresh token (SEP-2207), asked for only where the server has it.
const OFFLINE_ACCESS: &str = "offline_access";

/// The token requests carry now, read without waiting on an authorization in progress.
#[derive(Debug, Clone)]
struct Current {
    credential: Credential,
    renew_at: Option<SystemTime>,
    refreshable: bool,
}

/// An access token, as a request presents it.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    access_token: Arc<str>,
    /// Whether it is bound to the client's DPoP key: presented with the `DPoP` scheme and a
    /// proof, else as a bearer token.
    dpop: bool,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential").field("dpop", &self.dpop).finish_non_exhaustive()
    }
}

/// What the authorizer knows, changed one authorization or refresh at a time.
#[derive(Debug, Default)]
struct State {
    registration: Option<Registration>,
    grant: Option<Grant>,
    /// The scopes asked for so far: a step-up asks for these and the new ones (SEP-2350).
    requested: BTreeSet<String>,
    /// Authorizations since a request was last accepted.
    authorizations: u32,
}

/// Gets and keeps the tokens of one MCP endpoint.
#[derive(Debug)]
pub struct Authorizer {
    config: OAuthConfig,
    endpoint: String,
    http: reqwest::Client,
    current: std::sync::Mutex<Option<Current>>,
    state: tokio::sync::Mutex<State>,
    /// The proof key, made when an authorization server first offers DPoP.
    dpop: std::sync::OnceLock<Dpop>,
}

impl Authorizer {
    /// The authorizer of `endpoint`, with the tokens its file kept (if any); authorization
    /// servers are reached trusting `trust`.
    pub fn new(config: OAuthConfig, endpoint: &str, trust: &Trust) -> Result<Authorizer, AuthError> {
        let http = trust
            .http_client()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(EXCHANGE_TIMEOUT)
            .build()
            .map_err(|err| AuthError::Http(crate::tls::describe(&err)))?;
        let mut state = State::default();
        if let Some(path) = &config.token_file
            && let Some(saved) = token_file::load(path, endpoint)?
        {
            state.requested = saved.grant.scopes.iter().cloned().collect();
            state.registration = Some(saved.registration);
            state.grant = Some(saved.grant);
        }
        let current = state.grant.as_ref().map(current_of);
        Ok(Authorizer {
            config,
            endpoint: endpoint.to_owned(),
            http,
            current: std::sync::Mutex::new(current),
            state: tokio::sync::Mutex::new(state),
            dpop: std::sync::OnceLock::new(),
        })
    }

    /// The access token to send, refreshed first if it is about to expire and can be; `None`
    /// before the first authorization (the server's refusal says where to get one).
    pub fn token(&self) -> Pin<Box<dyn Future<Output = Option<Credential>> + Send + '_>> {
        Box::pin(self.renewed())
    }

    async fn renewed(&self) -> Option<Credential> {
        let current = self.current()?;
        let due = current.renew_at.is_some_and(|at| SystemTime::now() >= at);
        if !(due && current.refreshable) {
            return Some(current.credential);
        }
        let mut state = self.state.lock().await;
        if self.current().is_some_and(|now| now.credential == current.credential)
            && let Err(err) = self.refresh(&mut state).await
        {
            tracing::info!(%err, "refreshing the token ahead of its expiry failed; it is sent as it is");
        }
        self.current().map(|current| current.credential)
    }

    /// Puts `credential` in the headers of a `method` request to `url`: `Authorization`, and
    /// for a DPoP-bound token a fresh proof.
    pub fn present(
        &self,
        credential: &Credential,
        method: &str,
        url: &str,
        headers: &mut reqwest::header::HeaderMap,
    ) -> Result<(), AuthError> {
        let token = &*credential.access_token;
        let scheme = match (credential.dpop, self.dpop.get()) {
            (true, Some(dpop)) => {
                let proof = dpop.proof(method, url, Some(token), Dpop::nonce(&dpop.resource_nonce).as_deref())?;
                headers.insert("dpop", header_value(&proof)?);
                "DPoP"
            }
            _ => "Bearer",
        };
        headers.insert(reqwest::header::AUTHORIZATION, header_value(&format!("{scheme} {token}"))?);
        Ok(())
    }

    /// A request carrying `sent` was accepted: the next refusal may authorize afresh.
    pub fn accepted(&self) {
        if let Ok(mut state) = self.state.try_lock() {
            state.authorizations = 0;
        }
    }

    /// Answers a refusal of a request that carried `sent`: afterwards [`Authorizer::token`]
    /// gives a token that may be accepted. An error says no such token can be had.
    pub fn answer<'a>(
        &'a self,
        sent: Option<&'a Credential>,
        challenge: &'a Challenge,
    ) -> Pin<Box<dyn Future<Output = Result<(), AuthError>> + Send + 'a>> {
        Box::pin(self.answered(sent, challenge))
    }

    async fn answered(&self, sent: Option<&Credential>, challenge: &Challenge) -> Result<(), AuthError> {
        if let (Some(dpop), Some(nonce), Some("use_dpop_nonce")) =
            (self.dpop.get(), &challenge.dpop_nonce, challenge.error.as_deref())
            && sent.is_some_and(|sent| sent.dpop)
        {
            Dpop::keep_nonce(&dpop.resource_nonce, nonce);
            return Ok(());
        }
        let mut state = self.state.lock().await;
        let now = self.current().map(|current| current.credential);
        if now.as_ref() != sent {
            return Ok(()); // another request's refusal got a new token meanwhile
        }
        let mut scopes = state.requested.clone();
        match challenge.refusal {
            Refusal::Unauthenticated => {
                if state.grant.as_ref().is_some_and(|grant| grant.refresh_token.is_some()) {
                    match self.refresh(&mut state).await {
                        Ok(()) => return Ok(()),
                        Err(err) => tracing::info!(%err, "the refresh was refused; authorizing again"),
                    }
                }
            }
            Refusal::InsufficientScope => {
                let wanted: BTreeSet<String> = challenge.scopes().map(str::to_owned).collect();
                if wanted.is_subset(&scopes) {
                    return Err(AuthError::ScopeNotGranted(challenge.scope.clone().unwrap_or_default()));
                }
            }
        }
        scopes.extend(challenge.scopes().map(str::to_owned));
        self.authorize(&mut state, challenge, scopes).await
    }

    fn current(&self) -> Option<Current> {
        self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Discovers who authorizes the endpoint and gets a token there.
    async fn authorize(
        &self,
        state: &mut State,
        challenge: &Challenge,
        mut scopes: BTreeSet<String>,
    ) -> Result<(), AuthError> {
        state.authorizations += 1;
        if state.authorizations > self.config.max_authorizations {
            return Err(AuthError::TooManyAuthorizations(self.config.max_authorizations));
        }
        let discovered = discover(&self.http, &self.endpoint, challenge).await?;
        if state.registration.as_ref().is_some_and(|r| r.authorization_server != discovered.authorization_server) {
            // Another authorization server now: nothing of the old one's is shown to it.
            state.registration = None;
            state.grant = None;
        }
        if challenge.scope.is_none()
            && let Some(resource) = &discovered.resource
        {
            scopes.extend(resource.scopes_supported.iter().cloned());
        }
        let machine =
            !matches!(self.config.identity, ClientIdentity::Dynamic { .. } | ClientIdentity::Registered { .. });
        if !machine
            && discovered.server.scopes_supported.as_ref().is_some_and(|s| s.iter().any(|s| s == OFFLINE_ACCESS))
        {
            scopes.insert(OFFLINE_ACCESS.to_owned());
        }
        let (registration, response) = match &self.config.identity {
            ClientIdentity::Machine { client_id, credential } => {
                let registration = Registration {
                    authorization_server: discovered.authorization_server.clone(),
                    client_id: client_id.clone(),
                    client_secret: match credential {
                        MachineCredential::Secret(secret) => Some(secret.clone()),
                        MachineCredential::PrivateKey { .. } => None,
                    },
                    auth_method: match credential {
                        MachineCredential::Secret(_) => AuthMethod::Basic,
                        MachineCredential::PrivateKey { .. } => AuthMethod::None,
                    },
                };
                let response = self.client_credentials(&discovered, &registration, credential, &scopes).await?;
                (registration, response)
            }
            ClientIdentity::Workload { client_id, assertion } => {
                let registration = Registration {
                    authorization_server: discovered.authorization_server.clone(),
                    // Sent nowhere: an assertion grant is renewed by presenting the assertion
                    // again, never by a refresh token.
                    client_id: client_id.clone().unwrap_or_default(),
                    client_secret: None,
                    auth_method: AuthMethod::None,
                };
                let mut form = vec![("grant_type", JWT_BEARER), ("assertion", assertion.as_str())];
                if let Some(client_id) = client_id {
                    form.push(("client_id", client_id));
                }
                let mut response =
                    self.token_form(&discovered, &discovered.server.token_endpoint, form, &scopes, None).await?;
                response.set_refresh_token(None);
                (registration, response)
            }
            ClientIdentity::Enterprise { client_id, client_secret, idp_token_endpoint, idp_client_id, id_token } => {
                let mut exchange = vec![
                    ("grant_type", "urn:ietf:params:oauth:grant-type:token-exchange"),
                    ("requested_token_type", "urn:ietf:params:oauth:token-type:id-jag"),
                    ("audience", discovered.server.issuer.as_str()),
                    ("subject_token", id_token.as_str()),
                    ("subject_token_type", "urn:ietf:params:oauth:token-type:id_token"),
                ];
                if let Some(idp_client_id) = idp_client_id {
                    exchange.push(("client_id", idp_client_id));
                }
                let grant = self.token_form(&discovered, idp_token_endpoint, exchange, &scopes, None).await?;
                let form = vec![("grant_type", JWT_BEARER), ("assertion", grant.access_token().secret().as_str())];
                let basic = Some((client_id.as_str(), client_secret.as_str()));
                let response =
                    self.token_form(&discovered, &discovered.server.token_endpoint, form, &scopes, basic).await?;
                let registration = Registration {
                    authorization_server: discovered.authorization_server.clone(),
                    client_id: client_id.clone(),
                    client_secret: Some(client_secret.clone()),
                    auth_method: AuthMethod::Basic,
                };
                (registration, response)
            }
            ClientIdentity::Dynamic { .. } | ClientIdentity::Registered { .. } => {
                let registration = self.registration(state, &discovered).await?;
                let response = self.code_flow(&discovered, &registration, &scopes).await?;
                (registration, response)
            }
        };
        let resource = discovered.resource.as_ref().map(|r| r.resource.clone());
        let grant = grant_of(&response, None, &discovered.server.token_endpoint, resource, &scopes);
        state.requested = scopes;
        state.registration = Some(registration);
        self.keep(state, grant)
    }

    /// The client's registration with the discovered server: pre-registered, by metadata
    /// document, kept from before, or made now.
    async fn registration(&self, state: &State, discovered: &Discovered) -> Result<Registration, AuthError> {
        let server = &discovered.server;
        match &self.config.identity {
            ClientIdentity::Registered { client_id, client_secret, issuer } => {
                if let Some(issuer) = issuer
                    && *issuer != discovered.authorization_server
                {
                    return Err(AuthError::Registration(format!(
                        "the client is registered with {issuer}, and {} authorizes this resource",
                        discovered.authorization_server
                    )));
                }
                Ok(Registration {
                    authorization_server: discovered.authorization_server.clone(),
                    client_id: client_id.clone(),
                    client_secret: client_secret.clone(),
                    auth_method: auth_method(server, client_secret.is_some(), None),
                })
            }
            ClientIdentity::Dynamic { metadata_document: Some(document) }
                if server.client_id_metadata_document_supported =>
            {
                Ok(Registration {
                    authorization_server: discovered.authorization_server.clone(),
                    client_id: document.clone(),
                    client_secret: None,
                    auth_method: AuthMethod::None,
                })
            }
            _ => match &state.registration {
                Some(registration) => Ok(registration.clone()),
                None => self.register(discovered).await,
            },
        }
    }

    /// Dynamic client registration (RFC 7591).
    async fn register(&self, discovered: &Discovered) -> Result<Registration, AuthError> {
        let server = &discovered.server;
        let endpoint = server.registration_endpoint.as_deref().ok_or_else(|| {
            AuthError::Registration(format!(
                "{} offers no registration, and the client has no registration there",
                discovered.authorization_server
            ))
        })?;
        let method = [AuthMethod::None, AuthMethod::Basic, AuthMethod::Post]
            .into_iter()
            .find(|method| server.accepts_auth_method(method.name()))
            .unwrap_or(AuthMethod::None);
        let body = json!({
            "client_name": self.config.client_name,
            "redirect_uris": [self.config.user_agent.redirect_uri()],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": method.name(),
            "application_type": "native",
        });
        let failed = |why: String| AuthError::Registration(format!("{endpoint}: {why}"));
        let mut response = self
            .http
            .post(endpoint)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|err| failed(err.to_string()))?;
        let status = response.status();
        let answer = read_bounded(&mut response, MAX_ANSWER_BYTES).await.map_err(|err| failed(err.to_string()))?;
        if !status.is_success() {
            return Err(failed(format!("answered {status}: {}", String::from_utf8_lossy(&answer))));
        }
        let answer: Value = serde_json::from_slice(&answer).map_err(|err| failed(err.to_string()))?;
        let text = |name: &str| answer.get(name).and_then(Value::as_str).map(str::to_owned);
        let client_id = text("client_id").ok_or_else(|| failed("no client_id in the answer".into()))?;
        let client_secret = text("client_secret");
        let registered = text("token_endpoint_auth_method").and_then(|name| AuthMethod::named(&name));
        Ok(Registration {
            authorization_server: discovered.authorization_server.clone(),
            client_id,
            auth_method: auth_method(server, client_secret.is_some(), registered),
            client_secret,
        })
    }

    /// The authorization code flow with PKCE (S256) and the resource indicator.
    async fn code_flow(
        &self,
        discovered: &Discovered,
        registration: &Registration,
        scopes: &BTreeSet<String>,
    ) -> Result<BasicTokenResponse, AuthError> {
        let server = &discovered.server;
        let authorization_endpoint = server.authorization_endpoint.as_deref().ok_or_else(|| {
            AuthError::Discovery(format!("{} names no authorization endpoint", discovered.authorization_server))
        })?;
        match &server.code_challenge_methods_supported {
            Some(methods) if !methods.iter().any(|m| m == "S256") => {
                return Err(AuthError::Discovery(format!("{} does not support PKCE with S256", server.issuer)));
            }
            None if discovered.resource.is_some() => {
                return Err(AuthError::Discovery(format!("{} does not say it supports PKCE", server.issuer)));
            }
            _ => {}
        }
        let client = token_client(registration, &server.token_endpoint)?
            .set_auth_uri(AuthUrl::from_url(url(authorization_endpoint)?))
            .set_redirect_uri(RedirectUrl::from_url(url(self.config.user_agent.redirect_uri())?));
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let mut request = client
            .authorize_url(CsrfToken::new_random)
            .set_pkce_challenge(challenge)
            .add_scopes(scopes.iter().cloned().map(Scope::new));
        if let Some(resource) = &discovered.resource {
            request = request.add_extra_param("resource", resource.resource.clone());
        }
        let (authorize, csrf) = request.url();
        let redirected = self.config.user_agent.authorize(authorize.as_str()).await?;
        let code = authorization_code(&redirected, csrf.secret(), server)?;
        let mut exchange = client.exchange_code(code).set_pkce_verifier(verifier);
        if let Some(resource) = &discovered.resource {
            exchange = exchange.add_extra_param("resource", resource.resource.clone());
        }
        exchange.request_async(&self.exchange(server)?).await.map_err(token_error)
    }

    /// The client credentials grant, the client proven by its secret or a signed assertion.
    async fn client_credentials(
        &self,
        discovered: &Discovered,
        registration: &Registration,
        credential: &MachineCredential,
        scopes: &BTreeSet<String>,
    ) -> Result<BasicTokenResponse, AuthError> {
        let server = &discovered.server;
        let client = token_client(registration, &server.token_endpoint)?;
        let assertion = match credential {
            MachineCredential::PrivateKey { pem, algorithm } => {
                Some(assertion(&registration.client_id, &server.issuer, pem, *algorithm)?)
            }
            MachineCredential::Secret(_) => None,
        };
        let mut request = client.exchange_client_credentials().add_scopes(scopes.iter().cloned().map(Scope::new));
        if let Some(assertion) = assertion {
            request = request
                .add_extra_param("client_assertion_type", "urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
                .add_extra_param("client_assertion", assertion);
        }
        if let Some(resource) = &discovered.resource {
            request = request.add_extra_param("resource", resource.resource.clone());
        }
        request.request_async(&self.exchange(server)?).await.map_err(token_error)
    }

    /// The HTTP client of `server`'s token endpoint: with DPoP proofs if it takes them.
    fn exchange(&self, server: &ServerMetadata) -> Result<Exchange<'_>, AuthError> {
        let offers_dpop = server
            .dpop_signing_alg_values_supported
            .as_ref()
            .is_some_and(|algorithms| algorithms.iter().any(|a| a == dpop::ALGORITHM));
        let dpop = match self.dpop.get() {
            Some(dpop) => Some(dpop),
            None if offers_dpop => {
                let _ = self.dpop.set(Dpop::generate()?);
                self.dpop.get()
            }
            None => None,
        };
        Ok(Exchange { http: &self.http, dpop: dpop.filter(|_| offers_dpop) })
    }

    /// A token request of a grant the `oauth2` crate does not have (the JWT bearer grant, token
    /// exchange): `form`, with the resource and scopes, to `endpoint`, the client authenticated
    /// with HTTP Basic if `basic` says.
    async fn token_form(
        &self,
        discovered: &Discovered,
        endpoint: &str,
        mut form: Vec<(&str, &str)>,
        scopes: &BTreeSet<String>,
        basic: Option<(&str, &str)>,
    ) -> Result<BasicTokenResponse, AuthError> {
        let scope = scopes.iter().map(String::as_str).collect::<Vec<_>>().join(" ");
        if !scope.is_empty() {
            form.push(("scope", &scope));
        }
        if let Some(resource) = &discovered.resource {
            form.push(("resource", &resource.resource));
        }
        let body = oauth2::url::form_urlencoded::Serializer::new(String::new()).extend_pairs(form).finish();
        let mut request = self
            .http
            .post(endpoint)
            .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(reqwest::header::ACCEPT, "application/json")
            .body(body);
        if let Some((id, secret)) = basic {
            let encode = |text: &str| oauth2::url::form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>();
            request = request.basic_auth(encode(id), Some(encode(secret)));
        }
        let failed = |why: String| AuthError::Token(format!("{endpoint}: {why}"));
        let mut response = request.send().await.map_err(|err| failed(crate::tls::describe(&err)))?;
        let status = response.status();
        let answer = read_bounded(&mut response, MAX_ANSWER_BYTES).await.map_err(|err| failed(err.to_string()))?;
        if !status.is_success() {
            return Err(failed(format!("answered {status}: {}", String::from_utf8_lossy(&answer))));
        }
        serde_json::from_slice(&answer).map_err(|err| failed(format!("not a token answer: {err}")))
    }

    /// Exchanges the refresh token for a new access token.
    async fn refresh(&self, state: &mut State) -> Result<(), AuthError> {
        let (Some(grant), Some(registration)) = (&state.grant, &state.registration) else {
            return Err(AuthError::Token("nothing to refresh".into()));
        };
        let refresh_token = grant.refresh_token.clone().ok_or_else(|| AuthError::Token("no refresh token".into()))?;
        let client = token_client(registration, &grant.token_endpoint)?;
        let refresh = RefreshToken::new(refresh_token.clone());
        let mut request = client.exchange_refresh_token(&refresh);
        if let Some(resource) = &grant.resource {
            request = request.add_extra_param("resource", resource.clone());
        }
        let exchange = Exchange { http: &self.http, dpop: self.dpop.get().filter(|_| grant.dpop) };
        let response = request.request_async(&exchange).await;
        let response = match response {
            Ok(response) => response,
            Err(err) => {
                // A refused refresh token is spent: authorizing again is the way on.
                if let Some(grant) = &mut state.grant {
                    grant.refresh_token = None;
                }
                return Err(token_error(err));
            }
        };
        let grant =
            grant_of(&response, Some(refresh_token), &grant.token_endpoint, grant.resource.clone(), &state.requested);
        self.keep(state, grant)
    }

    /// Makes `grant` the one requests carry, and keeps it in the token file.
    fn keep(&self, state: &mut State, grant: Grant) -> Result<(), AuthError> {
        *self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(current_of(&grant));
        let saved = state.registration.clone().map(|registration| Saved { registration, grant: grant.clone() });
        state.grant = Some(grant);
        if let (Some(path), Some(saved)) = (&self.config.token_file, saved.filter(|saved| !saved.grant.dpop)) {
            token_file::store(path, &self.endpoint, &saved)?;
        }
        Ok(())
    }
}

/// How a client with (or without) a secret authenticates at `server`'s token endpoint: as it
/// registered, if the server accepts that; else Basic, then the body, then as a public client.
fn auth_method(server: &ServerMetadata, has_secret: bool, registered: Option<AuthMethod>) -> AuthMethod {
    if let Some(method) = registered
        && server.accepts_auth_method(method.name())
    {
        return method;
    }
    let candidates: &[AuthMethod] =
        if has_secret { &[AuthMethod::Basic, AuthMethod::Post, AuthMethod::None] } else { &[AuthMethod::None] };
    candidates.iter().copied().find(|method| server.accepts_auth_method(method.name())).unwrap_or(candidates[0])
}

/// The `oauth2` client of `registration` at `token_endpoint`: its id, and its secret unless it
/// authenticates as a public client.
fn token_client(
    registration: &Registration,
    token_endpoint: &str,
) -> Result<BasicClient<EndpointNotSet, EndpointNotSet, EndpointNotSet, EndpointNotSet, EndpointSet>, AuthError> {
    let client = BasicClient::new(ClientId::new(registration.client_id.clone()))
        .set_token_uri(TokenUrl::from_url(url(token_endpoint)?))
        .set_auth_type(auth_type(registration.auth_method));
    Ok(match &registration.client_secret {
        Some(secret) if registration.auth_method != AuthMethod::None => {
            client.set_client_secret(ClientSecret::new(secret.clone()))
        }
        _ => client,
    })
}

/// `text` as a URL, for the `oauth2` crate's endpoints.
fn url(text: &str) -> Result<reqwest::Url, AuthError> {
    reqwest::Url::parse(text).map_err(|err| AuthError::Discovery(format!("{text:?} is not a URL: {err}")))
}

fn auth_type(method: AuthMethod) -> AuthType {
    match method {
        AuthMethod::Basic => AuthType::BasicAuth,
        AuthMethod::None | AuthMethod::Post => AuthType::RequestBody,
    }
}

/// The code of the authorization response at `redirected`, once its `state` is ours and its
/// `iss` (RFC 9207) is the server's, compared as strings.
fn authorization_code(redirected: &str, state: &str, server: &ServerMetadata) -> Result<AuthorizationCode, AuthError> {
    let url = reqwest::Url::parse(redirected)
        .map_err(|err| AuthError::Denied(format!("the redirect {redirected:?} is not a URL: {err}")))?;
    let params: HashMap<String, String> = url.query_pairs().into_owned().collect();
    if let Some(error) = params.get("error") {
        let description = params.get("error_description").map(String::as_str).unwrap_or("");
        return Err(AuthError::Denied(format!("{error} {description}").trim_end().to_owned()));
    }
    if params.get("state").map(String::as_str) != Some(state) {
        return Err(AuthError::Denied("the redirect's state is not the one sent".into()));
    }
    match params.get("iss") {
        Some(iss) if *iss != server.issuer => {
            return Err(AuthError::IssuerMismatch { expected: server.issuer.clone(), named: iss.clone() });
        }
        None if server.authorization_response_iss_parameter_supported => {
            return Err(AuthError::IssuerMismatch { expected: server.issuer.clone(), named: String::new() });
        }
        _ => {}
    }
    let code = params.get("code").ok_or_else(|| AuthError::Denied("the redirect carries no code".into()))?;
    Ok(AuthorizationCode::new(code.clone()))
}

/// A client assertion (RFC 7523 §2.2): the client, to the issuer, for five minutes.
fn assertion(
    client_id: &str,
    issuer: &str,
    pem: &str,
    algorithm: jsonwebtoken::Algorithm,
) -> Result<String, AuthError> {
    use rustls::pki_types::PrivatePkcs8KeyDer;
    use rustls::pki_types::pem::PemObject;
    let refused = |why: String| AuthError::Token(format!("the client's key: {why}"));
    let der =
        PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes()).map_err(|err| refused(format!("not PKCS#8 PEM: {err}")))?;
    let key = match algorithm {
        jsonwebtoken::Algorithm::ES256 | jsonwebtoken::Algorithm::ES384 => {
            jsonwebtoken::EncodingKey::from_ec_der(der.secret_pkcs8_der())
        }
        other => return Err(refused(format!("{other:?} assertions are not supported; ES256 and ES384 are"))),
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let mut jti = [0u8; 16];
    getrandom::fill(&mut jti).map_err(|err| refused(format!("no randomness: {err}")))?;
    let claims = json!({
        "iss": client_id,
        "sub": client_id,
        "aud": issuer,
        "iat": now,
        "exp": now + 300,
        "jti": tether_core::lineage::base64url(&jti),
    });
    jsonwebtoken::encode(&jsonwebtoken::Header::new(algorithm), &claims, &key).map_err(|err| refused(err.to_string()))
}

fn grant_of(
    response: &BasicTokenResponse,
    previous_refresh: Option<String>,
    token_endpoint: &str,
    resource: Option<String>,
    scopes: &BTreeSet<String>,
) -> Grant {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    Grant {
        access_token: response.access_token().secret().clone(),
        refresh_token: response.refresh_token().map(|token| token.secret().clone()).or(previous_refresh),
        expires_at: response.expires_in().map(|lifetime| (now + lifetime).as_secs()),
        token_endpoint: token_endpoint.to_owned(),
        resource,
        scopes: scopes.iter().cloned().collect(),
        dpop: matches!(response.token_type(), oauth2::basic::BasicTokenType::Extension(kind) if kind.eq_ignore_ascii_case("dpop")),
    }
}

fn current_of(grant: &Grant) -> Current {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let renew_at = grant.expires_at.map(|at| {
        let expires = Duration::from_secs(at);
        UNIX_EPOCH + expires.saturating_sub(RENEW_BEFORE.min(expires.saturating_sub(now) / 4))
    });
    Current {
        credential: Credential { access_token: grant.access_token.as_str().into(), dpop: grant.dpop },
        renew_at,
        refreshable: grant.refresh_token.is_some(),
    }
}

/// Why an exchange with the authorization server failed at the HTTP level.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ExchangeFailed(String);

/// The exchanges of the `oauth2` crate's flows, over reqwest: no redirects followed, the answer
/// bounded; each request with a DPoP proof if `dpop`, sent once more with the nonce the server
/// asks for (RFC 9449 §8).
struct Exchange<'h> {
    http: &'h reqwest::Client,
    dpop: Option<&'h Dpop>,
}

impl<'c> oauth2::AsyncHttpClient<'c> for Exchange<'_> {
    type Error = ExchangeFailed;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<oauth2::HttpResponse, ExchangeFailed>> + Send + 'c>>;

    fn call(&'c self, request: oauth2::HttpRequest) -> Self::Future {
        Box::pin(async move {
            let Some(dpop) = self.dpop else { return exchange_http(self.http, request, None).await };
            let proof = |nonce: Option<String>| {
                dpop.proof(request.method().as_str(), &request.uri().to_string(), None, nonce.as_deref())
                    .map_err(|err| ExchangeFailed(err.to_string()))
            };
            let first = proof(Dpop::nonce(&dpop.server_nonce))?;
            let answer = exchange_http(self.http, clone_request(&request), Some(first)).await?;
            let nonce = answer.headers().get("dpop-nonce").and_then(|v| v.to_str().ok()).map(str::to_owned);
            let Some(nonce) = nonce else { return Ok(answer) };
            Dpop::keep_nonce(&dpop.server_nonce, &nonce);
            let asked = answer.status() == reqwest::StatusCode::BAD_REQUEST
                && serde_json::from_slice::<Value>(answer.body()).is_ok_and(|body| body["error"] == "use_dpop_nonce");
            if !asked {
                return Ok(answer);
            }
            let retry = proof(Some(nonce))?;
            exchange_http(self.http, request, Some(retry)).await
        })
    }
}

fn clone_request(request: &oauth2::HttpRequest) -> oauth2::HttpRequest {
    let mut copy = oauth2::HttpRequest::new(request.body().clone());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.headers_mut() = request.headers().clone();
    copy
}

async fn exchange_http(
    http: &reqwest::Client,
    request: oauth2::HttpRequest,
    proof: Option<String>,
) -> Result<oauth2::HttpResponse, ExchangeFailed> {
    let mut request = reqwest::Request::try_from(request).map_err(|err| ExchangeFailed(err.to_string()))?;
    if let Some(proof) = proof {
        let proof = reqwest::header::HeaderValue::from_str(&proof).map_err(|err| ExchangeFailed(err.to_string()))?;
        request.headers_mut().insert("dpop", proof);
    }
    let mut response = http.execute(request).await.map_err(|err| ExchangeFailed(crate::tls::describe(&err)))?;
    let body = read_bounded(&mut response, MAX_ANSWER_BYTES).await.map_err(|err| ExchangeFailed(err.to_string()))?;
    let mut answer = oauth2::HttpResponse::new(body);
    *answer.status_mut() = response.status();
    *answer.headers_mut() = std::mem::take(response.headers_mut());
    Ok(answer)
}

fn header_value(text: &str) -> Result<reqwest::header::HeaderValue, AuthError> {
    reqwest::header::HeaderValue::from_str(text)
        .map_err(|_| AuthError::Token("a token that is not a header value".into()))
}

fn token_error<E: std::error::Error + 'static>(err: E) -> AuthError {
    AuthError::Token(crate::tls::describe(&err))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(iss_supported: bool, methods: Option<&[&str]>) -> ServerMetadata {
        serde_json::from_value(json!({
            "issuer": "http://localhost:9000",
            "token_endpoint": "http://localhost:9000/token",
            "authorization_response_iss_parameter_supported": iss_supported,
            "token_endpoint_auth_methods_supported": methods,
        }))
        .expect("metadata")
    }

    #[test]
    fn the_code_is_taken_only_from_a_response_of_our_state_and_of_the_issuer_exactly() {
        let (supported, unsaid) = (server(true, None), server(false, None));
        let code =
            |url: &str, server: &ServerMetadata| authorization_code(url, "s1", server).map(|c| c.secret().clone());
        let back = "http://localhost:3000/callback?code=c1&state=s1";
        assert_eq!(code(&format!("{back}&iss=http%3A%2F%2Flocalhost%3A9000"), &supported).expect("taken"), "c1");
        assert_eq!(code(back, &unsaid).expect("no iss where none is promised"), "c1");
        for (url, server) in [
            (format!("{back}&iss=http%3A%2F%2Flocalhost%3A9000%2F"), &supported),
            (format!("{back}&iss=https%3A%2F%2Fevil.example.com"), &unsaid),
            (back.to_owned(), &supported),
        ] {
            assert!(matches!(code(&url, server), Err(AuthError::IssuerMismatch { .. })), "{url}");
        }
        let other_state = "http://localhost:3000/callback?code=c1&state=s2";
        assert!(matches!(code(other_state, &unsaid), Err(AuthError::Denied(_))));
        let denied = "http://localhost:3000/callback?error=access_denied&state=s1";
        assert!(matches!(code(denied, &unsaid), Err(AuthError::Denied(why)) if why.contains("access_denied")));
    }

    #[test]
    fn a_client_authenticates_as_registered_if_accepted_else_as_its_secret_allows() {
        let only = |methods: &[&str]| server(false, Some(methods));
        assert_eq!(auth_method(&only(&["client_secret_post"]), true, Some(AuthMethod::Post)), AuthMethod::Post);
        assert_eq!(auth_method(&only(&["client_secret_basic"]), true, Some(AuthMethod::Post)), AuthMethod::Basic);
        assert_eq!(auth_method(&only(&["client_secret_post"]), true, None), AuthMethod::Post);
        assert_eq!(auth_method(&only(&["none"]), true, None), AuthMethod::None);
        assert_eq!(auth_method(&server(false, None), true, None), AuthMethod::Basic);
        assert_eq!(auth_method(&only(&["client_secret_basic"]), false, None), AuthMethod::None);
    }
}
