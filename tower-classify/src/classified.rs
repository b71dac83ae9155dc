//! [`Classified`]: an error that carries its own classification.

use std::borrow::Cow;
use std::error::Error;
use std::fmt;
use std::time::Duration;

use crate::error::BoxError;
use crate::outcome::{Failure, FailureKind, RetryHint};

/// An error that already knows its classification: a layer's own error
/// returns one from [`Error::source`] ([crate
/// docs](crate#load-shedding-across-crates)).
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
    /// The wait an answer to a remote caller states, when it is not the
    /// hint's (see [`with_answer_wait`](Self::with_answer_wait)).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) answer_wait: Option<Duration>,
}

impl Classified {
    /// An error with the given classification and message.
    pub fn new(failure: impl Into<Failure>, message: impl Into<Cow<'static, str>>) -> Self {
        Classified {
            failure: failure.into(),
            message: message.into(),
            source: None,
            answer_wait: None,
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

    /// The same error, telling a caller in another process (through module
    /// `status`) to wait `wait`, in place of the hint meant for a retry layer
    /// here (an open circuit's time left, however early in its period).
    ///
    /// ```
    /// # #[cfg(feature = "http")] {
    /// use std::time::Duration;
    /// use tower_classify::status::Problem;
    /// use tower_classify::{Classified, ErrorChainClassifier};
    ///
    /// let open = Classified::shed("circuit open", None).with_answer_wait(Duration::from_millis(2500));
    /// let failure = ErrorChainClassifier::new().classify_error(&open).as_failure().copied();
    /// assert_eq!(failure.unwrap().hint, None, "a retry layer here is told nothing");
    /// let answer: http::Response<String> = Problem::for_error(&open).response();
    /// assert_eq!(answer.headers()["retry-after"], "3");
    /// # }
    /// ```
    pub fn with_answer_wait(mut self, wait: Duration) -> Self {
        self.answer_wait = Some(wait);
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
