//! [`Classified`]: an error that carries its own classification.

use std::borrow::Cow;
use std::error::Error;
use std::fmt;
use std::time::Duration;

use crate::error::BoxError;
use crate::outcome::{Failure, FailureKind, RetryHint};

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
