//! The results of a run: medians per (target, scenario), the goals, a Markdown report and SVG
//! plots.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use hdrhistogram::Histogram;
use plotters::prelude::*;

use crate::BenchError;
use crate::scenario::{Measurement, Outcome, SERVER_CPU, Scenario};
use crate::target::Target;

/// Every outcome of a run, grouped by target and scenario.
#[derive(Debug, Clone)]
pub struct Results {
    command: String,
    outcomes: BTreeMap<(Scenario, Target), Vec<Outcome>>,
}

/// The column ratios are taken on and the reference target, per scenario.
fn headline(scenario: Scenario) -> &'static str {
    match scenario {
        Scenario::ToolCall
        | Scenario::ToolCallJson
        | Scenario::Sustained
        | Scenario::SustainedSessions
        | Scenario::SustainedSingle => "calls/s",
        Scenario::Stream => "events/s",
        Scenario::Resume => "R=10000 ms",
        Scenario::Sessions => "sessions/s",
        Scenario::Fanout => "p50 ms",
    }
}

const REFERENCE: Target = Target::TetherMemory;

fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// A figure for a table cell: three significant digits, no exponent.
fn figure(value: f64) -> String {
    let magnitude = if value == 0.0 { 0 } else { value.abs().log10().floor() as i32 };
    let decimals = (2 - magnitude).clamp(0, 3) as usize;
    format!("{value:.decimals$}")
}

impl Results {
    /// No results yet, for a run started with `command`.
    pub fn new(command: String) -> Results {
        Results { command, outcomes: BTreeMap::new() }
    }

    /// Records one run's outcome.
    pub fn add(&mut self, target: Target, scenario: Scenario, outcome: Outcome) {
        self.outcomes.entry((scenario, target)).or_default().push(outcome);
    }

    fn measurements(&self, scenario: Scenario, target: Target) -> impl Iterator<Item = &Measurement> {
        self.outcomes.get(&(scenario, target)).into_iter().flatten().filter_map(|o| match o {
            Outcome::Measured(m) => Some(m),
            _ => None,
        })
    }

    /// The median over the runs of one figure.
    pub fn median(&self, scenario: Scenario, target: Target, metric: &str) -> Option<f64> {
        let values = self
            .measurements(scenario, target)
            .filter_map(|m| m.metrics.iter().find(|x| x.name == metric).map(|x| x.value))
            .collect();
        median(values)
    }

    /// The largest value of one figure over the runs (a maximum latency is not a median's).
    pub fn worst(&self, scenario: Scenario, target: Target, metric: &str) -> Option<f64> {
        self.measurements(scenario, target)
            .filter_map(|m| m.metrics.iter().find(|x| x.name == metric).map(|x| x.value))
            .reduce(f64::max)
    }

    fn targets(&self, scenario: Scenario) -> Vec<Target> {
        self.outcomes.keys().filter(|(s, _)| *s == scenario).map(|(_, t)| *t).collect()
    }

    fn scenarios(&self) -> Vec<Scenario> {
        let mut scenarios: Vec<Scenario> = self.outcomes.keys().map(|(s, _)| *s).collect();
        scenarios.dedup();
        scenarios
    }

    /// The goals of the bench and where this run stands on each: `(goal, measured, met)`.
    pub fn goals(&self) -> Vec<(String, String, Option<bool>)> {
        let m = |s, t, metric| self.median(s, t, metric);
        let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
        let mut goals = Vec::new();
        let mut goal = |text: &str, value: Option<f64>, show: &dyn Fn(f64) -> String, met: &dyn Fn(f64) -> bool| {
            goals.push((text.to_owned(), value.map_or("not measured".into(), show), value.map(met)));
        };
        let times = |v: f64| format!("{v:.2}×");
        let tool = Scenario::ToolCall;
        goal(
            "tool-call: tether (memory) ≥ 2× rmcp",
            ratio(m(tool, Target::TetherMemory, "calls/s"), m(tool, Target::Rmcp, "calls/s")),
            &times,
            &|r| r >= 2.0,
        );
        goal(
            "tool-call: tether (embedded) ≥ rmcp",
            ratio(m(tool, Target::TetherEmbedded, "calls/s"), m(tool, Target::Rmcp, "calls/s")),
            &times,
            &|r| r >= 1.0,
        );
        goal(
            "tool-call: tether (memory) ≥ 70% of raw",
            ratio(m(tool, Target::TetherMemory, "calls/s"), m(tool, Target::Raw, "calls/s")),
            &|r| format!("{:.0}%", r * 100.0),
            &|r| r >= 0.7,
        );
        goal(
            "stream: tether (memory) ≥ 60% of raw's events/s",
            ratio(m(Scenario::Stream, Target::TetherMemory, "events/s"), m(Scenario::Stream, Target::Raw, "events/s")),
            &|r| format!("{:.0}%", r * 100.0),
            &|r| r >= 0.6,
        );
        goal(
            "resume: 10,000 retained events replayed in < 5 ms (memory)",
            m(Scenario::Resume, Target::TetherMemory, "R=10000 ms"),
            &|v| format!("{v:.2} ms"),
            &|v| v < 5.0,
        );
        goal(
            "resume: time no worse than linear in R (t(100,000) / t(10,000) ≤ 10, memory)",
            ratio(
                m(Scenario::Resume, Target::TetherMemory, "R=100000 ms"),
                m(Scenario::Resume, Target::TetherMemory, "R=10000 ms"),
            ),
            &|r| format!("{r:.1}"),
            &|r| r <= 10.0,
        );
        for target in [Target::TetherMemory, Target::TetherEmbedded, Target::TetherRedis] {
            goal(
                &format!("sessions: ≤ 4 KiB resident per idle session ({})", target.name()),
                m(Scenario::Sessions, target, "KiB/session"),
                &|v| format!("{v:.2} KiB"),
                &|v| v <= 4.0,
            );
        }
        let (sustained, single) = (Scenario::Sustained, Scenario::SustainedSingle);
        let memory_p99 = m(sustained, Target::TetherMemory, "p99 ms");
        goal(
            "sustained: tether (memory) p99 ≤ 2× raw's and ≤ 5 ms",
            ratio(memory_p99, m(sustained, Target::Raw, "p99 ms")),
            &|r| format!("{r:.2}× raw ({:.2} ms)", memory_p99.unwrap_or(f64::NAN)),
            &|r| r <= 2.0 && memory_p99.is_some_and(|ms| ms <= 5.0),
        );
        goal(
            "sustained: tether (memory) max ≤ 25 ms (slowest run)",
            self.worst(sustained, Target::TetherMemory, "max ms"),
            &|v| format!("{v:.1} ms"),
            &|v| v <= 25.0,
        );
        // Beside a throughput goal, what a call costs the server against the other target's: the
        // bench's load generator shares the cores, so where both are bound by the CPU the rates'
        // ratio follows the servers' costs.
        let cpu = |a: Target, b: Target| {
            ratio(m(sustained, a, SERVER_CPU), m(sustained, b, SERVER_CPU))
                .map_or(String::new(), |r| format!("; server CPU per call {r:.2}× {}'s", b.name()))
        };
        let memory_cpu = cpu(Target::TetherMemory, Target::Raw);
        goal(
            "sustained: tether (memory) ≥ 90% of raw's calls/s",
            ratio(m(sustained, Target::TetherMemory, "calls/s"), m(sustained, Target::Raw, "calls/s")),
            &|r| format!("{:.0}%{memory_cpu}", r * 100.0),
            &|r| r >= 0.9,
        );
        goal(
            "sustained-single: tether (memory) p99 ≤ 2× raw's",
            ratio(m(single, Target::TetherMemory, "p99 ms"), m(single, Target::Raw, "p99 ms")),
            &times,
            &|r| r <= 2.0,
        );
        let embedded_p99 = ratio(m(sustained, Target::TetherEmbedded, "p99 ms"), m(sustained, Target::Rmcp, "p99 ms"));
        let embedded_cpu = cpu(Target::TetherEmbedded, Target::Rmcp);
        goal(
            "sustained: tether (embedded) ≥ rmcp's calls/s, p99 ≤ 2× rmcp's",
            ratio(m(sustained, Target::TetherEmbedded, "calls/s"), m(sustained, Target::Rmcp, "calls/s")),
            &|r| format!("{r:.2}×, p99 {:.2}× rmcp's{embedded_cpu}", embedded_p99.unwrap_or(f64::NAN)),
            &|r| r >= 1.0 && embedded_p99.is_some_and(|p| p <= 2.0),
        );
        // Measured, with no goal set: what fronting a server with `tether gateway` costs.
        let through = ratio(m(tool, Target::GatewayRmcp, "calls/s"), m(tool, Target::Rmcp, "calls/s"));
        goals.push((
            "tool-call: rmcp through tether gateway (memory), calls/s against rmcp directly (measured, no goal)"
                .to_owned(),
            through.map_or("not measured".into(), |r| format!("{r:.2}×")),
            None,
        ));
        goals
    }

    /// The Markdown report.
    pub fn markdown(&self, date: &str, machine: &str, runs: usize) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# tether bench, {date}\n");
        let _ = writeln!(out, "```\n{}\n```\n", self.command);
        let _ = writeln!(
            out,
            "{machine}. Every figure is the median of {runs} run(s), each against a freshly started server on \
             loopback; the load generator shares the machine. Ratios are to `{}` in the same run: compare them, \
             not absolute figures, across runs.\n",
            REFERENCE.name()
        );
        let _ = writeln!(out, "## Goals\n\n| goal | measured | met |\n|---|---|---|");
        for (goal, measured, met) in self.goals() {
            let met = match met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "n/a",
            };
            let _ = writeln!(out, "| {goal} | {measured} | {met} |");
        }
        for scenario in self.scenarios() {
            let _ = writeln!(out, "\n## {}\n", scenario.name());
            let targets = self.targets(scenario);
            let mut columns: Vec<String> = Vec::new();
            for target in &targets {
                for m in self.measurements(scenario, *target) {
                    for metric in &m.metrics {
                        if !columns.contains(&metric.name) {
                            columns.push(metric.name.clone());
                        }
                    }
                }
            }
            let key = headline(scenario);
            let _ = writeln!(out, "| target | {} | {key} ÷ {}'s | notes |", columns.join(" | "), REFERENCE.name());
            let _ = writeln!(out, "|---|{}---|---|", "---|".repeat(columns.len()));
            let reference = self.median(scenario, REFERENCE, key);
            for target in targets {
                let cells: Vec<String> =
                    columns.iter().map(|c| self.median(scenario, target, c).map_or("–".into(), figure)).collect();
                let ratio = self
                    .median(scenario, target, key)
                    .zip(reference)
                    .map_or("–".into(), |(v, r)| format!("{:.2}", v / r));
                let _ = write!(out, "| {} | {} | {ratio} |", target.name(), cells.join(" | "));
                let notes: Vec<String> = self
                    .outcomes
                    .get(&(scenario, target))
                    .into_iter()
                    .flatten()
                    .filter_map(|o| match o {
                        Outcome::Unsupported(why) => Some(format!("unsupported: {why}")),
                        Outcome::Failed(why) => Some(format!("failed: {why}")),
                        Outcome::Measured(_) => None,
                    })
                    .collect();
                let _ = match notes.first() {
                    Some(first) => writeln!(out, " {} ({} of {runs} runs) |", first.replace('|', "/"), notes.len()),
                    None => writeln!(out, " |"),
                };
            }
        }
        let _ = writeln!(out, "\n## Plots\n\n![throughput](throughput.svg)\n\n![latency](latency.svg)");
        if self.measured(Scenario::Resume) {
            let _ = writeln!(out, "\n![resume](resume.svg)");
        }
        for scenario in self.scenarios().into_iter().filter(|s| Self::over_time(*s)) {
            let _ = writeln!(out, "\n![{0} over time]({0}.svg)", scenario.name());
        }
        out
    }

    /// Writes `<date>.md` and the plots (in `<date>/`) under `dir`; returns the report's path.
    pub fn write(&self, dir: &Path, date: &str, machine: &str, runs: usize) -> Result<PathBuf, BenchError> {
        let plots = dir.join(date);
        std::fs::create_dir_all(&plots).map_err(|source| BenchError::Write { path: plots.clone(), source })?;
        self.plot_throughput(&plots.join("throughput.svg"))?;
        self.plot_latency(&plots.join("latency.svg"))?;
        if self.measured(Scenario::Resume) {
            self.plot_resume(&plots.join("resume.svg"))?;
        }
        for scenario in self.scenarios().into_iter().filter(|s| Self::over_time(*s)) {
            self.plot_timeline(scenario, &plots.join(format!("{}.svg", scenario.name())))?;
        }
        let report = self.markdown(date, machine, runs).replace("](", &format!("]({date}/"));
        let path = dir.join(format!("{date}.md"));
        std::fs::write(&path, report).map_err(|source| BenchError::Write { path: path.clone(), source })?;
        Ok(path)
    }

    /// Whether any target has a measurement of `scenario`: a plot of nothing is not drawn.
    fn measured(&self, scenario: Scenario) -> bool {
        Target::ALL.into_iter().any(|target| self.measurements(scenario, target).next().is_some())
    }

    fn plot_throughput(&self, path: &Path) -> Result<(), BenchError> {
        // Only the series measured are drawn, and named in the legend.
        let scenarios: Vec<Scenario> = [Scenario::ToolCall, Scenario::ToolCallJson]
            .into_iter()
            .filter(|s| Target::ALL.into_iter().any(|t| self.median(*s, t, "calls/s").is_some()))
            .collect();
        let targets: Vec<Target> = Target::ALL
            .into_iter()
            .filter(|t| scenarios.iter().any(|s| self.median(*s, *t, "calls/s").is_some()))
            .collect();
        let top = targets
            .iter()
            .flat_map(|t| scenarios.iter().filter_map(|s| self.median(*s, *t, "calls/s")))
            .fold(1.0, f64::max);
        draw(path, |root| {
            let mut chart = ChartBuilder::on(root)
                .caption("tool calls per second", ("sans-serif", 20))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(-0.5f64..(targets.len() as f64 - 0.5), 0f64..top * 1.1)?;
            let names: Vec<&str> = targets.iter().map(|t| t.name()).collect();
            chart
                .configure_mesh()
                .x_labels(targets.len().max(1))
                .x_label_formatter(&|x| names.get(x.round() as usize).map_or(String::new(), |n| (*n).to_owned()))
                .y_label_formatter(&|y| format!("{y:.0}"))
                .y_desc("calls/s")
                .draw()?;
            for (offset, (scenario, colour)) in scenarios.iter().zip([BLUE, RED]).enumerate() {
                let bars = targets.iter().enumerate().filter_map(|(i, t)| {
                    let v = self.median(*scenario, *t, "calls/s")?;
                    let x = i as f64 - 0.35 + 0.35 * offset as f64;
                    Some(Rectangle::new([(x, 0.0), (x + 0.33, v)], colour.filled()))
                });
                chart
                    .draw_series(bars)?
                    .label(scenario.name())
                    .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled()));
            }
            chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw()?;
            Ok(())
        })
    }

    fn plot_latency(&self, path: &Path) -> Result<(), BenchError> {
        let mut curves = Vec::new();
        for target in Target::ALL {
            let mut merged: Option<Histogram<u64>> = None;
            for m in self.measurements(Scenario::ToolCall, target) {
                if let Some(h) = &m.latency_us {
                    match &mut merged {
                        Some(all) => drop(all.add(h)),
                        None => merged = Some(h.clone()),
                    }
                }
            }
            if let Some(h) = merged.filter(|h| !h.is_empty()) {
                // The percentile axis counts nines (-log10 of what is slower), so the tail is as
                // wide as the body: p90 at 1, p99 at 2, p99.9 at 3.
                let points: Vec<(f64, f64)> = (0..=TAIL_STEPS)
                    .map(|i| {
                        let nines = TAIL_NINES * f64::from(i) / f64::from(TAIL_STEPS);
                        let q = 1.0 - 10f64.powf(-nines);
                        ((h.value_at_quantile(q) as f64 / 1000.0).max(0.001), nines)
                    })
                    .collect();
                curves.push((target, points));
            }
        }
        let high = curves.iter().flat_map(|(_, p)| p.iter().map(|(x, _)| *x)).fold(1.0, f64::max);
        let low = curves.iter().flat_map(|(_, p)| p.iter().map(|(x, _)| *x)).fold(high, f64::min);
        draw(path, |root| {
            let mut chart = ChartBuilder::on(root)
                .caption("tool-call latency (CDF)", ("sans-serif", 20))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(50)
                .build_cartesian_2d((low * 0.9..high * 1.1).log_scale(), 0f64..TAIL_NINES)?;
            chart
                .configure_mesh()
                .x_desc("latency (ms, log)")
                .y_desc("percentile")
                .y_labels(TAIL_NINES as usize + 1)
                .y_label_formatter(&|nines| percentile_label(*nines))
                .draw()?;
            draw_curves(&mut chart, curves, SeriesLabelPosition::LowerRight)
        })
    }

    /// Whether the scenario's report has a latency-over-time plot.
    fn over_time(scenario: Scenario) -> bool {
        matches!(scenario, Scenario::Sustained | Scenario::SustainedSessions | Scenario::SustainedSingle)
    }

    /// The slowest call of every step over the measured time, per target, from the run with
    /// the largest maximum: a stall shows as a spike.
    fn plot_timeline(&self, scenario: Scenario, path: &Path) -> Result<(), BenchError> {
        let step = crate::scenario::TIMELINE_STEP.as_secs_f64();
        let mut curves = Vec::new();
        for target in Target::ALL {
            let slowest = self.measurements(scenario, target).max_by(|a, b| {
                let max = |m: &Measurement| m.timeline.iter().flatten().copied().fold(0.0, f64::max);
                max(a).total_cmp(&max(b))
            });
            let Some(run) = slowest else { continue };
            // A step in which no call started is drawn at the top: the calls of the step before
            // were stalled through it.
            let ceiling = run.timeline.iter().flatten().copied().fold(0.001, f64::max);
            let points: Vec<(f64, f64)> = run
                .timeline
                .iter()
                .enumerate()
                .map(|(i, ms)| (i as f64 * step, ms.unwrap_or(ceiling).max(0.001)))
                .collect();
            if !points.is_empty() {
                curves.push((target, points));
            }
        }
        let all = || curves.iter().flat_map(|(_, p)| p.iter().copied());
        let (x_high, y_high) = all().fold((step, 1.0), |(x, y), (px, py)| (f64::max(x, px), f64::max(y, py)));
        let y_low = all().fold(y_high, |y, (_, py)| f64::min(y, py));
        let caption = format!("{}: slowest call of every {} ms (slowest run)", scenario.name(), step * 1_000.0);
        draw(path, |root| {
            let mut chart = ChartBuilder::on(root)
                .caption(caption, ("sans-serif", 20))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d(0f64..x_high, (y_low * 0.8..y_high * 1.2).log_scale())?;
            chart.configure_mesh().x_desc("s").y_desc("ms (log)").draw()?;
            draw_curves(&mut chart, curves, SeriesLabelPosition::UpperRight)
        })
    }

    fn plot_resume(&self, path: &Path) -> Result<(), BenchError> {
        let mut curves = Vec::new();
        for target in Target::ALL {
            let runs: Vec<&Measurement> = self.measurements(Scenario::Resume, target).collect();
            let sizes: Vec<u64> = runs.first().map(|m| m.curve.iter().map(|(r, _)| *r).collect()).unwrap_or_default();
            let points: Vec<(f64, f64)> = sizes
                .iter()
                .filter_map(|r| {
                    self.median(Scenario::Resume, target, &format!("R={r} ms")).map(|ms| (*r as f64, ms.max(0.001)))
                })
                .collect();
            if !points.is_empty() {
                curves.push((target, points));
            }
        }
        let all = || curves.iter().flat_map(|(_, p)| p.iter().copied());
        let (x_high, y_high) = all().fold((10.0, 1.0), |(x, y), (px, py)| (f64::max(x, px), f64::max(y, py)));
        let y_low = all().fold(y_high, |y, (_, py)| f64::min(y, py));
        draw(path, |root| {
            let mut chart = ChartBuilder::on(root)
                .caption("resume: time to replay R retained events", ("sans-serif", 20))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d((1f64..x_high * 1.2).log_scale(), (y_low * 0.8..y_high * 1.2).log_scale())?;
            chart.configure_mesh().x_desc("R (log)").y_desc("ms (log)").draw()?;
            draw_curves(&mut chart, curves, SeriesLabelPosition::UpperLeft)
        })
    }
}

/// How far into the tail the latency CDF reaches: p99.99.
const TAIL_NINES: f64 = 4.0;
/// Points per curve of the latency CDF.
const TAIL_STEPS: u32 = 400;

/// The percentile at `nines` on the tail axis: 0 → p0, 1 → p90, 2 → p99, 3 → p99.9.
fn percentile_label(nines: f64) -> String {
    let percentile = 100.0 * (1.0 - 10f64.powf(-nines));
    let text = format!("p{percentile:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// One line per target, with a legend.
fn draw_curves<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    curves: Vec<(Target, Vec<(f64, f64)>)>,
    legend: SeriesLabelPosition,
) -> DrawResult
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for (i, (target, points)) in curves.into_iter().enumerate() {
        let colour = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points, colour.stroke_width(2)))?
            .label(target.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour.stroke_width(2)));
    }
    chart.configure_series_labels().position(legend).background_style(WHITE).border_style(BLACK).draw()?;
    Ok(())
}

fn draw(
    path: &Path,
    plot: impl FnOnce(&DrawingArea<SVGBackend<'_>, plotters::coord::Shift>) -> DrawResult,
) -> Result<(), BenchError> {
    let fail = |reason: String| BenchError::Plot { path: path.to_owned(), reason };
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    plot(&root).map_err(|e| fail(e.to_string()))?;
    root.present().map_err(|e| fail(e.to_string()))
}

/// Today's date (UTC) as `YYYY-MM-DD`, for the report's file name.
pub fn today() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    civil_date(secs / 86_400)
}

/// The date of a day count since 1970-01-01.
fn civil_date(days: u64) -> String {
    let (year, month, day) = tether_core::date::civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02}")
}

/// A one-line description of the machine: cores and CPU model.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cores} cores, {model}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Metric;

    #[test]
    fn a_plot_of_nothing_is_neither_written_nor_linked_and_the_tail_axis_counts_nines() {
        let mut results = Results::new("tether bench".into());
        let measured = Outcome::Measured(Measurement {
            metrics: vec![Metric { name: "calls/s".into(), value: 18_000.0 }],
            ..Default::default()
        });
        results.add(Target::TetherMemory, Scenario::ToolCall, measured);
        let dir = std::env::temp_dir().join(format!("tether-bench-plots-{}", std::process::id()));
        let report = results.write(&dir, "2026-01-01", "2 cores", 1).expect("written");
        let text = std::fs::read_to_string(&report).expect("the report");
        assert!(!text.contains("resume.svg"), "{text}");
        assert!(!dir.join("2026-01-01/resume.svg").exists());
        let throughput = std::fs::read_to_string(dir.join("2026-01-01/throughput.svg")).expect("the plot");
        let labels: Vec<&str> = throughput.lines().filter(|l| !l.starts_with('<')).collect();
        assert!(labels.contains(&"tool-call") && !labels.contains(&"tool-call-json"), "{labels:?}");
        assert!(labels.contains(&"18000") && !labels.iter().any(|l| l.ends_with(".0")), "whole calls/s: {labels:?}");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            [0.0, 1.0, 2.0, 3.0, 4.0].map(percentile_label),
            ["p0", "p90", "p99", "p99.9", "p99.99"].map(str::to_owned)
        );
    }

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil_date(0), "1970-01-01");
        assert_eq!(civil_date(20_423), "2025-12-01");
        assert_eq!(civil_date(11_016), "2000-02-29");
    }

    #[test]
    fn medians_and_ratios_reach_the_report() {
        let mut results = Results::new("tether bench".into());
        let measured = |v: f64| {
            Outcome::Measured(Measurement {
                metrics: vec![Metric { name: "calls/s".into(), value: v }],
                ..Default::default()
            })
        };
        for v in [100.0, 300.0, 200.0] {
            results.add(Target::TetherMemory, Scenario::ToolCall, measured(v));
        }
        results.add(Target::Rmcp, Scenario::ToolCall, measured(50.0));
        results.add(Target::Python, Scenario::ToolCall, Outcome::Failed("refused".into()));
        assert_eq!(results.median(Scenario::ToolCall, Target::TetherMemory, "calls/s"), Some(200.0));
        let goals = results.goals();
        assert_eq!(goals[0].1, "4.00×");
        assert_eq!(goals[0].2, Some(true));
        assert_eq!(goals[1].2, None);
        let report = results.markdown("2026-01-01", "2 cores", 3);
        assert!(report.contains("| rmcp | 50.0 | 0.25 | |"), "{report}");
        assert!(report.contains("failed: refused (1 of 3 runs)"), "{report}");
    }

    #[test]
    fn tail_goals_take_the_slowest_run_for_the_maximum() {
        let mut results = Results::new("tether bench".into());
        let measured = |p99: f64, max: f64, cpu: f64| {
            let metric = |name: &str, value| Metric { name: name.into(), value };
            Outcome::Measured(Measurement {
                metrics: vec![
                    metric("calls/s", 1_000.0),
                    metric("p99 ms", p99),
                    metric("max ms", max),
                    metric(SERVER_CPU, cpu),
                ],
                ..Default::default()
            })
        };
        for (p99, max) in [(3.0, 10.0), (3.0, 30.0), (3.0, 12.0)] {
            results.add(Target::TetherMemory, Scenario::Sustained, measured(p99, max, 30.0));
        }
        results.add(Target::Raw, Scenario::Sustained, measured(2.0, 5.0, 20.0));
        let goals = results.goals();
        let goal = |text: &str| goals.iter().find(|(g, _, _)| g.starts_with(text)).expect(text).clone();
        let (_, shown, met) = goal("sustained: tether (memory) p99");
        assert_eq!((shown.as_str(), met), ("1.50× raw (3.00 ms)", Some(true)));
        let (_, shown, met) = goal("sustained: tether (memory) max");
        assert_eq!((shown.as_str(), met), ("30.0 ms", Some(false)), "the median run's 12 ms would pass");
        let (_, shown, met) = goal("sustained: tether (memory) ≥ 90%");
        assert_eq!((shown.as_str(), met), ("100%; server CPU per call 1.50× raw's", Some(true)));
        let (_, shown, _) = goal("sustained: tether (embedded)");
        assert_eq!(shown, "not measured", "no CPU figure without the rates it explains");
        assert_eq!(goal("sustained-single").2, None, "not measured");
    }
}
