//! Black-box tests of `tether-server` over real loopback HTTP.

mod common;
mod modern;
mod protocol;
mod resume;
