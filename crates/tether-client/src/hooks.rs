//! Answers to the server's own requests (sampling, elicitation, roots, ping).

use std::future::Future;
use std::pin::Pin;

use serde_json::{Value, json};
use tether_core::jsonrpc::{ErrorObject, code};

/// The future a hook returns.
pub type HookFuture = Pin<Box<dyn Future<Output = Result<Value, ErrorObject>> + Send + 'static>>;

/// Answers requests the server sends to the client.
pub trait ServerRequests: Send + Sync + 'static {
    /// The capabilities to declare in `initialize` (they must match what `answer` handles).
    fn capabilities(&self) -> Value;

    /// Answers one request.
    fn answer(&self, method: &str, params: Value) -> HookFuture;
}

/// Answers `ping`, `roots/list` (no roots) and `elicitation/create` (accepts with the defaults
/// the schema gives); refuses sampling, which needs a model.
#[derive(Debug, Default, Clone, Copy)]
pub struct DefaultHooks;

impl ServerRequests for DefaultHooks {
    fn capabilities(&self) -> Value {
        json!({"roots": {"listChanged": false}, "elicitation": {}})
    }

    fn answer(&self, method: &str, params: Value) -> HookFuture {
        let result = match method {
            "ping" => Ok(json!({})),
            "roots/list" => Ok(json!({"roots": []})),
            "elicitation/create" => Ok(accept_with_defaults(&params)),
            other => Err(ErrorObject::with_reason(
                code::METHOD_NOT_FOUND,
                format!("this client does not handle {other}"),
                "not_supported",
            )),
        };
        Box::pin(std::future::ready(result))
    }
}

/// Accepts an elicitation with every default of its requested schema filled in.
fn accept_with_defaults(params: &Value) -> Value {
    let mut content = serde_json::Map::new();
    if let Some(properties) = params.pointer("/requestedSchema/properties").and_then(Value::as_object) {
        for (name, schema) in properties {
            if let Some(default) = schema.get("default") {
                content.insert(name.clone(), default.clone());
            }
        }
    }
    json!({"action": "accept", "content": content})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elicitation_is_accepted_with_schema_defaults() {
        let params = json!({"message": "m", "requestedSchema": {"type": "object", "properties": {
            "name": {"type": "string", "default": "John Doe"}, "age": {"type": "integer", "default": 30},
            "free": {"type": "string"}}}});
        assert_eq!(
            accept_with_defaults(&params),
            json!({"action": "accept", "content": {"name": "John Doe", "age": 30}})
        );
    }
}
