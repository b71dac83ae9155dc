//! gRPC `grpc-retry-pushback-ms` and `grpc-status`
//! (`tower_classify::hint::parse_grpc_pushback`, `GrpcClassifier`).
//!
//! Input: the pushback value, optionally `\n` and a `grpc-status` value.
#![no_main]

use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use tower_classify::grpc::GRPC_RETRY_PUSHBACK_MS;
use tower_classify::hint::parse_grpc_pushback;
use tower_classify::{BoxError, Classify, GrpcClassifier, Outcome, RetryHint, StreamEnd};

fuzz_target!(|data: &[u8]| {
    let (pushback, status) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], Some(&data[at + 1..])),
        None => (data, None),
    };

    // A non-negative integer is a wait in milliseconds, saturating; anything
    // else asks the client not to retry.
    let hint = parse_grpc_pushback(pushback);
    let trimmed = pushback.trim_ascii();
    if !trimmed.is_empty() && trimmed.iter().all(u8::is_ascii_digit) {
        let ms = std::str::from_utf8(trimmed)
            .unwrap()
            .parse::<u64>()
            .unwrap_or(u64::MAX);
        assert_eq!(hint, RetryHint::After(Duration::from_millis(ms)));
    } else {
        assert_eq!(hint, RetryHint::DoNotRetry);
    }

    // Round trip: a number written in decimal reads back as itself.
    if data.len() >= 8 {
        let ms = u64::from_le_bytes(data[..8].try_into().unwrap());
        assert_eq!(
            parse_grpc_pushback(ms.to_string().as_bytes()),
            RetryHint::After(Duration::from_millis(ms))
        );
    }

    // Trailers: the status code decides the outcome; a failure carries the
    // pushback as its hint; a success or an ignored call carries none.
    let mut trailers = HeaderMap::new();
    if let Ok(value) = HeaderValue::from_bytes(pushback) {
        trailers.insert(GRPC_RETRY_PUSHBACK_MS, value);
    }
    if let Some(Ok(value)) = status.map(HeaderValue::from_bytes) {
        trailers.insert("grpc-status", value);
    }
    let outcome = Classify::<http::Response<()>, BoxError>::classify_end(
        &GrpcClassifier::new(),
        StreamEnd::Trailers(Some(&trailers)),
    );
    match GrpcClassifier::status_code(&trailers) {
        Some(code) => match GrpcClassifier::code_outcome(code) {
            Outcome::Failure(failure) => {
                let failed = outcome.as_failure().expect("a failure code fails");
                assert_eq!(failed.kind, failure.kind);
                let expected = trailers
                    .get(GRPC_RETRY_PUSHBACK_MS)
                    .map(|value| parse_grpc_pushback(value.as_bytes()));
                assert_eq!(failed.hint, expected);
            }
            other => assert_eq!(outcome, other),
        },
        None => assert_eq!(
            outcome,
            // No status where the body ended: 2 `UNKNOWN`, as tonic reports it.
            GrpcClassifier::code_outcome(2)
        ),
    }
});
