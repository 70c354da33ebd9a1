//! The command line as a person meets it: an unreachable server is an error, with its cause,
//! on both outputs; a URL without a scheme and a `--listen` of a host name or a bare port are
//! taken or refused when the arguments are parsed; errors are one line, never a backtrace;
//! `--header` reaches a server that wants a token; completions and the version with its commit.

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use serde_json::Value;

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tether")).args(args).env("RUST_BACKTRACE", "1").output().expect("run tether")
}

fn stdout_lines(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

#[test]
fn an_unreachable_server_is_an_error_with_its_cause_on_both_outputs() {
    let url = format!("http://127.0.0.1:{}/mcp", free_port());
    for command in [vec!["call", &url, "count"], vec!["watch", &url], vec!["task", &url, "some-task"]] {
        // One retry: a refused connection is tried again, as a server restarting would be.
        let mut args = command.clone();
        args.extend(["--retries", "1", "--timeout", "60s"]);
        let output = run(&args);
        assert_eq!(output.status.code(), Some(1), "{command:?}");
        let lines = stdout_lines(&output);
        let error = lines.last().unwrap_or_else(|| panic!("{command:?}: no JSON line"));
        assert_eq!(error["event"], "error", "{command:?}: {error}");
        assert_eq!(error["error"]["data"]["reason"], "connect_failed", "{error}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("Connection refused"), "the cause, not only the top error: {message}");
        assert!(String::from_utf8_lossy(&output.stderr).contains("Connection refused"));
    }
}

#[test]
fn urls_are_checked_when_the_arguments_are_parsed() {
    for args in [
        vec!["call", "127.0.0.1:8899/mcp", "count"],
        vec!["connect", "not-a-url"],
        vec!["probe", "ftp://127.0.0.1/mcp"],
        vec!["gateway", "--upstream", "localhost/mcp"],
    ] {
        let output = run(&args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: a usage error");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("http"), "{args:?}: {stderr}");
    }
}

#[test]
fn an_error_is_one_line_with_its_cause_and_no_backtrace() {
    let dir = temp_dir("cli-error");
    let output = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["serve", "--listen", "127.0.0.1:0", "--tls-cert", "/nonexistent", "--tls-key", "/nonexistent"])
        .current_dir(&dir)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("tether runs");
    assert_eq!(output.status.code(), Some(1));
    assert!(!dir.join("tether-data").exists(), "a server that cannot start leaves no store behind");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let error = stderr.lines().find(|l| l.starts_with("error: ")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(error.contains("--tls-cert") && error.contains("No such file"), "{error}");
    assert!(!stderr.contains("backtrace"), "{stderr}");
}

#[test]
fn listen_takes_a_host_name_and_header_reaches_a_server_that_wants_a_token() {
    let dir = temp_dir("cli-header");
    let port = free_port();
    let listen = format!("localhost:{port}");
    let server =
        tether(&["serve", "--listen", &listen, "--data-dir", dir.to_str().expect("utf-8"), "--auth-token", "s3cret"]);
    let first = server.line(Duration::from_secs(20)).expect("tether serve started");
    let url = first.strip_prefix("listening on ").expect("listening line").to_owned();
    assert_eq!(url, format!("http://127.0.0.1:{port}/mcp"));
    let refused = run(&["call", &url, "count", "--args", r#"{"to": 1}"#, "--timeout", "10s"]);
    assert_eq!(refused.status.code(), Some(1), "no token: {}", String::from_utf8_lossy(&refused.stdout));
    let called = run(&["call", &url, "count", "--args", r#"{"to": 1}"#, "--header", "Authorization: Bearer s3cret"]);
    let lines = stdout_lines(&called);
    assert_eq!(lines.last().map(|l| l["event"].clone()), Some(Value::from("result")), "{lines:?}");
    assert_eq!(called.status.code(), Some(0));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn completions_and_the_version_with_its_commit() {
    for shell in ["bash", "zsh", "fish"] {
        let output = run(&["completions", shell]);
        assert_eq!(output.status.code(), Some(0), "{shell}");
        assert!(String::from_utf8_lossy(&output.stdout).contains("tether"), "{shell}");
    }
    let version = String::from_utf8_lossy(&run(&["--version"]).stdout).into_owned();
    let commit = version.trim().strip_prefix(&format!("tether {} (", env!("CARGO_PKG_VERSION")));
    assert!(commit.is_some_and(|c| c.ends_with(')') && c.len() > 2), "{version}");
}

/// What a person sees at a terminal (a pseudo-terminal through `script`): a progress bar the
/// server's progress drives (`call` sends a progress token there), a resume in words, the
/// result's text; no JSON, and no colour under `NO_COLOR`.
#[test]
fn a_person_at_a_terminal_sees_progress_resumes_and_the_result_in_words() {
    use std::sync::atomic::Ordering;
    let dir = temp_dir("cli-terminal");
    let port = free_port();
    let (_server, _) = serve(port, &dir, &["--store", "memory", "--sse-retry", "100ms"]);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let proxy = runtime.block_on(tether_testkit::proxy::start(vec![upstream], 7, 150, 300));
    proxy.cutting.store(true, Ordering::Relaxed);
    let command = format!(
        "'{}' call http://{}/mcp count --args '{{\"to\": 20, \"interval_ms\": 20}}' --timeout 30s",
        env!("CARGO_BIN_EXE_tether"),
        proxy.addr
    );
    let seen = Command::new("script")
        .args(["-qfec", &command, "/dev/null"])
        .env("NO_COLOR", "1")
        .output()
        .expect("script (util-linux) runs the command in a pseudo-terminal");
    let screen = String::from_utf8_lossy(&seen.stdout).into_owned();
    assert_eq!(seen.status.code(), Some(0), "{screen}");
    assert!(screen.contains("] 20/20"), "the progress bar reached its end: {screen:?}");
    assert!(screen.contains("counted to 20"), "{screen:?}");
    assert!(proxy.cuts.load(Ordering::Relaxed) > 0, "the proxy cut the call's stream");
    assert!(screen.contains("resumed: nothing lost"), "{screen:?}");
    assert!(!screen.contains("{\"event\""), "no JSON for a person: {screen:?}");
    assert!(!screen.contains("\x1b[3") && !screen.contains("\x1b[1;3"), "no colour under NO_COLOR: {screen:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
