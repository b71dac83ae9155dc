//! `Retry-After` and `grpc-retry-pushback-ms`.

use std::time::{Duration, SystemTime};

use crate::outcome::RetryHint;

/// Reads an HTTP `Retry-After` value ([RFC 9110 §10.2.3]).
///
/// - *delay-seconds* (`120`), saturating at `u64::MAX` seconds (still "far
///   too long" to a retry layer's `max_wait`);
/// - *HTTP-date*: the time from the `date` header (else `now`) to it; a
///   past date is zero.
///
/// Anything else is `None`: the caller falls back to its own backoff.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use tower_classify::hint::parse_retry_after;
///
/// let now = SystemTime::now();
/// assert_eq!(parse_retry_after(b"120", None, now), Some(Duration::from_secs(120)));
/// assert_eq!(
///     parse_retry_after(
///         b"Wed, 21 Oct 2026 07:28:30 GMT",
///         Some(b"Wed, 21 Oct 2026 07:28:00 GMT"),
///         now,
///     ),
///     Some(Duration::from_secs(30)),
/// );
/// assert_eq!(parse_retry_after(b"-1", None, now), None);
/// ```
///
/// [RFC 9110 §10.2.3]: https://www.rfc-editor.org/rfc/rfc9110#section-10.2.3
pub fn parse_retry_after(value: &[u8], date: Option<&[u8]>, now: SystemTime) -> Option<Duration> {
    let value = value.trim_ascii();
    if let Some(secs) = decimal(value) {
        return Some(Duration::from_secs(secs));
    }
    let retry_at = parse_http_date(value)?;
    let base = date
        .and_then(|d| parse_http_date(d.trim_ascii()))
        .unwrap_or(now);
    Some(retry_at.duration_since(base).unwrap_or(Duration::ZERO))
}

/// Reads gRPC's `grpc-retry-pushback-ms` trailer value ([gRFC A6]).
///
/// A non-negative integer is a wait in milliseconds (saturating); a
/// negative or unreadable value is [`RetryHint::DoNotRetry`].
///
/// [gRFC A6]: https://github.com/grpc/proposal/blob/master/A6-client-retries.md
pub fn parse_grpc_pushback(value: &[u8]) -> RetryHint {
    match decimal(value.trim_ascii()) {
        Some(millis) => RetryHint::After(Duration::from_millis(millis)),
        None => RetryHint::DoNotRetry,
    }
}

/// An HTTP-date (IMF-fixdate, RFC 850 or asctime form) as a `SystemTime`.
pub(crate) fn parse_http_date(value: &[u8]) -> Option<SystemTime> {
    let text = std::str::from_utf8(value).ok()?;
    httpdate::parse_http_date(text).ok()
}

/// The value of a non-empty run of ASCII digits, saturating at `u64::MAX`;
/// `None` for anything else (a sign, a space, nothing).
pub(crate) fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0u64, |acc, d| {
        acc.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}
