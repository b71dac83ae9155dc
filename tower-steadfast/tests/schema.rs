//! The checked-in JSON Schema is the one the types generate, and it
//! describes the keys the loader accepts.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;

const SCHEMA_FILE: &str = "schema/resilience.schema.json";
const UPDATE: &str =
    "cargo run -p tower-steadfast --features json-schema --example print_schema > tower-steadfast/schema/resilience.schema.json";

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
fn the_schema_states_the_ranges_and_leaves_defaults_to_the_layers() {
    let schema = serde_json::to_value(tower_steadfast::json_schema()).unwrap();
    let retry = &schema["$defs"]["RetrySection"]["properties"];
    assert_eq!(retry["max_attempts"]["minimum"], 1);
    assert_eq!(retry["max_attempts"]["maximum"], 17);
    assert_eq!(retry["retry_on"]["minItems"], 1);
    let breaker = &schema["$defs"]["CircuitBreakerSection"]["properties"];
    assert_eq!(breaker["cooldown_secs"]["minimum"], 1);
    assert_eq!(breaker["cooldown_secs"]["type"], "integer");
    // A key left out is the layer's default: the schema states no default
    // value for it, and a section's default leaves every such key out.
    for (section, keys) in [
        (
            "RetrySection",
            &[
                "max_attempts",
                "backoff",
                "base_ms",
                "max_ms",
                "jitter",
                "retry_on",
            ][..],
        ),
        (
            "CircuitBreakerSection",
            &["consecutive_failures", "cooldown_secs"][..],
        ),
        ("PoisonSection", &["action"][..]),
    ] {
        for key in keys {
            let property = &schema["$defs"][section]["properties"][key];
            assert!(property.get("default").is_none(), "{section}.{key}");
        }
    }
    let block = &schema["$defs"]["ResilienceConfig"]["properties"];
    assert_eq!(block["retry"]["default"], serde_json::json!({}));
    assert_eq!(block["circuit_breaker"]["default"], serde_json::json!({}));
    assert_eq!(block["poison"]["default"], serde_json::json!({}));
    // The keys without a layer default state the block's own.
    assert_eq!(
        schema["$defs"]["PoisonSection"]["properties"]["max_row_attempts"]["default"],
        3
    );
    assert_eq!(retry["deadline_ms"]["default"], 10_000);
    assert_eq!(retry["attempt_timeout_ms"]["default"], 3_000);
}

/// The `const` names of one of the schema's name definitions.
fn names(schema: &Value, definition: &str) -> Vec<String> {
    schema["$defs"][definition]["oneOf"]
        .as_array()
        .unwrap_or_else(|| panic!("{definition} lists no names"))
        .iter()
        .map(|name| name["const"].as_str().unwrap().to_owned())
        .collect()
}

/// The block speaks the layers' vocabulary: every name the schema offers is
/// one the layer's own parser reads, so the two cannot drift apart.
#[test]
fn the_schemas_names_are_the_layers_names() {
    let schema = serde_json::to_value(tower_steadfast::json_schema()).unwrap();
    let backoffs = names(&schema, "BackoffName");
    assert_eq!(backoffs.len(), 4);
    for name in &backoffs {
        name.parse::<tower_retry_budget::BackoffKind>()
            .unwrap_or_else(|e| panic!("backoff `{name}`: {e}"));
    }
    let classes = names(&schema, "RetryClassName");
    assert_eq!(
        tower_classify::RetryOn::from_names(&classes).unwrap(),
        tower_classify::RetryOn::default(),
        "the schema names every class"
    );
    for name in names(&schema, "ActionName") {
        name.parse::<tower_poison::Action>()
            .unwrap_or_else(|e| panic!("action `{name}`: {e}"));
    }
    for name in ["none", "full", "equal", "decorrelated", "0.5..1.5"] {
        name.parse::<tower_retry_budget::Jitter>().unwrap();
        let yaml = format!("retry: {{jitter: \"{name}\"}}");
        tower_steadfast::ResilienceConfig::from_yaml_str(&yaml).unwrap();
    }
}
