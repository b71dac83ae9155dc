//! The boxed error type and the configuration error.

use std::borrow::Cow;
use std::error::Error;
use std::fmt;

/// The error type the family's layers return: any error, boxed.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// A configuration value was refused; the message names the field. Every
/// layer of the family reports bad configuration with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: Cow<'static, str>,
    reason: String,
}

impl ConfigError {
    /// An error about `field`, explained by `reason`.
    pub fn new(field: impl Into<Cow<'static, str>>, reason: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The refused field, as a path such as `retry.backoff.max_delay`.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// Why it was refused.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The same error with `parent` prefixed to its field path, for nested
    /// configuration (`backoff` + `max_delay` = `backoff.max_delay`).
    pub fn within(mut self, parent: &str) -> Self {
        self.field = Cow::Owned(format!("{parent}.{}", self.field));
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid configuration `{}`: {}", self.field, self.reason)
    }
}

impl Error for ConfigError {}
