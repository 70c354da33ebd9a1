//! Sessions in this process: what it keeps of each beyond its store record (`runtime`), and the
//! one owner of their life (`service`).

mod runtime;
pub(crate) mod service;

pub use runtime::LogLevel;
#[cfg(test)]
pub(crate) use runtime::test_record;
pub(crate) use runtime::{Attachment, SessionRuntime};
pub(crate) use service::Sessions;
