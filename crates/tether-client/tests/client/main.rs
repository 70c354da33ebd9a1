//! The client against a real tether server, through a real fault proxy.

mod chaos;
mod reactions;
mod telemetry;
