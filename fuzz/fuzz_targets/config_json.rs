//! Every crate's configuration read from JSON. See `config_cases.rs`.
#![no_main]

mod config_cases;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| config_cases::check::<config_cases::Json>(data));
