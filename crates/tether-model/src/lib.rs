//! An exhaustive model of MCP stream resumption: one client, two server replicas over a
//! shared store with the real retention and session-expiry rules, and a network that cuts
//! connections and delays or drops what is in flight. The replicas decide resumes with
//! [`tether_core::lineage::decide_resume`] and the client judges every reconnect and event with
//! [`tether_core::lineage::client_verdict`] and [`tether_core::lineage::StreamValidator`]: the
//! model checks the decision code that ships, not a re-implementation of it.
//!
//! [`lifecycle`] models a request's life, from the client's first attempt to what it says of
//! the request, over [`tether_core::lifecycle`]'s decisions. [`task_stream`] models a task's
//! event stream over a store that goes back in time, judged by
//! [`tether_core::lineage::TaskStreamValidator`].
//!
//! [`checker`] visits every reachable state breadth-first and checks the properties of
//! [`protocol`] in each; deliberately broken variants of the server and the client show that
//! each property can fail, and how. Test-only: nothing shipped depends on this crate.

pub mod checker;
pub mod lifecycle;
pub mod protocol;
pub mod task_stream;
