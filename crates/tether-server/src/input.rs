//! What a handler returns to ask the client for input before it can finish (SEP-2322, 2026-07-28
//! multi round-trip requests): the requests it needs answered and the state it wants back. The
//! server seals the state; the next round's handler reads the answers with
//! [`Context::input_response`](crate::Context::input_response) and the state with
//! [`Context::request_state`](crate::Context::request_state).

use serde_json::{Map, Value, json};
use tether_core::input_required::{RESULT_TYPE, STATE};

/// An `InputRequiredResult` under construction.
#[derive(Debug, Clone, Default)]
pub struct InputRequired {
    requests: Map<String, Value>,
    state: Option<Value>,
}

impl InputRequired {
    /// Asks for nothing yet.
    pub fn new() -> InputRequired {
        InputRequired::default()
    }

    /// Asks the client to answer `method` (`elicitation/create`, `sampling/createMessage`,
    /// `roots/list`) with `params`; its answer comes back under `key`.
    pub fn ask(mut self, key: &str, method: &str, params: Value) -> InputRequired {
        self.requests.insert(key.to_owned(), json!({"method": method, "params": params}));
        self
    }

    /// Whether anything is asked.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// The state to get back with the answers: whatever the handler needs to go on where it
    /// stopped. It travels signed, so the client cannot change it or move it to another request;
    /// it is not encrypted, so it must hold nothing the client may not read.
    pub fn state(mut self, state: Value) -> InputRequired {
        self.state = Some(state);
        self
    }

    /// The result a handler returns.
    pub fn into_result(self) -> Value {
        let mut result = json!({"resultType": RESULT_TYPE});
        if !self.requests.is_empty() {
            result["inputRequests"] = Value::Object(self.requests);
        }
        if let Some(state) = self.state {
            result[STATE] = state;
        }
        result
    }
}
