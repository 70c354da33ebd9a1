#![no_main]

include!("../http_checks.rs");

libfuzzer_sys::fuzz_target!(|data: &[u8]| check_http_exchange(data));
