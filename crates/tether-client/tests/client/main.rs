//! The client against a real tether server, through a real fault proxy.

mod chaos;
mod input;
mod reactions;
mod tasks;
mod telemetry;
mod unsent;
