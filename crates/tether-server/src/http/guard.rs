//! Checks every request passes before anything else looks at it: origin, host, credentials,
//! media types and protocol version.

use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST, ORIGIN, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderMap, HeaderName, HeaderValue, Uri};
use serde_json::{Value, json};
use tether_core::jsonrpc::Request;
use tether_core::mcp::{Era, ProtocolVersion, method};

use super::names;
use crate::auth::{Authenticator, Identity, ProtectedResource, Unauthenticated};
use crate::config::ServerConfig;
use crate::excerpt::quoted;
use crate::refusal::{Refusal, Rejection};

fn is_loopback_host(host: &str) -> bool {
    // Strip a port, keeping bracketed IPv6 literals whole.
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host
            .rsplit_once(':')
            .map_or(host, |(name, port)| if port.bytes().all(|b| b.is_ascii_digit()) { name } else { host }),
    };
    let name = name.trim_end_matches('.');
    name.eq_ignore_ascii_case("localhost")
        || name == "::1"
        || name.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

fn is_loopback_origin(origin: &str) -> bool {
    origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .is_some_and(|authority| !authority.contains('/') && is_loopback_host(authority))
}

/// The authority a request is for: the request target's when it has one (absolute form, and
/// HTTP/2's `:authority`), else the `Host` header's (RFC 9112 §3.2.2, RFC 9113 §8.3.1).
fn authority<'a>(uri: &'a Uri, headers: &'a HeaderMap) -> &'a str {
    match uri.authority() {
        Some(authority) => authority.as_str(),
        None => headers.get(HOST).and_then(|h| h.to_str().ok()).unwrap_or(""),
    }
}

/// Origin (403) and, when bound to loopback, the authority the request is for (403): the
/// DNS-rebinding defences.
pub(crate) fn origin_and_host(uri: &Uri, headers: &HeaderMap, config: &ServerConfig) -> Result<(), Rejection> {
    if let Some(origin) = headers.get(ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let allowed = is_loopback_origin(origin) || config.allowed_origins.iter().any(|o| o == origin);
        if !allowed {
            return Err(Refusal::OriginNotAllowed.with(format!("origin {} is not allowed", quoted(origin))));
        }
    }
    if config.require_loopback_host {
        let host = authority(uri, headers);
        if !is_loopback_host(host) {
            return Err(Refusal::HostNotAllowed
                .with(format!("host {} is not a loopback name; this server is bound to loopback", quoted(host))));
        }
    }
    Ok(())
}

/// The caller's identity, or 401 when authentication is required and missing or wrong (503
/// when the keys that would verify it cannot be fetched: the same token may pass in a moment).
pub(crate) async fn authenticate(
    headers: &HeaderMap,
    auth: Option<&dyn Authenticator>,
) -> Result<Option<Identity>, Rejection> {
    let Some(auth) = auth else { return Ok(None) };
    let credentials = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok());
    let refused = match auth.authenticate(credentials).await {
        Ok(identity) => return Ok(Some(identity)),
        Err(refused) => refused,
    };
    let metadata = auth.protected_resource().map(ProtectedResource::metadata_url);
    let metadata = metadata.map(|url| ("resource_metadata", url));
    Err(match &refused {
        Unauthenticated::Missing => Refusal::Unauthorized
            .with("a bearer token is required")
            .with_header(WWW_AUTHENTICATE, challenge(metadata.into_iter())),
        Unauthenticated::Invalid(why) => {
            let said = [("error", "invalid_token"), ("error_description", why.as_str())];
            Refusal::Unauthorized
                .with(format!("invalid bearer token: {why}"))
                .with_header(WWW_AUTHENTICATE, challenge(metadata.into_iter().chain(said)))
        }
        Unauthenticated::KeysUnavailable(_) => Refusal::KeysUnavailable
            .with(format!("{refused}; try again later"))
            .with_header(RETRY_AFTER, HeaderValue::from_static("1")),
    })
}

/// 403 `insufficient_scope` when `request` calls a tool that requires a scope the caller's
/// grant lacks, naming the scopes the tool requires (RFC 6750 §3.1), so that the client can ask
/// for them and send the request again.
pub(crate) fn authorize(
    auth: Option<&dyn Authenticator>,
    caller: Option<&Identity>,
    request: &Request,
) -> Result<(), Rejection> {
    let (Some(resource), Some(caller)) = (auth.and_then(|auth| auth.protected_resource()), caller) else {
        return Ok(());
    };
    if request.method != method::TOOLS_CALL {
        return Ok(());
    }
    let tool = request.params.as_ref().and_then(|params| params.get("name")).and_then(Value::as_str).unwrap_or("");
    let required = resource.scopes_for(tool);
    let lacking = caller.grant.lacks(required);
    if lacking.is_empty() {
        return Ok(());
    }
    let message = format!("calling the tool {} requires the scope {}", quoted(tool), lacking.join(" "));
    let scope = required.join(" ");
    let said = [
        ("error", "insufficient_scope"),
        ("scope", scope.as_str()),
        ("resource_metadata", resource.metadata_url()),
        ("error_description", message.as_str()),
    ];
    Err(Refusal::InsufficientScope
        .with(message.clone())
        .with_header(WWW_AUTHENTICATE, challenge(said.into_iter()))
        .with_data("scope", json!(scope))
        .with_id(Some(request.id.clone())))
}

/// A `Bearer` challenge (RFC 6750 §3) with `params` as quoted strings; a character a quoted
/// string cannot hold (a quote, a backslash, a control) is left out.
fn challenge<'a>(params: impl Iterator<Item = (&'a str, &'a str)>) -> HeaderValue {
    let mut value = String::from("Bearer");
    for (i, (name, said)) in params.enumerate() {
        value.push_str(if i == 0 { " " } else { ", " });
        value.push_str(name);
        value.push_str("=\"");
        value.extend(said.chars().filter(|c| (' '..='~').contains(c) && !matches!(c, '"' | '\\')));
        value.push('"');
    }
    // Only visible ASCII and spaces were written.
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
}

/// Which of the two media types MCP responds with an `Accept` header admits.
#[derive(Debug, Default, PartialEq, Eq)]
struct Accepted {
    json: bool,
    sse: bool,
}

/// Reads every `Accept` range once, counting wildcards (`*/*`, `type/*`).
fn accepted(headers: &HeaderMap) -> Accepted {
    let mut accepted = Accepted::default();
    for range in headers.get_all(ACCEPT).iter().flat_map(|v| v.as_bytes().split(|&b| b == b',')) {
        let range = range.split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
        let Some(slash) = range.iter().position(|&b| b == b'/') else { continue };
        let (kind, sub) = (&range[..slash], &range[slash + 1..]);
        let any = kind == b"*" && sub == b"*";
        accepted.json |=
            any || kind.eq_ignore_ascii_case(b"application") && (sub == b"*" || sub.eq_ignore_ascii_case(b"json"));
        accepted.sse |=
            any || kind.eq_ignore_ascii_case(b"text") && (sub == b"*" || sub.eq_ignore_ascii_case(b"event-stream"));
    }
    accepted
}

fn not_acceptable(needed: &str) -> Rejection {
    Refusal::NotAcceptable.with(format!("Accept must include {needed}"))
}

/// A POST must accept both JSON and SSE (406 otherwise) and send JSON (415 otherwise).
pub(crate) fn post_media(headers: &HeaderMap) -> Result<(), Rejection> {
    if accepted(headers) != (Accepted { json: true, sse: true }) {
        return Err(not_acceptable("application/json and text/event-stream"));
    }
    let content_type = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let essence = content_type.split(';').next().unwrap_or("").trim();
    if !essence.eq_ignore_ascii_case("application/json") {
        return Err(Refusal::UnsupportedMediaType.with("Content-Type must be application/json"));
    }
    Ok(())
}

/// A GET must accept SSE (406 otherwise).
pub(crate) fn get_media(headers: &HeaderMap) -> Result<(), Rejection> {
    if accepted(headers).sse { Ok(()) } else { Err(not_acceptable("text/event-stream")) }
}

/// What the `MCP-Protocol-Version` header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeaderVersion {
    /// No header: a sessionful client from before 2025-06-18, or one relying on its session.
    Absent,
    /// A supported sessionful revision.
    Sessionful(ProtocolVersion),
    /// A supported revision of the stateless era (2026-07-28).
    Stateless(ProtocolVersion),
    /// Anything else, as sent.
    Unsupported(String),
}

/// Reads the `MCP-Protocol-Version` header; sent twice, or as a list, it is refused.
pub(crate) fn protocol_version(headers: &HeaderMap) -> Result<HeaderVersion, Rejection> {
    let Some(value) = single(headers, &names::PROTOCOL_VERSION, Values::One)? else { return Ok(HeaderVersion::Absent) };
    let text = value.to_str().unwrap_or("");
    Ok(match text.parse::<ProtocolVersion>() {
        Ok(version) if crate::SUPPORTED_VERSIONS.contains(&version) => match version.era() {
            Era::Sessionful => HeaderVersion::Sessionful(version),
            Era::Stateless => HeaderVersion::Stateless(version),
        },
        _ => HeaderVersion::Unsupported(text.to_owned()),
    })
}

/// What a header that must be sent at most once may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Values {
    /// One token: a comma-joined list (how intermediaries combine repeated lines) is refused.
    One,
    /// Any one value, commas included (a name or an argument compared with the body, where a
    /// joined list cannot match).
    Any,
}

/// The value of header `name`, which a request may carry at most once: sent on two lines (or, for
/// [`Values::One`], as a list), it is refused with -32020 `header_mismatch`, since an
/// intermediary that reads another of the values than the server would route or authorize on
/// something other than what runs.
pub(crate) fn single<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
    values: Values,
) -> Result<Option<&'h HeaderValue>, Rejection> {
    let mut sent = headers.get_all(name).iter();
    let Some(first) = sent.next() else { return Ok(None) };
    if sent.next().is_some() {
        return Err(
            Refusal::HeaderMismatch.with(format!("header {name} must be sent once, and it was sent more than once"))
        );
    }
    if values == Values::One && first.as_bytes().contains(&b',') {
        return Err(Refusal::HeaderMismatch.with(format!("header {name} must hold one value, not a list")));
    }
    Ok(Some(first))
}

/// 400 with -32022 and the supported versions.
pub(crate) fn unsupported_version(requested: &str) -> Rejection {
    Refusal::UnsupportedProtocolVersion
        .with(format!("unsupported protocol version {}", quoted(requested)))
        .with_data("supported", json!(crate::SUPPORTED_VERSIONS.map(ProtocolVersion::as_str)))
        .with_data("requested", json!(requested))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_and_origins() {
        for host in [
            "localhost",
            "localhost:8808",
            "127.0.0.1",
            "127.0.0.1:1",
            "127.9.9.9:80",
            "[::1]",
            "[::1]:8808",
            "LOCALHOST",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in ["evil.example.com", "evil.example.com:80", "10.0.0.1", "localhost.evil.com", "", "[::2]:80"] {
            assert!(!is_loopback_host(host), "{host}");
        }
        assert!(is_loopback_origin("http://localhost:3000"));
        assert!(is_loopback_origin("https://127.0.0.1"));
        assert!(!is_loopback_origin("http://evil.example.com"));
        assert!(!is_loopback_origin("null"));
        assert!(!is_loopback_origin("http://localhost/x"));
    }

    #[test]
    fn the_authority_is_the_targets_before_the_host_headers() {
        let mut headers = HeaderMap::new();
        headers.insert(HOST, HeaderValue::from_static("127.0.0.1:8808"));
        let absolute: Uri = "http://evil.example/mcp".parse().expect("absolute form");
        assert_eq!(authority(&absolute, &headers), "evil.example");
        let origin: Uri = "/mcp".parse().expect("origin form");
        assert_eq!(authority(&origin, &headers), "127.0.0.1:8808");
        assert_eq!(authority(&origin, &HeaderMap::new()), "");
    }

    #[test]
    fn accept_ranges_with_wildcards_and_params() {
        let of = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(ACCEPT, HeaderValue::from_static(value));
            let Accepted { json, sse } = accepted(&headers);
            (json, sse)
        };
        assert_eq!(of("application/json;q=0.9, text/event-stream"), (true, true));
        assert_eq!(of("*/*"), (true, true));
        assert_eq!(of("application/json"), (true, false));
        assert_eq!(of("TEXT/*"), (false, true), "a type's wildcard is that type's only");
        assert_eq!(of("Application/JSON ; q=1,text/plain"), (true, false));
        assert_eq!(of("*/json, text/event-streams, event-stream"), (false, false), "not a media range");
        let mut headers = HeaderMap::new();
        headers.append(ACCEPT, HeaderValue::from_static("application/json"));
        headers.append(ACCEPT, HeaderValue::from_static("text/event-stream"));
        assert_eq!(accepted(&headers), Accepted { json: true, sse: true }, "ranges over several headers");
    }
}
