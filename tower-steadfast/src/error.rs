//! Error types.

use tower_classify::ConfigError;

/// A configuration could not be loaded.
///
/// Either the text is not valid in its format ([`Syntax`](Self::Syntax)), or
/// a value breaks a rule ([`Invalid`](Self::Invalid)). An invalid value is
/// reported with the path of the exact key that holds it, as written in the
/// document (`resilience.retry.base_ms`, `retry.retry_on[2]`), and the rule
/// it breaks in words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The text is not valid YAML, TOML or JSON.
    #[error("cannot read the configuration as {format}: {message}")]
    Syntax {
        /// `YAML`, `TOML` or `JSON`.
        format: &'static str,
        /// The parser's own message, with its line and column.
        message: String,
    },
    /// A key is unknown or a value breaks a rule. The inner error's
    /// [`field`](ConfigError::field) is the key's path.
    #[error(transparent)]
    Invalid(#[from] ConfigError),
}

impl LoadError {
    /// The path of the refused key, for an [`Invalid`](Self::Invalid) value.
    pub fn field(&self) -> Option<&str> {
        match self {
            LoadError::Invalid(error) => Some(error.field()),
            LoadError::Syntax { .. } => None,
        }
    }

    /// Why the value was refused, or the parser's message.
    pub fn reason(&self) -> &str {
        match self {
            LoadError::Invalid(error) => error.reason(),
            LoadError::Syntax { message, .. } => message,
        }
    }
}
