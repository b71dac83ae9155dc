//! Every delay-hint form, including hostile input.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;
use proptest::prelude::*;
use tower_classify::duration::{format_duration, parse_duration};
use tower_classify::hint::{
    parse_grpc_pushback, parse_retry_after, BackoffFrom, JsonPath, WaitUnit,
};
use tower_classify::RetryHint;

/// 2026-10-21T07:28:00Z.
fn t0() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_792_567_680)
}

fn http_date(time: SystemTime) -> String {
    httpdate::fmt_http_date(time)
}

#[test]
fn retry_after_delay_seconds() {
    let now = t0();
    let rows: &[(&[u8], Option<Duration>)] = &[
        (b"120", Some(Duration::from_secs(120))),
        (b"0", Some(Duration::ZERO)),
        (b" 5 ", Some(Duration::from_secs(5))),
        (b"", None),
        (b"   ", None),
        (b"-5", None),
        (b"1.5", None),
        (b"abc", None),
        (b"5s", None),
        (b"\xff\xfe", None),
        (b"18446744073709551615", Some(Duration::from_secs(u64::MAX))),
        (
            b"99999999999999999999999999",
            Some(Duration::from_secs(u64::MAX)),
        ),
    ];
    for (value, expected) in rows {
        assert_eq!(
            parse_retry_after(value, None, now),
            *expected,
            "{:?}",
            String::from_utf8_lossy(value)
        );
    }
}

#[test]
fn retry_after_http_date() {
    let now = t0();
    let in_30s = http_date(now + Duration::from_secs(30));
    assert_eq!(
        parse_retry_after(in_30s.as_bytes(), None, now),
        Some(Duration::from_secs(30)),
        "measured from now without a Date header"
    );
    let past = http_date(now - Duration::from_secs(30));
    assert_eq!(
        parse_retry_after(past.as_bytes(), None, now),
        Some(Duration::ZERO),
        "a date in the past means now"
    );
    assert_eq!(
        parse_retry_after(b"Thu, 01 Jan 1970 00:00:00 GMT", None, now),
        Some(Duration::ZERO),
        "far past"
    );
    let far_future = parse_retry_after(b"Fri, 31 Dec 9999 23:59:59 GMT", None, now).unwrap();
    assert!(
        far_future > Duration::from_secs(250_000_000_000),
        "{far_future:?}"
    );
    // RFC 850 and asctime forms are HTTP-dates too.
    assert_eq!(
        parse_retry_after(b"Wednesday, 21-Oct-26 07:28:30 GMT", None, now),
        Some(Duration::from_secs(30))
    );
    assert_eq!(
        parse_retry_after(b"Wed Oct 21 07:28:30 2026", None, now),
        Some(Duration::from_secs(30))
    );
    assert_eq!(
        parse_retry_after(b"Wed, 32 Oct 2026 07:28:30 GMT", None, now),
        None
    );
}

#[test]
fn retry_after_date_is_measured_against_the_date_header() {
    // The local clock is an hour fast; the server's Date and Retry-After agree
    // on a 30 s wait, and the skew must not change it.
    let server_now = t0();
    let skewed_local = server_now + Duration::from_secs(3_600);
    let retry_at = http_date(server_now + Duration::from_secs(30));
    let date = http_date(server_now);
    assert_eq!(
        parse_retry_after(retry_at.as_bytes(), Some(date.as_bytes()), skewed_local),
        Some(Duration::from_secs(30))
    );
    // A local clock an hour slow gives the same answer.
    let slow_local = server_now - Duration::from_secs(3_600);
    assert_eq!(
        parse_retry_after(retry_at.as_bytes(), Some(date.as_bytes()), slow_local),
        Some(Duration::from_secs(30))
    );
    // An unreadable Date header falls back to the local clock.
    assert_eq!(
        parse_retry_after(retry_at.as_bytes(), Some(b"yesterday"), server_now),
        Some(Duration::from_secs(30))
    );
}

#[test]
fn grpc_pushback() {
    let rows: &[(&[u8], RetryHint)] = &[
        (b"0", RetryHint::After(Duration::ZERO)),
        (b"250", RetryHint::After(Duration::from_millis(250))),
        (
            b"18446744073709551615",
            RetryHint::After(Duration::from_millis(u64::MAX)),
        ),
        (
            b"999999999999999999999999",
            RetryHint::After(Duration::from_millis(u64::MAX)),
        ),
        (b"-1", RetryHint::DoNotRetry),
        (b"-250", RetryHint::DoNotRetry),
        (b"", RetryHint::DoNotRetry),
        (b"1e3", RetryHint::DoNotRetry),
        (b"soon", RetryHint::DoNotRetry),
    ];
    for (value, expected) in rows {
        assert_eq!(
            parse_grpc_pushback(value),
            *expected,
            "{:?}",
            String::from_utf8_lossy(value)
        );
    }
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(*name, value.parse().unwrap());
    }
    map
}

#[test]
fn backoff_from_header_units() {
    let now = t0();
    let epoch_now = now.duration_since(UNIX_EPOCH).unwrap().as_secs();
    let read = |unit, value: &str| {
        BackoffFrom::header("x-reset", unit).unwrap().read(
            &headers(&[("x-reset", value)]),
            None,
            now,
        )
    };
    assert_eq!(read(WaitUnit::Seconds, "30"), Some(Duration::from_secs(30)));
    assert_eq!(
        read(WaitUnit::Seconds, "1.5"),
        Some(Duration::from_millis(1500))
    );
    assert_eq!(
        read(WaitUnit::Ms, "1500"),
        Some(Duration::from_millis(1500))
    );
    assert_eq!(read(WaitUnit::Minutes, "2"), Some(Duration::from_secs(120)));
    assert_eq!(
        read(WaitUnit::EpochS, &(epoch_now + 45).to_string()),
        Some(Duration::from_secs(45))
    );
    assert_eq!(
        read(WaitUnit::EpochMs, &((epoch_now + 45) * 1000).to_string()),
        Some(Duration::from_secs(45))
    );
    assert_eq!(
        read(WaitUnit::EpochS, &(epoch_now - 45).to_string()),
        Some(Duration::ZERO),
        "an instant in the past retries immediately"
    );
    assert_eq!(
        read(WaitUnit::Rfc3339, "2026-10-21T07:29:00Z"),
        Some(Duration::from_secs(60))
    );
    assert_eq!(
        read(WaitUnit::Rfc3339, "2026-10-21T09:29:00+02:00"),
        Some(Duration::from_secs(60))
    );
    // Hostile values read as "no hint", never panic, never overflow.
    for garbage in ["", "-5", "abc", "NaN", "inf", "-inf", "1e400", "0x10"] {
        assert_eq!(read(WaitUnit::Seconds, garbage), None, "{garbage:?}");
    }
    assert_eq!(
        read(WaitUnit::Seconds, "1e300"),
        Some(Duration::from_millis(u64::MAX)),
        "absurd but finite waits saturate"
    );
    assert_eq!(
        read(WaitUnit::EpochMs, "1e300"),
        Some(Duration::from_millis(u64::MAX))
    );
    // Finite, yet past `f64` once scaled to milliseconds: a relative wait
    // reads as none, an instant as the longest wait.
    assert_eq!(read(WaitUnit::Seconds, "1e308"), None);
    assert_eq!(
        read(WaitUnit::EpochS, "1e308"),
        Some(Duration::from_millis(u64::MAX))
    );
    assert_eq!(read(WaitUnit::Rfc3339, "2026-13-01T00:00:00Z"), None);
    // A missing header is no hint.
    assert_eq!(
        BackoffFrom::header("x-reset", WaitUnit::Seconds)
            .unwrap()
            .read(&HeaderMap::new(), None, now),
        None
    );
}

#[test]
fn backoff_from_absolute_instants_use_the_date_header() {
    let server_now = t0();
    let skewed_local = server_now + Duration::from_secs(600);
    let reset = server_now.duration_since(UNIX_EPOCH).unwrap().as_secs() + 20;
    let reader = BackoffFrom::header("x-ratelimit-reset", WaitUnit::EpochS).unwrap();
    let map = headers(&[
        ("x-ratelimit-reset", &reset.to_string()),
        ("date", &http_date(server_now)),
    ]);
    assert_eq!(
        reader.read(&map, None, skewed_local),
        Some(Duration::from_secs(20))
    );
}

#[test]
fn backoff_from_json_header_and_body() {
    let now = t0();
    let usage = r#"{"1234":[{"type":"ads","estimated_time_to_regain_access":3}]}"#;
    let reader = BackoffFrom::header_json(
        "x-app-usage",
        "$.*[0].estimated_time_to_regain_access",
        WaitUnit::Minutes,
    )
    .unwrap();
    assert_eq!(
        reader.read(&headers(&[("x-app-usage", usage)]), None, now),
        Some(Duration::from_secs(180))
    );
    assert_eq!(
        reader.read(&headers(&[("x-app-usage", "{not json")]), None, now),
        None
    );

    let body = br#"{"error":{"retry_in_ms":750}}"#;
    let reader = BackoffFrom::body("$.error.retry_in_ms", WaitUnit::Ms).unwrap();
    assert_eq!(
        reader.read(&HeaderMap::new(), Some(body), now),
        Some(Duration::from_millis(750))
    );
    assert_eq!(
        reader.read(&HeaderMap::new(), None, now),
        None,
        "no body, no hint"
    );
}

#[test]
fn cost_bucket_formula() {
    let body = br#"{"extensions":{"cost":{"requestedQueryCost":1000,
        "throttleStatus":{"currentlyAvailable":250,"restoreRate":50}}}}"#;
    let reader = BackoffFrom::cost_bucket(
        "$.extensions.cost.requestedQueryCost",
        "$.extensions.cost.throttleStatus.currentlyAvailable",
        "$.extensions.cost.throttleStatus.restoreRate",
    )
    .unwrap();
    // ceil((1000 - 250) / 50) = 15 s.
    assert_eq!(
        reader.read(&HeaderMap::new(), Some(body), t0()),
        Some(Duration::from_secs(15))
    );
    // The formula on its own (a value that is not finite, which JSON cannot
    // carry, in the crate's unit test).
    let wait = |requested: f64, available: f64, rate: f64| {
        let body = serde_json::json!({"r": requested, "a": available, "rate": rate}).to_string();
        BackoffFrom::cost_bucket("$.r", "$.a", "$.rate")
            .unwrap()
            .read(&HeaderMap::new(), Some(body.as_bytes()), t0())
    };
    // ceil((101 - 0) / 50) = 3 s: the formula rounds up.
    assert_eq!(wait(101.0, 0.0, 50.0), Some(Duration::from_secs(3)));
    assert_eq!(wait(10.0, 20.0, 5.0), Some(Duration::ZERO));
    assert_eq!(wait(10.0, 0.0, 0.0), None, "no restore rate");
    assert_eq!(wait(10.0, 0.0, -1.0), None);
    assert_eq!(
        wait(f64::MAX, 0.0, f64::MIN_POSITIVE),
        Some(Duration::from_millis(u64::MAX))
    );
}

#[test]
fn json_paths() {
    let doc = serde_json::json!({"a": {"b": [1, {"c": 2}], "weird key": 3}});
    let select = |path: &str| {
        JsonPath::parse("path", path)
            .unwrap()
            .select(&doc)
            .into_iter()
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(select("$.a.b[0]"), [serde_json::json!(1)]);
    assert_eq!(select("$.a.b[1].c"), [serde_json::json!(2)]);
    assert_eq!(select("$.a['weird key']"), [serde_json::json!(3)]);
    assert_eq!(select("$.a.b[*]").len(), 2);
    assert_eq!(select("$.a.missing"), Vec::<serde_json::Value>::new());
    for bad in ["a.b", "$.", "$[", "$[x]", "$..a"] {
        let err = JsonPath::parse("body_path", bad).unwrap_err();
        assert_eq!(err.field(), "body_path", "{bad}");
    }
}

#[test]
fn durations_in_human_form() {
    let rows: &[(&str, Option<Duration>)] = &[
        ("200ms", Some(Duration::from_millis(200))),
        ("30s", Some(Duration::from_secs(30))),
        ("1m30s", Some(Duration::from_secs(90))),
        ("1.5s", Some(Duration::from_millis(1500))),
        ("7d", Some(Duration::from_secs(7 * 86_400))),
        ("2h", Some(Duration::from_secs(7_200))),
        ("0", Some(Duration::ZERO)),
        ("10us", Some(Duration::from_micros(10))),
        ("30", None),
        ("", None),
        ("s", None),
        ("-1s", None),
        ("1.2.3s", None),
        ("5 parsecs", None),
        ("99999999999999999999999d", None),
    ];
    for (text, expected) in rows {
        assert_eq!(parse_duration(text).ok(), *expected, "{text:?}");
    }
    assert!(parse_duration("3x")
        .unwrap_err()
        .to_string()
        .contains("\"3x\""));
}

proptest! {
    #[test]
    fn retry_after_never_panics(value in proptest::collection::vec(any::<u8>(), 0..64),
                                date in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
                                secs in any::<u64>()) {
        let now = UNIX_EPOCH.checked_add(Duration::from_secs(secs % (400 * 365 * 86_400))).unwrap();
        let _ = parse_retry_after(&value, date.as_deref(), now);
    }

    #[test]
    fn retry_after_reads_any_delay_seconds(secs in any::<u64>()) {
        prop_assert_eq!(
            parse_retry_after(secs.to_string().as_bytes(), None, t0()),
            Some(Duration::from_secs(secs))
        );
    }

    #[test]
    fn retry_after_dates_never_go_negative(offset in -1_000_000i64..1_000_000) {
        let now = t0();
        let at = if offset >= 0 {
            now + Duration::from_secs(offset as u64)
        } else {
            now - Duration::from_secs(offset.unsigned_abs())
        };
        let wait = parse_retry_after(http_date(at).as_bytes(), None, now).unwrap();
        prop_assert_eq!(wait, Duration::from_secs(offset.max(0) as u64));
    }

    #[test]
    fn pushback_never_panics(value in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = parse_grpc_pushback(&value);
    }

    #[test]
    fn backoff_readers_never_panic(value in "\\PC{0,40}", body in proptest::collection::vec(any::<u8>(), 0..80)) {
        let mut map = HeaderMap::new();
        if let Ok(header) = http::HeaderValue::from_str(&value) {
            map.insert("x-wait", header.clone());
            map.insert("date", header);
        }
        for unit in [WaitUnit::Seconds, WaitUnit::Ms, WaitUnit::Minutes, WaitUnit::EpochS, WaitUnit::EpochMs, WaitUnit::Rfc3339] {
            let _ = BackoffFrom::header("x-wait", unit).unwrap().read(&map, Some(&body), t0());
            let _ = BackoffFrom::header_json("x-wait", "$.a[0]", unit).unwrap().read(&map, Some(&body), t0());
            let _ = BackoffFrom::body("$.*", unit).unwrap().read(&map, Some(&body), t0());
        }
        let _ = BackoffFrom::cost_bucket("$.a", "$.b", "$.c").unwrap().read(&map, Some(&body), t0());
    }

    #[test]
    fn json_numbers_never_overflow(n in any::<f64>(), unit_index in 0usize..5) {
        let unit = [WaitUnit::Seconds, WaitUnit::Ms, WaitUnit::Minutes, WaitUnit::EpochS, WaitUnit::EpochMs][unit_index];
        if let Some(number) = serde_json::Number::from_f64(n) {
            let body = serde_json::json!({ "wait": number }).to_string();
            let reader = BackoffFrom::body("$.wait", unit).unwrap();
            let _ = reader.read(&HeaderMap::new(), Some(body.as_bytes()), t0());
        }
    }

    #[test]
    fn cost_bucket_never_panics(requested in any::<f64>(), available in any::<f64>(), rate in any::<f64>()) {
        let number = |n: f64| serde_json::Number::from_f64(n).map_or(serde_json::Value::Null, Into::into);
        let body = serde_json::json!({"r": number(requested), "a": number(available), "rate": number(rate)});
        let reader = BackoffFrom::cost_bucket("$.r", "$.a", "$.rate").unwrap();
        let _ = reader.read(&HeaderMap::new(), Some(body.to_string().as_bytes()), t0());
    }

    #[test]
    fn rfc3339_never_panics(text in "\\PC{0,40}") {
        let body = serde_json::json!({ "at": text }).to_string();
        let reader = BackoffFrom::body("$.at", WaitUnit::Rfc3339).unwrap();
        let _ = reader.read(&HeaderMap::new(), Some(body.as_bytes()), t0());
    }

    #[test]
    fn json_path_parse_never_panics(text in "\\PC{0,30}") {
        let _ = JsonPath::parse("path", &text);
    }

    #[test]
    fn durations_never_panic(text in "\\PC{0,30}") {
        let _ = parse_duration(&text);
    }

    #[test]
    fn durations_round_trip(secs in 0u64..(u64::MAX / 86_400), nanos in 0u32..1_000_000_000) {
        let duration = Duration::new(secs, nanos);
        prop_assert_eq!(parse_duration(&format_duration(duration)).unwrap(), duration);
    }
}
