//! `Retry-After` values and HTTP-dates (`tower_classify::hint::parse_retry_after`).
//!
//! Input: `value`, optionally `\n` and the response's `Date` header. The first
//! 16 bytes also serve as two instants for a format/parse round trip.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;
use tower_classify::hint::parse_retry_after;

/// The local clock of every run, so a run is reproducible.
const NOW_SECS: u64 = 1_800_000_000;
/// The last second an HTTP-date can name (9999-12-31T23:59:59Z).
const LAST_HTTP_DATE_SECS: u64 = 253_402_300_799;

fuzz_target!(|data: &[u8]| {
    let now = UNIX_EPOCH + Duration::from_secs(NOW_SECS);
    let (value, date) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], Some(&data[at + 1..])),
        None => (data, None),
    };
    let wait = parse_retry_after(value, date, now);

    // Surrounding whitespace never changes the reading.
    let mut padded = b" \t".to_vec();
    padded.extend_from_slice(value);
    padded.extend_from_slice(b"\t ");
    assert_eq!(parse_retry_after(&padded, date, now), wait);

    // delay-seconds: exactly the number, saturating rather than overflowing.
    let trimmed = value.trim_ascii();
    if !trimmed.is_empty() && trimmed.iter().all(u8::is_ascii_digit) {
        let digits = std::str::from_utf8(trimmed).unwrap();
        let seconds = digits.parse::<u64>().unwrap_or(u64::MAX);
        assert_eq!(wait, Some(Duration::from_secs(seconds)));
    } else if let Some(wait) = wait {
        // An HTTP-date: at most the distance from the Unix epoch to the
        // last expressible date.
        assert!(wait <= Duration::from_secs(LAST_HTTP_DATE_SECS), "{wait:?}");
    }

    // Round trip: an HTTP-date written by `httpdate` reads back as the
    // distance from the `Date` header (zero when it is in the past).
    if data.len() >= 16 {
        let instant = |bytes: &[u8]| {
            let secs = u64::from_le_bytes(bytes.try_into().unwrap()) % (LAST_HTTP_DATE_SECS + 1);
            UNIX_EPOCH + Duration::from_secs(secs)
        };
        let (retry_at, base) = (instant(&data[..8]), instant(&data[8..16]));
        let retry_at_text = httpdate::fmt_http_date(retry_at);
        let base_text = httpdate::fmt_http_date(base);
        let expected = retry_at.duration_since(base).unwrap_or(Duration::ZERO);
        assert_eq!(
            parse_retry_after(retry_at_text.as_bytes(), Some(base_text.as_bytes()), now),
            Some(expected)
        );
        // Without a (readable) `Date`, the local clock is the base.
        let from_now = retry_at.duration_since(now).unwrap_or(Duration::ZERO);
        assert_eq!(
            parse_retry_after(retry_at_text.as_bytes(), None, now),
            Some(from_now)
        );
    }
});
