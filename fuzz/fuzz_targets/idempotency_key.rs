//! `Idempotency-Key` header values (the guard's key parser).
//!
//! Input: the header value's bytes.
#![no_main]

use http::HeaderValue;
use libfuzzer_sys::fuzz_target;
use tower_idempotency::__fuzz::parse_idempotency_key;
use tower_idempotency::{Rejection, MAX_KEY_LEN};

fuzz_target!(|data: &[u8]| {
    let Ok(value) = HeaderValue::from_bytes(data) else {
        return;
    };
    // One pair of surrounding quotes (a structured-field string) is not part
    // of the key.
    let inner = data
        .strip_prefix(b"\"")
        .and_then(|d| d.strip_suffix(b"\""))
        .unwrap_or(data);
    match parse_idempotency_key(&value) {
        Ok(key) => {
            assert_eq!(key.as_bytes(), inner);
            assert!((1..=MAX_KEY_LEN).contains(&key.len()), "{key:?}");
            assert!(key.bytes().all(|b| b.is_ascii_graphic()), "{key:?}");
            // A key sent quoted is the same key.
            let quoted = HeaderValue::from_str(&format!("\"{key}\"")).unwrap();
            assert_eq!(parse_idempotency_key(&quoted), Ok(key));
        }
        Err(Rejection::KeyTooLong) => {
            assert!(inner.len() > MAX_KEY_LEN);
            assert!(value.to_str().is_ok());
        }
        Err(Rejection::KeyInvalid) => {
            // Not header text (visible ASCII, spaces and tabs), or short
            // enough and not all visible ASCII.
            let visible = !inner.is_empty() && inner.iter().all(u8::is_ascii_graphic);
            assert!(!visible, "{data:?}");
            if value.to_str().is_ok() {
                assert!(inner.len() <= MAX_KEY_LEN, "{data:?}");
            }
        }
        Err(other) => panic!("a key parser refused {data:?} with {other:?}"),
    }
});
