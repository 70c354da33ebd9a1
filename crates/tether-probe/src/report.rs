//! Verdicts and how they are shown: a table for people, JSON for machines, Markdown for reports.

use serde::Serialize;

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The server behaves as a resumption-safe server must.
    Pass,
    /// Allowed by the spec, but a client cannot prove continuity with it.
    Warn,
    /// A defect: a client can lose, duplicate or wait forever.
    Fail,
    /// The check does not apply to this server.
    #[serde(rename = "n/a")]
    NotApplicable,
}

impl Verdict {
    /// `text` in this verdict's ANSI colour.
    pub fn paint(self, text: &str) -> String {
        let code = match self {
            Verdict::Pass => "32",
            Verdict::Warn => "33",
            Verdict::Fail => "1;31",
            Verdict::NotApplicable => "2",
        };
        format!("\x1b[{code}m{text}\x1b[0m")
    }

    /// The verdict as printed.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
            Verdict::NotApplicable => "n/a",
        }
    }
}

/// One check's result, with what was seen.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Stable identifier, e.g. `unknown-session-404`.
    pub id: &'static str,
    /// What the check looks at.
    pub title: &'static str,
    /// The outcome.
    pub verdict: Verdict,
    /// Requests sent and what came back.
    pub evidence: Vec<String>,
    /// For failures: the seed failure signature it matches, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<&'static str>,
    /// For a resume check: what was sent and what came back, drawn in the HTML report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<ResumeTrace>,
}

/// What a resume check saw: the reference call's notifications, how many arrived before the
/// stream was dropped, and what came back after the resume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResumeTrace {
    /// How many notifications the reference call sent.
    pub sent: usize,
    /// How many of them arrived before the drop.
    pub before_drop: usize,
    /// Each notification that came after the resume, in order: the position (from 0) of the
    /// reference notification it equals, or `None` for one the reference never sent.
    pub after: Vec<Option<usize>>,
}

impl ResumeTrace {
    /// Sent notifications due after the drop that never came back.
    pub fn gaps(&self) -> Vec<usize> {
        (self.before_drop..self.sent).filter(|i| !self.after.contains(&Some(*i))).collect()
    }

    /// Positions in `after` of notifications that came back though they were delivered already
    /// (before the drop, or earlier in the resume), or that the reference never sent.
    pub fn extra(&self) -> Vec<usize> {
        let mut seen = std::collections::HashSet::new();
        self.after
            .iter()
            .enumerate()
            .filter(|(_, came)| match came {
                Some(i) => *i < self.before_drop || !seen.insert(*i),
                None => true,
            })
            .map(|(at, _)| at)
            .collect()
    }

    /// The picture: the sent notifications in a row (those before the drop grey, those that came
    /// back green, those that never did red), and what came back after the resume below them
    /// (green, or orange for a duplicate or a stranger).
    pub fn to_svg(&self) -> String {
        const CELL: usize = 14;
        const LEFT: usize = 110;
        let (gaps, extra) = (self.gaps(), self.extra());
        let columns = self.sent.max(self.after.len()).max(1);
        let width = LEFT + columns * (CELL + 2) + 10;
        let cell = |x: usize, y: usize, class: &str, title: String| {
            format!(
                "<rect x={} y={y} width={CELL} height={CELL} class={class}><title>{}</title></rect>",
                LEFT + x * (CELL + 2),
                escape(&title)
            )
        };
        let mut out = format!(
            "<svg class=trace xmlns=\"http://www.w3.org/2000/svg\" width={width} height=74 role=img \
             aria-label=\"{} sent, {} before the drop, {} came back after the resume; {} lost, {} extra\">\
             <text x=0 y=12>sent</text><text x=0 y=42>after resume</text>",
            self.sent,
            self.before_drop,
            self.after.len(),
            gaps.len(),
            extra.len()
        );
        for i in 0..self.sent {
            let (class, what) = if i < self.before_drop {
                ("before", "arrived before the drop")
            } else if gaps.contains(&i) {
                ("gap", "never came back: lost")
            } else {
                ("back", "came back after the resume")
            };
            out.push_str(&cell(i, 1, class, format!("notification {}: {what}", i + 1)));
        }
        for (at, came) in self.after.iter().enumerate() {
            let class = if extra.contains(&at) { "dup" } else { "back" };
            let title = match came {
                Some(i) if class == "dup" => format!("notification {} again: a duplicate", i + 1),
                Some(i) => format!("notification {}", i + 1),
                None => "a notification the call never sent".to_owned(),
            };
            out.push_str(&cell(at, 31, class, title));
        }
        out.push_str(&format!("<text x={LEFT} y=68>{} lost, {} extra</text></svg>", gaps.len(), extra.len()));
        out
    }
}

/// What the server said of itself when the probe initialized a session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ServerIdentity {
    /// `serverInfo.name`, if it gave one.
    pub name: Option<String>,
    /// `serverInfo.version`, if it gave one.
    pub version: Option<String>,
    /// The protocol revision it answered with.
    pub protocol: String,
}

/// What a whole run concludes, and so the probe's exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Conclusion {
    /// Nothing failed, and a check of resumption itself passed (exit 0).
    Pass,
    /// A check failed (exit 2).
    Fail,
    /// Nothing failed, but resumption could not be tested, or no check of it passed: the server
    /// cannot be called safe to resume (exit 3).
    Inconclusive,
}

impl Conclusion {
    /// As printed at the top of a report.
    pub fn as_str(self) -> &'static str {
        match self {
            Conclusion::Pass => "PASS",
            Conclusion::Fail => "FAIL",
            Conclusion::Inconclusive => "INCONCLUSIVE",
        }
    }
}

/// How many checks ended each way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Checks that passed.
    pub pass: usize,
    /// Checks that warned.
    pub warn: usize,
    /// Checks that failed.
    pub fail: usize,
    /// Checks that did not apply.
    #[serde(rename = "n/a")]
    pub not_applicable: usize,
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} pass, {} warn, {} fail, {} n/a", self.pass, self.warn, self.fail, self.not_applicable)
    }
}

/// The checks that test resumption itself: one of them must pass for the run to pass.
const RESUMPTION: [&str; 5] =
    ["mid-stream-resume", "result-recoverable", "replica-resume", "restart", "evicted-cursor"];

/// Everything one probe run found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The server probed.
    pub target: String,
    /// What the server said of itself.
    pub server: ServerIdentity,
    /// The tether version that probed.
    pub tether: &'static str,
    /// When the probe ran (RFC 3339, UTC).
    pub date: String,
    /// Requests the probe sent.
    pub requests: u32,
    /// The checks, in the order they ran.
    pub checks: Vec<Check>,
}

impl Report {
    /// Whether any check failed.
    pub fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.verdict == Verdict::Fail)
    }

    /// How many checks ended each way.
    pub fn counts(&self) -> Counts {
        let count = |v| self.checks.iter().filter(|c| c.verdict == v).count();
        Counts {
            pass: count(Verdict::Pass),
            warn: count(Verdict::Warn),
            fail: count(Verdict::Fail),
            not_applicable: count(Verdict::NotApplicable),
        }
    }

    /// What the run concludes.
    pub fn conclusion(&self) -> Conclusion {
        if self.failed() {
            Conclusion::Fail
        } else if self.checks.iter().any(|c| RESUMPTION.contains(&c.id) && c.verdict == Verdict::Pass) {
            Conclusion::Pass
        } else {
            Conclusion::Inconclusive
        }
    }

    /// The one line a reader needs: the conclusion, why, and the counts.
    pub fn verdict_line(&self) -> String {
        let counts = self.counts();
        let why = match self.conclusion() {
            Conclusion::Pass => "resuming a stream here is safe".to_owned(),
            Conclusion::Fail => {
                let failed: Vec<&str> =
                    self.checks.iter().filter(|c| c.verdict == Verdict::Fail).map(|c| c.id).collect();
                format!("failed: {}", failed.join(", "))
            }
            Conclusion::Inconclusive
                if !self.checks.iter().any(|c| RESUMPTION.contains(&c.id) && c.verdict != Verdict::NotApplicable) =>
            {
                "resumption could not be tested (give --tool a tool that streams notifications)".to_owned()
            }
            Conclusion::Inconclusive => {
                "no check of resumption passed: a client cannot prove it resumed continuously".to_owned()
            }
        };
        format!("{}: {why} ({counts})", self.conclusion().as_str())
    }

    /// Who answered and who asked, when: `server NAME VERSION (protocol P), tether V, DATE`.
    pub fn identity_line(&self) -> String {
        let name = self.server.name.as_deref().unwrap_or("(unnamed)");
        let version = self.server.version.as_deref().map(|v| format!(" {v}")).unwrap_or_default();
        format!("server {name}{version} (protocol {}), tether {}, {}", self.server.protocol, self.tether, self.date)
    }

    /// JSON with a stable shape: `{conclusion, verdict, counts, target, server, tether, date,
    /// requests, checks: [{id, title, verdict, evidence, signature?}]}`.
    pub fn to_json(&self) -> String {
        // Strings, numbers and enums only: serialization cannot fail.
        let mut value = serde_json::to_value(self).unwrap_or_default();
        value["conclusion"] = serde_json::json!(self.conclusion());
        value["verdict"] = serde_json::json!(self.verdict_line());
        value["counts"] = serde_json::json!(self.counts());
        serde_json::to_string_pretty(&value).unwrap_or_default()
    }

    /// A plain-text table.
    pub fn to_table(&self) -> String {
        self.table(false)
    }

    /// The table with verdicts in ANSI colours, for a terminal.
    pub fn to_colour_table(&self) -> String {
        self.table(true)
    }

    fn table(&self, colour: bool) -> String {
        let verdict = self.verdict_line();
        let verdict = match (colour, self.conclusion()) {
            (false, _) => verdict,
            (true, Conclusion::Pass) => Verdict::Pass.paint(&verdict),
            (true, Conclusion::Fail) => Verdict::Fail.paint(&verdict),
            (true, Conclusion::Inconclusive) => Verdict::Warn.paint(&verdict),
        };
        let mut out =
            format!("{verdict}\ntether probe {} ({} requests)\n{}\n", self.target, self.requests, self.identity_line());
        for check in &self.checks {
            let verdict = format!("{:<5}", check.verdict.as_str());
            let verdict = if colour { check.verdict.paint(&verdict) } else { verdict };
            out.push_str(&format!("{verdict} {:<28} {}\n", check.id, check.title));
            if check.verdict != Verdict::Pass {
                if let Some(signature) = check.signature {
                    out.push_str(&format!("      signature: {signature}\n"));
                }
                for line in &check.evidence {
                    out.push_str(&format!("      {line}\n"));
                }
            }
        }
        out.push_str(&format!("{}\n", self.counts()));
        out
    }

    /// A Markdown table with the evidence of every check that did not pass.
    pub fn to_markdown(&self) -> String {
        let mut out = format!(
            "# tether probe: {}\n\n**{}**\n\n{}\n\n| verdict | check | what |\n|---|---|---|\n",
            self.target,
            self.verdict_line(),
            self.identity_line()
        );
        for check in &self.checks {
            out.push_str(&format!("| {} | `{}` | {} |\n", check.verdict.as_str(), check.id, check.title));
        }
        for check in self.checks.iter().filter(|c| c.verdict != Verdict::Pass) {
            out.push_str(&format!("\n## `{}`: {}\n\n", check.id, check.verdict.as_str()));
            if let Some(signature) = check.signature {
                out.push_str(&format!("Signature: {signature}\n\n"));
            }
            for line in &check.evidence {
                out.push_str(&format!("- {}\n", line.replace('|', "\\|")));
            }
        }
        out
    }

    /// One self-contained HTML page (inline style, no scripts) a person can read and share.
    pub fn to_html(&self) -> String {
        let mut rows = String::new();
        for check in &self.checks {
            let verdict = check.verdict.as_str();
            let class = if check.verdict == Verdict::NotApplicable { "na" } else { verdict };
            let mut detail = String::new();
            if let Some(signature) = check.signature {
                detail.push_str(&format!("<p class=sig>{}</p>", escape(signature)));
            }
            if let Some(trace) = &check.trace {
                detail.push_str(&trace.to_svg());
            }
            if check.verdict != Verdict::Pass {
                detail.push_str("<ul>");
                for line in &check.evidence {
                    detail.push_str(&format!("<li><code>{}</code></li>", escape(line)));
                }
                detail.push_str("</ul>");
            }
            rows.push_str(&format!(
                "<tr><td class={class}>{verdict}</td><td><code>{}</code></td><td>{}{detail}</td></tr>\n",
                escape(check.id),
                escape(check.title)
            ));
        }
        format!(
            "<!doctype html>\n<html lang=en><head><meta charset=utf-8><title>tether probe: {target}</title>\n\
             <style>body{{font:15px/1.4 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}}\
             table{{border-collapse:collapse;width:100%}}td{{border-top:1px solid #ddd;padding:.4rem;vertical-align:top}}\
             .pass{{color:#186a3b}}.warn{{color:#9a6700}}.fail{{color:#b00020;font-weight:bold}}.na{{color:#777}}\
             .sig{{margin:.2rem 0;font-style:italic}}ul{{margin:.2rem 0;padding-left:1.2rem}}\
             .verdict{{font-size:1.3rem;padding:.6rem;border:2px solid currentColor}}\
             svg.trace{{display:block;margin:.3rem 0;font-size:11px}}.trace .before{{fill:#bbb}}\
             .trace .back{{fill:#2e7d32}}.trace .gap{{fill:#c62828}}.trace .dup{{fill:#ef6c00}}</style></head>\n\
             <body><h1>tether probe</h1><p class=\"verdict {class}\" id=verdict>{verdict}</p>\n\
             <p><code>{target}</code>: {requests} requests<br>{identity}</p>\n<table>\n{rows}</table></body></html>\n",
            class = match self.conclusion() {
                Conclusion::Pass => "pass",
                Conclusion::Fail => "fail",
                Conclusion::Inconclusive => "warn",
            },
            verdict = escape(&self.verdict_line()),
            identity = escape(&self.identity_line()),
            target = escape(&self.target),
            requests = self.requests,
        )
    }
}

/// Escapes text for HTML element content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resume_trace_marks_what_was_lost_and_what_came_twice() {
        // Six sent, two before the drop; after the resume: the second again, the third, the fifth
        // (the fourth is lost), the sixth, and one the call never sent.
        let trace = ResumeTrace { sent: 6, before_drop: 2, after: vec![Some(1), Some(2), Some(4), Some(5), None] };
        assert_eq!(trace.gaps(), [3]);
        assert_eq!(trace.extra(), [0, 4]);
        let svg = trace.to_svg();
        assert_eq!(svg.matches("class=before").count(), 2);
        assert_eq!(svg.matches("class=gap").count(), 1);
        assert_eq!(svg.matches("class=dup").count(), 2);
        assert!(svg.contains("1 lost, 2 extra"), "{svg}");
        let exact = ResumeTrace { sent: 3, before_drop: 1, after: vec![Some(1), Some(2)] };
        assert!(exact.gaps().is_empty() && exact.extra().is_empty());
    }
}
