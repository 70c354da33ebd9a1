//! Multi round-trip requests (SEP-2322, 2026-07-28): what a handler returns to ask the client
//! for input before it can finish ([`InputRequired`]: the requests it needs answered and the state
//! it wants back), how the server opens a request's answers and state before the handler runs and
//! seals the state after, and how a session serves the same handler by asking the client
//! itself. The next round's handler reads the answers with
//! [`Context::input_response`](crate::Context::input_response) and the state with
//! [`Context::request_state`](crate::Context::request_state).

use std::sync::Arc;

use serde_json::{Map, Value, json};
use tether_core::input_required::{self, InputError, RESULT_TYPE, STATE};
use tether_core::jsonrpc::{ErrorObject, Message};

use crate::refusal::Refusal;
use crate::request::context::{Context, Input};
use crate::{Handler, ServerState};

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

/// What a 2026-07-28 request brings back from its earlier rounds (SEP-2322), checked before its
/// handler runs: answers that are not an object of objects, or a state this server did not seal
/// for this request, are refused. Methods whose results never ask for input bring nothing.
pub(crate) fn of(shared: &ServerState, method: &str, params: &Value) -> Result<Input, InputError> {
    if !tether_core::methods::may_ask_input(method) {
        return Ok(Input::default());
    }
    let responses = input_required::responses(params)?.cloned().unwrap_or_default();
    let state = match params.get(input_required::STATE) {
        None => None,
        Some(Value::String(sealed)) => {
            let key = shared.state_key.as_ref().ok_or(InputError::State)?;
            Some(key.open(&input_required::binding(method, params), sealed, crate::now_ms())?)
        }
        Some(_) => return Err(InputError::State),
    };
    Ok(Input { responses, state })
}

/// Seals the state of a handler's `InputRequiredResult` for the request it answers, `message`
/// (its JSON-RPC bytes as they came: read again only for a result with a state to seal, so
/// that a request whose result asks nothing costs no digest of its params). The client brings
/// the state back opaque. A result that asks for input where none may be asked, asks for
/// nothing, or cannot be sealed is the handler's error.
pub(crate) fn seal(shared: &ServerState, method: &str, message: &[u8], outcome: &mut Result<Value, ErrorObject>) {
    let Ok(result) = outcome else { return };
    if !input_required::asks(result) {
        return;
    }
    let Value::Object(result) = result else { return };
    let failure = |message: String| Err(Refusal::InputRequiredInvalid.error(message));
    if !tether_core::methods::may_ask_input(method) {
        *outcome = failure(format!("a {method} result cannot ask for input"));
        return;
    }
    if !result.contains_key("inputRequests") && !result.contains_key(input_required::STATE) {
        *outcome = failure("an input-required result must ask for input or carry a state".into());
        return;
    }
    if let Some(state) = result.get_mut(input_required::STATE) {
        let Some(key) = &shared.state_key else {
            *outcome = failure("no key to seal the request state with".into());
            return;
        };
        let binding = match tether_core::jsonrpc::parse_message(message) {
            Ok(Message::Request(request)) => input_required::binding(method, &request.params.unwrap_or_default()),
            _ => {
                *outcome = failure("the request could not be read again to seal its state".into());
                return;
            }
        };
        *state = Value::String(key.seal(&binding, state, crate::now_ms()));
    }
}

/// Who answers a handler's input requests between its rounds, where the server itself carries
/// the request through them (a 2026-07-28 request without a task answers its client instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answerer {
    /// A session, whose client knows nothing of multi round-trip requests: the server
    /// asks the client itself (server-to-client requests on the request's stream), and the
    /// handler's state never leaves the server.
    Session,
    /// A task (SEP-2663), once the request became one: the task waits in `input_required` until
    /// `tasks/update` answers every request. Before it became one, the result answers the request.
    Task,
}

/// A request's params, as its rounds take them. The handler owns the tree once a round runs,
/// and only a result that asks for input has a round after it: where the request's record
/// serialized them (`bytes`), a later round reads them again from there, so that a request
/// that never asks costs no copy of its params.
pub(crate) struct Params {
    /// The params.
    pub(crate) tree: Value,
    /// The same, as JSON, if they were serialized.
    pub(crate) bytes: Option<Vec<u8>>,
}

/// What a round keeps of its params for the next.
enum Kept<'a> {
    /// A copy of the tree.
    Tree(Value),
    /// The tree's JSON, read again.
    Json(&'a [u8]),
}

impl Kept<'_> {
    /// The params of the round after.
    fn params(self) -> Result<Value, ErrorObject> {
        match self {
            Kept::Tree(params) => Ok(params),
            Kept::Json(bytes) => serde_json::from_slice(bytes).map_err(|err| {
                Refusal::InputRequiredInvalid.error(format!("the request's params could not be read again: {err}"))
            }),
        }
    }
}

/// Runs a handler until its result is complete: what it asks for in an `InputRequiredResult`,
/// `answerer` gets answered, then the handler runs again with the answers and its state, at most
/// [`input_required::MAX_ROUNDS`] times. So one handler serves both eras, with or without tasks.
pub(crate) async fn rounds(
    handler: Arc<dyn Handler>,
    ctx: Context,
    method: String,
    params: Params,
    answerer: Answerer,
) -> Result<Value, ErrorObject> {
    let Params { tree: mut round, bytes } = params;
    for _ in 0..input_required::MAX_ROUNDS {
        let kept = match &bytes {
            Some(bytes) => Kept::Json(bytes),
            None => Kept::Tree(round.clone()),
        };
        let result = match handler.call(ctx.clone(), method.clone(), round).await {
            Ok(result) if input_required::asks(&result) => result,
            other => return other,
        };
        let input = match answerer {
            Answerer::Session => ask_client(&ctx, &result).await?,
            Answerer::Task => match ctx.task_id() {
                Some(task) => crate::tasks::ask(&ctx, task, &result).await?,
                None => return Ok(result),
            },
        };
        ctx.next_round(input);
        round = kept.params()?;
    }
    Err(Refusal::InputRequiredInvalid
        .error(format!("the handler still asked for input after {} rounds", input_required::MAX_ROUNDS)))
}

/// Asks the client of a session what `result` asks for: the answers, and the state.
async fn ask_client(ctx: &Context, result: &Value) -> Result<Input, ErrorObject> {
    let mut responses = serde_json::Map::new();
    for (key, asked, asked_params) in input_required::requests(result) {
        let answer = ctx
            .request(asked, asked_params)
            .await
            .map_err(|err| Refusal::InputFailed.error(format!("asking the client failed: {err}")))?;
        responses.insert(key.to_owned(), answer);
    }
    Ok(Input { responses, state: result.get(input_required::STATE).cloned() })
}
