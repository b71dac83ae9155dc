//! The checked-in JSON Schema is the one the types generate, and it
//! describes the keys the loader accepts.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;

const SCHEMA_FILE: &str = "schema/resilience.schema.json";
const UPDATE: &str =
    "cargo run -p tower-steadfast --example print_schema > tower-steadfast/schema/resilience.schema.json";

#[test]
fn the_checked_in_schema_is_current() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(SCHEMA_FILE);
    let checked_in = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; create it with `{UPDATE}`", path.display()));
    let generated = tower_steadfast::json_schema_text();
    assert!(
        checked_in == generated,
        "{SCHEMA_FILE} is stale: the configuration types changed since it was written.\n\
         Update it with:\n\n    {UPDATE}\n"
    );
}

fn properties(schema: &Value, definition: &str) -> BTreeSet<String> {
    schema["$defs"][definition]["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("no properties for {definition}"))
        .keys()
        .cloned()
        .collect()
}

/// The keys the loader accepts, read from its own refusal of an unknown key.
fn accepted(yaml: &str) -> BTreeSet<String> {
    let error = tower_steadfast::ResilienceConfig::from_yaml_str(yaml).unwrap_err();
    let listed = error
        .reason()
        .strip_prefix("unknown key; expected ")
        .unwrap_or_else(|| panic!("{error}"));
    let listed = listed.split(" (").next().unwrap();
    listed.split(", ").map(str::to_owned).collect()
}

#[test]
fn the_schema_and_the_loader_accept_the_same_keys() {
    let schema = serde_json::to_value(tower_steadfast::json_schema()).unwrap();
    for (definition, yaml) in [
        ("ResilienceConfig", "nope: 1"),
        ("RetrySection", "retry: {nope: 1}"),
        ("CircuitBreakerSection", "circuit_breaker: {nope: 1}"),
        ("PoisonSection", "poison: {nope: 1}"),
    ] {
        assert_eq!(
            properties(&schema, definition),
            accepted(yaml),
            "{definition}"
        );
        assert_eq!(
            schema["$defs"][definition]["additionalProperties"],
            Value::Bool(false),
            "{definition} refuses unknown keys"
        );
    }
}

#[test]
fn the_schema_states_the_ranges_and_defaults() {
    let schema = serde_json::to_value(tower_steadfast::json_schema()).unwrap();
    let retry = &schema["$defs"]["RetrySection"]["properties"];
    assert_eq!(retry["max_attempts"]["minimum"], 1);
    assert_eq!(retry["max_attempts"]["maximum"], 17);
    assert_eq!(retry["max_attempts"]["default"], 5);
    assert_eq!(retry["retry_on"]["minItems"], 1);
    let breaker = &schema["$defs"]["CircuitBreakerSection"]["properties"];
    assert_eq!(breaker["cooldown_secs"]["minimum"], 1);
    // Left out, the breaker's backing-off open period: no default value,
    // and the section's default leaves the key out.
    assert_eq!(breaker["cooldown_secs"]["type"], "integer");
    assert!(breaker["cooldown_secs"].get("default").is_none());
    let section_default =
        &schema["$defs"]["ResilienceConfig"]["properties"]["circuit_breaker"]["default"];
    assert_eq!(section_default["consecutive_failures"], 5);
    assert!(section_default.get("cooldown_secs").is_none());
}
