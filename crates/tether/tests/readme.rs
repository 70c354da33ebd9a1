//! The README's examples, run exactly as written. The Quick start's first command starts the
//! server (the `tether` just built stands for `cargo run --release -p tether --`), in a directory
//! of its own: it must listen where its comment says, with its embedded store in
//! `./tether-data`. Then every command of a fenced `sh` block the README marks as run (an HTML
//! comment naming this file just before the fence) runs against it with `sh -c`, with that
//! `tether` first on `PATH`, and must exit as its comment says (`# exit N`), or 0.

mod common;

use std::io::{BufRead, BufReader};
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

/// The commands of every marked block, with the exit status each must end with.
fn marked_commands(readme: &str) -> Vec<(String, i32)> {
    let mut commands = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if !line.starts_with(MARK) {
            continue;
        }
        assert_eq!(lines.next(), Some("```sh"), "a marked block is a fenced sh block right after its mark");
        for command in lines.by_ref().take_while(|l| *l != "```") {
            let command = command.trim();
            if command.is_empty() || command.starts_with('#') {
                continue;
            }
            let want = command
                .split_once("# exit ")
                .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
                .unwrap_or(0);
            commands.push((command.to_owned(), want));
        }
    }
    commands
}

#[test]
fn the_readmes_examples_run_as_written() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).expect("README");
    let commands = marked_commands(&readme);
    assert!(commands.len() >= 5, "the README's examples: {commands:?}");
    let dir = temp_dir("readme");
    let work = dir.join("work");
    std::fs::create_dir_all(&work).expect("a working directory");
    let (args, says) = quick_start(&readme);
    let mut child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(&args)
        .current_dir(&work)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the Quick start's command starts");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let server = Process { child, lines };
    let listening = server.line(Duration::from_secs(20)).expect("the Quick start's server says where it listens");
    let url = listening.strip_prefix("listening on ").expect("a listening line");
    assert!(says.contains(url), "{args:?} listens on {url}, and the Quick start says: {says}");
    assert!(says.contains("./tether-data"), "{says}");
    assert!(work.join("tether-data").is_dir(), "the embedded store is in ./tether-data");
    let bin = Path::new(env!("CARGO_BIN_EXE_tether")).parent().expect("the binary's directory");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    for (command, want) in &commands {
        let output = Command::new("timeout")
            .args(["60", "sh", "-c", command])
            .current_dir(&work)
            .env("PATH", &path)
            .env_remove("RUST_LOG")
            .output()
            .expect("sh runs");
        assert_eq!(
            output.status.code(),
            Some(*want),
            "{command}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
