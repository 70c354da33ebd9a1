//! Server-Sent Events codec, per the WHATWG `text/event-stream` rules.
//!
//! The [`Decoder`] turns bytes arriving in arbitrary chunks into [`Event`]s and keeps the
//! stream state a reconnecting client needs (last event id, reconnection time). The
//! [`Encoder`] writes events that the decoder gives back exactly.

mod decode;
mod encode;

pub use decode::{DecodeError, Decoder, Event, Limits};
pub use encode::{EncodeError, Encoder, OutgoingEvent};

/// The media type of an SSE body.
pub const CONTENT_TYPE: &str = "text/event-stream";
