//! The black-box scenarios. Each sends a few requests, looks at what comes back, and gives a
//! verdict with the evidence.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use tether_core::lineage::{EventId, ObservedId};

use crate::ProbeError;
use crate::report::{Check, Verdict};
use crate::wire::{Answer, Session, Wire};

pub(crate) const SHORT: Duration = Duration::from_millis(1_500);
const LONG: Duration = Duration::from_secs(10);

pub(crate) fn check(id: &'static str, title: &'static str, verdict: Verdict, evidence: Vec<String>) -> Check {
    Check { id, title, verdict, evidence, signature: None, trace: None }
}

pub(crate) fn ping(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "ping"})
}

/// Where an event id puts its event, in the id schemes servers use: tether lineage ids, plain
/// integers, and `<index>/<stream>` (rmcp). Ids with no readable position have none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Position {
    stream: String,
    index: u64,
}

impl Position {
    pub fn of(id: &str) -> Option<Position> {
        match ObservedId::parse(id) {
            ObservedId::Lineage(id) => Some(Position { stream: format!("{}:{}", id.epoch, id.stream), index: id.seq }),
            ObservedId::Integer(index) => Some(Position { stream: String::new(), index }),
            ObservedId::Opaque(text) => {
                let (index, stream) = text.split_once('/')?;
                Some(Position { stream: stream.to_owned(), index: index.parse().ok()? })
            }
        }
    }

    /// Whether `self` is on the same stream as `other` and not after it.
    pub fn at_or_before(&self, other: &Position) -> bool {
        self.stream == other.stream && self.index <= other.index
    }

    /// The id `by` events after `id`, written in the server's own scheme (none if it would
    /// overflow: a server's ids are input, never trusted to be small).
    fn ahead(id: &str, by: u64) -> Option<String> {
        Position::at(id, Position::of(id)?.index.checked_add(by)?)
    }

    /// The id of position `index` of `id`'s stream, in the server's own scheme.
    fn at(id: &str, index: u64) -> Option<String> {
        match ObservedId::parse(id) {
            ObservedId::Lineage(id) => Some(EventId { seq: index, ..id }.to_string()),
            ObservedId::Integer(_) => Some(index.to_string()),
            ObservedId::Opaque(text) => {
                let (_, stream) = text.split_once('/')?;
                Some(format!("{index}/{stream}"))
            }
        }
    }
}

/// Handshake: a session id of good quality.
pub(crate) fn session_id(session: &Session, answer: &Answer) -> Check {
    const TITLE: &str = "initialize mints a session id: visible ASCII, long enough to be unguessable";
    let Some(id) = &session.id else {
        return check(
            "session-id",
            TITLE,
            Verdict::NotApplicable,
            vec!["no Mcp-Session-Id: the server keeps no sessions".into()],
        );
    };
    let evidence = vec![answer.summary(), format!("Mcp-Session-Id: {} characters", id.len())];
    let visible = id.bytes().all(|b| (0x21..=0x7e).contains(&b));
    // Characters of an id drawn from at least a 16-symbol alphabet carry ≥ 4 bits each.
    let verdict = match (visible, id.len()) {
        (false, _) => Verdict::Fail,
        (true, n) if n < 32 => Verdict::Warn,
        _ => Verdict::Pass,
    };
    check("session-id", TITLE, verdict, evidence)
}

/// An unsupported `MCP-Protocol-Version` is refused.
pub(crate) async fn version_rejected(wire: &Wire, session: &Session) -> Result<Check, ProbeError> {
    let answer = wire.post(Some(session), &ping(2), &[("mcp-protocol-version", "1999-01-01")], 4, SHORT).await?;
    let verdict = if answer.status == 400 { Verdict::Pass } else { Verdict::Fail };
    Ok(check(
        "protocol-version-rejected",
        "an unsupported MCP-Protocol-Version gets 400",
        verdict,
        vec![answer.summary()],
    ))
}

/// DNS-rebinding defences: a foreign `Origin` is refused, and so is a foreign `Host` when the
/// server is on loopback. Allowed to be missing for resumption, so a warning, not a failure.
pub(crate) async fn origin_and_host(wire: &Wire, session: &Session) -> Result<Check, ProbeError> {
    const TITLE: &str = "a foreign Origin (and, on loopback, a foreign Host) is refused";
    let origin = wire.post(Some(session), &ping(5), &[("origin", "http://tether-probe.invalid")], 4, SHORT).await?;
    let mut evidence = vec![format!("Origin http://tether-probe.invalid: {}", origin.summary())];
    let mut refused = matches!(origin.status, 400 | 403);
    if wire.on_loopback() {
        let host = wire.post(Some(session), &ping(6), &[("host", "tether-probe.invalid")], 4, SHORT).await?;
        evidence.push(format!("Host tether-probe.invalid: {}", host.summary()));
        refused &= matches!(host.status, 400 | 403 | 421);
    }
    if !refused {
        evidence.push("the spec requires servers to validate Origin (DNS rebinding)".into());
    }
    Ok(check("origin-host-rejected", TITLE, if refused { Verdict::Pass } else { Verdict::Warn }, evidence))
}

/// An unknown session id gets 404, so clients re-initialize.
pub(crate) async fn unknown_session(wire: &Wire, session: &Session) -> Result<Check, ProbeError> {
    let ghost = Session { id: Some("tether-probe-no-such-session-0123456789".into()), ..session.clone() };
    let answer = wire.post(Some(&ghost), &ping(3), &[], 4, SHORT).await?;
    let mut result = check(
        "unknown-session-404",
        "an unknown session id gets 404 (not 400, not 401, not a fresh session)",
        if answer.status == 404 { Verdict::Pass } else { Verdict::Fail },
        vec![answer.summary()],
    );
    if answer.ok() {
        result.signature = Some("session resurrection: a dead session id is accepted with fresh state");
    }
    Ok(result)
}

/// DELETE ends the session; later requests get 404.
pub(crate) async fn delete_then_404(wire: &Wire) -> Result<Check, ProbeError> {
    const TITLE: &str = "after DELETE, requests with the session id get 404";
    let (session, _) = wire.initialize().await?;
    if session.id.is_none() {
        return Ok(check("delete-then-404", TITLE, Verdict::NotApplicable, vec!["no sessions".into()]));
    }
    let deleted = wire.delete(&session).await?;
    if deleted == 405 {
        return Ok(check(
            "delete-then-404",
            TITLE,
            Verdict::NotApplicable,
            vec!["DELETE → 405: clients may not end sessions".into()],
        ));
    }
    let after = wire.post(Some(&session), &ping(4), &[], 4, SHORT).await?;
    let verdict = if after.status == 404 { Verdict::Pass } else { Verdict::Fail };
    Ok(check(
        "delete-then-404",
        TITLE,
        verdict,
        vec![format!("DELETE → {deleted}"), format!("then: {}", after.summary())],
    ))
}

/// The streaming call the resumption checks use.
#[derive(Debug, Clone)]
pub(crate) struct StreamingCall {
    pub tool: String,
    pub arguments: Value,
}

impl StreamingCall {
    fn body(&self, id: u64) -> Value {
        // A progress token: some servers (rmcp) put only progress for a token on the request's stream.
        let meta = json!({"progressToken": format!("tether-probe-{id}")});
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": self.tool, "arguments": self.arguments, "_meta": meta}})
    }
}

/// The request id of the reference call.
pub(crate) const REFERENCE_REQUEST: u64 = 100;

/// A complete call, read to its end: the reference the resumption checks compare with.
pub(crate) struct Reference {
    pub answer: Answer,
    /// The notifications' params, in order.
    pub notifications: Vec<Value>,
}

/// Most resumes the probe makes to follow one call whose server closes streams mid-call
/// (SEP-1699 polling), as a client would.
const MAX_FOLLOW: usize = 8;

pub(crate) fn notifications(answers: &[Answer]) -> Vec<Value> {
    // Without the progress token, which differs per call, so calls can be compared.
    let params = |m: Value| {
        let mut params = m["params"].clone();
        if let Some(map) = params.as_object_mut() {
            map.remove("progressToken");
        }
        params
    };
    answers.iter().flat_map(Answer::messages).filter(|m| m.get("id").is_none()).map(params).collect()
}

pub(crate) fn has_result(answers: &[Answer], id: u64) -> bool {
    answers.iter().flat_map(Answer::messages).any(|m| m.get("id") == Some(&json!(id)))
}

/// Resumes after `answer` for as long as the server ends the stream before the result of
/// request `id` and each stream brought events (at most `MAX_FOLLOW` times).
pub(crate) async fn follow(wire: &Wire, session: &Session, answer: Answer, id: u64) -> Result<Vec<Answer>, ProbeError> {
    let mut answers = vec![answer];
    while answers.len() <= MAX_FOLLOW && !has_result(&answers, id) {
        let last = &answers[answers.len() - 1];
        let Some(cursor) = last.events.iter().rev().find_map(|e| e.id.clone()) else { break };
        if !last.ended || !last.ok() {
            break;
        }
        let next = wire.get(session, Some(&cursor), 500, LONG).await?;
        answers.push(next);
    }
    Ok(answers)
}

pub(crate) async fn reference(wire: &Wire, session: &Session, call: &StreamingCall) -> Result<Reference, ProbeError> {
    let answer = wire.post(Some(session), &call.body(REFERENCE_REQUEST), &[], 500, LONG).await?;
    let answers = follow(wire, session, answer.clone(), REFERENCE_REQUEST).await?;
    Ok(Reference { answer, notifications: notifications(&answers) })
}

/// 2025-11-25: a priming event (id, empty data) and a `retry` hint.
pub(crate) fn priming(session: &Session, reference: &Reference) -> Check {
    const TITLE: &str = "2025-11-25 streams start with a priming event and announce retry";
    if session.version != "2025-11-25" || reference.answer.events.is_empty() {
        return check("priming-and-retry", TITLE, Verdict::NotApplicable, vec![reference.answer.summary()]);
    }
    let first = &reference.answer.events[0];
    let primed = first.id.is_some() && first.data.trim().is_empty();
    let retry = reference.answer.events.iter().any(|e| e.retry.is_some());
    let verdict = match (primed, retry) {
        (true, true) => Verdict::Pass,
        _ => Verdict::Warn,
    };
    check(
        "priming-and-retry",
        TITLE,
        verdict,
        vec![reference.answer.summary(), format!("priming {primed}, retry {retry}")],
    )
}

/// Ids increase along a stream, so a client can check order.
pub(crate) fn ids_ordered(reference: &Reference) -> Check {
    const TITLE: &str = "event ids carry order (and the stream), so continuity can be checked";
    let ids: Vec<&str> = reference.answer.events.iter().filter_map(|e| e.id.as_deref()).collect();
    if ids.is_empty() {
        return check("ids-ordered", TITLE, Verdict::Warn, vec!["no event ids: streams cannot be resumed".into()]);
    }
    let positions: Option<Vec<Position>> = ids.iter().map(|id| Position::of(id)).collect();
    let evidence = vec![format!("ids {:?}", ids.iter().take(5).collect::<Vec<_>>())];
    let verdict = match positions {
        Some(p) if p.windows(2).all(|w| w[0].stream == w[1].stream && w[0].index < w[1].index) => Verdict::Pass,
        Some(_) => Verdict::Fail,
        None => Verdict::Warn,
    };
    check("ids-ordered", TITLE, verdict, evidence)
}

/// The core check: drop a streaming call mid-way, resume, and compare with the reference.
pub(crate) async fn mid_stream_resume(
    wire: &Wire,
    session: &Session,
    call: &StreamingCall,
    reference: &Reference,
) -> Result<(Check, Option<String>), ProbeError> {
    let which = ResumeCheck {
        id: "mid-stream-resume",
        title: "a call dropped mid-stream resumes with exactly the events after the cursor",
        request: 101,
    };
    dropped_call(wire, wire, session, call, reference, which).await
}

/// The same, resuming on another replica than the one the call started on.
pub(crate) async fn replica_resume(
    wire: &Wire,
    replica: &Wire,
    session: &Session,
    call: &StreamingCall,
    reference: &Reference,
) -> Result<Check, ProbeError> {
    let which = ResumeCheck {
        id: "replica-resume",
        title: "a call dropped on one replica resumes exactly on another (or is refused explicitly)",
        request: 102,
    };
    let (mut result, _) = dropped_call(wire, replica, session, call, reference, which).await?;
    result.evidence.insert(0, format!("call on {}, resume on {}", wire.url, replica.url));
    Ok(result)
}

/// Which dropped-call check this is, and the request id its call uses.
pub(crate) struct ResumeCheck {
    id: &'static str,
    title: &'static str,
    request: u64,
}

/// Starts `call` on `wire`, drops it after a few events, resumes on `at` and follows it to its
/// result, then compares what arrived after the cursor with the reference.
async fn dropped_call(
    wire: &Wire,
    at: &Wire,
    session: &Session,
    call: &StreamingCall,
    reference: &Reference,
    which: ResumeCheck,
) -> Result<(Check, Option<String>), ProbeError> {
    let ResumeCheck { id, title, request } = which;
    let keep = 2;
    let priming = usize::from(reference.answer.events.first().is_some_and(|e| e.data.trim().is_empty()));
    let dropped = wire.post(Some(session), &call.body(request), &[], priming + keep, LONG).await?;
    let Some(cursor) = dropped.events.iter().rev().find_map(|e| e.id.clone()) else {
        return Ok((
            check(id, title, Verdict::Warn, vec![dropped.summary(), "no event id to resume from".into()]),
            None,
        ));
    };
    let seen = notifications(std::slice::from_ref(&dropped));
    let resumed = at.get(session, Some(&cursor), 500, LONG).await?;
    let mut evidence = vec![
        format!("dropped after {} events, cursor {cursor}", dropped.events.len()),
        format!("resume: {}", resumed.summary()),
    ];
    if !resumed.ok() {
        return Ok((check(id, title, Verdict::Warn, evidence), Some(cursor)));
    }
    let first_id = resumed.events.first().and_then(|e| e.id.clone());
    let answers = follow(at, session, resumed, request).await?;
    if answers.len() > 1 {
        evidence
            .push(format!("the server ended the stream again; followed it with {} more resumes", answers.len() - 1));
    }
    let after = notifications(&answers);
    let result = has_result(&answers, request);
    let expected = reference.notifications.get(seen.len()..).unwrap_or_default();
    let mut verdict = check(id, title, Verdict::Pass, Vec::new());
    verdict.trace = Some(crate::report::ResumeTrace {
        sent: reference.notifications.len(),
        before_drop: seen.len(),
        after: after.iter().map(|n| reference.notifications.iter().position(|r| r == n)).collect(),
    });
    if has_result(&answers, REFERENCE_REQUEST) {
        verdict.verdict = Verdict::Fail;
        verdict.signature = Some("cross-stream replay: the resume delivers another stream's events");
    } else if first_id.as_deref() == Some(cursor.as_str()) {
        verdict.verdict = Verdict::Fail;
        verdict.signature = Some("duplicate: the replay repeats the cursor's own event");
    } else if after.is_empty() && !result {
        verdict.verdict = Verdict::Fail;
        verdict.signature = Some("silent empty 200: the resume looks like a quiet stream");
    } else if after != expected {
        verdict.verdict = Verdict::Fail;
        verdict.signature = Some(if after.len() < expected.len() {
            "gap: events after the cursor are missing"
        } else {
            "duplicate: events are replayed twice"
        });
        evidence.push(format!("expected {} notifications after the cursor, got {}", expected.len(), after.len()));
    } else if !result {
        verdict.verdict = Verdict::Fail;
        verdict.signature = Some("unbounded latency: the result never arrives");
    }
    verdict.evidence = evidence;
    Ok((verdict, Some(cursor)))
}

/// What a resume with a cursor the server cannot honour looks like: explicit or silent.
async fn explicit_refusal(wire: &Wire, session: &Session, cursor: &str) -> Result<(Verdict, String), ProbeError> {
    let answer = wire.get(session, Some(cursor), 20, SHORT).await?;
    Ok((
        if answer.refused_explicitly() { Verdict::Pass } else { Verdict::Fail },
        format!("Last-Event-ID {cursor:?}: {}", answer.summary()),
    ))
}

/// Unknown, garbage and forged-ahead cursors get an explicit signal, never a silent 200.
pub(crate) async fn bad_cursors(wire: &Wire, session: &Session, known: Option<&str>) -> Result<Vec<Check>, ProbeError> {
    let (verdict, evidence) = explicit_refusal(wire, session, "tether-probe-unknown-cursor").await?;
    let mut garbage = check(
        "unknown-cursor",
        "an unknown cursor is refused explicitly, not with a silent empty 200",
        verdict,
        vec![evidence],
    );
    if verdict == Verdict::Fail {
        garbage.signature = Some("silent empty 200: a failed resume looks like a quiet stream");
    }
    let ahead = known.and_then(|id| Position::ahead(id, 1_000));
    let title = "a cursor ahead of the stream is refused explicitly";
    let forged = match ahead {
        None => {
            check("forged-ahead-cursor", title, Verdict::NotApplicable, vec!["ids carry no position to forge".into()])
        }
        Some(cursor) => {
            let (verdict, evidence) = explicit_refusal(wire, session, &cursor).await?;
            let mut c = check("forged-ahead-cursor", title, verdict, vec![evidence]);
            if verdict == Verdict::Fail {
                c.signature = Some("gap with continuous ids: the client is told nothing was lost");
            }
            c
        }
    };
    Ok(vec![garbage, forged])
}

/// Session B presenting session A's cursor must not get A's events.
pub(crate) async fn isolation(wire: &Wire, cursor_of_a: Option<&str>) -> Result<Check, ProbeError> {
    const TITLE: &str = "another session's cursor never replays that session's events";
    let Some(cursor) = cursor_of_a else {
        return Ok(check("session-isolation", TITLE, Verdict::NotApplicable, vec!["no cursor".into()]));
    };
    let (b, _) = wire.initialize().await?;
    let answer = wire.get(&b, Some(cursor), 20, SHORT).await?;
    let leaked = answer.ok() && !answer.messages().is_empty();
    let verdict = if leaked { Verdict::Fail } else { Verdict::Pass };
    Ok(check("session-isolation", TITLE, verdict, vec![format!("session B with A's cursor: {}", answer.summary())]))
}

/// The result of a finished call can be recovered by resuming its stream.
pub(crate) async fn result_recoverable(
    wire: &Wire,
    session: &Session,
    reference: &Reference,
) -> Result<Check, ProbeError> {
    const TITLE: &str = "after a call finished, resuming its stream still delivers the result";
    let Some(first) = reference.answer.events.iter().find_map(|e| e.id.clone()) else {
        return Ok(check("result-recoverable", TITLE, Verdict::NotApplicable, vec!["no event ids".into()]));
    };
    let answer = wire.get(session, Some(&first), 500, SHORT).await?;
    let recovered = has_result(std::slice::from_ref(&answer), REFERENCE_REQUEST);
    let verdict = if recovered { Verdict::Pass } else { Verdict::Warn };
    Ok(check("result-recoverable", TITLE, verdict, vec![format!("resume from {first}: {}", answer.summary())]))
}

/// A call that outruns the server's retention, then resumes from its first event: whatever is
/// gone must be named, once and exactly, and whatever is retained replayed. Classified as
/// exact (pass), lossy (events missing without a word, or named lost although still retained)
/// or silent (nothing at all).
pub(crate) async fn evicted_cursor(
    wire: &Wire,
    session: &Session,
    call: &StreamingCall,
    arguments: Option<&Value>,
) -> Result<Check, ProbeError> {
    const ID: &str = "evicted-cursor";
    const TITLE: &str = "a cursor whose history was evicted gets exactly what is retained, and what is gone named once";
    let Some(arguments) = arguments else {
        let why = "give --evict-args: arguments for the streaming tool that outrun the server's retention";
        return Ok(check(ID, TITLE, Verdict::NotApplicable, vec![why.into()]));
    };
    const REQUEST: u64 = 103;
    let long = StreamingCall { tool: call.tool.clone(), arguments: arguments.clone() };
    let answer = wire.post(Some(session), &long.body(REQUEST), &[], 5_000, LONG).await?;
    let answers = follow(wire, session, answer, REQUEST).await?;
    let ids: Vec<String> = answers.iter().flat_map(|a| &a.events).filter_map(|e| e.id.clone()).collect();
    let (Some(first), Some(start)) = (ids.first(), ids.first().and_then(|id| Position::of(id))) else {
        return Ok(check(ID, TITLE, Verdict::NotApplicable, vec!["the call's events carry no positions".into()]));
    };
    let end = ids.iter().filter_map(|id| Position::of(id)).filter(|p| p.stream == start.stream).map(|p| p.index).max();
    let end = end.unwrap_or(start.index);
    let early = wire.get(session, Some(first), 5_000, LONG).await?;
    // What the server still retains at the end of the stream: the truth a notice is held to.
    let late_at = end.saturating_sub(2).max(start.index);
    // The id the server sent there, if it did: a tagged id is only good as it was sent.
    let sent =
        ids.iter().find(|id| Position::of(id) == Some(Position { stream: start.stream.clone(), index: late_at }));
    let late_cursor = sent.cloned().or_else(|| Position::at(first, late_at)).unwrap_or_else(|| first.clone());
    let late = wire.get(session, Some(&late_cursor), 50, LONG).await?;
    let mut evidence = vec![
        format!("the call's stream reached position {end}; resume from {first}: {}", early.summary()),
        format!("resume from {late_cursor}: {}", late.summary()),
    ];
    if !early.ok() {
        evidence.push("refused: more is lost than is gone, but never silently".into());
        return Ok(check(ID, TITLE, Verdict::Warn, evidence));
    }
    let (replayed, named) = positions(&early, &start);
    let (retained, _) = positions(&late, &start);
    let needless: Vec<u64> = named.intersection(&retained).copied().collect();
    let missing: Vec<u64> = (start.index + 1..=end).filter(|p| !replayed.contains(p) && !named.contains(p)).collect();
    let (verdict, class, signature) = if !needless.is_empty() {
        evidence.push(format!("named lost but still replayed: {needless:?}"));
        (Verdict::Fail, "lossy", Some("needless loss: a resync discards events the server still retains"))
    } else if !missing.is_empty() && replayed.is_empty() && named.is_empty() {
        (Verdict::Fail, "silent", Some("silent empty 200: the resume looks like a quiet stream"))
    } else if !missing.is_empty() {
        evidence.push(format!("missing without a word: {} events from {}", missing.len(), missing[0]));
        (Verdict::Fail, "lossy", Some("gap: events after the cursor are missing"))
    } else if named.is_empty() {
        evidence.push("nothing was evicted: give --evict-args that outrun the server's retention".into());
        (Verdict::NotApplicable, "not evicted", None)
    } else {
        (Verdict::Pass, "exact", None)
    };
    evidence.insert(0, format!("{class}: {} replayed, {} named lost", replayed.len(), named.len()));
    let mut result = check(ID, TITLE, verdict, evidence);
    result.signature = signature;
    Ok(result)
}

/// The positions of `stream` an answer replayed, and those its `resync` events named lost
/// (`lost_from..=lost_to`).
fn positions(answer: &Answer, stream: &Position) -> (BTreeSet<u64>, BTreeSet<u64>) {
    let (mut replayed, mut named) = (BTreeSet::new(), BTreeSet::new());
    for event in &answer.events {
        if event.event.as_deref() == Some("resync") {
            let notice: Value = serde_json::from_str(&event.data).unwrap_or_default();
            if let (Some(from), Some(to)) = (notice["lost_from"].as_u64(), notice["lost_to"].as_u64()) {
                // Bounded by the probe's own reading: a notice is input, never trusted to be small.
                named.extend(from..=to.min(from.saturating_add(100_000)));
            }
            continue;
        }
        let position = event.id.as_deref().and_then(Position::of);
        if let Some(position) = position.filter(|p| p.stream == stream.stream) {
            replayed.insert(position.index);
        }
    }
    (replayed, named)
}

#[cfg(test)]
mod tests {
    use super::Position;

    #[test]
    fn positions_are_read_from_integer_and_index_slash_stream_ids() {
        let rmcp = Position::of("2/3").expect("rmcp id");
        assert!(Position::of("1/3").expect("rmcp id").at_or_before(&rmcp));
        assert!(!Position::of("1/4").expect("other stream").at_or_before(&rmcp));
        assert!(!Position::of("3/3").expect("later").at_or_before(&rmcp));
        assert_eq!(Position::ahead("2/3", 1_000).as_deref(), Some("1002/3"));
        assert_eq!(Position::at("2/3", 7).as_deref(), Some("7/3"));
        assert_eq!(Position::at("41", 7).as_deref(), Some("7"));
        assert_eq!(Position::ahead("41", 1_000).as_deref(), Some("1041"));
        assert_eq!(Position::of("0b6c_1796047336263_1chccux6"), None);
        assert_eq!(Position::ahead("x/3", 1), None);
        assert_eq!(Position::ahead(&u64::MAX.to_string(), 1), None);
    }
}
