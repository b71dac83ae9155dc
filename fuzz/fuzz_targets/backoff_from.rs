//! `backoff_from` readers (`tower_classify::hint::BackoffFrom`): a wait read
//! from a header, a JSON-valued header, a JSON body, or a cost report.
//!
//! Input: one selector byte (reader and unit), then `\n`-separated fields:
//! path, second path, third path, header value, `Date` header, body.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use tower_classify::hint::{BackoffFrom, WaitUnit};

const UNITS: [WaitUnit; 6] = [
    WaitUnit::Seconds,
    WaitUnit::Ms,
    WaitUnit::Minutes,
    WaitUnit::EpochS,
    WaitUnit::EpochMs,
    WaitUnit::Rfc3339,
];
const HEADER: &str = "x-retry-wait";
/// The local clock of every run, so a run is reproducible.
const NOW_SECS: u64 = 1_800_000_000;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let unit = UNITS[usize::from(selector) % UNITS.len()];
    let mut fields = rest.splitn(6, |&b| b == b'\n');
    let mut field = || fields.next().unwrap_or_default();
    let (path, path2, path3) = (text(field()), text(field()), text(field()));
    let (header, date, body) = (field(), field(), field());

    let reader = match (selector / 6) % 4 {
        0 => BackoffFrom::header(HEADER, unit),
        1 => BackoffFrom::header_json(HEADER, path, unit),
        2 => BackoffFrom::body(path, unit),
        _ => BackoffFrom::cost_bucket(path, path2, path3),
    };
    let Ok(reader) = reader else {
        return;
    };
    let mut headers = HeaderMap::new();
    if let Ok(value) = HeaderValue::from_bytes(header) {
        headers.insert(HEADER, value);
    }
    if let Ok(value) = HeaderValue::from_bytes(date) {
        headers.insert(http::header::DATE, value);
    }
    let now = UNIX_EPOCH + Duration::from_secs(NOW_SECS);
    let wait = reader.read(&headers, Some(body), now);

    // A reader of the body reads nothing without one.
    if matches!(
        reader,
        BackoffFrom::Body { .. } | BackoffFrom::CostBucket { .. }
    ) {
        assert_eq!(reader.read(&headers, None, now), None);
    }

    // A plain non-negative integer in a header is exactly that many units;
    // a negative number is no hint.
    if let BackoffFrom::Header { unit, .. } = &reader {
        let stated = headers.get(HEADER).and_then(|v| v.to_str().ok());
        if let Some(n) = stated.and_then(|t| t.trim().parse::<u32>().ok()) {
            let n = u64::from(n);
            let expected = match unit {
                WaitUnit::Seconds => Some(Duration::from_secs(n)),
                WaitUnit::Ms => Some(Duration::from_millis(n)),
                WaitUnit::Minutes => Some(Duration::from_secs(n * 60)),
                // No `Date` header or an unreadable one: measured from now.
                _ => wait,
            };
            assert_eq!(wait, expected, "{n} {unit:?}");
        }
        if let Some(n) = stated.and_then(|t| t.trim().parse::<f64>().ok()) {
            if n < 0.0 && matches!(unit, WaitUnit::Seconds | WaitUnit::Ms | WaitUnit::Minutes) {
                assert_eq!(wait, None, "{n} {unit:?}");
            }
        }
    }

    // The cost report's arithmetic, from numbers the input chooses.
    if rest.len() >= 24 {
        let number = |at: usize| f64::from_le_bytes(rest[at..at + 8].try_into().unwrap());
        let (requested, available, rate) = (number(0), number(8), number(16));
        // Read from a report, as a response states it: JSON carries finite
        // numbers only, and one that is not reads as absent.
        let json = |n: f64| serde_json::Number::from_f64(n).map_or(serde_json::Value::Null, Into::into);
        let report = serde_json::json!({"r": json(requested), "a": json(available), "rate": json(rate)});
        let reader = BackoffFrom::cost_bucket("$.r", "$.a", "$.rate").unwrap();
        let body = report.to_string();
        match reader.read(&HeaderMap::new(), Some(body.as_bytes()), UNIX_EPOCH) {
            None => assert!(
                !(requested.is_finite() && available.is_finite() && rate.is_finite())
                    || rate <= 0.0
            ),
            Some(wait) if requested <= available => assert_eq!(wait, Duration::ZERO),
            Some(wait) => {
                // Whole seconds, as far as an f64 count of milliseconds is
                // exact (below 2^53 ms, some 285,000 years), and at least
                // the exact quotient (to within f64 rounding).
                let exact_ms = Duration::from_millis(1 << 53);
                assert!(wait.subsec_nanos() == 0 || wait >= exact_ms, "{wait:?}");
                let exact = (requested - available) / rate;
                let longest = u64::MAX as f64 / 1_000.0;
                assert!(wait.as_secs_f64() >= exact.min(longest).floor() * (1.0 - 1e-12));
            }
        }
    }
});

fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or("$")
}
