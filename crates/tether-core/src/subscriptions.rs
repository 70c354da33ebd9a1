//! `subscriptions/listen` (SEP-2575, 2026-07-28) as pure decisions: what a client asks to hear,
//! what a server can honour, and which notifications a subscription carries. The server streams
//! them; nothing here does I/O.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

/// The method a client opens a subscription stream with.
pub const LISTEN: &str = "subscriptions/listen";

/// The notification that opens every subscription stream, naming what the server honours.
pub const ACKNOWLEDGED: &str = "notifications/subscriptions/acknowledged";

/// The `_meta` key every notification of a subscription carries: the listen request's id.
pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// What a subscription carries (the request's `notifications`, the acknowledgement's subset).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// `notifications/tools/list_changed`.
    pub tools_list_changed: bool,
    /// `notifications/prompts/list_changed`.
    pub prompts_list_changed: bool,
    /// `notifications/resources/list_changed`.
    pub resources_list_changed: bool,
    /// `notifications/resources/updated` for these uris.
    pub resource_subscriptions: BTreeSet<String>,
}

impl Filter {
    /// The filter a listen request's `params.notifications` asks for; fields left out (or not
    /// of their type) ask for nothing.
    pub fn requested(params: &Value) -> Filter {
        let asked = params.get("notifications").unwrap_or(&Value::Null);
        let flag = |name: &str| asked.get(name).and_then(Value::as_bool).unwrap_or(false);
        Filter {
            tools_list_changed: flag("toolsListChanged"),
            prompts_list_changed: flag("promptsListChanged"),
            resources_list_changed: flag("resourcesListChanged"),
            resource_subscriptions: asked
                .get("resourceSubscriptions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
        }
    }

    /// What of `self` a server with `capabilities` honours: list changes it announces
    /// (`listChanged`), resource updates if it offers `resources.subscribe`.
    pub fn honoured(&self, capabilities: &Value) -> Filter {
        let offers = |kind: &str, option: &str| {
            capabilities
                .get(kind)
                .and_then(|c| c.get(option))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        Filter {
            tools_list_changed: self.tools_list_changed && offers("tools", "listChanged"),
            prompts_list_changed: self.prompts_list_changed && offers("prompts", "listChanged"),
            resources_list_changed: self.resources_list_changed
                && offers("resources", "listChanged"),
            resource_subscriptions: if offers("resources", "subscribe") {
                self.resource_subscriptions.clone()
            } else {
                BTreeSet::new()
            },
        }
    }

    /// Whether a subscription with this filter carries notification `method` with `params`.
    /// Nothing else is (never a request-scoped notification: logs, progress).
    pub fn carries(&self, method: &str, params: &Value) -> bool {
        match method {
            "notifications/tools/list_changed" => self.tools_list_changed,
            "notifications/prompts/list_changed" => self.prompts_list_changed,
            "notifications/resources/list_changed" => self.resources_list_changed,
            "notifications/resources/updated" => params
                .get("uri")
                .and_then(Value::as_str)
                .is_some_and(|uri| self.resource_subscriptions.contains(uri)),
            _ => false,
        }
    }

    /// The filter as the wire names it (only what it carries).
    pub fn to_json(&self) -> Value {
        let mut fields = Map::new();
        for (name, on) in [
            ("toolsListChanged", self.tools_list_changed),
            ("promptsListChanged", self.prompts_list_changed),
            ("resourcesListChanged", self.resources_list_changed),
        ] {
            if on {
                fields.insert(name.into(), json!(true));
            }
        }
        if !self.resource_subscriptions.is_empty() {
            fields.insert(
                "resourceSubscriptions".into(),
                json!(self.resource_subscriptions),
            );
        }
        Value::Object(fields)
    }
}

/// `params` with the subscription's id added to their `_meta` (a notification delivered on it).
pub fn tagged(params: Option<&Value>, subscription: &Value) -> Value {
    let mut params = match params {
        Some(Value::Object(map)) => Value::Object(map.clone()),
        _ => json!({}),
    };
    if !params.get("_meta").is_some_and(Value::is_object) {
        params["_meta"] = json!({});
    }
    params["_meta"][SUBSCRIPTION_ID] = subscription.clone();
    params
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscription_carries_only_what_was_asked_and_is_offered() {
        let asked = Filter::requested(&json!({"notifications": {
            "toolsListChanged": true, "promptsListChanged": true, "resourcesListChanged": "yes",
            "resourceSubscriptions": ["file:///a", 7]}}));
        assert!(!asked.resources_list_changed, "only a boolean asks");
        let offered = json!({"tools": {"listChanged": true}, "prompts": {}, "resources": {"subscribe": true}});
        let honoured = asked.honoured(&offered);
        assert_eq!(
            honoured.to_json(),
            json!({"toolsListChanged": true, "resourceSubscriptions": ["file:///a"]})
        );
        assert!(honoured.carries("notifications/tools/list_changed", &json!({})));
        assert!(
            !honoured.carries("notifications/prompts/list_changed", &json!({})),
            "not offered"
        );
        assert!(honoured.carries(
            "notifications/resources/updated",
            &json!({"uri": "file:///a"})
        ));
        assert!(!honoured.carries(
            "notifications/resources/updated",
            &json!({"uri": "file:///b"})
        ));
        assert!(
            !honoured.carries("notifications/message", &json!({})),
            "logs are request-scoped"
        );
        assert_eq!(
            Filter::requested(&json!({})).honoured(&offered),
            Filter::default()
        );
        let tagged = tagged(Some(&json!({"uri": "u", "_meta": {"k": 1}})), &json!(42));
        assert_eq!(tagged["_meta"], json!({"k": 1, SUBSCRIPTION_ID: 42}));
        assert_eq!(tagged["uri"], "u");
    }
}
