//! `tether bench` end to end against the targets it can always start (tether on the memory
//! store and the raw baseline), with the quick sizes: every scenario measured, the report and
//! its plots (latency over time for the sustained scenarios) written, the CPU a call cost the
//! server and the bench, and a target whose program is missing reported, not fatal.

mod common;

use std::process::Command;

#[test]
fn bench_measures_every_scenario_and_writes_the_report() {
    let out = common::temp_dir("bench");
    let output = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["bench", "--quick", "--runs", "1", "--duration", "1s", "--sustained", "1s"])
        .args(["--sessions", "2", "--concurrency", "2"])
        .args(["--target", "tether-memory", "--target", "raw", "--target", "rmcp", "--out"])
        .arg(&out)
        .env_remove("TETHER_BENCH_RMCP")
        .output()
        .expect("run tether bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report_path = std::fs::read_dir(&out)
        .expect("out dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "md"))
        .expect("a report");
    let report = std::fs::read_to_string(&report_path).expect("report");
    let scenarios = ["tool-call", "tool-call-json", "stream", "resume", "sessions", "fanout", "sustained"];
    for scenario in scenarios.into_iter().chain(["sustained-sessions", "sustained-single"]) {
        let section = report.split(&format!("\n## {scenario}\n")).nth(1).expect(scenario);
        let section = section.split("\n## ").next().unwrap_or_default();
        for target in ["tether-memory", "raw"] {
            let row = section.lines().find(|l| l.starts_with(&format!("| {target} |"))).expect(target);
            assert!(!row.contains("failed") && !row.contains("unsupported"), "{scenario}: {row}");
            let first = row.split('|').nth(2).expect("a figure").trim();
            assert!(first.parse::<f64>().is_ok_and(|v| v > 0.0), "{scenario} {target}: {row}");
        }
        let rmcp = section.lines().find(|l| l.starts_with("| rmcp |")).expect("rmcp row");
        assert!(rmcp.contains("no rmcp server built"), "{rmcp}");
    }
    // The sustained table says what each call cost the server and the bench, from `/proc`.
    let sustained = report.split("\n## sustained\n").nth(1).expect("sustained");
    let header = sustained.lines().find(|l| l.starts_with("| target |")).expect("header");
    let columns: Vec<&str> = header.split('|').map(str::trim).collect();
    for name in ["server CPU µs/call", "client CPU µs/call"] {
        let column = columns.iter().position(|c| *c == name).expect(name);
        for target in ["tether-memory", "raw"] {
            let row = sustained.lines().find(|l| l.starts_with(&format!("| {target} |"))).expect(target);
            let figure = row.split('|').nth(column).map(str::trim).unwrap_or_default();
            assert!(figure.parse::<f64>().is_ok_and(|v| v > 0.0), "{name} of {target}: {row}");
        }
    }
    // Every fan-out message reached every stream.
    let fanout = report.split("\n## fanout\n").nth(1).expect("fanout");
    let row = fanout.lines().find(|l| l.starts_with("| tether-memory |")).expect("row");
    assert_eq!(row.split('|').nth(2).map(str::trim), Some("100"), "{row}");
    let plots = report_path.with_extension("");
    let over_time = ["sustained.svg", "sustained-sessions.svg", "sustained-single.svg"];
    for plot in ["throughput.svg", "latency.svg", "resume.svg"].into_iter().chain(over_time) {
        let svg = std::fs::read_to_string(plots.join(plot)).expect(plot);
        assert!(svg.starts_with("<svg") && svg.contains("tether-memory"), "{plot}");
    }
    let _ = std::fs::remove_dir_all(&out);
}
