//! The JSON form of protobuf's `google.protobuf.Duration` (`"0.1s"`,
//! `"1.000340012s"`), in which a service config writes every duration; the
//! [parent module](super) says why not the family's human syntax.

use std::time::Duration;

/// The largest number of seconds a protobuf `Duration` holds (10,000 years).
pub(crate) const MAX_PROTO_DURATION_SECS: u64 = 315_576_000_000;

/// The longest input worth reading: a sign, twelve digits of seconds, a
/// point, nine digits of nanoseconds and the `s`. Anything longer is refused
/// before it is scanned.
const MAX_INPUT_LEN: usize = 24;

/// Reads a protobuf JSON duration that must not be negative.
///
/// Accepted: digits, optionally a point and one to nine digits, then `s`;
/// a leading `-` only on a zero value (`"-0s"` is zero). Refused, without
/// panicking or overflowing: a negative value, a missing `s`, any other
/// unit, an exponent, `+`, whitespace, `NaN`, more than nine fractional
/// digits (finer than a nanosecond), more than
/// [`MAX_PROTO_DURATION_SECS`] seconds, and any input longer than a valid
/// duration can be. The error says why.
pub(crate) fn parse_proto_duration(input: &str) -> Result<Duration, &'static str> {
    if input.len() > MAX_INPUT_LEN {
        return Err("it is longer than any valid duration");
    }
    let number = input.strip_suffix('s').ok_or("it does not end in `s`")?;
    let (negative, number) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number),
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (number, None),
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return Err("the seconds are not a decimal number");
    }
    // Digits only, so a failed parse is an overflow: too long too.
    let secs = whole
        .parse::<u64>()
        .ok()
        .filter(|secs| *secs <= MAX_PROTO_DURATION_SECS)
        .ok_or("it is longer than 315576000000 seconds, protobuf's limit")?;
    let nanos = match fraction {
        None => 0,
        Some(fraction) => {
            if fraction.is_empty() || !fraction.bytes().all(|b| b.is_ascii_digit()) {
                return Err("the fraction of a second is not a decimal number");
            }
            if fraction.len() > 9 {
                return Err("it has more than nine fractional digits (finer than a nanosecond)");
            }
            let digits = fraction
                .bytes()
                .fold(0u32, |acc, digit| acc * 10 + u32::from(digit - b'0'));
            digits * 10u32.pow(9 - fraction.len() as u32)
        }
    };
    if negative && (secs != 0 || nanos != 0) {
        return Err("it is negative");
    }
    Ok(Duration::new(secs, nanos))
}

/// Writes `duration` as protobuf's JSON encoders do: 0, 3, 6 or 9
/// fractional digits, as few as hold it exactly, then `s`.
///
/// The result reads back with [`parse_proto_duration`] to the same value
/// for every duration up to [`MAX_PROTO_DURATION_SECS`] seconds.
#[cfg(test)]
pub(crate) fn format_proto_duration(duration: Duration) -> String {
    let secs = duration.as_secs();
    let nanos = duration.subsec_nanos();
    if nanos == 0 {
        format!("{secs}s")
    } else if nanos % 1_000_000 == 0 {
        format!("{secs}.{:03}s", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!("{secs}.{:06}s", nanos / 1_000)
    } else {
        format!("{secs}.{nanos:09}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_the_forms_of_the_mapping() {
        let cases = [
            ("0s", Duration::ZERO),
            ("-0s", Duration::ZERO),
            ("-0.000s", Duration::ZERO),
            ("1s", Duration::from_secs(1)),
            ("1.5s", Duration::from_millis(1500)),
            ("0.1s", Duration::from_millis(100)),
            ("1.000340012s", Duration::new(1, 340_012)),
            ("0.000000001s", Duration::from_nanos(1)),
            (
                "315576000000s",
                Duration::from_secs(MAX_PROTO_DURATION_SECS),
            ),
            (
                "315576000000.999999999s",
                Duration::new(MAX_PROTO_DURATION_SECS, 999_999_999),
            ),
            ("007s", Duration::from_secs(7)),
        ];
        for (input, expected) in cases {
            assert_eq!(parse_proto_duration(input), Ok(expected), "{input}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_non_negative_duration() {
        let cases = [
            ("", "it does not end in `s`"),
            ("s", "the seconds are not a decimal number"),
            ("1", "it does not end in `s`"),
            ("100ms", "the seconds are not a decimal number"),
            ("1m", "it does not end in `s`"),
            ("-1s", "it is negative"),
            ("-0.000000001s", "it is negative"),
            ("+1s", "the seconds are not a decimal number"),
            (" 1s", "the seconds are not a decimal number"),
            ("1 s", "the seconds are not a decimal number"),
            ("1e3s", "the seconds are not a decimal number"),
            ("NaNs", "the seconds are not a decimal number"),
            ("infs", "the seconds are not a decimal number"),
            (".5s", "the seconds are not a decimal number"),
            ("1.s", "the fraction of a second is not a decimal number"),
            ("1.2.3s", "the fraction of a second is not a decimal number"),
            ("1.-5s", "the fraction of a second is not a decimal number"),
            (
                "0.0000000001s",
                "it has more than nine fractional digits (finer than a nanosecond)",
            ),
            (
                "315576000001s",
                "it is longer than 315576000000 seconds, protobuf's limit",
            ),
            (
                "99999999999999999999999s",
                "it is longer than 315576000000 seconds, protobuf's limit",
            ),
            (
                "999999999999999999999999s",
                "it is longer than any valid duration",
            ),
            ("１s", "the seconds are not a decimal number"),
        ];
        for (input, reason) in cases {
            let err = parse_proto_duration(input).expect_err(input);
            assert_eq!(err, reason, "{input:?}");
        }
    }

    /// What the module docs showed before the module became private.
    #[test]
    fn reads_seconds_only_and_never_negative() {
        assert_eq!(
            parse_proto_duration("0.1s").unwrap(),
            Duration::from_millis(100)
        );
        assert_eq!(
            parse_proto_duration("0.000000001s").unwrap(),
            Duration::from_nanos(1)
        );
        assert!(parse_proto_duration("-1s").is_err()); // no A6 duration may be negative
        assert!(parse_proto_duration("100ms").is_err()); // seconds only
        assert_eq!(format_proto_duration(Duration::from_millis(1500)), "1.500s");
    }

    #[test]
    fn formats_with_as_few_digit_groups_as_needed() {
        assert_eq!(format_proto_duration(Duration::ZERO), "0s");
        assert_eq!(format_proto_duration(Duration::from_secs(30)), "30s");
        assert_eq!(format_proto_duration(Duration::from_millis(100)), "0.100s");
        assert_eq!(
            format_proto_duration(Duration::from_micros(1_000_001)),
            "1.000001s"
        );
        assert_eq!(
            format_proto_duration(Duration::from_nanos(1)),
            "0.000000001s"
        );
    }

    proptest! {
        #[test]
        fn never_panics_on_any_string(input in ".{0,40}") {
            let _ = parse_proto_duration(&input);
        }

        #[test]
        fn never_panics_on_duration_like_strings(input in "-?[0-9]{0,30}(\\.[0-9]{0,15})?s?") {
            if let Ok(duration) = parse_proto_duration(&input) {
                prop_assert!(duration.as_secs() <= MAX_PROTO_DURATION_SECS);
            }
        }

        #[test]
        fn round_trips_every_valid_duration(
            secs in 0..=MAX_PROTO_DURATION_SECS,
            nanos in 0u32..1_000_000_000,
        ) {
            let duration = Duration::new(secs, nanos);
            let text = format_proto_duration(duration);
            prop_assert_eq!(parse_proto_duration(&text), Ok(duration), "{}", text);
        }

        #[test]
        fn reads_any_digits_the_way_they_are_written(
            secs in 0..=MAX_PROTO_DURATION_SECS,
            fraction in "[0-9]{1,9}",
        ) {
            let parsed = parse_proto_duration(&format!("{secs}.{fraction}s")).unwrap();
            let scale = 10u32.pow(9 - fraction.len() as u32);
            prop_assert_eq!(parsed, Duration::new(secs, fraction.parse::<u32>().unwrap() * scale));
        }
    }
}
