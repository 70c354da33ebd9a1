//! `--restart-cmd`: restart the server between a finished call and its resume, and classify what
//! a returning client sees.

use std::time::Duration;

use crate::ProbeError;
use crate::checks::{Position, REFERENCE_REQUEST, Reference, SHORT, check, follow, has_result, notifications, ping};
use crate::report::{Check, Verdict};
use crate::wire::{Session, Wire};

const ID: &str = "restart";
const TITLE: &str = "after a restart, a returning client gets 404 or the same session with continuous history";
/// Longest the restart command may take, and then the server to accept connections again.
const RESTART_LIMIT: Duration = Duration::from_secs(60);

/// Runs `command` with `sh -c`, waits for the server's port, then presents the old session and
/// a cursor from before the restart.
pub(crate) async fn restart(
    wire: &Wire,
    session: &Session,
    reference: &Reference,
    command: &str,
) -> Result<Check, ProbeError> {
    let events = &reference.answer.events;
    let Some(at) = events.iter().position(|e| e.id.is_some()) else {
        return Ok(check(ID, TITLE, Verdict::NotApplicable, vec!["no event ids to resume from".into()]));
    };
    let cursor = events[at].id.clone().unwrap_or_default();
    let seen = events[..=at].iter().filter(|e| !e.data.trim().is_empty()).count();
    let status =
        tokio::time::timeout(RESTART_LIMIT, tokio::process::Command::new("sh").arg("-c").arg(command).status())
            .await
            .map_err(|_| ProbeError::Restart(format!("{command:?} took longer than {RESTART_LIMIT:?}")))?
            .map_err(|e| ProbeError::Restart(format!("{command:?}: {e}")))?;
    if !status.success() {
        return Err(ProbeError::Restart(format!("{command:?} exited with {status}")));
    }
    wire.wait_until_accepting(RESTART_LIMIT).await?;

    let ping = wire.post(Some(session), &ping(7), &[], 4, SHORT).await?;
    let mut evidence = vec![format!("old session after the restart: {}", ping.summary())];
    if ping.status == 404 {
        return Ok(check(ID, TITLE, Verdict::Pass, evidence));
    }
    if !ping.ok() {
        evidence.push("not 404: clients will not know to re-initialize".into());
        return Ok(check(ID, TITLE, Verdict::Warn, evidence));
    }
    let resumed = wire.get(session, Some(&cursor), 500, SHORT).await?;
    evidence.push(format!("resume from {cursor} (before the restart): {}", resumed.summary()));
    let explicit = resumed.refused_explicitly();
    let first_events = resumed.events.clone();
    let answers = if explicit { vec![resumed] } else { follow(wire, session, resumed, REFERENCE_REQUEST).await? };
    let replayed = notifications(&answers);
    let expected = reference.notifications.get(seen..).unwrap_or_default();
    let mut result = check(ID, TITLE, Verdict::Pass, Vec::new());
    if explicit {
        evidence.push("the session survived; lost history was reported explicitly".into());
    } else if replayed == expected && has_result(&answers, REFERENCE_REQUEST) {
        evidence.push("the session survived with continuous history".into());
    } else {
        result.verdict = Verdict::Fail;
        let before = Position::of(&cursor);
        let from_zero = first_events
            .iter()
            .filter_map(|e| e.id.as_deref().and_then(Position::of))
            .any(|id| before.as_ref().is_some_and(|before| id.at_or_before(before)));
        result.signature = Some(if first_events.is_empty() {
            "resurrection with reset state: the old session is accepted, its history silently gone"
        } else if from_zero {
            "replay from zero: ids at or before the cursor come back after the restart"
        } else {
            "gap with continuous ids: new ids continue the old counter over lost events"
        });
    }
    result.evidence = evidence;
    Ok(result)
}
