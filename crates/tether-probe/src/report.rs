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
        let mut out = format!("tether probe {} ({} requests)\n", self.target, self.requests);
        for check in &self.checks {
            out.push_str(&format!("{:<5} {:<28} {}\n", check.verdict.as_str(), check.id, check.title));
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
}
