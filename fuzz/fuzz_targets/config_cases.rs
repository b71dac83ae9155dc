//! What the three config targets share: every crate's configuration type,
//! read from the input in one format, checked by the crate, and written back.
//!
//! Input: one selector byte (which crate's configuration), then the file's
//! bytes. Each crate's `build` (or `builder`) must refuse or accept without
//! panicking; a configuration it accepts must survive being written out and
//! read back, in JSON and in the format it was read from.

use std::fmt::Debug;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tower_breaker::BreakerConfig;
use tower_classify::config::HttpClassifierConfig;
use tower_classify::ErrorChainClassifier;
use tower_idempotency::config::IdempotencyConfig;
use tower_idempotency::store::MemoryIdempotencyStore;
use tower_poison::config::DeadLetterConfig;
use tower_poison::store::MemoryStore;
use tower_retry_budget::config::RetryConfig;

/// A configuration file format.
pub trait Format {
    /// `bytes` read as a `T`, if they are one.
    fn read<T: DeserializeOwned>(bytes: &[u8]) -> Option<T>;
    /// `value` written in this format, if the format can express it.
    fn write<T: Serialize>(value: &T) -> Option<Vec<u8>>;
}

/// JSON, the format the crates' documentation uses.
pub struct Json;

impl Format for Json {
    fn read<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
        serde_json::from_slice(bytes).ok()
    }
    fn write<T: Serialize>(value: &T) -> Option<Vec<u8>> {
        serde_json::to_vec(value).ok()
    }
}

/// Checks the configuration selected by `data[0]` read from `data[1..]`.
pub fn check<F: Format>(data: &[u8]) {
    let Some((&selector, file)) = data.split_first() else {
        return;
    };
    match selector % 5 {
        0 => round_trip::<F, HttpClassifierConfig>(file, |c| c.build().is_ok()),
        1 => round_trip::<F, RetryConfig>(file, |c| {
            // The backoff a valid configuration describes is capped and
            // never overflows, however many retries are asked for.
            if let Ok(backoff) = c.backoff.to_backoff() {
                for n in [0, 1, 2, 17, 1_000, u32::MAX] {
                    assert!(backoff.delay(n) <= backoff.max_delay(), "{backoff:?} {n}");
                }
                for delay in backoff.iter_seeded(7).take(20) {
                    assert!(delay <= backoff.max_delay(), "{backoff:?} {delay:?}");
                }
            }
            c.http_builder().and_then(|b| b.build()).is_ok()
        }),
        2 => round_trip::<F, BreakerConfig>(file, |c| {
            c.builder()
                .and_then(|b| b.build(ErrorChainClassifier::new()))
                .is_ok()
        }),
        3 => round_trip::<F, IdempotencyConfig>(file, |c| {
            c.build(MemoryIdempotencyStore::new(1)).is_ok()
        }),
        _ => round_trip::<F, DeadLetterConfig>(file, |c| c.build(MemoryStore::new(1)).is_ok()),
    }
}

/// Reads a `T`, builds it with `build` (which says whether the crate took
/// it), and writes back a configuration the crate took.
fn round_trip<F, T>(file: &[u8], build: impl Fn(&T) -> bool)
where
    F: Format,
    T: DeserializeOwned + Serialize + PartialEq + Debug,
{
    let Some(config) = F::read::<T>(file) else {
        return;
    };
    if !build(&config) {
        return;
    }
    let json = Json::write(&config).expect("an accepted configuration writes as JSON");
    let back: T = Json::read(&json).expect("its JSON reads back");
    assert_eq!(back, config, "{}", String::from_utf8_lossy(&json));
    // Some formats cannot write every value (TOML has no null); those that
    // can must read it back the same.
    if let Some(written) = F::write(&config) {
        let back: T = F::read(&written).expect("a written configuration reads back");
        assert_eq!(back, config, "{}", String::from_utf8_lossy(&written));
    }
}
