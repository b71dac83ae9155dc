//! The JSON Schema of a configuration document.

use schemars::{JsonSchema, Schema};

use crate::config::ResilienceConfig;

/// A document holding the block under a top-level `resilience` key.
#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Only its schema is used: the loader reads documents itself.
struct WrappedDocument {
    /// The resilience settings.
    resilience: ResilienceConfig,
}

/// A configuration document: the `resilience` block, either on its own or
/// under a top-level `resilience` key.
#[derive(JsonSchema)]
#[serde(untagged)]
#[schemars(title = "Resilience configuration")]
#[allow(dead_code)] // Only its schema is used.
enum ResilienceDocument {
    /// `resilience: { retry: …, circuit_breaker: …, poison: … }`.
    Wrapped(WrappedDocument),
    /// `{ retry: …, circuit_breaker: …, poison: … }`.
    Bare(ResilienceConfig),
}

/// The JSON Schema (draft 2020-12) of a configuration document, with a
/// definition for every configuration type. Editors that read JSON Schema
/// (for YAML too, e.g. through `yaml-language-server`) then complete keys
/// and flag wrong values while the file is written; the loader still checks
/// the rules a schema cannot state (`base_ms` not above `max_ms`).
///
/// ```
/// let schema = tower_steadfast::json_schema();
/// let text = serde_json::to_string(&schema).unwrap();
/// assert!(text.contains("max_attempts"));
/// ```
pub fn json_schema() -> Schema {
    schemars::schema_for!(ResilienceDocument)
}

/// [`json_schema`] as the text checked in at `schema/resilience.schema.json`:
/// pretty-printed, ending in a newline.
pub fn json_schema_text() -> String {
    let mut text = serde_json::to_string_pretty(&json_schema())
        .expect("a schema is plain JSON and always serializes");
    text.push('\n');
    text
}
