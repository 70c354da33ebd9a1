//! The README's examples, run exactly as written. Every command of a fenced `sh` block the README
//! marks as run (an HTML comment naming this file just before the fence) runs with `sh -c`, with
//! the `tether` just built first on `PATH`, in a directory of its own, against `tether serve` on
//! the README's default address (127.0.0.1:8808). It must exit as its comment says (`# exit N`),
//! or 0.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// What marks a block as run.
const MARK: &str = "<!-- run as written by crates/tether/tests/readme.rs";

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
    let (server, _) = serve(8808, &dir.join("data"), &["--store", "memory"]);
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
