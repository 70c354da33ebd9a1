//! Tool parameters mirrored in HTTP headers (SEP-2243, 2026-07-28): a tool's input schema marks a
//! parameter with `"x-mcp-header": "<Label>"`, clients send its value as `Mcp-Param-<Label>`,
//! and the server refuses a call whose headers do not say what its body says, so whatever routes
//! on headers (a gateway, a balancer) sees the truth.
//!
//! Values are text; a string that is not plain visible ASCII, or has whitespace at either end,
//! travels as `=?base64?<standard base64 of its UTF-8>?=`.

use serde_json::Value;

use crate::base64::{self, Encoding};

/// The prefix of every parameter header.
pub const PREFIX: &str = "mcp-param-";

/// The keyword that marks a parameter.
pub const KEYWORD: &str = "x-mcp-header";

/// The type of a mirrored parameter: only these can be written as a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// A JSON string, compared exactly.
    String,
    /// A JSON integer, compared as a number.
    Integer,
    /// A JSON boolean, `true` or `false`.
    Boolean,
}

/// One mirrored parameter of a tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamHeader {
    /// The parameter's name in `arguments`.
    pub property: String,
    /// The header's label: the header is `Mcp-Param-<label>`.
    pub label: String,
    /// Its type.
    pub kind: ParamKind,
}

impl ParamHeader {
    /// The header's name, lowercase.
    pub fn header_name(&self) -> String {
        format!("{PREFIX}{}", self.label.to_ascii_lowercase())
    }
}

/// Why a tool's declaration of mirrored parameters is invalid (clients drop such tools).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeclarationError {
    /// The label is not a non-empty string.
    #[error("parameter {0:?}: x-mcp-header must be a non-empty string")]
    Empty(String),
    /// The label has a character a header name cannot have.
    #[error("parameter {0:?}: x-mcp-header may hold only visible ASCII without ':'")]
    Charset(String),
    /// The parameter is not a string, integer or boolean.
    #[error(
        "parameter {0:?}: only string, integer and boolean parameters can be mirrored in a header"
    )]
    NotPrimitive(String),
    /// Two parameters use one label (labels compare without case, as header names do).
    #[error("header label {0:?} is used twice")]
    Duplicate(String),
}

/// The parameters `input_schema` mirrors in headers, by property name.
pub fn declared(input_schema: &Value) -> Result<Vec<ParamHeader>, DeclarationError> {
    let Some(properties) = input_schema.get("properties").and_then(Value::as_object) else {
        return Ok(Vec::new());
    };
    let mut headers: Vec<ParamHeader> = Vec::new();
    for (property, schema) in properties {
        let Some(label) = schema.get(KEYWORD) else {
            continue;
        };
        let label = match label.as_str() {
            Some(label) if !label.is_empty() => label,
            _ => return Err(DeclarationError::Empty(property.clone())),
        };
        if !label.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
            return Err(DeclarationError::Charset(property.clone()));
        }
        let kind = match schema.get("type").and_then(Value::as_str) {
            Some("string") => ParamKind::String,
            Some("integer") => ParamKind::Integer,
            Some("boolean") => ParamKind::Boolean,
            _ => return Err(DeclarationError::NotPrimitive(property.clone())),
        };
        if headers.iter().any(|h| h.label.eq_ignore_ascii_case(label)) {
            return Err(DeclarationError::Duplicate(label.to_owned()));
        }
        headers.push(ParamHeader {
            property: property.clone(),
            label: label.to_owned(),
            kind,
        });
    }
    Ok(headers)
}

/// Why a call's headers do not match its arguments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    /// The argument is in the body, its header is not.
    #[error("header Mcp-Param-{0} is required: the call has that argument")]
    Missing(String),
    /// The header is there, the argument is not.
    #[error("header Mcp-Param-{0} names an argument the call does not have")]
    Unexpected(String),
    /// The header's value is not valid (bad base64, not UTF-8).
    #[error("header Mcp-Param-{0}: {1}")]
    Invalid(String, ValueError),
    /// The header's value is not ASCII: a value that is must be sent as `=?base64?…?=`.
    #[error("header Mcp-Param-{0} is not ASCII: send such a value as =?base64?…?=")]
    NotAscii(String),
    /// The header says something else than the body.
    #[error("header Mcp-Param-{0} does not match the argument")]
    Differs(String),
}

/// Checks each of `declared` against `arguments`, reading headers' raw bytes through `header`
/// (by lowercase name).
pub fn check<'h>(
    declared: &[ParamHeader],
    arguments: &Value,
    header: impl Fn(&str) -> Option<&'h [u8]>,
) -> Result<(), Mismatch> {
    for param in declared {
        let argument = arguments.get(&param.property).filter(|v| !v.is_null());
        let sent = header(&param.header_name());
        let (argument, sent) = match (argument, sent) {
            (None, None) => continue,
            (Some(_), None) => return Err(Mismatch::Missing(param.label.clone())),
            (None, Some(_)) => return Err(Mismatch::Unexpected(param.label.clone())),
            (Some(argument), Some(sent)) => (argument, sent),
        };
        let sent = match std::str::from_utf8(sent) {
            Ok(sent) if sent.is_ascii() => sent,
            _ => return Err(Mismatch::NotAscii(param.label.clone())),
        };
        let sent = decode_value(sent).map_err(|e| Mismatch::Invalid(param.label.clone(), e))?;
        let same = match param.kind {
            ParamKind::String => argument.as_str() == Some(sent.as_str()),
            ParamKind::Integer => argument
                .as_i64()
                .is_some_and(|n| sent.parse::<i64>() == Ok(n)),
            ParamKind::Boolean => argument
                .as_bool()
                .is_some_and(|b| sent == if b { "true" } else { "false" }),
        };
        if !same {
            return Err(Mismatch::Differs(param.label.clone()));
        }
    }
    Ok(())
}

/// Why a header value cannot be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// Not standard base64 with its padding.
    #[error("the =?base64?…?= value is not padded standard base64")]
    Base64,
    /// The decoded bytes are not UTF-8.
    #[error("the =?base64?…?= value is not UTF-8")]
    Utf8,
}

/// A header value as the text it stands for: surrounding whitespace dropped, and
/// `=?base64?…?=` decoded (strictly: standard alphabet, padding required). Any other value is
/// taken literally.
pub fn decode_value(raw: &str) -> Result<String, ValueError> {
    let raw = raw.trim_matches([' ', '\t']);
    let Some(encoded) = raw
        .strip_prefix("=?base64?")
        .and_then(|v| v.strip_suffix("?="))
    else {
        return Ok(raw.to_owned());
    };
    String::from_utf8(base64::decode(encoded, Encoding::StandardPadded).ok_or(ValueError::Base64)?)
        .map_err(|_| ValueError::Utf8)
}

/// How a client writes `value` in a header: as it is if it is visible ASCII and spaces with no
/// whitespace at either end, else `=?base64?…?=`.
pub fn encode_value(value: &str) -> String {
    let plain = value.bytes().all(|b| (0x20..0x7f).contains(&b)) && value.trim() == value;
    if plain {
        value.to_owned()
    } else {
        format!(
            "=?base64?{}?=",
            base64::encode(value.as_bytes(), Encoding::StandardPadded)
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn values_are_decoded_strictly_and_taken_literally_otherwise() {
        assert_eq!(decode_value("=?base64?SGVsbG8=?="), Ok("Hello".into()));
        assert_eq!(
            decode_value("  =?base64?w6lsw6h2ZQ==?=\t"),
            Ok("\u{e9}l\u{e8}ve".into())
        );
        assert_eq!(
            decode_value("=?base64?SGVsbG8?="),
            Err(ValueError::Base64),
            "padding is required"
        );
        assert_eq!(
            decode_value("=?base64?SGVs!!!bG8=?="),
            Err(ValueError::Base64)
        );
        assert_eq!(
            decode_value("=?base64?SGVs=bG8=?="),
            Err(ValueError::Base64),
            "padding only at the end"
        );
        assert_eq!(decode_value("=?base64?/w==?="), Err(ValueError::Utf8));
        assert_eq!(decode_value("SGVsbG8="), Ok("SGVsbG8=".into()));
        assert_eq!(
            decode_value("=?base64?SGVsbG8="),
            Ok("=?base64?SGVsbG8=".into()),
            "no suffix: a literal"
        );
    }

    #[test]
    fn encoding_round_trips_and_leaves_plain_values_plain() {
        for value in [
            "Hello",
            "two words",
            " padded",
            "tab\there",
            "\u{e9}l\u{e8}ve",
            "",
            "a",
            "ab",
            "abc",
        ] {
            assert_eq!(
                decode_value(&encode_value(value)).as_deref(),
                Ok(value),
                "{value:?}"
            );
        }
        assert_eq!(encode_value("two words"), "two words");
        assert_eq!(encode_value(" padded"), "=?base64?IHBhZGRlZA==?=");
    }

    #[test]
    fn declarations_are_read_by_name_and_checked() {
        let schema = json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "plain": {"type": "string"},
            "n": {"type": "integer", "x-mcp-header": "N"}}});
        let headers = declared(&schema).expect("valid");
        assert_eq!(
            headers.iter().map(|h| h.header_name()).collect::<Vec<_>>(),
            ["mcp-param-n", "mcp-param-region"]
        );
        let bad = |property: Value| {
            declared(
                &json!({"properties": {"a": property, "b": {"type": "string", "x-mcp-header": "B"}}}),
            )
        };
        assert_eq!(
            bad(json!({"type": "string", "x-mcp-header": ""})),
            Err(DeclarationError::Empty("a".into()))
        );
        assert_eq!(
            bad(json!({"type": "string", "x-mcp-header": "a b"})),
            Err(DeclarationError::Charset("a".into()))
        );
        assert_eq!(
            bad(json!({"type": "number", "x-mcp-header": "A"})),
            Err(DeclarationError::NotPrimitive("a".into()))
        );
        assert_eq!(
            bad(json!({"type": "string", "x-mcp-header": "b"})),
            Err(DeclarationError::Duplicate("B".into()))
        );
    }

    #[test]
    fn a_call_must_say_in_its_headers_what_its_body_says() {
        let schema = json!({"properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "n": {"type": "integer", "x-mcp-header": "N"},
            "dry": {"type": "boolean", "x-mcp-header": "Dry"}}});
        let declared = declared(&schema).expect("valid");
        let call = |arguments: Value, headers: &[(&str, &str)]| {
            let headers: Vec<(String, String)> = headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            check(&declared, &arguments, |name| {
                headers
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.as_bytes())
            })
        };
        let all = [
            ("mcp-param-region", "=?base64?SGVsbG8=?="),
            ("mcp-param-n", "7"),
            ("mcp-param-dry", "false"),
        ];
        assert_eq!(
            call(json!({"region": "Hello", "n": 7, "dry": false}), &all),
            Ok(())
        );
        assert_eq!(
            call(json!({}), &[]),
            Ok(()),
            "absent arguments need no headers"
        );
        assert_eq!(
            call(json!({"region": "Hello"}), &[]),
            Err(Mismatch::Missing("Region".into()))
        );
        assert_eq!(
            call(json!({}), &all[..1]),
            Err(Mismatch::Unexpected("Region".into()))
        );
        assert_eq!(
            call(json!({"region": "Bye"}), &all[..1]),
            Err(Mismatch::Differs("Region".into()))
        );
        assert_eq!(
            call(json!({"n": 8}), &all[1..2]),
            Err(Mismatch::Differs("N".into()))
        );
        assert_eq!(
            call(json!({"dry": true}), &all[2..]),
            Err(Mismatch::Differs("Dry".into()))
        );
        assert!(matches!(
            call(
                json!({"region": "Hello"}),
                &[("mcp-param-region", "=?base64?SGVsbG8?=")]
            ),
            Err(Mismatch::Invalid(..))
        ));
        assert_eq!(
            call(
                json!({"region": "Zürich"}),
                &[("mcp-param-region", "Zürich")]
            ),
            Err(Mismatch::NotAscii("Region".into())),
            "raw UTF-8 is named as such, not as a missing header"
        );
    }
}
