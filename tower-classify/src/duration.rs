//! Durations in human form (`"200ms"`, `"30s"`, `"1m30s"`, `"7d"`): the one
//! duration syntax of the family's configuration and CLI.

use std::fmt;
use std::time::Duration;

/// A duration string was not readable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurationParseError {
    input: String,
    reason: &'static str,
}

impl fmt::Display for DurationParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot read {:?} as a duration: {} (write e.g. \"200ms\", \"30s\", \"1m30s\", \"7d\")",
            self.input, self.reason
        )
    }
}

impl std::error::Error for DurationParseError {}

/// Parses a duration in human form.
///
/// A duration is one or more `<number><unit>` parts, added together; the number
/// may have a decimal fraction. Units: `ns`, `us`, `ms`, `s`, `m`, `h`, `d`.
/// A bare `0` is zero. Overflow is an error, never a wrap.
///
/// ```
/// use std::time::Duration;
/// use tower_classify::duration::parse_duration;
///
/// assert_eq!(parse_duration("200ms").unwrap(), Duration::from_millis(200));
/// assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
/// assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
/// assert!(parse_duration("30").is_err());
/// ```
pub fn parse_duration(input: &str) -> Result<Duration, DurationParseError> {
    let error = |reason| DurationParseError {
        input: input.to_owned(),
        reason,
    };
    let text = input.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(error("it is empty"));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| error("a number must be followed by a unit"))?;
        if number_len == 0 {
            return Err(error("expected a number"));
        }
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        if unit.is_empty() {
            return Err(error("a number must be followed by a unit"));
        }
        let (nanos_per_unit, _) = UNITS
            .into_iter()
            .find(|(_, name)| *name == unit)
            .ok_or_else(|| error("unknown unit; use ns, us, ms, s, m, h or d"))?;
        let part = scaled_nanos(number, nanos_per_unit).ok_or_else(|| error("not a number"))?;
        total = nanos_to_duration(part)
            .and_then(|part| total.checked_add(part))
            .ok_or_else(|| error("too large"))?;
        rest = after;
    }
    Ok(total)
}

/// The units, largest first, in nanoseconds.
const UNITS: [(u128, &str); 7] = [
    (86_400_000_000_000, "d"),
    (3_600_000_000_000, "h"),
    (60_000_000_000, "m"),
    (1_000_000_000, "s"),
    (1_000_000, "ms"),
    (1_000, "us"),
    (1, "ns"),
];

/// `number × nanos_per_unit`, where `number` is `digits[.digits]`; `None` when
/// it is not a number or overflows.
fn scaled_nanos(number: &str, nanos_per_unit: u128) -> Option<u128> {
    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (number, ""),
    };
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return None;
    }
    let mut nanos: u128 = 0;
    for digit in whole.bytes() {
        nanos = nanos
            .checked_mul(10)?
            .checked_add(u128::from(digit - b'0'))?;
    }
    nanos = nanos.checked_mul(nanos_per_unit)?;
    // Digits past nanosecond precision cannot change the result.
    let mut scale = nanos_per_unit;
    for digit in fraction.bytes().take(30) {
        scale /= 10;
        nanos = nanos.checked_add(u128::from(digit - b'0') * scale)?;
    }
    Some(nanos)
}

fn nanos_to_duration(nanos: u128) -> Option<Duration> {
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    Some(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// Writes `duration` in the form [`parse_duration`] reads, choosing the largest
/// unit that keeps it exact (`"90s"`, `"200ms"`, `"2h"`).
pub fn format_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    if nanos == 0 {
        return "0".to_owned();
    }
    let (size, unit) = UNITS
        .iter()
        .find(|(size, _)| nanos % size == 0)
        .copied()
        .unwrap_or((1, "ns"));
    format!("{}{unit}", nanos / size)
}

/// `#[serde(with = "tower_classify::duration::serde")]` for `Duration` and
/// `Option<Duration>` fields written in human form (`None` is `null`).
#[cfg(feature = "serde")]
pub mod serde {
    use std::borrow::Cow;
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Reads a human-form duration, or an optional one.
    pub fn deserialize<'de, D: Deserializer<'de>, T: Human>(
        deserializer: D,
    ) -> Result<T, D::Error> {
        T::read(deserializer)
    }

    /// Writes a human-form duration, or an optional one.
    pub fn serialize<S: Serializer, T: Human>(value: &T, serializer: S) -> Result<S::Ok, S::Error> {
        value.write(serializer)
    }

    /// What the functions read and write: `Duration` and `Option<Duration>`
    /// (a trait no other type can implement, its module being private).
    mod human {
        use serde::{Deserializer, Serializer};

        pub trait Human: Sized {
            fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error>;
            fn write<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error>;
        }
    }
    use human::Human;

    impl Human for Duration {
        fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let text = Cow::<'de, str>::deserialize(deserializer)?;
            super::parse_duration(&text).map_err(serde::de::Error::custom)
        }

        fn write<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.serialize_str(&super::format_duration(*self))
        }
    }

    impl Human for Option<Duration> {
        fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let text = Option::<Cow<'de, str>>::deserialize(deserializer)?;
            text.map(|text| super::parse_duration(&text).map_err(serde::de::Error::custom))
                .transpose()
        }

        fn write<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            match self {
                Some(duration) => duration.write(serializer),
                None => serializer.serialize_none(),
            }
        }
    }
}
