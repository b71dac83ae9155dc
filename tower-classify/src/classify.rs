//! The [`Classify`] trait, closure classifiers and combinators.

use std::fmt;

use crate::outcome::{Failure, FailureKind, Outcome};
use crate::retry_on::RetryOn;
#[cfg(feature = "http")]
use crate::settle::StreamEnd;

/// Decides what one call's result, its response *or* its error, means
/// ([crate docs](crate#what-it-decides)). Every layer calls it once per
/// attempt, so it must be cheap. A streamed response may settle its call
/// only where its body ends ([crate docs](crate#what-it-reads)). The
/// combinators, `&C` and `Arc<C>` pass every method on.
pub trait Classify<Res, E> {
    /// Classifies one result.
    fn classify(&self, result: Result<&Res, &E>) -> Outcome;

    /// Classifies one result whose response may still be streaming: `None`
    /// when its head does not settle the call. By default the head settles
    /// every call, as [`classify`](Self::classify) says.
    #[cfg_attr(
        feature = "http",
        doc = "\nA call left open is judged by [`classify_end`](Self::classify_end) where its response's body ends."
    )]
    // The example needs the gRPC classifier, which comes with `http`.
    #[cfg_attr(
        feature = "http",
        doc = r#"
```
use http::Response;
use tower_classify::{BoxError, Classify, GrpcClassifier, Outcome};

let grpc = GrpcClassifier::new();
let streaming = Response::builder()
    .header("content-type", "application/grpc")
    .body(())
    .unwrap();
// The status comes in the trailers: the head settles nothing.
assert_eq!(Classify::<_, BoxError>::classify_head(&grpc, Ok(&streaming)), None);
let plain = Response::new(());
assert_eq!(Classify::<_, BoxError>::classify_head(&grpc, Ok(&plain)), Some(Outcome::Success));
```
"#
    )]
    fn classify_head(&self, result: Result<&Res, &E>) -> Option<Outcome> {
        Some(self.classify(result))
    }

    /// Judges the end of a response body whose head left its call open
    /// ([`classify_head`](Self::classify_head) answered `None`).
    ///
    /// By default a body that ends is a success (trailers or none), a body
    /// error a [`Connection`](FailureKind::Connection) failure, and a body
    /// dropped before its end [ignored](Outcome::Ignored): the caller went
    /// away, which says nothing about the other side.
    ///
    /// ```
    /// use http::{HeaderMap, Response};
    /// use tower_classify::{BoxError, Classify, FailureKind, GrpcClassifier, Outcome, StreamEnd};
    ///
    /// fn end(end: StreamEnd<'_>) -> Outcome {
    ///     Classify::<Response<()>, BoxError>::classify_end(&GrpcClassifier::new(), end)
    /// }
    /// let mut trailers = HeaderMap::new();
    /// trailers.insert("grpc-status", "0".parse().unwrap());
    /// assert_eq!(end(StreamEnd::Trailers(Some(&trailers))), Outcome::Success);
    /// trailers.insert("grpc-status", "14".parse().unwrap());
    /// assert!(end(StreamEnd::Trailers(Some(&trailers))).is_retryable());
    /// assert_eq!(end(StreamEnd::Dropped), Outcome::Ignored);
    /// ```
    #[cfg(feature = "http")]
    fn classify_end(&self, end: StreamEnd<'_>) -> Outcome {
        end.default_outcome()
    }
}

/// `&C` and `Arc<C>` are the classifier they point to, ends included.
macro_rules! forward_classify {
    ($($pointer:ty),*) => {$(
        impl<C, Res, E> Classify<Res, E> for $pointer
        where
            C: Classify<Res, E> + ?Sized,
        {
            fn classify(&self, result: Result<&Res, &E>) -> Outcome {
                (**self).classify(result)
            }

            fn classify_head(&self, result: Result<&Res, &E>) -> Option<Outcome> {
                (**self).classify_head(result)
            }

            #[cfg(feature = "http")]
            fn classify_end(&self, end: StreamEnd<'_>) -> Outcome {
                (**self).classify_end(end)
            }
        }
    )*};
}

forward_classify!(&C, std::sync::Arc<C>);

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

/// Combinators for classifiers, without type annotations at the call; a
/// classifier of your own gets them with `impl ClassifyExt for Mine {}`.
pub trait ClassifyExt: Sized {
    /// Asks `self` first; where `self` answers [`Outcome::Success`], asks
    /// `other` (a narrow classifier in front of a general one). A call either
    /// leaves open at the head stays open unless the other finds a failure;
    /// at the end of its body `self` judges first.
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
    /// failure of any other class becomes [`FailureKind::Rejected`], for
    /// *every* layer sharing the classifier (a breaker stops counting it
    /// too); to narrow only the retries, give the set to the retry layer.
    fn retry_on(self, retry_on: RetryOn) -> Map<Self, RetryOn> {
        Map {
            inner: self,
            f: retry_on,
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

    /// Open while either leaves the call open and neither found a
    /// failure: a failure found at the head settles the call at once.
    fn classify_head(&self, result: Result<&Res, &E>) -> Option<Outcome> {
        match self.first.classify_head(result) {
            Some(Outcome::Success) => self.second.classify_head(result),
            Some(decided) => Some(decided),
            None => match self.second.classify_head(result) {
                Some(failure @ Outcome::Failure(_)) => Some(failure),
                _ => None,
            },
        }
    }

    #[cfg(feature = "http")]
    fn classify_end(&self, end: StreamEnd<'_>) -> Outcome {
        match self.first.classify_end(end) {
            Outcome::Success => self.second.classify_end(end),
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

/// Rewrites one outcome, for [`ClassifyExt::map`] (closures) and
/// [`ClassifyExt::retry_on`] (a [`RetryOn`] set, a type one can name).
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

/// As [`ClassifyExt::retry_on`] says; the rejected failure has no hint.
impl MapOutcome for RetryOn {
    fn map_outcome(&self, outcome: Outcome) -> Outcome {
        match outcome {
            Outcome::Failure(failure)
                if failure.kind.is_transient() && !self.contains(failure.kind) =>
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

impl<C, F, Res, E> Classify<Res, E> for Map<C, F>
where
    C: Classify<Res, E>,
    F: MapOutcome,
{
    fn classify(&self, result: Result<&Res, &E>) -> Outcome {
        self.f.map_outcome(self.inner.classify(result))
    }

    fn classify_head(&self, result: Result<&Res, &E>) -> Option<Outcome> {
        let outcome = self.inner.classify_head(result)?;
        Some(self.f.map_outcome(outcome))
    }

    #[cfg(feature = "http")]
    fn classify_end(&self, end: StreamEnd<'_>) -> Outcome {
        self.f.map_outcome(self.inner.classify_end(end))
    }
}
