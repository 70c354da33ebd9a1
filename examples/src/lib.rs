//! Examples of tether's libraries; run them with `cargo run -p tether-examples --example NAME`.
//! See `examples/README.md`.

pub mod rmcp_counter;
