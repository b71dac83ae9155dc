//! Absolute instants as milliseconds since the Unix epoch, in `i128` so that no
//! value a server can send overflows.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::decimal;

/// `time` as milliseconds since the epoch (negative before it).
pub(crate) fn epoch_ms(time: SystemTime) -> i128 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => after.as_millis() as i128,
        Err(before) => -(before.duration().as_millis() as i128),
    }
}

/// The wait from `base_ms` until `at_ms`: zero when `at_ms` is past, and
/// saturating at `u64::MAX` milliseconds.
pub(crate) fn wait_until(at_ms: i128, base_ms: i128) -> Duration {
    let wait = at_ms.saturating_sub(base_ms);
    if wait <= 0 {
        Duration::ZERO
    } else {
        Duration::from_millis(u64::try_from(wait).unwrap_or(u64::MAX))
    }
}

/// Reads an RFC 3339 timestamp (`2026-10-21T07:28:00Z`,
/// `2026-10-21t07:28:00.5+02:00`) as milliseconds since the epoch.
pub(crate) fn parse_rfc3339(text: &str) -> Option<i128> {
    let bytes = text.trim().as_bytes();
    let number = |range: std::ops::Range<usize>| i64::try_from(decimal(bytes.get(range)?)?).ok();
    let punct = |at: usize, allowed: &[u8]| bytes.get(at).is_some_and(|b| allowed.contains(b));
    if !(punct(4, b"-")
        && punct(7, b"-")
        && punct(10, b"Tt ")
        && punct(13, b":")
        && punct(16, b":"))
    {
        return None;
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut at = 19;
    let mut millis = 0i64;
    if punct(at, b".") {
        let digits = bytes[at + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        for (i, digit) in bytes[at + 1..at + 1 + digits.min(3)].iter().enumerate() {
            millis += i64::from(digit - b'0') * 10i64.pow(2 - i as u32);
        }
        at += 1 + digits;
    }
    let offset_minutes = match bytes.get(at..)? {
        b"Z" | b"z" => 0,
        [sign @ (b'+' | b'-'), ..] if bytes.len() == at + 6 && punct(at + 3, b":") => {
            let (h, m) = (number(at + 1..at + 3)?, number(at + 4..at + 6)?);
            if h > 23 || m > 59 {
                return None;
            }
            let minutes = h * 60 + m;
            if *sign == b'-' {
                -minutes
            } else {
                minutes
            }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_minutes * 60;
    Some(i128::from(seconds) * 1_000 + i128::from(millis))
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_instants() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("1970-01-01T00:00:01.5Z"), Some(1_500));
        assert_eq!(parse_rfc3339("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(parse_rfc3339("2000-03-01T00:00:00Z"), Some(951_868_800_000));
        assert_eq!(parse_rfc3339("2024-02-30T00:00:00Z"), None);
        assert_eq!(parse_rfc3339("2024-02-29T00:00:00"), None);
        assert_eq!(parse_rfc3339("2024-02-29T00:00:00+1:00"), None);
    }
}
