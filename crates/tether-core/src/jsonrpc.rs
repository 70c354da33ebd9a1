//! JSON-RPC 2.0 messages as MCP uses them.
//!
//! Parsing classifies every failure the way the server must answer it: bytes that are not
//! JSON are a parse error (-32700), JSON that is not a valid message is an invalid request
//! (-32600), each with a reason a person can act on.

use std::fmt;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

/// The standard JSON-RPC error codes.
pub mod code {
    /// The body is not JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// The JSON is not a valid JSON-RPC message.
    pub const INVALID_REQUEST: i64 = -32600;
    /// The method does not exist.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// The params are invalid for the method.
    pub const INVALID_PARAMS: i64 = -32602;
    /// An internal error of the receiver.
    pub const INTERNAL_ERROR: i64 = -32603;
}

/// A request id: a string or an integer, never null.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RequestId {
    /// An integer id.
    Number(i64),
    /// A string id.
    String(String),
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::Number(n) => write!(f, "{n}"),
            RequestId::String(s) => write!(f, "{s:?}"),
        }
    }
}

impl From<i64> for RequestId {
    fn from(n: i64) -> Self {
        RequestId::Number(n)
    }
}

impl From<&str> for RequestId {
    fn from(s: &str) -> Self {
        RequestId::String(s.to_owned())
    }
}

impl Serialize for RequestId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            RequestId::Number(n) => serializer.serialize_i64(*n),
            RequestId::String(s) => serializer.serialize_str(s),
        }
    }
}

impl RequestId {
    /// The id as a JSON value.
    pub fn to_value(&self) -> Value {
        match self {
            RequestId::Number(n) => Value::from(*n),
            RequestId::String(s) => Value::from(s.as_str()),
        }
    }

    /// The longest string id accepted, in bytes: ids are kept with every request's record, so
    /// their length is bounded like everything else a peer sends.
    pub const MAX_STRING_BYTES: usize = 256;

    /// The id a JSON value is, or why it is none (JSON-RPC ids are strings or integers, and a
    /// string id is at most [`RequestId::MAX_STRING_BYTES`] long).
    pub fn from_value(value: &Value) -> Result<RequestId, String> {
        match value {
            Value::String(s) if s.len() > Self::MAX_STRING_BYTES => Err(format!(
                "a string id is at most {} bytes long, this one {}",
                Self::MAX_STRING_BYTES,
                s.len()
            )),
            Value::String(s) => Ok(RequestId::String(s.clone())),
            Value::Number(n) => n
                .as_i64()
                .map(RequestId::Number)
                .ok_or_else(|| format!("id {n} is not an integer in the signed 64-bit range")),
            Value::Null => Err("id must not be null".to_owned()),
            _ => Err("id must be a string or an integer".to_owned()),
        }
    }
}

/// A request: expects exactly one response with the same id.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The id the response will carry.
    pub id: RequestId,
    /// The method name.
    pub method: String,
    /// The params object or array, if any.
    pub params: Option<Value>,
}

/// A notification: no id, never answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    /// The method name.
    pub method: String,
    /// The params object or array, if any.
    pub params: Option<Value>,
}

/// The error member of an error response.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ErrorObject {
    /// The error code.
    pub code: i64,
    /// A short description.
    pub message: String,
    /// Structured detail; tether puts `{"reason": ...}` here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl ErrorObject {
    /// An error with a machine-readable reason in `data.reason`.
    pub fn with_reason(code: i64, message: impl Into<String>, reason: &str) -> ErrorObject {
        ErrorObject {
            code,
            message: message.into(),
            data: Some(serde_json::json!({ "reason": reason })),
        }
    }

    /// Reads an error object from its JSON (`code`, `message`, optional `data`).
    pub fn from_value(value: Value) -> Result<ErrorObject, ParseError> {
        error_from_value(value)
    }

    /// The error object as JSON.
    pub fn to_value(&self) -> Value {
        let mut fields = serde_json::Map::new();
        fields.insert("code".into(), Value::from(self.code));
        fields.insert("message".into(), Value::from(self.message.clone()));
        if let Some(data) = &self.data {
            fields.insert("data".into(), data.clone());
        }
        Value::Object(fields)
    }

    /// The `data.reason` string, if the error carries one.
    pub fn reason(&self) -> Option<&str> {
        self.data.as_ref()?.get("reason")?.as_str()
    }
}

/// A response: the outcome of the request with the same id.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// The request's id; `None` only for an error about a request whose id could not be read.
    pub id: Option<RequestId>,
    /// The result or the error.
    pub outcome: Result<Value, ErrorObject>,
}

impl Response {
    /// A successful response.
    pub fn result(id: RequestId, result: Value) -> Response {
        Response {
            id: Some(id),
            outcome: Ok(result),
        }
    }

    /// An error response.
    pub fn error(id: Option<RequestId>, error: ErrorObject) -> Response {
        Response {
            id,
            outcome: Err(error),
        }
    }
}

/// Any JSON-RPC message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A request.
    Request(Request),
    /// A notification.
    Notification(Notification),
    /// A response.
    Response(Response),
}

impl Message {
    /// Serializes the message to compact JSON bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        serde_json::to_vec(self)
            .expect("a message serializes: every map key is a string, every value a serde_json::Value or a primitive")
    }

    /// The method of a request or notification.
    pub fn method(&self) -> Option<&str> {
        match self {
            Message::Request(r) => Some(&r.method),
            Message::Notification(n) => Some(&n.method),
            Message::Response(_) => None,
        }
    }
}

impl From<Request> for Message {
    fn from(r: Request) -> Self {
        Message::Request(r)
    }
}

impl From<Notification> for Message {
    fn from(n: Notification) -> Self {
        Message::Notification(n)
    }
}

impl From<Response> for Message {
    fn from(r: Response) -> Self {
        Message::Response(r)
    }
}

impl Serialize for Message {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("jsonrpc", "2.0")?;
        match self {
            Message::Request(r) => {
                map.serialize_entry("id", &r.id)?;
                map.serialize_entry("method", &r.method)?;
                if let Some(params) = &r.params {
                    map.serialize_entry("params", params)?;
                }
            }
            Message::Notification(n) => {
                map.serialize_entry("method", &n.method)?;
                if let Some(params) = &n.params {
                    map.serialize_entry("params", params)?;
                }
            }
            Message::Response(r) => {
                map.serialize_entry("id", &r.id)?;
                match &r.outcome {
                    Ok(result) => map.serialize_entry("result", result)?,
                    Err(error) => map.serialize_entry("error", error)?,
                }
            }
        }
        map.end()
    }
}

/// A POST body: one message, or (2025-03-26 only) a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// One message.
    Single(Message),
    /// A non-empty array of messages.
    Batch(Vec<Message>),
}

/// Why bytes are not a valid JSON-RPC message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The bytes are not JSON (-32700).
    #[error("not JSON: {0}")]
    NotJson(String),
    /// JSON, but not a valid JSON-RPC message (-32600).
    #[error("invalid JSON-RPC message: {0}")]
    Invalid(String),
}

impl ParseError {
    /// The JSON-RPC error code for this failure.
    pub fn code(&self) -> i64 {
        match self {
            ParseError::NotJson(_) => code::PARSE_ERROR,
            ParseError::Invalid(_) => code::INVALID_REQUEST,
        }
    }

    /// The error object to answer with.
    pub fn to_error_object(&self) -> ErrorObject {
        let reason = match self {
            ParseError::NotJson(_) => "parse_error",
            ParseError::Invalid(_) => "invalid_message",
        };
        ErrorObject {
            code: self.code(),
            message: self.to_string(),
            data: Some(serde_json::json!({ "reason": reason })),
        }
    }
}

/// Parses a POST body: one message or a batch.
pub fn parse_body(bytes: &[u8]) -> Result<Body, ParseError> {
    match parse_shape(bytes)? {
        Shape::Array(items) if items.is_empty() => {
            Err(ParseError::Invalid("empty batch".to_owned()))
        }
        Shape::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                message_from_shape(item).map_err(|e| match e {
                    ParseError::Invalid(reason) => {
                        ParseError::Invalid(format!("batch element {i}: {reason}"))
                    }
                    other => other,
                })
            })
            .collect::<Result<_, _>>()
            .map(Body::Batch),
        shape => message_from_shape(shape).map(Body::Single),
    }
}

/// Parses exactly one message (batches are rejected).
pub fn parse_message(bytes: &[u8]) -> Result<Message, ParseError> {
    message_from_shape(parse_shape(bytes)?)
}

/// Reads JSON as far as the rules look: an object's members that name a message's parts, and
/// an array's elements, without building a tree of the rest.
fn parse_shape(bytes: &[u8]) -> Result<Shape, ParseError> {
    serde_json::from_slice(bytes).map_err(|e| ParseError::NotJson(e.to_string()))
}

/// Classifies a JSON value as a message.
pub fn message_from_value(value: Value) -> Result<Message, ParseError> {
    match value {
        Value::Object(object) => message_from_members(Members::of(object)),
        _ => Err(not_an_object()),
    }
}

fn message_from_shape(shape: Shape) -> Result<Message, ParseError> {
    match shape {
        Shape::Object(members) => message_from_members(members),
        Shape::Array(_) | Shape::Other => Err(not_an_object()),
    }
}

fn not_an_object() -> ParseError {
    ParseError::Invalid("a message must be a JSON object".to_owned())
}

/// What makes a message of an object's members, whichever way they were read.
fn message_from_members(members: Members) -> Result<Message, ParseError> {
    let invalid = |reason: &str| ParseError::Invalid(reason.to_owned());
    let Members {
        jsonrpc,
        id: id_value,
        method,
        params,
        result,
        error,
    } = members;
    if jsonrpc.as_ref().and_then(Value::as_str) != Some("2.0") {
        return Err(invalid(r#"the "jsonrpc" member must be "2.0""#));
    }
    let id = id_value.as_ref().map(RequestId::from_value);
    if let Some(method) = method {
        let Value::String(method) = method else {
            return Err(invalid(r#"the "method" member must be a string"#));
        };
        let params = checked_params(params)?;
        return match id {
            None => Ok(Message::Notification(Notification { method, params })),
            Some(Ok(id)) => Ok(Message::Request(Request { id, method, params })),
            Some(Err(reason)) => Err(ParseError::Invalid(reason)),
        };
    }
    let outcome = match (result, error) {
        (Some(result), None) => Ok(result),
        (None, Some(error)) => Err(error_from_value(error)?),
        (Some(_), Some(_)) => {
            return Err(invalid(r#"a response has "result" or "error", not both"#));
        }
        (None, None) => return Err(invalid(r#"a message needs "method", "result" or "error""#)),
    };
    let id = match (id, &outcome) {
        (Some(Ok(id)), _) => Some(id),
        // An error about an unreadable request may carry a null id.
        (Some(Err(_)), Err(_)) if id_value == Some(Value::Null) => None,
        (Some(Err(reason)), _) => return Err(ParseError::Invalid(reason)),
        (None, _) => return Err(invalid(r#"a response needs an "id""#)),
    };
    Ok(Message::Response(Response { id, outcome }))
}

/// The members of a message object the rules read; a member given twice is the last one.
#[derive(Default)]
struct Members {
    jsonrpc: Option<Value>,
    id: Option<Value>,
    method: Option<Value>,
    params: Option<Value>,
    result: Option<Value>,
    error: Option<Value>,
}

impl Members {
    /// The members of an object already read whole.
    fn of(mut object: Map<String, Value>) -> Members {
        let mut members = Members::default();
        for part in Part::ALL {
            *members.slot(part) = object.remove(part.name());
        }
        members
    }

    fn slot(&mut self, part: Part) -> &mut Option<Value> {
        match part {
            Part::Jsonrpc => &mut self.jsonrpc,
            Part::Id => &mut self.id,
            Part::Method => &mut self.method,
            Part::Params => &mut self.params,
            Part::Result => &mut self.result,
            Part::Error => &mut self.error,
        }
    }
}

/// A member of a message object that the rules read.
#[derive(Debug, Clone, Copy)]
enum Part {
    Jsonrpc,
    Id,
    Method,
    Params,
    Result,
    Error,
}

impl Part {
    const ALL: [Part; 6] = [
        Part::Jsonrpc,
        Part::Id,
        Part::Method,
        Part::Params,
        Part::Result,
        Part::Error,
    ];

    /// The member's name.
    fn name(self) -> &'static str {
        match self {
            Part::Jsonrpc => "jsonrpc",
            Part::Id => "id",
            Part::Method => "method",
            Part::Params => "params",
            Part::Result => "result",
            Part::Error => "error",
        }
    }

    /// The part a member called `name` is, if any.
    fn named(name: &str) -> Option<Part> {
        Part::ALL.into_iter().find(|part| part.name() == name)
    }
}

/// A JSON document as [`parse_shape`] reads it.
enum Shape {
    /// An object: its members that name a message's parts.
    Object(Members),
    /// An array: its elements.
    Array(Vec<Shape>),
    /// A string, a number, a boolean or null.
    Other,
}

impl<'de> serde::Deserialize<'de> for Shape {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Shape, D::Error> {
        deserializer.deserialize_any(ShapeVisitor)
    }
}

struct ShapeVisitor;

impl<'de> serde::de::Visitor<'de> for ShapeVisitor {
    type Value = Shape;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Shape, E> {
        Ok(Shape::Other)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Shape, E> {
        Ok(Shape::Other)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Shape, E> {
        Ok(Shape::Other)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Shape, E> {
        Ok(Shape::Other)
    }

    fn visit_str<E>(self, _: &str) -> Result<Shape, E> {
        Ok(Shape::Other)
    }

    fn visit_unit<E>(self) -> Result<Shape, E> {
        Ok(Shape::Other)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Shape>()? {
            items.push(item);
        }
        Ok(Shape::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
        let mut members = Members::default();
        while let Some(MemberName(part)) = map.next_key()? {
            match part {
                Some(part) => *members.slot(part) = Some(map.next_value()?),
                None => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(Shape::Object(members))
    }
}

/// The part a member's name names, if any: read without copying the name.
struct MemberName(Option<Part>);

impl<'de> serde::Deserialize<'de> for MemberName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<MemberName, D::Error> {
        struct NameVisitor;
        impl serde::de::Visitor<'_> for NameVisitor {
            type Value = MemberName;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }

            fn visit_str<E>(self, name: &str) -> Result<MemberName, E> {
                Ok(MemberName(Part::named(name)))
            }
        }
        deserializer.deserialize_str(NameVisitor)
    }
}

fn checked_params(params: Option<Value>) -> Result<Option<Value>, ParseError> {
    match params {
        None => Ok(None),
        Some(params @ (Value::Object(_) | Value::Array(_))) => Ok(Some(params)),
        Some(_) => Err(ParseError::Invalid(
            r#""params" must be an object or an array"#.to_owned(),
        )),
    }
}

fn error_from_value(value: Value) -> Result<ErrorObject, ParseError> {
    let invalid = |reason: &str| ParseError::Invalid(reason.to_owned());
    let Value::Object(mut error) = value else {
        return Err(invalid(r#""error" must be an object"#));
    };
    let code = error
        .get("code")
        .and_then(Value::as_i64)
        .ok_or_else(|| invalid(r#""error.code" must be an integer"#))?;
    let Some(Value::String(message)) = error.remove("message") else {
        return Err(invalid(r#""error.message" must be a string"#));
    };
    Ok(ErrorObject {
        code,
        message,
        data: error.remove("data"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: Value) -> Result<Message, ParseError> {
        parse_message(value.to_string().as_bytes())
    }

    #[test]
    fn request_with_integer_and_string_ids() {
        let m = parse(json!({"jsonrpc":"2.0","id":1,"method":"ping"})).expect("valid");
        assert_eq!(
            m,
            Message::Request(Request {
                id: RequestId::Number(1),
                method: "ping".into(),
                params: None
            })
        );
        let m =
            parse(json!({"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"x"}}))
                .expect("valid");
        let Message::Request(r) = m else {
            panic!("not a request")
        };
        assert_eq!(r.id, RequestId::String("a".into()));
        assert_eq!(r.params, Some(json!({"name":"x"})));
    }

    #[test]
    fn null_id_is_rejected_for_requests() {
        let err = parse(json!({"jsonrpc":"2.0","id":null,"method":"ping"})).expect_err("null id");
        assert_eq!(err.code(), code::INVALID_REQUEST);
        assert!(err.to_string().contains("null"));
    }

    #[test]
    fn fractional_and_out_of_range_ids_are_rejected() {
        for id in [json!(1.5), json!(u64::MAX), json!(true), json!({})] {
            let err = parse(json!({"jsonrpc":"2.0","id":id,"method":"ping"})).expect_err("bad id");
            assert_eq!(err.code(), code::INVALID_REQUEST, "{id}");
        }
    }

    #[test]
    fn a_string_id_is_bounded() {
        let longest = "i".repeat(RequestId::MAX_STRING_BYTES);
        assert!(parse(json!({"jsonrpc":"2.0","id":longest,"method":"ping"})).is_ok());
        let err = parse(json!({"jsonrpc":"2.0","id":format!("{longest}i"),"method":"ping"}))
            .expect_err("too long");
        assert_eq!(err.code(), code::INVALID_REQUEST);
        assert!(
            err.to_string().len() < 200,
            "the error does not quote the id"
        );
    }

    #[test]
    fn notification_has_no_id() {
        let m =
            parse(json!({"jsonrpc":"2.0","method":"notifications/initialized"})).expect("valid");
        assert!(matches!(m, Message::Notification(n) if n.method == "notifications/initialized"));
    }

    #[test]
    fn responses_with_result_or_error() {
        let m = parse(json!({"jsonrpc":"2.0","id":3,"result":{}})).expect("valid");
        assert_eq!(m, Message::Response(Response::result(3.into(), json!({}))));
        let m = parse(json!({"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"bad","data":{"reason":"x"}}}))
            .expect("error with null id");
        let Message::Response(r) = m else {
            panic!("not a response")
        };
        assert_eq!(r.id, None);
        assert_eq!(r.outcome.expect_err("error").reason(), Some("x"));
    }

    #[test]
    fn invalid_messages_are_classified_with_a_reason() {
        for (value, needle) in [
            (json!([1, 2]), "batch element 0"),
            (json!("x"), "object"),
            (json!({"id":1,"method":"ping"}), "jsonrpc"),
            (json!({"jsonrpc":"1.0","id":1,"method":"ping"}), "jsonrpc"),
            (json!({"jsonrpc":"2.0","id":1,"method":5}), "method"),
            (
                json!({"jsonrpc":"2.0","id":1,"method":"x","params":3}),
                "params",
            ),
            (json!({"jsonrpc":"2.0","id":1}), "method"),
            (json!({"jsonrpc":"2.0","result":{}}), "id"),
            (
                json!({"jsonrpc":"2.0","id":1,"result":{},"error":{}}),
                "not both",
            ),
            (
                json!({"jsonrpc":"2.0","id":1,"error":{"code":"x","message":"m"}}),
                "code",
            ),
            (json!({"jsonrpc":"2.0","id":null,"result":{}}), "null"),
            (
                json!({"jsonrpc":"2.0","id":1.5,"error":{"code":1,"message":"m"}}),
                "integer",
            ),
        ] {
            let err = parse_body(value.to_string().as_bytes()).expect_err("invalid");
            assert_eq!(err.code(), code::INVALID_REQUEST, "{value}");
            assert!(err.to_string().contains(needle), "{value}: {err}");
        }
    }

    #[test]
    fn non_json_is_a_parse_error() {
        for bytes in [&b"{"[..], b"", b"\xff", b"{\"jsonrpc\":\"2.0\",}"] {
            let err = parse_body(bytes).expect_err("not json");
            assert_eq!(err.code(), code::PARSE_ERROR);
            assert_eq!(err.to_error_object().reason(), Some("parse_error"));
        }
    }

    #[test]
    fn batches_parse_and_empty_batch_is_invalid() {
        let body = parse_body(
            br#"[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"b"}]"#,
        )
        .expect("batch");
        assert!(matches!(body, Body::Batch(ref v) if v.len() == 2));
        assert_eq!(
            parse_body(b"[]").expect_err("empty").code(),
            code::INVALID_REQUEST
        );
        assert!(parse_message(b"[]").is_err());
    }

    /// A message read from its bytes is what the same JSON read as a tree makes of it: the
    /// members read by name as the tree keys them (escapes undone, the last of two alike), the
    /// others skipped.
    #[test]
    fn bytes_and_trees_read_the_same_message() {
        for bytes in [
            &br#"{"jsonrpc":"2.0","id":"a","method":"m","params":{"x":[1,{"y":null}]},"extra":{"z":[true]}}"#[..],
            br#"{"jsonrpc":"2.0","id":1,"method":"first","method":"second"}"#,
            br#"{"json\u0072pc":"2.0","\u0069d":2,"method":"m"}"#,
            br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"m"}}"#,
            br#"{"jsonrpc":"2.0","id":null,"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":3,"result":{},"Result":5}"#,
            br#"{"jsonrpc":"2.0","method":"n","params":[1,2],"id":4,"id":"late"}"#,
            br#"{"jsonrpc":"2.0","id":5,"method":"m","params":null}"#,
            br#"{"jsonrpc":"2.0","id":6,"method":"m","params":{},"jsonrpc":"1.0"}"#,
            br#"[{"jsonrpc":"2.0","id":7,"method":"m"}]"#,
            br#"7"#,
        ] {
            let tree: Value = serde_json::from_slice(bytes).expect("JSON");
            let text = String::from_utf8_lossy(bytes);
            assert_eq!(parse_message(bytes), message_from_value(tree), "{text}");
        }
    }

    #[test]
    fn serialization_round_trips() {
        let messages = [
            Message::Request(Request {
                id: "r1".into(),
                method: "tools/call".into(),
                params: Some(json!({"name":"count","arguments":{"to":3}})),
            }),
            Message::Notification(Notification {
                method: "notifications/progress".into(),
                params: Some(json!({"progressToken":1,"progress":1})),
            }),
            Message::Response(Response::result(7.into(), json!({"content":[]}))),
            Message::Response(Response::error(
                None,
                ErrorObject::with_reason(code::INVALID_REQUEST, "bad", "invalid_message"),
            )),
        ];
        for message in messages {
            let bytes = message.to_vec();
            assert_eq!(parse_message(&bytes).expect("round trip"), message);
            assert!(bytes.starts_with(br#"{"jsonrpc":"2.0""#));
        }
    }
}
