//! What tether knows of each MCP method, in one table: the eras it exists in, who serves it,
//! which param `Mcp-Name` mirrors, whether a 2026-07-28 result carries cache hints, and whether
//! it may ask for input. Routing, header validation, result decoration and the client's header builder all
//! read it, so a new method or a new revision is one row or one column here.

use crate::mcp::{Era, method};
use crate::{subscriptions, tasks};

/// Who answers a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServedBy {
    /// The application's handler.
    Handler,
    /// The transport itself, as the protocol defines the method: `initialize`, `ping`,
    /// `logging/setLevel`, `server/discover`.
    Protocol,
    /// The transport's tasks (SEP-2663 and tether's task streams).
    Tasks,
    /// The transport's subscriptions (`subscriptions/listen`, SEP-2575).
    Subscriptions,
}

/// What tether knows of one method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodInfo {
    /// The method's name.
    pub name: &'static str,
    /// The eras it exists in; in any other it is unknown (-32601).
    pub eras: &'static [Era],
    /// Who answers it.
    pub served_by: ServedBy,
    /// The params field a 2026-07-28 request's `Mcp-Name` header mirrors (SEP-2243).
    pub mcp_name: Option<&'static str>,
    /// Whether its 2026-07-28 result carries cache hints (`ttlMs`, `cacheScope`).
    pub cacheable: bool,
    /// Whether its 2026-07-28 result may ask the client for input (SEP-2322).
    pub may_ask_input: bool,
}

const BOTH: &[Era] = &[Era::Sessionful, Era::Stateless];
const SESSIONFUL: &[Era] = &[Era::Sessionful];
const STATELESS: &[Era] = &[Era::Stateless];

const fn row(name: &'static str, eras: &'static [Era]) -> MethodInfo {
    MethodInfo {
        name,
        eras,
        served_by: ServedBy::Handler,
        mcp_name: None,
        cacheable: false,
        may_ask_input: false,
    }
}

const fn served(info: MethodInfo, served_by: ServedBy) -> MethodInfo {
    MethodInfo { served_by, ..info }
}

const fn named(info: MethodInfo, field: &'static str) -> MethodInfo {
    MethodInfo {
        mcp_name: Some(field),
        ..info
    }
}

const fn cacheable(info: MethodInfo) -> MethodInfo {
    MethodInfo {
        cacheable: true,
        ..info
    }
}

const fn asks_input(info: MethodInfo) -> MethodInfo {
    MethodInfo {
        may_ask_input: true,
        ..info
    }
}

/// Every method tether treats specially. A method not listed exists in every era, is served by
/// the handler, mirrors no name, and carries nothing extra: the handler decides what it is.
pub const METHODS: [MethodInfo; 21] = [
    served(row(method::INITIALIZE, SESSIONFUL), ServedBy::Protocol),
    row(method::INITIALIZED, SESSIONFUL),
    served(row(method::PING, SESSIONFUL), ServedBy::Protocol),
    served(row("logging/setLevel", SESSIONFUL), ServedBy::Protocol),
    row("resources/subscribe", SESSIONFUL),
    row("resources/unsubscribe", SESSIONFUL),
    served(
        cacheable(row(method::SERVER_DISCOVER, STATELESS)),
        ServedBy::Protocol,
    ),
    served(
        row(subscriptions::LISTEN, STATELESS),
        ServedBy::Subscriptions,
    ),
    cacheable(row(method::TOOLS_LIST, BOTH)),
    asks_input(named(row(method::TOOLS_CALL, BOTH), "name")),
    cacheable(row("prompts/list", BOTH)),
    asks_input(named(row("prompts/get", BOTH), "name")),
    cacheable(row("resources/list", BOTH)),
    asks_input(cacheable(named(row("resources/read", BOTH), "uri"))),
    cacheable(row("resources/templates/list", BOTH)),
    served(
        named(row(tasks::method::GET, STATELESS), "taskId"),
        ServedBy::Tasks,
    ),
    served(
        named(row(tasks::method::UPDATE, STATELESS), "taskId"),
        ServedBy::Tasks,
    ),
    served(
        named(row(tasks::method::CANCEL, STATELESS), "taskId"),
        ServedBy::Tasks,
    ),
    served(
        named(row(tasks::method::STREAM, STATELESS), "taskId"),
        ServedBy::Tasks,
    ),
    // The first tasks design's methods, which SEP-2663 removed.
    asks_input(row("tasks/result", SESSIONFUL)),
    row("tasks/list", SESSIONFUL),
];

/// What tether knows of `name`, if it is in the table.
pub fn info(name: &str) -> Option<&'static MethodInfo> {
    index(name).map(|i| &METHODS[i])
}

/// Where `name` stands in [`METHODS`], for tables kept in its order.
pub fn index(name: &str) -> Option<usize> {
    METHODS.iter().position(|info| info.name == name)
}

/// Whether `name` exists in `era` (a method not in the table exists in every era).
pub fn exists_in(name: &str, era: Era) -> bool {
    info(name).is_none_or(|info| info.eras.contains(&era))
}

/// Who answers `name`.
pub fn served_by(name: &str) -> ServedBy {
    info(name).map_or(ServedBy::Handler, |info| info.served_by)
}

/// The params field `Mcp-Name` mirrors for `name`, if any.
pub fn mcp_name(name: &str) -> Option<&'static str> {
    info(name).and_then(|info| info.mcp_name)
}

/// Whether a 2026-07-28 result of `name` carries cache hints.
pub fn is_cacheable(name: &str) -> bool {
    info(name).is_some_and(|info| info.cacheable)
}

/// Whether a 2026-07-28 result of `name` may ask for input.
pub fn may_ask_input(name: &str) -> bool {
    info(name).is_some_and(|info| info.may_ask_input)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_is_listed_once() {
        for (i, a) in METHODS.iter().enumerate() {
            assert!(
                METHODS[i + 1..].iter().all(|b| b.name != a.name),
                "{} twice",
                a.name
            );
            assert!(!a.eras.is_empty(), "{} exists in no era", a.name);
        }
    }

    #[test]
    fn the_table_answers_for_each_column() {
        assert!(!exists_in("ping", Era::Stateless) && exists_in("ping", Era::Sessionful));
        assert!(
            !exists_in("tasks/list", Era::Stateless)
                && !exists_in(tasks::method::GET, Era::Sessionful)
        );
        assert!(exists_in("tools/call", Era::Stateless) && exists_in("x/unknown", Era::Stateless));
        assert_eq!(served_by("ping"), ServedBy::Protocol);
        assert_eq!(served_by("server/discover"), ServedBy::Protocol);
        assert_eq!(served_by("subscriptions/listen"), ServedBy::Subscriptions);
        assert_eq!(served_by("tasks/stream"), ServedBy::Tasks);
        assert_eq!(served_by("tools/call"), ServedBy::Handler);
        assert_eq!(served_by("x/unknown"), ServedBy::Handler);
        // The stateless endpoint answers its one protocol method as `server/discover`.
        let stateless_protocol: Vec<&str> = METHODS
            .iter()
            .filter(|m| m.served_by == ServedBy::Protocol && m.eras.contains(&Era::Stateless))
            .map(|m| m.name)
            .collect();
        assert_eq!(stateless_protocol, ["server/discover"]);
        assert_eq!(mcp_name("resources/read"), Some("uri"));
        assert_eq!(mcp_name("tasks/cancel"), Some("taskId"));
        assert_eq!(mcp_name("tools/list"), None);
        assert!(
            is_cacheable("server/discover")
                && is_cacheable("resources/read")
                && !is_cacheable("tools/call")
        );
        assert!(
            may_ask_input("prompts/get")
                && !may_ask_input("tools/list")
                && !may_ask_input("x/unknown")
        );
    }
}
