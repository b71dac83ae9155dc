//! Error types.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_classify::Classified;
#[cfg(feature = "http")]
use tower_classify::RefusalToken;

/// The breaker refused a call: the circuit is open (or half-open with every
/// probe slot taken). The inner service was not called.
///
/// Returned boxed, as tower middleware errors are; downcast to read it:
///
/// ```
/// # use tower_breaker::CircuitOpen;
/// # fn handle(err: tower_classify::BoxError) {
/// if let Some(open) = err.downcast_ref::<CircuitOpen>() {
///     println!("try again in {:?}", open.remaining());
/// }
/// # }
/// ```
///
/// Its [`source`](std::error::Error::source) is its [`failure`](CircuitOpen::failure)
/// as a [`tower_classify::Classified`], which an
/// [`ErrorChainClassifier`](tower_classify::ErrorChainClassifier) recognises
/// ([crate docs](crate#layer-order)).
///
/// When a breaker answering HTTP requests (the `http` feature's
/// [answers](crate::answer), `Http503` and `HttpError`) refuses a request
/// that carries a [`RefusalToken`](tower_classify::RefusalToken) (an
/// idempotency guard in front of it gave it one), the failure carries that
/// token as its
/// [`refusal`](tower_classify::Failure::refusal): proof, to that guard,
/// that the service behind the breaker never saw the request.
#[derive(Debug)]
pub struct CircuitOpen {
    key: Arc<str>,
    remaining: Option<Duration>,
    /// Carries `retry_after` as its failure's hint.
    classified: Classified,
}

impl CircuitOpen {
    pub(crate) fn new(
        key: Arc<str>,
        remaining: Option<Duration>,
        retry_after: Option<Duration>,
    ) -> Self {
        CircuitOpen {
            key,
            remaining,
            classified: classified(Classified::shed("circuit open", retry_after), remaining),
        }
    }

    /// The same refusal, of a request that carried `token` (from its
    /// extensions; `None` when it carried none).
    #[cfg(feature = "http")]
    pub(crate) fn refusing(self, token: Option<RefusalToken>) -> Self {
        if token.is_none() {
            // Nothing to prove: most refusals of an outage end here.
            return self;
        }
        let failure = self.classified.failure().with_refusal(token);
        CircuitOpen {
            classified: classified(Classified::new(failure, "circuit open"), self.remaining),
            ..self
        }
    }

    /// How long the circuit stays open, when that is known. `None` while the
    /// breaker is half-open with every probe slot taken (it closes when the
    /// probes succeed) or forced open by an operator.
    pub fn remaining(&self) -> Option<Duration> {
        self.remaining
    }

    /// The classification this refusal carries: a
    /// [`Shed`](tower_classify::FailureKind::Shed) failure whose hint,
    /// `failure().retry_after()`, says when the caller should try again.
    ///
    /// That hint is set for a call refused in the last fifth of an open
    /// period, to five times [`remaining`](Self::remaining) (the [crate
    /// docs](crate#recovery)' ramp); `None` for a call refused earlier, or
    /// while the breaker is half-open, forced open or throttling. A refusal
    /// of a [slow start](crate::Builder::slow_start) names a point of what
    /// is left of it. An HTTP or gRPC answer of the refusal tells its caller
    /// this wait, or without it the remaining open time (see
    /// [`Classified::with_answer_wait`](tower_classify::Classified::with_answer_wait)).
    pub fn failure(&self) -> tower_classify::Failure {
        self.classified.failure()
    }

    /// The breaker's key: the key of a keyed breaker, else the layer's name.
    pub fn key(&self) -> &str {
        &self.key
    }
}

/// `shed` telling a remote caller (an HTTP or gRPC answer) to come back at
/// its place on the release ramp or, refused earlier in the period, when the
/// period ends: the wait an open circuit promises, whatever answers it. The
/// hint a retry layer in process reads stays `retry_after` alone.
fn classified(shed: Classified, remaining: Option<Duration>) -> Classified {
    match shed.failure().retry_after().or(remaining) {
        Some(wait) => shed.with_answer_wait(wait),
        None => shed,
    }
}

impl fmt::Display for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("circuit open")
    }
}

impl std::error::Error for CircuitOpen {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.classified)
    }
}
