//! Error types.

use std::borrow::Cow;
use std::error::Error;
use std::fmt;
use std::time::Duration;

use crate::outcome::{Failure, FailureKind, RetryHint};

/// The error type the family's layers return: any error, boxed.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// A configuration value was refused. The message names the field.
///
/// Every layer of the family reports bad configuration with this type, so a
/// service that loads its resilience settings from a file can tell an operator
/// exactly which key to fix.
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

/// An error that already knows its classification.
///
/// The family's crates do not depend on each other, yet each must recognise the
/// others' errors: a retry layer must not spin on a breaker's open circuit, and
/// a breaker outside a retry layer must count a retry that gave up. They agree
/// through this type. A layer's own error (such as a breaker's `CircuitOpen`)
/// keeps its public type, for callers to downcast, and returns a `Classified`
/// from [`Error::source`]. The [`ErrorChainClassifier`](crate::ErrorChainClassifier)
/// finds it anywhere in the chain and takes its [`Failure`] as the answer.
///
/// ```
/// use std::time::Duration;
/// use tower_classify::{Classified, ErrorChainClassifier, FailureKind};
///
/// let shed = Classified::shed("circuit open", Some(Duration::from_secs(3)));
/// let outcome = ErrorChainClassifier::new().classify_error(&shed);
/// let failure = outcome.as_failure().unwrap();
/// assert_eq!(failure.kind, FailureKind::Shed);
/// assert_eq!(failure.retry_after(), Some(Duration::from_secs(3)));
/// ```
#[derive(Debug)]
pub struct Classified {
    failure: Failure,
    message: Cow<'static, str>,
    source: Option<BoxError>,
}

impl Classified {
    /// An error with the given classification and message.
    pub fn new(failure: impl Into<Failure>, message: impl Into<Cow<'static, str>>) -> Self {
        Classified {
            failure: failure.into(),
            message: message.into(),
            source: None,
        }
    }

    /// A load-shedding refusal: the call never reached the dependency. When
    /// `retry_after` is known, callers may try again after it.
    pub fn shed(message: impl Into<Cow<'static, str>>, retry_after: Option<Duration>) -> Self {
        let failure =
            Failure::new(FailureKind::Shed).with_hint_opt(retry_after.map(RetryHint::After));
        Classified::new(failure, message)
    }

    /// The same error with `source` as its cause.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// The classification this error carries.
    pub fn failure(&self) -> Failure {
        self.failure
    }
}

impl fmt::Display for Classified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for Classified {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}
