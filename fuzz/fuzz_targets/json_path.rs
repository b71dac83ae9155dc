//! The JSONPath subset of response rules and `backoff_from`
//! (`tower_classify::hint::JsonPath`).
//!
//! Input: a path, optionally `\n` and a JSON document to select in.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tower_classify::hint::JsonPath;

fuzz_target!(|data: &[u8]| {
    let (path, document) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &b""[..]),
    };
    let Ok(path) = std::str::from_utf8(path) else {
        return;
    };
    let parsed = JsonPath::parse("path", path);
    // Only `$`-rooted paths are read.
    if !path.starts_with('$') {
        assert!(parsed.is_err());
    }
    let Ok(parsed) = parsed else {
        return;
    };
    // The path keeps its text (its `Debug`), and that text reads back as
    // the same path.
    assert_eq!(format!("{parsed:?}"), path);
    assert_eq!(JsonPath::parse("path", path).unwrap(), parsed);

    let Ok(document) = serde_json::from_slice::<Value>(document) else {
        return;
    };
    let selected = parsed.select(&document);

    // A trailing `[*]` (or `.*`) selects exactly the children of what the
    // path selects, in order.
    let children: Vec<&Value> = selected
        .iter()
        .flat_map(|value| -> Vec<&Value> {
            match value {
                Value::Array(items) => items.iter().collect(),
                Value::Object(map) => map.values().collect(),
                _ => Vec::new(),
            }
        })
        .collect();
    for wildcard in ["[*]", ".*"] {
        let extended = JsonPath::parse("path", &format!("{path}{wildcard}")).unwrap();
        assert_eq!(extended.select(&document), children, "{path}{wildcard}");
    }
});
