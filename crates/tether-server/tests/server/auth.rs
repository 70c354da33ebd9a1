//! `--auth jwt`: OAuth access tokens verified with the issuer's keys (minted by the test), the
//! protected resource's metadata, scopes a tool requires, and each principal kept to its own
//! sessions, tasks and idempotency keys, on the memory and the embedded store.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tether_builtin::BuiltinHandler;
use tether_server::{Builder, FetchFuture, Jwt, JwtConfig, KeySetSource, ProtectedResource};
use tether_testkit::oauth::Issuer;

use crate::common::*;

const RESOURCE: &str = "https://mcp.example.test/mcp";
const METADATA: &str = "https://mcp.example.test/.well-known/oauth-protected-resource/mcp";

/// The test's issuer as the server's key source.
struct Minted(Arc<Issuer>);

impl KeySetSource for Minted {
    fn fetch(&self) -> FetchFuture<'_> {
        let document = self.0.jwks().into_bytes();
        Box::pin(std::future::ready(Ok(document)))
    }
}

/// Where a server keeps its state: both stores a single `tether serve` runs on.
#[derive(Debug, Clone, Copy)]
enum Kept {
    Memory,
    Embedded,
}

/// A server verifying `issuer`'s tokens, `counter_add` requiring `counter:write`; the
/// directory of an embedded store is removed when the server is dropped.
async fn serve(kept: Kept, issuer: &Arc<Issuer>, refetch_after: Duration) -> Served {
    let resource = ProtectedResource::new(RESOURCE, issuer.issuer())
        .expect("a resource")
        .require_scopes("counter_add", ["counter:write".to_owned()]);
    let config = JwtConfig { refetch_after, ..JwtConfig::new(issuer.issuer()) };
    let jwt = Jwt::new(config, resource, Minted(Arc::clone(issuer)));
    let builder = Builder::new(BuiltinHandler::in_memory()).config(crate::common::config()).authenticator(jwt);
    match kept {
        Kept::Memory => Served { server: start_with(builder).await, dir: None },
        Kept::Embedded => {
            static SERVERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = SERVERS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let dir = std::env::temp_dir().join(format!("tether-jwt-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            let store =
                tether_store::SqliteStore::open(&dir, tether_store::Retention::default(), "test").expect("open");
            Served { server: start_with(builder.store(Arc::new(store))).await, dir: Some(dir) }
        }
    }
}

/// A server, and the directory of its embedded store, if it has one.
struct Served {
    server: TestServer,
    dir: Option<std::path::PathBuf>,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn initialize() -> Value {
    request(
        json!(0),
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
    )
}

/// A session `token`'s principal opened.
async fn session_of(client: &Client, token: &str) -> Session {
    let response = client.post(None, &initialize()).bearer_auth(token).send().await.expect("initialize");
    assert_eq!(response.status(), 200, "initialize");
    let id = response.headers()["mcp-session-id"].to_str().expect("ascii").to_owned();
    Session { id, epoch: String::new(), version: "2025-11-25".into() }
}

fn www_authenticate(response: &reqwest::Response) -> String {
    response.headers().get("www-authenticate").map(|v| v.to_str().expect("ascii").to_owned()).unwrap_or_default()
}

async fn refused_initialize(client: &Client, token: &str) -> (u16, String, Value) {
    let response = client.post(None, &initialize()).bearer_auth(token).send().await.expect("send");
    let status = response.status().as_u16();
    let challenge = www_authenticate(&response);
    (status, challenge, json_body(response).await)
}

async fn tokens_are_verified_and_the_resource_described(kept: Kept) {
    let issuer = Arc::new(Issuer::new("https://issuer.example.test"));
    let served = serve(kept, &issuer, Duration::ZERO).await;
    let (server, client) = (&served.server, Client::new(&served.server));

    let bare = client.post(None, &initialize()).send().await.expect("send");
    assert_eq!(bare.status(), 401);
    assert_eq!(www_authenticate(&bare), format!("Bearer resource_metadata=\"{METADATA}\""));
    let origin = server.url.trim_end_matches("/mcp");
    let metadata = client.http.get(format!("{origin}/.well-known/oauth-protected-resource/mcp")).send().await;
    let metadata = json_body(metadata.expect("metadata")).await;
    assert_eq!(metadata["resource"], RESOURCE);
    assert_eq!(metadata["authorization_servers"], json!([issuer.issuer()]));
    assert_eq!(metadata["scopes_supported"], json!(["counter:write"]));

    let valid = issuer.token("alice", RESOURCE, "mcp", 300);
    session_of(&client, &valid).await;

    let cases = [
        ("expired", issuer.token("alice", RESOURCE, "mcp", -120), "the token has expired"),
        (
            "for another resource",
            issuer.token("alice", "https://other.example.test/mcp", "mcp", 300),
            "not for this resource",
        ),
        ("not a JWT", "s3cret".to_owned(), "not a JWT"),
        (
            "signed by a key of the same name, not the issuer's",
            Issuer::new(issuer.issuer()).token("alice", RESOURCE, "mcp", 300),
            "signature does not verify",
        ),
    ];
    for (what, token, why) in cases {
        let (status, challenge, body) = refused_initialize(&client, &token).await;
        assert_eq!(status, 401, "{what}");
        assert!(
            challenge.starts_with(&format!("Bearer resource_metadata=\"{METADATA}\", error=\"invalid_token\"")),
            "{what}: {challenge}"
        );
        assert!(challenge.contains(why), "{what}: {challenge}");
        assert_eq!(body["error"]["data"]["reason"], "unauthorized", "{what}");
    }

    // A rotated key is fetched when a token first names it; the dropped one verifies nothing.
    let fetched = issuer.fetches();
    issuer.rotate();
    session_of(&client, &issuer.token("alice", RESOURCE, "mcp", 300)).await;
    assert_eq!(issuer.fetches(), fetched + 1, "one fetch for the new key");
    assert_eq!(refused_initialize(&client, &valid).await.0, 401, "a token of the dropped key");
}

#[tokio::test]
async fn jwt_tokens_are_verified_and_the_resource_described_on_the_memory_store() {
    tokens_are_verified_and_the_resource_described(Kept::Memory).await;
}

#[tokio::test]
async fn jwt_tokens_are_verified_and_the_resource_described_on_the_embedded_store() {
    tokens_are_verified_and_the_resource_described(Kept::Embedded).await;
}

/// Tokens naming keys the server does not hold fetch the key set at most once per interval,
/// however many come.
#[tokio::test]
async fn a_flood_of_unknown_keys_fetches_the_key_set_once_per_interval() {
    let issuer = Arc::new(Issuer::new("https://issuer.example.test"));
    let served = serve(Kept::Memory, &issuer, Duration::from_secs(30)).await;
    let client = Client::new(&served.server);
    session_of(&client, &issuer.token("alice", RESOURCE, "mcp", 300)).await;
    assert_eq!(issuer.fetches(), 1);
    let stranger = Issuer::new(issuer.issuer());
    for _ in 0..10 {
        let kid = stranger.rotate();
        let (status, challenge, _) = refused_initialize(&client, &stranger.token("alice", RESOURCE, "mcp", 300)).await;
        assert_eq!(status, 401, "{kid}");
        assert!(challenge.contains("names no key"), "{kid}: {challenge}");
    }
    assert_eq!(issuer.fetches(), 1, "no fetch within the interval");
}

async fn scopes_and_principals_are_kept(kept: Kept) {
    let issuer = Arc::new(Issuer::new("https://issuer.example.test"));
    let served = serve(kept, &issuer, Duration::ZERO).await;
    let client = Client::new(&served.server);
    let alice = issuer.token("alice", RESOURCE, "mcp counter:write", 300);
    let bob = issuer.token("bob", RESOURCE, "mcp counter:write", 300);
    let reader = issuer.token("carol", RESOURCE, "mcp", 300);

    // A tool that requires a scope the token lacks is refused before it runs.
    let session = session_of(&client, &reader).await;
    let add = |key: &str| json!({"name": "counter_add", "arguments": {"key": "k", "amount": 5}, "_meta": {"io.tether/idempotencyKey": key}});
    let refused =
        client.post(Some(&session), &request(json!(1), "tools/call", add("key-0"))).bearer_auth(&reader).send().await;
    let refused = refused.expect("send");
    assert_eq!(refused.status(), 403);
    let challenge = www_authenticate(&refused);
    assert!(
        challenge.starts_with("Bearer error=\"insufficient_scope\", scope=\"counter:write\", resource_metadata="),
        "{challenge}"
    );
    let body = json_body(refused).await;
    assert_eq!((body["id"].as_i64(), body["error"]["data"]["reason"].as_str()), (Some(1), Some("insufficient_scope")));
    let read = client.post(
        Some(&session),
        &request(json!(2), "tools/call", json!({"name": "counter_get", "arguments": {"key": "k"}})),
    );
    let read = json_body(read.bearer_auth(&reader).send().await.expect("send")).await;
    assert_eq!(read["result"]["structuredContent"]["value"], 0, "the refused call did not run: {read}");

    // Alice's session is unknown to Bob.
    let theirs = session_of(&client, &alice).await;
    let ping = request(json!(3), "ping", json!({}));
    let as_bob = client.post(Some(&theirs), &ping).bearer_auth(&bob).send().await.expect("send");
    assert_eq!((as_bob.status().as_u16(), reason(as_bob).await.as_str()), (404, "unknown_session"));

    // Alice's idempotency key is hers: Bob's call under the same key runs as his own.
    let call = |token: &str, session: Session| {
        let client = &client;
        let token = token.to_owned();
        let body = request(json!(4), "tools/call", add("key-1"));
        async move { json_body(client.post(Some(&session), &body).bearer_auth(token).send().await.expect("send")).await }
    };
    let hers = call(&alice, theirs.clone()).await;
    let his = call(&bob, session_of(&client, &bob).await).await;
    assert_eq!(hers["result"]["structuredContent"]["value"], 5, "{hers}");
    assert_eq!(his["result"]["structuredContent"]["value"], 10, "his own run, not her record: {his}");
    assert_eq!(call(&alice, theirs).await["result"], hers["result"], "hers again, from her record");

    // Alice's task is unknown to Bob, who can neither read nor cancel it.
    let task_meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    });
    let stateless = |method: &str, mut params: Value, token: &str| {
        params["_meta"] = task_meta.clone();
        stateless_post(&client, json!(5), method, params).bearer_auth(token)
    };
    let count = json!({"name": "count", "arguments": {"to": 2, "interval_ms": 60_000}});
    let created = json_body(stateless("tools/call", count, &alice).send().await.expect("send")).await;
    let task = created["result"]["taskId"].as_str().unwrap_or_else(|| panic!("a task: {created}")).to_owned();
    for method in ["tasks/get", "tasks/cancel"] {
        let body = json_body(stateless(method, json!({"taskId": task}), &bob).send().await.expect("send")).await;
        assert_eq!(body["error"]["data"]["reason"], "unknown_task", "bob's {method}: {body}");
    }
    let own = json_body(stateless("tasks/get", json!({"taskId": task}), &alice).send().await.expect("send")).await;
    assert_eq!(own["result"]["status"], "working", "not cancelled by bob: {own}");
}

#[tokio::test]
async fn scopes_and_principals_are_kept_on_the_memory_store() {
    scopes_and_principals_are_kept(Kept::Memory).await;
}

#[tokio::test]
async fn scopes_and_principals_are_kept_on_the_embedded_store() {
    scopes_and_principals_are_kept(Kept::Embedded).await;
}
