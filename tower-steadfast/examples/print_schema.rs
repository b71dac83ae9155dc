//! Prints the JSON Schema of a resilience configuration document.
//!
//! ```text
//! cargo run -p tower-steadfast --features json-schema --example print_schema > tower-steadfast/schema/resilience.schema.json
//! ```

fn main() {
    print!("{}", tower_steadfast::json_schema_text());
}
