//! Calls whose head leaves them open: settled where the response body ends.

use std::fmt;
use std::future::{ready, Ready};
use std::time::Duration;

use tower_classify::{BoxError, OnEnd, Outcome, StreamEnd};

use crate::permit::Permit;

/// A call the classifier left open at its response head, under the
/// [`HttpError`](crate::answer::HttpError) answer: its response body, a
/// [`SettleBody`](tower_classify::SettleBody), records it in the breaker
/// where it ends, as the classifier's
/// [`classify_end`](tower_classify::Classify::classify_end) judges that end.
/// The rules are listed on [`HttpError`](crate::answer::HttpError).
pub struct OpenCall<C> {
    pub(crate) permit: Permit,
    /// The call's duration up to its response head; `None` when nothing
    /// needs it (no slow-call threshold, no per-call callback).
    pub(crate) elapsed: Option<Duration>,
    pub(crate) classifier: C,
    /// `classifier`'s `classify_end` for the response type it was left open
    /// with, so that the body's type names the classifier alone.
    pub(crate) judge: fn(&C, StreamEnd<'_>) -> Outcome,
}

impl<C> OnEnd for OpenCall<C> {
    type Future = Ready<Result<(), BoxError>>;

    fn classify_end(&self, end: StreamEnd<'_>) -> Outcome {
        (self.judge)(&self.classifier, end)
    }

    fn settle(mut self, outcome: Outcome, end: StreamEnd<'_>) -> Self::Future {
        match (end, outcome) {
            // The caller went away and the classifier makes nothing of it:
            // nothing is recorded, and dropping the permit gives a probe's
            // slot back.
            (StreamEnd::Dropped, Outcome::Ignored) => {}
            _ => self.permit.complete(outcome, self.elapsed),
        }
        ready(Ok(()))
    }
}

impl<C> fmt::Debug for OpenCall<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenCall")
            .field("permit", &self.permit)
            .field("elapsed", &self.elapsed)
            .finish_non_exhaustive()
    }
}
