//! tether's guarantees for MCP servers written in any language.
//!
//! [`stdio::Command`] starts a stdio MCP server as a child process per instance, so that
//! [`tether_server::upstream::UpstreamHandler`] serves it over tether's transport: one child per
//! downstream session (and per 2026-07-28 request), its stderr logged, killed when the session
//! ends; a child that exits ends its session as `upstream_lost` and its running requests with
//! `request_aborted`.

pub mod stdio;
