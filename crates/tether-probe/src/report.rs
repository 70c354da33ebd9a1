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
}

/// Everything one probe run found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The server probed.
    pub target: String,
    /// Requests the probe sent.
    pub requests: u32,
    /// The checks, in the order they ran.
    pub checks: Vec<Check>,
}

impl Report {
    /// Whether any check failed (the probe's exit status 2).
    pub fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.verdict == Verdict::Fail)
    }

    /// JSON with a stable shape: `{target, requests, checks: [{id, title, verdict, evidence, signature?}]}`.
    pub fn to_json(&self) -> String {
        // Strings, numbers and enums only: serialization cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
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
        let mut out = format!("tether probe {} ({} requests)\n", self.target, self.requests);
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
        let count = |v| self.checks.iter().filter(|c| c.verdict == v).count();
        out.push_str(&format!(
            "{} pass, {} warn, {} fail, {} n/a\n",
            count(Verdict::Pass),
            count(Verdict::Warn),
            count(Verdict::Fail),
            count(Verdict::NotApplicable)
        ));
        out
    }

    /// A Markdown table with the evidence of every check that did not pass.
    pub fn to_markdown(&self) -> String {
        let mut out = format!("# tether probe: {}\n\n| verdict | check | what |\n|---|---|---|\n", self.target);
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
             .sig{{margin:.2rem 0;font-style:italic}}ul{{margin:.2rem 0;padding-left:1.2rem}}</style></head>\n\
             <body><h1>tether probe</h1><p><code>{target}</code>: {requests} requests</p>\n<table>\n{rows}</table></body></html>\n",
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
