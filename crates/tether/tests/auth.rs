//! `tether serve --auth jwt` against an issuer on loopback: its keys are found through its
//! metadata (RFC 8414) and fetched over HTTP, a request without a token is told where the
//! protected resource metadata is, and a tool's required scope is enforced.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tether_testkit::oauth::IssuerServer;

const RESOURCE: &str = "https://mcp.example.test/mcp";
const WAIT: Duration = Duration::from_secs(10);

fn initialize() -> String {
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    .to_string()
}

/// `with_token`'s headers and those of `session`.
fn in_session<'a>(with_token: &[(&'a str, &'a str); 3], session: &'a str) -> [(&'a str, &'a str); 5] {
    let [media, accept, authorization] = *with_token;
    [media, accept, authorization, ("mcp-session-id", session), ("mcp-protocol-version", "2025-11-25")]
}

const MEDIA: [(&str, &str); 2] =
    [("content-type", "application/json"), ("accept", "application/json, text/event-stream")];

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn serve_verifies_access_tokens_with_keys_found_through_the_issuers_metadata() {
    let issuer = IssuerServer::start().await;
    let url = issuer.issuer.issuer().to_owned();
    let dir = temp_dir("auth-jwt");
    let scope = ["--tool-scope", "counter_add=counter:write"];
    let jwt = ["--auth", "jwt", "--jwt-issuer", &url, "--jwt-audience", RESOURCE];
    let (mut server, endpoint) = serve(free_port(), &dir, &[&jwt[..], &scope[..]].concat());

    let bare = exchange(&endpoint, "POST", &MEDIA, &initialize(), |_| false, WAIT);
    assert_eq!(bare.status, 401);
    let metadata_url = "https://mcp.example.test/.well-known/oauth-protected-resource/mcp";
    assert_eq!(header(&bare.headers, "www-authenticate"), format!("Bearer resource_metadata=\"{metadata_url}\""));
    let origin = endpoint.trim_end_matches("/mcp");
    let metadata =
        exchange(&format!("{origin}/.well-known/oauth-protected-resource/mcp"), "GET", &[], "", |_| false, WAIT);
    let metadata: Value = serde_json::from_str(&metadata.body).expect("metadata");
    assert_eq!(metadata["authorization_servers"], json!([url]));
    assert_eq!(metadata["scopes_supported"], json!(["counter:write"]));

    let token = issuer.issuer.token("alice", RESOURCE, "mcp", 300);
    let bearer = format!("Bearer {token}");
    let with_token = [MEDIA[0], MEDIA[1], ("authorization", bearer.as_str())];
    let opened = exchange(&endpoint, "POST", &with_token, &initialize(), |body| body.contains("serverInfo"), WAIT);
    assert_eq!(opened.status, 200, "{}", opened.body);
    assert_eq!(issuer.issuer.fetches(), 1, "the key set, once");
    let session = header(&opened.headers, "mcp-session-id").to_owned();

    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "counter_add", "arguments": {"key": "k", "amount": 1}}});
    let in_session = in_session(&with_token, &session);
    let refused = exchange(&endpoint, "POST", &in_session, &call.to_string(), |_| false, WAIT);
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(header(&refused.headers, "www-authenticate").contains("scope=\"counter:write\""), "{:?}", refused.headers);

    server.kill9();
    let _ = std::fs::remove_dir_all(dir);
}

/// `tether call --oauth` against `tether serve --auth jwt`: the authorization URL is printed, a
/// "browser" (this test) opens it and follows the redirect to tether's loopback listener, the
/// call completes; a second call uses the token kept in the token file (mode 0600), with no
/// authorization.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn call_authorizes_through_the_browser_once_and_keeps_its_token() {
    use std::io::BufRead as _;
    let issuer = IssuerServer::start().await;
    let url = issuer.issuer.issuer().to_owned();
    let dir = temp_dir("auth-call");
    let port = free_port();
    let resource = format!("http://127.0.0.1:{port}/mcp");
    let jwt = ["--auth", "jwt", "--jwt-issuer", &url, "--jwt-audience", &resource];
    let (mut server, endpoint) = serve(port, &dir, &jwt);
    let tokens = dir.join("config").join("tokens.json");
    let tokens = tokens.to_str().expect("utf-8").to_owned();
    let call = |stderr: std::process::Stdio| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tether"))
            .args(["call", &endpoint, "count", "--args", r#"{"to":1}"#, "--format", "json", "--timeout", "20s"])
            .args(["--oauth", "--oauth-token-file", &tokens])
            .stdout(std::process::Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn tether call")
    };

    let mut first = call(std::process::Stdio::piped());
    let stderr = first.stderr.take().expect("stderr");
    let authorize_at = format!("{url}/authorize?");
    let printed = tokio::task::spawn_blocking(move || {
        std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .find_map(|line| line.trim().starts_with(&authorize_at).then(|| line.trim().to_owned()))
    });
    let authorization = tokio::time::timeout(WAIT, printed).await.expect("in time").expect("read").expect("the URL");
    let approved = exchange(&authorization, "GET", &[], "", |_| false, WAIT);
    assert_eq!(approved.status, 302, "{}", approved.body);
    let back = header(&approved.headers, "location").to_owned();
    assert!(back.starts_with("http://127.0.0.1:"), "to the loopback listener: {back}");
    let landed = exchange(&back, "GET", &[], "", |_| false, WAIT);
    assert_eq!(landed.status, 200, "{}", landed.body);
    let first = tokio::task::spawn_blocking(move || first.wait_with_output()).await.expect("join").expect("output");
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stdout));
    assert!(String::from_utf8_lossy(&first.stdout).contains("counted to 1"));
    assert_eq!(issuer.grants.exchanged(), 1);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&tokens).expect("the token file").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the token file is its owner's alone");
    }

    let second = call(std::process::Stdio::null());
    let second = tokio::task::spawn_blocking(move || second.wait_with_output()).await.expect("join").expect("output");
    assert!(second.status.success(), "{}", String::from_utf8_lossy(&second.stdout));
    assert!(String::from_utf8_lossy(&second.stdout).contains("counted to 1"));
    assert_eq!(issuer.grants.exchanged(), 1, "the kept token served, no second authorization");

    server.kill9();
    let _ = std::fs::remove_dir_all(dir);
}

/// What the recording upstream saw of one request: its JSON-RPC method, the forwarded
/// principal, and whether it carried any `Authorization`.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    principal: Option<String>,
    authorization: bool,
}

/// A minimal Streamable HTTP MCP server on loopback (JSON answers, one session, one tool) that
/// records the headers of each request it is sent.
async fn recording_upstream() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Seen>>>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/mcp", listener.local_addr().expect("address"));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorded = std::sync::Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let recorded = std::sync::Arc::clone(&recorded);
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 4096];
                for _ in 0..1_000 {
                    let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
                    let field = |name: &str| {
                        head.lines().find_map(|line| line.strip_prefix(name)).map(|value| value.trim().to_owned())
                    };
                    let length: usize = field("content-length:").and_then(|v| v.parse().ok()).unwrap_or(0);
                    while buffer.len() < end + 4 + length {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body: Value = serde_json::from_slice(&buffer[end + 4..end + 4 + length]).unwrap_or(Value::Null);
                    buffer.drain(..end + 4 + length);
                    let verb = head.split(' ').next().unwrap_or("").to_owned();
                    let method = body["method"].as_str().unwrap_or(&verb).to_owned();
                    recorded.lock().expect("not poisoned").push(Seen {
                        method: method.clone(),
                        principal: field("x-tether-principal:"),
                        authorization: field("authorization:").is_some(),
                    });
                    let (status, answer) = match (verb.as_str(), body.get("id")) {
                        ("post", Some(id)) => {
                            let result = match method.as_str() {
                                "initialize" => json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                                    "serverInfo": {"name": "recording", "version": "1"}}),
                                "tools/list" => {
                                    json!({"tools": [{"name": "hello", "inputSchema": {"type": "object"}}]})
                                }
                                "tools/call" => json!({"content": [{"type": "text", "text": "hello"}]}),
                                _ => json!({}),
                            };
                            ("200 OK", json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string())
                        }
                        ("post", None) => ("202 Accepted", String::new()),
                        ("delete", _) => ("200 OK", String::new()),
                        _ => ("405 Method Not Allowed", String::new()),
                    };
                    let reply = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\nmcp-session-id: s1\r\ncontent-length: {}\r\n\r\n{answer}",
                        answer.len()
                    );
                    if socket.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, seen)
}

/// `tether gateway --auth jwt --upstream URL --upstream-principal-header H`: the upstream is told
/// who each client authenticated as, in the header, and never given the client's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_tells_its_upstream_the_principal_and_never_passes_the_token() {
    let issuer = IssuerServer::start().await;
    let url = issuer.issuer.issuer().to_owned();
    let (upstream, seen) = recording_upstream().await;
    let listen = format!("127.0.0.1:{}", free_port());
    let jwt = ["--auth", "jwt", "--jwt-issuer", &url, "--jwt-audience", RESOURCE];
    let gateway = ["gateway", "--store", "memory", "--listen", &listen];
    let forward = ["--upstream", &upstream, "--upstream-principal-header", "x-tether-principal"];
    let process = tether(&[&gateway[..], &jwt[..], &forward[..]].concat());
    let endpoint = tokio::task::block_in_place(|| process.line(Duration::from_secs(30)))
        .expect("tether gateway started")
        .strip_prefix("listening on ")
        .expect("listening line")
        .to_owned();

    let token = issuer.issuer.token("alice", RESOURCE, "mcp", 300);
    let bearer = format!("Bearer {token}");
    let with_token = [MEDIA[0], MEDIA[1], ("authorization", bearer.as_str())];
    let opened = tokio::task::block_in_place(|| {
        exchange(&endpoint, "POST", &with_token, &initialize(), |body| body.contains("serverInfo"), WAIT)
    });
    assert_eq!(opened.status, 200, "{}", opened.body);
    let session = header(&opened.headers, "mcp-session-id").to_owned();
    let in_session = in_session(&with_token, &session);
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "hello", "arguments": {}}});
    let called = tokio::task::block_in_place(|| {
        exchange(&endpoint, "POST", &in_session, &call.to_string(), |body| body.contains("\"result\""), WAIT)
    });
    assert!(called.body.contains("hello"), "{}", called.body);

    let seen = seen.lock().expect("not poisoned").clone();
    assert!(seen.iter().all(|s| !s.authorization), "no token went upstream: {seen:?}");
    let calls: Vec<&Seen> = seen.iter().filter(|s| s.method == "tools/call").collect();
    assert_eq!(calls.len(), 1, "{seen:?}");
    assert_eq!(calls[0].principal.as_deref(), Some("alice"), "{seen:?}");
    drop(process);
}
