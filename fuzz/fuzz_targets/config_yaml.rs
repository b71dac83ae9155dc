//! Every crate's configuration read from YAML. See `config_cases.rs`.
#![no_main]

mod config_cases;

use config_cases::Format;
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;

struct Yaml;

impl Format for Yaml {
    fn read<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
        yaml_serde::from_slice(bytes).ok()
    }
    fn write<T: Serialize>(value: &T) -> Option<Vec<u8>> {
        yaml_serde::to_string(value).ok().map(String::into_bytes)
    }
}

fuzz_target!(|data: &[u8]| config_cases::check::<Yaml>(data));
