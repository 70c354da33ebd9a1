//! How `call`, `watch` and `task` print what happens: one JSON object per line for scripts, or
//! lines for a person (the default on a terminal): a progress bar driven by the server's progress
//! notifications, resumes and divergences in words, the result's text. The JSON line is made
//! first, always; the person's line is a view of it, so both say the same.

use std::io::{IsTerminal as _, Write as _};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::ValueEnum;
use serde_json::Value;

/// The shape of the client commands' output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Lines for a person (the default when standard output is a terminal).
    Human,
    /// One JSON object per line (the default otherwise): a stable interface for scripts.
    Json,
}

impl Format {
    /// `chosen`, or what suits where standard output goes.
    pub fn or_default(chosen: Option<Format>) -> Format {
        chosen.unwrap_or(if std::io::stdout().is_terminal() { Format::Human } else { Format::Json })
    }
}

struct Output {
    format: Format,
    /// Standard output is a terminal: the progress bar is redrawn in place.
    terminal: bool,
    /// Colours: on a terminal, unless `NO_COLOR` is set.
    colour: bool,
    /// A progress bar is drawn and the cursor is still on its line.
    bar_open: AtomicBool,
}

static OUTPUT: OnceLock<Output> = OnceLock::new();

/// Sets the output's format, once, before anything is printed (JSON if never set).
pub fn set(format: Format) {
    let terminal = std::io::stdout().is_terminal();
    let colour = terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let _ = OUTPUT.set(Output { format, terminal, colour, bar_open: AtomicBool::new(false) });
}

/// Whether a person reads the output.
pub fn human() -> bool {
    OUTPUT.get().is_some_and(|o| o.format == Format::Human)
}

/// Prints one event, as its format says.
pub fn print(line: &Value) {
    let Some(output) = OUTPUT.get().filter(|o| o.format == Format::Human) else {
        println!("{line}");
        return;
    };
    let mut out = std::io::stdout().lock();
    if let Some(bar) = progress_bar(line) {
        if output.terminal {
            let _ = write!(out, "\r\x1b[2K{bar}");
            output.bar_open.store(true, Ordering::Relaxed);
        } else {
            let _ = writeln!(out, "{bar}");
        }
        let _ = out.flush();
        return;
    }
    if output.bar_open.swap(false, Ordering::Relaxed) {
        let _ = writeln!(out);
    }
    for text in words(line, output.colour) {
        let _ = writeln!(out, "{text}");
    }
}

/// The bar a `notifications/progress` message draws: `[=====>    ] 5/10 message`.
fn progress_bar(line: &Value) -> Option<String> {
    let message = &line["message"];
    if line["event"] != "message" || message["method"] != "notifications/progress" {
        return None;
    }
    let params = &message["params"];
    let progress = params["progress"].as_f64()?;
    let said = params["message"].as_str().map(|m| format!(" {m}")).unwrap_or_default();
    Some(match params["total"].as_f64().filter(|t| *t > 0.0) {
        Some(total) => {
            const WIDTH: usize = 30;
            let filled = ((progress / total).clamp(0.0, 1.0) * WIDTH as f64).round() as usize;
            let head = if filled < WIDTH { ">" } else { "" };
            let rest = WIDTH.saturating_sub(filled + head.len());
            format!("[{}{head}{}] {}/{}{said}", "=".repeat(filled), " ".repeat(rest), number(progress), number(total))
        }
        None => format!("progress {}{said}", number(progress)),
    })
}

fn number(value: f64) -> String {
    if value.fract() == 0.0 { format!("{value:.0}") } else { format!("{value:.2}") }
}

fn paint(colour: bool, code: &str, text: &str) -> String {
    if colour { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_owned() }
}

/// What a person reads of one event.
fn words(line: &Value, colour: bool) -> Vec<String> {
    let text = |key: &str| line[key].as_str().unwrap_or_default().to_owned();
    match line["event"].as_str().unwrap_or_default() {
        "message" => vec![message_words(&line["message"])],
        "resumed" => vec![paint(
            colour,
            "2",
            match line["verdict"].as_str() {
                Some("continuous") => "resumed: nothing lost",
                Some("duplicate_skipped") => "resumed: nothing lost (an event sent twice was skipped)",
                _ => "resumed, but the server gave no way to prove nothing was lost",
            },
        )],
        "divergence" if line["kind"] == "resync" => vec![paint(colour, "33", &format!("resync: {}", text("detail")))],
        "divergence" => vec![paint(colour, "33", &format!("divergence ({}): {}", text("kind"), text("detail")))],
        "reinitialized" => {
            vec![paint(colour, "33", "re-initialized: a new session; what the server held for the old one is gone")]
        }
        "reissued" => {
            vec![paint(colour, "2", &format!("sent again (attempt {}): {}", line["attempt"], text("reason")))]
        }
        "unkeyed" => vec![paint(colour, "2", &format!("note: {}", text("reason")))],
        "task" => {
            let said = line["message"].as_str().map(|m| format!(": {m}")).unwrap_or_default();
            vec![format!("task {}: {}{said}", text("taskId"), text("status"))]
        }
        "result" => result_words(&line["result"], colour),
        "error" => {
            let error = &line["error"];
            let reason = error["data"]["reason"].as_str().map(|r| format!(" ({r})")).unwrap_or_default();
            vec![paint(colour, "1;31", &format!("error: {}{reason}", error["message"].as_str().unwrap_or_default()))]
        }
        "outcome_unknown" => {
            vec![paint(colour, "33", &format!("outcome unknown: {} (it may have run)", text("reason")))]
        }
        "gave_up" => vec![paint(colour, "33", &format!("gave up: {}", text("reason")))],
        "metrics" => vec![format!("metrics at {}", text("url"))],
        _ => vec![line.to_string()],
    }
}

/// A server message in one line: a log message by its level and data, anything else by its
/// method and params.
fn message_words(message: &Value) -> String {
    let params = &message["params"];
    if message["method"] == "notifications/message" {
        let data = match &params["data"] {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        return format!("{}: {data}", params["level"].as_str().unwrap_or("log"));
    }
    match message["method"].as_str() {
        Some(method) if params.is_null() => method.to_owned(),
        Some(method) => format!("{method} {params}"),
        None => message.to_string(),
    }
}

/// A tool's result: its text content as written, any other content and structured content
/// pretty-printed; a result that says it failed, in red.
fn result_words(result: &Value, colour: bool) -> Vec<String> {
    let mut lines = Vec::new();
    for item in result["content"].as_array().into_iter().flatten() {
        match item["text"].as_str() {
            Some(text) if item["type"] == "text" => lines.push(text.to_owned()),
            _ => lines.push(serde_json::to_string_pretty(item).unwrap_or_default()),
        }
    }
    if lines.is_empty() {
        lines.push(serde_json::to_string_pretty(result.get("structuredContent").unwrap_or(result)).unwrap_or_default());
    }
    if result["isError"] == true {
        lines.insert(0, paint(colour, "1;31", "the tool reported an error:"));
    }
    lines
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn progress_draws_a_bar_with_its_count() {
        let progress = |p: f64, total: Option<f64>| {
            let mut params = json!({"progressToken": "t", "progress": p});
            if let Some(total) = total {
                params["total"] = json!(total);
            }
            json!({"event": "message", "message": {"method": "notifications/progress", "params": params}})
        };
        assert_eq!(progress_bar(&progress(5.0, Some(10.0))).as_deref(), Some("[===============>              ] 5/10"));
        assert_eq!(
            progress_bar(&progress(10.0, Some(10.0))).as_deref(),
            Some("[==============================] 10/10")
        );
        assert_eq!(progress_bar(&progress(3.0, None)).as_deref(), Some("progress 3"));
        assert_eq!(progress_bar(&json!({"event": "result"})), None);
    }

    #[test]
    fn events_are_told_in_words() {
        let resync = json!({"event": "divergence", "kind": "resync", "detail": "events 40..=52 of stream r1 are gone"});
        assert_eq!(words(&resync, false), ["resync: events 40..=52 of stream r1 are gone"]);
        let result = json!({"event": "result", "result": {"content": [{"type": "text", "text": "counted to 3"}]}});
        assert_eq!(words(&result, false), ["counted to 3"]);
        let error =
            json!({"event": "error", "error": {"message": "could not connect", "data": {"reason": "connect_failed"}}});
        assert_eq!(words(&error, false), ["error: could not connect (connect_failed)"]);
        assert_eq!(words(&error, true), ["\x1b[1;31merror: could not connect (connect_failed)\x1b[0m"]);
        let log = json!({"event": "message", "message": {"method": "notifications/message", "params": {"level": "info", "data": {"count": 2}}}});
        assert_eq!(words(&log, false), [r#"info: {"count":2}"#]);
    }
}
