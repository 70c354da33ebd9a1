//! TLS end to end on loopback, with a certificate authority the test makes: `tether serve` with
//! `--tls-cert`/`--tls-key`, reached by `call`, `connect` and `gateway --upstream https://…`
//! that are given the authority with `--ca-cert`; a server whose authority is not given is
//! refused with the reason; HTTP/2 is negotiated by ALPN.

mod common;

use std::io::{BufRead, BufReader, Read as _, Write as _};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Process, free_port, parse, serve, temp_dir, tether};
use serde_json::{Value, json};
use tether_testkit::tls::Authority;

/// A test's directory, a certificate authority whose certificate is `ca` in it, and `tether
/// serve` over TLS at `url` with a certificate the authority issued. The directory goes with it.
struct Secured {
    dir: PathBuf,
    ca: PathBuf,
    url: String,
    _server: Process,
}

impl Secured {
    fn start(name: &str) -> Secured {
        Secured::start_with(name, &[])
    }

    /// With `flags` for `tether serve`.
    fn start_with(name: &str, flags: &[&str]) -> Secured {
        let dir = temp_dir(name);
        let authority = Authority::new("tether test CA");
        let ca = authority.write(&dir.join("ca.pem"));
        let issued = authority.issue(&dir, "server");
        let (cert, key) = (issued.certificate.to_str().expect("utf-8"), issued.key.to_str().expect("utf-8"));
        let tls = ["--tls-cert", cert, "--tls-key", key];
        let (server, url) = serve(free_port(), &dir.join("data"), &[&tls[..], flags].concat());
        assert!(url.starts_with("https://127.0.0.1:"), "{url}");
        Secured { dir, ca, url, _server: server }
    }

    fn ca(&self) -> &str {
        self.ca.to_str().expect("utf-8")
    }
}

impl Drop for Secured {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The JSON lines `tether ARGS…` printed, and its stderr, once it exits (killed after `within`).
fn run(args: &[&str], within: Duration) -> (bool, Vec<Value>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(args)
        // What the client tries, for the tests to see.
        .env("RUST_LOG", "warn,tether_client=debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tether");
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("tether {args:?} ran past {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut out, mut err) = (String::new(), String::new());
    child.stdout.take().expect("stdout").read_to_string(&mut out).expect("stdout");
    child.stderr.take().expect("stderr").read_to_string(&mut err).expect("stderr");
    let lines: Vec<String> = out.lines().map(str::to_owned).collect();
    (status.success(), parse(&lines), err)
}

fn greeting(lines: &[Value]) -> Option<&str> {
    lines.iter().find(|line| line["event"] == "result")?["result"]["content"][0]["text"].as_str()
}

#[test]
fn call_reaches_an_https_server_whose_authority_it_is_given() {
    let secured = Secured::start("tls-call");
    let args =
        ["call", &secured.url, "greet", "--args", r#"{"name": "tls"}"#, "--ca-cert", secured.ca(), "--timeout", "20s"];
    let (ok, lines, err) = run(&args, Duration::from_secs(30));
    assert!(ok, "{lines:?} {err}");
    assert_eq!(greeting(&lines), Some("Hello, tls!"), "{lines:?}");
    // 2026-07-28 too: stateless requests over the same TLS.
    let args = [&args[..], &["--protocol-version", "2026-07-28"]].concat();
    let (ok, lines, err) = run(&args, Duration::from_secs(30));
    assert!(ok, "{lines:?} {err}");
    assert_eq!(greeting(&lines), Some("Hello, tls!"), "{lines:?}");
}

#[test]
fn a_server_whose_authority_is_not_trusted_is_refused_with_the_reason() {
    let secured = Secured::start("tls-untrusted");
    let other = Authority::new("another CA").write(&secured.dir.join("other.pem"));
    for trust in [vec![], vec!["--ca-cert", other.to_str().expect("utf-8")]] {
        let args = [&["call", &secured.url, "greet", "--timeout", "20s"][..], &trust].concat();
        let (ok, lines, err) = run(&args, Duration::from_secs(30));
        assert!(!ok, "{lines:?}");
        assert!(greeting(&lines).is_none(), "{lines:?}");
        assert!(err.contains("UnknownIssuer"), "the reason is named: {err}");
        assert!(!err.contains("trying the handshake again"), "no retry can mend it: {err}");
    }
    let missing = secured.dir.join("missing.pem");
    let (ok, _, err) =
        run(&["call", &secured.url, "greet", "--ca-cert", missing.to_str().expect("utf-8")], Duration::from_secs(10));
    assert!(!ok);
    assert!(err.contains("--ca-cert") && err.contains("missing.pem"), "a usage error naming the file: {err}");
}

#[test]
fn connect_bridges_a_desktop_client_to_an_https_server() {
    let secured = Secured::start("tls-connect");
    let args = ["connect", &secured.url, "--ca-cert", secured.ca()];
    desktop_session(Command::new(env!("CARGO_BIN_EXE_tether")).args(args));
}

/// The README's desktop-client entry, as written: its command and arguments, with the example
/// URL and token replaced by this test's, and the test's authority as `SSL_CERT_FILE` (as a
/// machine that trusts a private CA would have it).
#[test]
fn the_readme_s_desktop_client_entry_works_as_written() {
    let readme = include_str!("../../../README.md");
    let block = readme
        .split("```json\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .find(|block| block.contains("mcpServers"))
        .expect("the README's desktop-client entry");
    let entry: Value = serde_json::from_str(block).expect("the entry is JSON");
    let server = entry["mcpServers"].as_object().and_then(|servers| servers.values().next()).expect("a server");
    assert_eq!(server["command"], "tether", "{server}");
    let secured = Secured::start_with("tls-readme", &["--auth-token", "readme-token"]);
    let args: Vec<String> = server["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|arg| {
            let arg = arg.as_str().expect("a string");
            arg.replace("https://mcp.example.com/mcp", &secured.url).replace("${MCP_TOKEN}", "readme-token")
        })
        .collect();
    assert!(args.contains(&secured.url), "the entry names an https URL: {args:?}");
    desktop_session(Command::new(env!("CARGO_BIN_EXE_tether")).args(&args).env("SSL_CERT_FILE", &secured.ca));
}

/// Plays a desktop application over `bridge`'s stdio: initializes, calls `greet`.
fn desktop_session(bridge: &mut Command) {
    let mut child = bridge
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn tether connect");
    let killer = Killed(&mut child);
    let mut stdin = killer.0.stdin.take().expect("stdin");
    let (tx, lines) = std::sync::mpsc::channel();
    let stdout = killer.0.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(serde_json::from_str::<Value>(&line).expect("a JSON-RPC message per line"));
        }
    });
    let mut send = |message: Value| writeln!(stdin, "{message}").expect("write a line");
    send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "desktop", "version": "1"}}}));
    let answer = lines.recv_timeout(Duration::from_secs(20)).expect("initialize answered");
    assert!(answer["result"]["serverInfo"].is_object(), "{answer}");
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let call = json!({"name": "greet", "arguments": {"name": "desk"}});
    send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}));
    let answer = lines.recv_timeout(Duration::from_secs(20)).expect("the call answered");
    assert_eq!(answer["result"]["content"][0]["text"], "Hello, desk!", "{answer}");
}

/// A child killed and reaped when the test ends, however it ends.
struct Killed<'a>(&'a mut std::process::Child);

impl Drop for Killed<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_gateway_fronts_an_https_upstream() {
    let secured = Secured::start("tls-gateway");
    let listen = format!("127.0.0.1:{}", free_port());
    let upstream = ["--upstream", &secured.url, "--ca-cert", secured.ca()];
    let gateway_args = [&["gateway", "--store", "memory", "--listen", &listen][..], &upstream].concat();
    let gateway = tether(&gateway_args);
    let first = gateway.line(Duration::from_secs(30)).expect("tether gateway started");
    let url = first.strip_prefix("listening on ").expect("listening line").to_owned();
    let (ok, lines, err) =
        run(&["call", &url, "greet", "--args", r#"{"name": "gate"}"#, "--timeout", "20s"], Duration::from_secs(30));
    assert!(ok, "{lines:?} {err}");
    assert_eq!(greeting(&lines), Some("Hello, gate!"), "{lines:?}");
}

#[test]
fn http2_is_negotiated_by_alpn() {
    let secured = Secured::start("tls-alpn");
    let trust = tether_client::tls::Trust::platform().with_ca_file(&secured.ca).expect("the authority");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let version = runtime.block_on(async {
        let http = trust.http_client().build().expect("an HTTP client");
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}).to_string();
        let response = http
            .post(&secured.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .body(body)
            .timeout(Duration::from_secs(20))
            .send()
            .await
            .expect("an answer");
        format!("{:?}", response.version())
    });
    assert_eq!(version, "HTTP/2.0");
}

/// A certificate and key that cannot serve TLS stop `serve` at start, saying which and why.
#[test]
fn serve_refuses_a_certificate_it_cannot_use() {
    let dir = temp_dir("tls-refused");
    let authority = Authority::new("tether test CA");
    let (one, other) = (authority.issue(&dir, "one"), authority.issue(&dir, "other"));
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "").expect("write");
    let path = |path: &PathBuf| path.to_str().expect("utf-8").to_owned();
    let listen = format!("127.0.0.1:{}", free_port());
    for (cert, key, said) in [
        (path(&one.certificate), path(&other.key), "cannot serve TLS"),
        (path(&empty), path(&one.key), "empty.pem holds no readable PEM certificate"),
        (path(&one.certificate), path(&empty), "empty.pem holds no readable PEM private key"),
    ] {
        let args = ["serve", "--store", "memory", "--listen", &listen, "--tls-cert", &cert, "--tls-key", &key];
        let (ok, _, err) = run(&args, Duration::from_secs(20));
        assert!(!ok && err.contains(said), "{said}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
