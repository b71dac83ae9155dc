//! Every crate's configuration read from TOML. See `config_cases.rs`.
#![no_main]

mod config_cases;

use config_cases::Format;
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;

struct Toml;

impl Format for Toml {
    fn read<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
        toml::from_str(std::str::from_utf8(bytes).ok()?).ok()
    }
    fn write<T: Serialize>(value: &T) -> Option<Vec<u8>> {
        toml::to_string(value).ok().map(String::into_bytes)
    }
}

fuzz_target!(|data: &[u8]| config_cases::check::<Toml>(data));
