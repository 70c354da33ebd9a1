//! The request runtime: a request is recorded, run (`eager`: where it starts until it must
//! wait, then in a task of its own) with a [`Context`]
//! (`context`), its output sent to one sink (`output`), its outcome recorded under its
//! idempotency key (`idempotency`), and the input it asks for gathered in rounds (`input`).
//!
//! [`Context`]: context::Context

pub(crate) mod context;
pub(crate) mod dispatch;
pub(crate) mod eager;
pub(crate) mod idempotency;
pub(crate) mod input;
pub(crate) mod output;
