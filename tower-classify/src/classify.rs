//! The [`Classify`] trait, closure classifiers and combinators.

use std::fmt;

use crate::outcome::{Failure, FailureKind, Outcome};
use crate::retry_on::RetryOn;

/// Decides what one call's result means.
///
/// A classifier sees the response *or* the error of a call and answers with an
/// [`Outcome`]. One classifier value, configured once, is cloned into every
/// layer of a stack, so the retry layer, the circuit breaker and the
/// dead-letter layer agree on what a failure is.
///
/// Classifiers must be cheap to call: every layer calls them once per attempt.
/// Those shipped here are `Clone` and share their configuration through `Arc`.
pub trait Classify<Res, E> {
    /// Classifies one result.
    fn classify(&self, result: Result<&Res, &E>) -> Outcome;
}

impl<C, Res, E> Classify<Res, E> for &C
where
    C: Classify<Res, E> + ?Sized,
{
    fn classify(&self, result: Result<&Res, &E>) -> Outcome {
        (**self).classify(result)
    }
}

impl<C, Res, E> Classify<Res, E> for std::sync::Arc<C>
where
    C: Classify<Res, E> + ?Sized,
{
    fn classify(&self, result: Result<&Res, &E>) -> Outcome {
        (**self).classify(result)
    }
}

/// A classifier made from a closure; see [`classify_fn`].
#[derive(Clone, Copy)]
pub struct ClassifyFn<F> {
    f: F,
}

/// Makes a classifier from a closure over the call's result.
///
/// ```
/// use tower_classify::{classify_fn, Classify, FailureKind, Outcome};
///
/// let classifier = classify_fn(|result: Result<&u16, &std::io::Error>| match result {
///     Ok(200) => Outcome::Success,
///     Ok(_) => Outcome::failure(FailureKind::Rejected),
///     Err(_) => Outcome::failure(FailureKind::Connection),
/// });
/// assert_eq!(classifier.classify(Ok(&200)), Outcome::Success);
/// ```
pub const fn classify_fn<F>(f: F) -> ClassifyFn<F> {
    ClassifyFn { f }
}

impl<F, Res, E> Classify<Res, E> for ClassifyFn<F>
where
    F: Fn(Result<&Res, &E>) -> Outcome,
{
    fn classify(&self, result: Result<&Res, &E>) -> Outcome {
        (self.f)(result)
    }
}

impl<F> fmt::Debug for ClassifyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClassifyFn")
            .field("f", &std::any::type_name::<F>())
            .finish()
    }
}

/// Combinators for classifiers.
///
/// Implemented by every classifier in this crate and by the combinators
/// themselves. The trait has no type parameters, so calls need no annotations;
/// a classifier of your own gets the combinators with an empty impl:
/// `impl ClassifyExt for MyClassifier {}`.
pub trait ClassifyExt: Sized {
    /// Asks `self` first; where `self` answers [`Outcome::Success`], asks `other`.
    ///
    /// Use it to put a narrow classifier in front of a general one, for example
    /// one that recognises an application's own "try later" payload in front of
    /// the HTTP status classifier: the first failure found wins.
    fn or<C>(self, other: C) -> Or<Self, C> {
        Or {
            first: self,
            second: other,
        }
    }

    /// Rewrites every outcome with `f`.
    fn map<F>(self, f: F) -> Map<Self, F>
    where
        F: Fn(Outcome) -> Outcome,
    {
        Map { inner: self, f }
    }

    /// Keeps only the transient classes in `retry_on` transient: a transient
    /// failure of any other class becomes [`FailureKind::Rejected`].
    ///
    /// This changes what *every* layer sharing the classifier sees, so a
    /// breaker stops counting the classes left out too. To narrow only what a
    /// retry layer retries, give the [`RetryOn`] set to the retry layer instead.
    fn retry_on(self, retry_on: RetryOn) -> Map<Self, RetryOnFilter> {
        Map {
            inner: self,
            f: RetryOnFilter { retry_on },
        }
    }
}

impl<F> ClassifyExt for ClassifyFn<F> {}
impl<A, B> ClassifyExt for Or<A, B> {}
impl<C, F> ClassifyExt for Map<C, F> {}

/// The classifier returned by [`ClassifyExt::or`].
#[derive(Debug, Clone, Copy)]
pub struct Or<A, B> {
    first: A,
    second: B,
}

impl<A, B, Res, E> Classify<Res, E> for Or<A, B>
where
    A: Classify<Res, E>,
    B: Classify<Res, E>,
{
    fn classify(&self, result: Result<&Res, &E>) -> Outcome {
        match self.first.classify(result) {
            Outcome::Success => self.second.classify(result),
            decided => decided,
        }
    }
}

/// The classifier returned by [`ClassifyExt::map`] and [`ClassifyExt::retry_on`].
#[derive(Clone, Copy)]
pub struct Map<C, F> {
    inner: C,
    f: F,
}

impl<C: fmt::Debug, F> fmt::Debug for Map<C, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Map")
            .field("inner", &self.inner)
            .field("f", &std::any::type_name::<F>())
            .finish()
    }
}

/// Rewrites one outcome; implemented for closures and [`RetryOnFilter`].
pub trait MapOutcome {
    /// Rewrites `outcome`.
    fn map_outcome(&self, outcome: Outcome) -> Outcome;
}

impl<F> MapOutcome for F
where
    F: Fn(Outcome) -> Outcome,
{
    fn map_outcome(&self, outcome: Outcome) -> Outcome {
        self(outcome)
    }
}

impl<C, F, Res, E> Classify<Res, E> for Map<C, F>
where
    C: Classify<Res, E>,
    F: MapOutcome,
{
    fn classify(&self, result: Result<&Res, &E>) -> Outcome {
        self.f.map_outcome(self.inner.classify(result))
    }
}

/// The outcome rewrite behind [`ClassifyExt::retry_on`].
#[derive(Debug, Clone, Copy)]
pub struct RetryOnFilter {
    retry_on: RetryOn,
}

impl MapOutcome for RetryOnFilter {
    fn map_outcome(&self, outcome: Outcome) -> Outcome {
        match outcome {
            Outcome::Failure(failure)
                if failure.kind.is_transient() && !self.retry_on.contains(failure.kind) =>
            {
                Outcome::Failure(Failure {
                    kind: FailureKind::Rejected,
                    hint: None,
                    ..failure
                })
            }
            other => other,
        }
    }
}
