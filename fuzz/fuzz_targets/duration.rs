//! The human duration syntax (`tower_classify::duration`): `"200ms"`,
//! `"1m30s"`, `"1.5s"`, `"7d"`.
//!
//! Input: a duration text, optionally `\n` and a second one; the first 12
//! bytes also serve as a `Duration` for a format/parse round trip.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tower_classify::duration::{format_duration, parse_duration};

fuzz_target!(|data: &[u8]| {
    if data.len() >= 12 {
        let secs = u64::from_le_bytes(data[..8].try_into().unwrap());
        let nanos = u32::from_le_bytes(data[8..12].try_into().unwrap()) % 1_000_000_000;
        let duration = Duration::new(secs, nanos);
        assert_eq!(parse_duration(&format_duration(duration)), Ok(duration));
    }

    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (first, second) = text.split_once('\n').unwrap_or((text, ""));
    let Ok(parsed) = parse_duration(first) else {
        return;
    };
    // Every duration read is one the formatter writes back exactly.
    let written = format_duration(parsed);
    assert_eq!(
        parse_duration(&written),
        Ok(parsed),
        "{first:?} as {written:?}"
    );

    // Parts add: `a` followed by `b` is `a + b`, or an error when the sum
    // does not fit (never a wrap).
    let Ok(second_parsed) = parse_duration(second) else {
        return;
    };
    let plain = |t: &str| t != "0" && !t.contains(char::is_whitespace);
    if plain(first) && plain(second) {
        let joined = format!("{first}{second}");
        assert_eq!(
            parse_duration(&joined).ok(),
            parsed.checked_add(second_parsed),
            "{joined:?}"
        );
    }
});
