//! `tether probe` against `tether serve` processes: every check passes, including a kill -9
//! restart (`--restart-cmd`) on the embedded store and a switch between two replicas on Redis.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;
use tether_testkit::RedisServer;

/// A script that (re)starts `tether serve` on `port` in the background, killing the previous one
/// with SIGKILL first; it records the server's pid so the test can stop it.
fn restart_script(dir: &Path, port: u16, extra: &str) -> String {
    let script = dir.join("restart.sh");
    let text = format!(
        "#!/bin/sh\nset -e\ncd '{dir}'\nif [ -f pid ]; then kill -9 \"$(cat pid)\" 2>/dev/null || true; sleep 0.3; fi\n\
         '{bin}' serve --listen 127.0.0.1:{port} --data-dir data {extra} >/dev/null 2>&1 &\necho $! > pid\n",
        dir = dir.display(),
        bin = env!("CARGO_BIN_EXE_tether"),
    );
    std::fs::write(&script, text).expect("write script");
    format!("sh '{}'", script.display())
}

/// Stops the server the script started last.
struct Started(std::path::PathBuf);

impl Drop for Started {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.0.join("pid")) {
            let _ = Command::new("kill").arg("-9").arg(pid.trim()).status();
        }
    }
}

fn probe(args: &[&str]) -> (Option<i32>, Value) {
    let output = Command::new(env!("CARGO_BIN_EXE_tether"))
        .arg("probe")
        .args(args)
        .args(["--format", "json"])
        .output()
        .expect("run tether probe");
    let report = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("JSON report ({e}): {}", String::from_utf8_lossy(&output.stderr)));
    (output.status.code(), report)
}

fn verdicts(report: &Value) -> Vec<(String, String)> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| (c["id"].as_str().unwrap_or("").to_owned(), c["verdict"].as_str().unwrap_or("").to_owned()))
        .collect()
}

fn verdict(report: &Value, id: &str) -> String {
    verdicts(report).into_iter().find(|(c, _)| c == id).map(|(_, v)| v).unwrap_or_else(|| panic!("no {id}: {report}"))
}

fn evidence(report: &Value, id: &str) -> String {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["id"] == id)
        .map(|c| c["evidence"].to_string())
        .unwrap_or_default()
}

fn wait_for_port(port: u16) {
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("server on {port} did not start");
}

/// The pid the restart script recorded last.
fn recorded_pid(dir: &Path) -> u32 {
    std::fs::read_to_string(dir.join("pid")).expect("pid file").trim().parse().expect("a pid")
}

/// Whether process `pid` still runs (a zombie waiting to be reaped does not).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .is_ok_and(|status| !status.lines().any(|l| l.starts_with("State:") && l.contains('Z')))
}

/// Starts `tether serve` (with `extra` flags) through a restart script, probes it (with `args`)
/// with that script as `--restart-cmd`, stops the server and returns the probe's exit status and
/// report, after checking that the restart really replaced the process.
fn probe_across_a_restart(name: &str, extra: &str, args: &[&str]) -> (Option<i32>, Value) {
    let dir = temp_dir(name);
    let port = free_port();
    let command = restart_script(&dir, port, extra);
    let started = Started(dir.clone());
    assert!(Command::new("sh").arg("-c").arg(&command).status().expect("start").success());
    wait_for_port(port);
    let first = recorded_pid(&dir);
    let url = format!("http://127.0.0.1:{port}/mcp");
    let outcome = probe(&[&[url.as_str(), "--restart-cmd", &command], args].concat());
    let second = recorded_pid(&dir);
    assert_ne!(first, second, "the probe restarted the server");
    assert!(!running(first), "the first server (pid {first}) was killed");
    assert!(running(second), "the restarted server (pid {second}) answered the probe");
    drop(started);
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

#[test]
fn embedded_store_survives_a_kill_9_restart_with_continuous_history() {
    let evicting = ["--evict-args", r#"{"to": 40}"#];
    let (code, report) = probe_across_a_restart("probe-restart", "--max-events-per-stream 10", &evicting);
    assert_eq!(code, Some(0), "{report:#}");
    assert!(verdicts(&report).iter().all(|(_, v)| v == "pass"), "{report:#}");
    assert!(evidence(&report, "restart").contains("continuous history"), "{report:#}");
}

#[test]
fn memory_store_restart_answers_404() {
    let (code, report) = probe_across_a_restart("probe-restart-memory", "--store memory", &[]);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(verdict(&report, "restart"), "pass");
    assert!(evidence(&report, "restart").contains("HTTP 404"), "{report:#}");
}

#[test]
fn redis_replicas_resume_each_other_s_calls_exactly() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let redis = runtime.block_on(RedisServer::start());
    let dir = temp_dir("probe-replicas");
    let (a, b) = (free_port(), free_port());
    let store = ["--store", "redis", "--redis-url", &redis.url, "--redis-durability", "none"];
    let (_first, url_a) = serve(a, &dir.join("a"), &store);
    let (_second, url_b) = serve(b, &dir.join("b"), &store);
    let (code, report) = probe(&[&url_a, "--replica", &url_b]);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(verdict(&report, "replica-resume"), "pass", "{report:#}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn memory_replicas_without_shared_history_are_refused_explicitly() {
    let dir = temp_dir("probe-replicas-memory");
    let (a, b) = (free_port(), free_port());
    let (_first, url_a) = serve(a, &dir.join("a"), &["--store", "memory"]);
    let (_second, url_b) = serve(b, &dir.join("b"), &["--store", "memory"]);
    let (code, report) = probe(&[&url_a, "--replica", &url_b]);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(verdict(&report, "replica-resume"), "warn", "{report:#}");
    assert!(evidence(&report, "replica-resume").contains("HTTP 404"), "{report:#}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The verdict at a glance: a conclusion with counts and the server's identity at the top of
/// every report, and an exit status of its own when resumption could not be tested (a tool that
/// streams nothing): 3, not the 0 of a pass.
#[test]
fn a_probe_that_could_not_test_resumption_is_inconclusive_not_a_pass() {
    let dir = temp_dir("probe-inconclusive");
    let (_server, url) = serve(free_port(), &dir, &["--store", "memory"]);
    let (code, report) = probe(&[&url, "--tool", "sleep", "--args", r#"{"ms": 10}"#]);
    assert_eq!(code, Some(3), "{report:#}");
    assert_eq!(report["conclusion"], "inconclusive", "{report:#}");
    assert!(report["verdict"].as_str().is_some_and(|v| v.starts_with("INCONCLUSIVE: ")), "{report:#}");
    assert_eq!(report["counts"]["fail"], 0);
    assert_eq!(report["server"]["name"], "tether");
    assert_eq!(report["server"]["protocol"], "2025-11-25");
    assert_eq!(report["tether"], env!("CARGO_PKG_VERSION"));
    let (code, passing) = probe(&[&url]);
    assert_eq!((code, passing["conclusion"].as_str()), (Some(0), Some("pass")), "{passing:#}");
    let counts = &passing["counts"];
    let checks = passing["checks"].as_array().map_or(0, Vec::len) as u64;
    let counted: u64 = ["pass", "warn", "fail", "n/a"].iter().filter_map(|k| counts[*k].as_u64()).sum();
    assert_eq!(counted, checks, "{counts}");
    for format in ["table", "markdown", "html"] {
        let output = Command::new(env!("CARGO_BIN_EXE_tether"))
            .args(["probe", &url, "--format", format])
            .output()
            .expect("run tether probe");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(text.contains("PASS: resuming a stream here is safe"), "{format}: {text}");
        assert!(text.contains(&format!("tether {}", env!("CARGO_PKG_VERSION"))), "{format}: {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The HTML report as a browser shows it: headless Chromium renders it (its screenshot is kept
/// in the test's target directory, `probe-report.png`), and the rendered page carries the verdict
/// and the picture of the resume (nothing lost, nothing extra against `tether serve`).
#[test]
fn the_html_report_renders_its_verdict_and_the_resume_in_a_browser() {
    let dir = temp_dir("probe-html");
    let (_server, url) = serve(free_port(), &dir.join("data"), &["--store", "memory"]);
    let report = dir.join("report.html");
    let status = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["probe", &url, "--format", "html", "--out", report.to_str().expect("utf-8")])
        .status()
        .expect("run tether probe");
    assert_eq!(status.code(), Some(0));
    let page = format!("file://{}", report.display());
    let chromium = |extra: &[&str]| {
        Command::new("timeout")
            .args(["60", "chromium", "--headless", "--no-sandbox", "--disable-gpu"])
            .args(extra)
            .arg(&page)
            .output()
            .expect("chromium (Debian's chromium; scripts/test installs it)")
    };
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("probe-report.png");
    let _ = std::fs::remove_file(&shot);
    let shown = chromium(&[&format!("--screenshot={}", shot.display()), "--window-size=1200,1600"]);
    let size = std::fs::metadata(&shot).map_or(0, |m| m.len());
    assert!(size > 10_000, "a screenshot of the page ({size} bytes): {}", String::from_utf8_lossy(&shown.stderr));
    let dom = String::from_utf8_lossy(&chromium(&["--dump-dom"]).stdout).into_owned();
    let verdict = dom.split("id=\"verdict\">").nth(1).and_then(|rest| rest.split('<').next()).unwrap_or_default();
    assert!(verdict.starts_with("PASS: resuming a stream here is safe"), "the rendered verdict: {verdict:?}");
    assert!(dom.contains("<svg class=\"trace\""), "the resume's picture is in the page");
    assert!(dom.contains("0 lost, 0 extra"), "nothing lost, nothing extra");
    let _ = std::fs::remove_dir_all(&dir);
}
