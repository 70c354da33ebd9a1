//! The README's examples, run exactly as written. The Quick start's first command starts the
//! server (the `tether` just built stands for `cargo run --release -p tether --`), in a directory
//! of its own: it must listen where its comment says, with its embedded store in
//! `./tether-data`. Then every command of a fenced `sh` block the README marks as run (an HTML
//! comment naming this file just before the fence) runs with `sh -c`, with that `tether` first on
//! `PATH`, `REDIS_URL` naming a Redis of the test's own and a stdio MCP server as `server.py`,
//! each block in a directory of its own. A command ending in `&` is a server: it must say where it
//! listens, and is stopped (SIGTERM) when its block ends. Any other must exit as its comment says
//! (`# exit N`), or 0.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// What marks a block as run.
const MARK: &str = "<!-- run as written by crates/tether/tests/readme.rs";

/// How the Quick start runs tether, which here is the binary just built.
const CARGO_RUN: &str = "cargo run --release -p tether -- ";

/// The Quick start's first command: tether's arguments, and the comment that says what it does.
fn quick_start(readme: &str) -> (Vec<String>, String) {
    let block = readme.split("## Quick start").nth(1).expect("a Quick start section");
    let first = block.lines().skip_while(|l| *l != "```sh").nth(1).expect("a command in the Quick start");
    let (command, comment) = first.split_once('#').expect("the command says what it does");
    let args = command.trim().strip_prefix(CARGO_RUN).expect("the Quick start runs tether with cargo");
    (args.split_whitespace().map(str::to_owned).collect(), comment.trim().to_owned())
}

/// One command of a marked block.
#[derive(Debug)]
struct Example {
    /// As written, without a trailing `&`.
    command: String,
    /// Started in the background (it ends with `&`): a server that runs until its block ends.
    background: bool,
    /// The exit status it must end with (`# exit N`), for one run in the foreground.
    want: i32,
}

/// The commands of every marked block, block by block.
fn marked_blocks(readme: &str) -> Vec<Vec<Example>> {
    let mut blocks = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if !line.starts_with(MARK) {
            continue;
        }
        assert_eq!(lines.next(), Some("```sh"), "a marked block is a fenced sh block right after its mark");
        let mut block = Vec::new();
        for line in lines.by_ref().take_while(|l| *l != "```") {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (command, comment) = line.split_once(" #").unwrap_or((line, ""));
            let want = comment
                .trim()
                .strip_prefix("exit ")
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
                .unwrap_or(0);
            let command = command.trim();
            let (command, background) = match command.strip_suffix('&') {
                Some(command) => (command.trim(), true),
                None => (command, false),
            };
            block.push(Example { command: command.to_owned(), background, want });
        }
        blocks.push(block);
    }
    blocks
}

/// Stops a server an example started as an orchestrator would (SIGTERM), so that it stops the
/// children it runs; killed if it has not exited within ten seconds.
fn stop(mut server: Process) {
    server.signal("TERM");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if server.child.try_wait().expect("wait").is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_readmes_examples_run_as_written() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).expect("README");
    let blocks = marked_blocks(&readme);
    assert!(blocks.iter().flatten().count() >= 10, "the README's examples: {blocks:?}");
    assert!(blocks.iter().flatten().any(|e| e.background), "some examples start servers: {blocks:?}");
    let dir = temp_dir("readme");
    let work = dir.join("work");
    std::fs::create_dir_all(&work).expect("a working directory");
    // The server the gateway examples run: any stdio MCP server will do.
    let server_py = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/gateway/stdio_server.py");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    // A Redis as tether asks for by default: every write on disk before it answers.
    let redis =
        runtime.block_on(tether_testkit::RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]));
    let (args, says) = quick_start(&readme);
    let child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(&args)
        .current_dir(&work)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the Quick start's command starts");
    let server = Process::reading(child);
    let listening = server.line(Duration::from_secs(20)).expect("the Quick start's server says where it listens");
    let url = listening.strip_prefix("listening on ").expect("a listening line");
    assert!(says.contains(url), "{args:?} listens on {url}, and the Quick start says: {says}");
    assert!(says.contains("./tether-data"), "{says}");
    assert!(work.join("tether-data").is_dir(), "the embedded store is in ./tether-data");
    let bin = Path::new(env!("CARGO_BIN_EXE_tether")).parent().expect("the binary's directory");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    // Each block runs in a directory of its own (a gateway's embedded store is in
    // ./tether-data, as the server's is), where `server.py` is a stdio MCP server.
    let in_block = |mut command: Command, block: &Path| {
        command.current_dir(block).env("PATH", &path).env("REDIS_URL", &redis.url).env_remove("RUST_LOG");
        command
    };
    for (n, block) in blocks.iter().enumerate() {
        let here = work.join(format!("block-{n}"));
        std::fs::create_dir_all(&here).expect("a directory for the block");
        std::fs::copy(&server_py, here.join("server.py")).expect("a stdio server for the gateway examples");
        let mut started = Vec::new();
        for example in block {
            if example.background {
                let mut sh = Command::new("sh");
                sh.args(["-c", &format!("exec {}", example.command)]);
                let child = in_block(sh, &here).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("sh runs");
                let server = Process::reading(child);
                let first = server.line(Duration::from_secs(30));
                assert!(
                    first.as_deref().is_some_and(|l| l.starts_with("listening on ")),
                    "{}: {first:?}",
                    example.command
                );
                started.push(server);
                continue;
            }
            // A gateway's first session may start its child from a registry (npx).
            let mut sh = Command::new("timeout");
            sh.args(["120", "sh", "-c", &example.command]);
            let output = in_block(sh, &here).output().expect("sh runs");
            assert_eq!(
                output.status.code(),
                Some(example.want),
                "{}\nstdout: {}\nstderr: {}",
                example.command,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        started.into_iter().for_each(stop);
    }
    stop(server);
    drop(redis);
    let _ = std::fs::remove_dir_all(&dir);
}
