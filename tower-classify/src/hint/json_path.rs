//! The small JSONPath subset that response rules and `backoff_from` use.

use std::fmt;

use serde_json::Value;

use crate::error::ConfigError;

/// A parsed JSONPath of the subset APIs' error documents need: `$` followed by
/// `.name`, `['name']`, `[index]`, `.*` or `[*]` steps.
///
/// ```
/// use serde_json::json;
/// use tower_classify::hint::JsonPath;
///
/// let path = JsonPath::parse("body_path", "$.errors[*].extensions.code").unwrap();
/// let doc = json!({"errors": [{"extensions": {"code": "THROTTLED"}}]});
/// assert_eq!(path.select(&doc), vec![&json!("THROTTLED")]);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct JsonPath {
    text: String,
    steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Key(String),
    Index(usize),
    Wildcard,
}

impl JsonPath {
    /// Parses `text`; an error names `field`.
    pub fn parse(field: &'static str, text: &str) -> Result<Self, ConfigError> {
        let error = |reason: &str| ConfigError::new(field, format!("JSONPath {text:?}: {reason}"));
        let mut rest = text
            .strip_prefix('$')
            .ok_or_else(|| error("must start with `$`"))?;
        let mut steps = Vec::new();
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix(".*") {
                steps.push(Step::Wildcard);
                rest = after;
            } else if let Some(after) = rest.strip_prefix('.') {
                let end = after.find(['.', '[']).unwrap_or(after.len());
                if end == 0 {
                    return Err(error("empty name after `.`"));
                }
                steps.push(Step::Key(after[..end].to_owned()));
                rest = &after[end..];
            } else if let Some(after) = rest.strip_prefix('[') {
                let end = after.find(']').ok_or_else(|| error("unclosed `[`"))?;
                let inside = after[..end].trim();
                let quoted = |quote: char| inside.strip_prefix(quote)?.strip_suffix(quote);
                let not_index = |_| error("expected an index, `*` or a quoted name in `[]`");
                steps.push(if inside == "*" {
                    Step::Wildcard
                } else if let Some(name) = quoted('\'').or_else(|| quoted('"')) {
                    Step::Key(name.to_owned())
                } else {
                    Step::Index(inside.parse().map_err(not_index)?)
                });
                rest = &after[end + 1..];
            } else {
                return Err(error("expected `.` or `[`"));
            }
        }
        let text = text.to_owned();
        Ok(JsonPath { text, steps })
    }

    /// Every value the path selects in `document`, in document order.
    pub fn select<'a>(&self, document: &'a Value) -> Vec<&'a Value> {
        let mut current = vec![document];
        for step in &self.steps {
            let mut next = Vec::new();
            for value in current {
                match (step, value) {
                    (Step::Key(key), Value::Object(map)) => next.extend(map.get(key)),
                    (Step::Index(index), Value::Array(items)) => next.extend(items.get(*index)),
                    (Step::Wildcard, Value::Array(items)) => next.extend(items.iter()),
                    (Step::Wildcard, Value::Object(map)) => next.extend(map.values()),
                    _ => {}
                }
            }
            current = next;
        }
        current
    }

    /// The first value the path selects, if any.
    pub(crate) fn first<'a>(&self, document: &'a Value) -> Option<&'a Value> {
        self.select(document).into_iter().next()
    }
}

impl fmt::Debug for JsonPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::JsonPath;

    /// Documents whose keys are the ones the paths below name, and whose
    /// arrays and objects hold several different values, so a wildcard
    /// selects more than one.
    fn document() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "[a-z]{0,3}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec(("[abc]", inner), 0..4)
                    .prop_map(|pairs| Value::Object(pairs.into_iter().collect())),
            ]
        })
    }

    /// Paths of every step kind, over the documents' keys and indexes.
    fn path() -> impl Strategy<Value = String> {
        let step = prop_oneof![
            "\\.[abc]",
            "\\['[abc]'\\]",
            "\\[\"[abc]\"\\]",
            "\\[[0-3]\\]",
            Just(".*".to_owned()),
            Just("[*]".to_owned()),
        ];
        prop::collection::vec(step, 0..5).prop_map(|steps| format!("${}", steps.concat()))
    }

    proptest! {
        /// `first` (what `backoff_from` and response rules read) is the
        /// first of the values `select` gives, in document order.
        #[test]
        fn first_is_the_first_selected_value(text in path(), doc in document()) {
            let path = JsonPath::parse("path", &text).unwrap();
            prop_assert_eq!(path.first(&doc), path.select(&doc).first().copied());
        }
    }
}
