//! Counting the attempts a retry layer makes below the dead-letter layer (see
//! the crate docs' [layer order](crate#layer-order)).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use pin_project_lite::pin_project;
use tower_classify::attempts::{self, AttemptTally, TallyScope};
use tower_layer::Layer;
use tower_service::Service;

use crate::store::{millis_since_epoch, time_from_millis};

/// A shared attempt count, carried in a request's extensions, for stacks
/// where the attempts run on another task than the dead-letter layer.
///
/// [`CountAttempts`] counts into the dead-letter call polled on its own
/// thread (see [`CountAttemptsLayer`]), which needs nothing in the request.
/// A `Buffer` or a spawned task between the two layers runs the attempts
/// elsewhere: insert an `AttemptCounter::default()` into the request's extensions
/// before the dead-letter layer, and a retry layer that copies extensions to
/// each attempt (http 1's `Extensions` is `Clone`) carries it down to
/// `CountAttempts`, which then counts each attempt in it and notes when the
/// first one finished. [`HttpCapture`](crate::HttpCapture) reads it back for
/// the entry's attempt count and first failure time.
#[derive(Debug, Clone, Default)]
pub struct AttemptCounter {
    inner: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    started: AtomicU32,
    /// Milliseconds since the epoch when the first attempt finished, 0 if none.
    first_done: AtomicU64,
}

impl AttemptCounter {
    /// Counts one attempt.
    pub(crate) fn record_attempt(&self) {
        self.inner.started.fetch_add(1, Ordering::Relaxed);
    }

    /// Notes that an attempt finished at `now` (only the first is kept).
    pub(crate) fn record_done(&self, now: SystemTime) {
        let millis = millis_since_epoch(now).max(1);
        let first_done = &self.inner.first_done;
        let _ = first_done.compare_exchange(0, millis, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// How many attempts were counted.
    pub(crate) fn attempts(&self) -> u32 {
        self.inner.started.load(Ordering::Relaxed)
    }

    /// When the first attempt finished, if one did.
    pub(crate) fn first_done(&self) -> Option<SystemTime> {
        match self.inner.first_done.load(Ordering::Relaxed) {
            0 => None,
            millis => Some(time_from_millis(millis)),
        }
    }

    /// A counter holding what a dead-letter call's [`Attempts`] say, for
    /// its [`RequestRecord`](crate::RequestRecord).
    pub(crate) fn settled(attempts: Attempts) -> Self {
        let counter = AttemptCounter::default();
        let started = &counter.inner.started;
        started.store(attempts.started, Ordering::Relaxed);
        if let Some(first_done) = attempts.first_done {
            counter.record_done(first_done);
        }
        counter
    }
}

/// A dead-letter call's attempts, as it hands them to its record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Attempts {
    /// Attempts started (0 when nothing below reports them).
    pub(crate) started: u32,
    /// When the first attempt was seen finished, if the call went on
    /// after it.
    pub(crate) first_done: Option<SystemTime>,
}

pin_project! {
    /// A dead-letter call's inner future, polled with its tally current;
    /// resolves to its output and the call's [`Attempts`].
    pub(crate) struct Tallied<F> {
        #[pin]
        call: F,
        tally: AttemptTally,
        first_done: Option<SystemTime>,
    }
}

impl<F> Tallied<F> {
    /// The call made inside `scope`, which ends here.
    #[inline]
    pub(crate) fn in_scope(call: F, scope: TallyScope) -> Self {
        Tallied {
            call,
            tally: scope.exit(),
            first_done: None,
        }
    }
}

impl<F: Future> Future for Tallied<F> {
    type Output = (F::Output, Attempts);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let scope = TallyScope::enter(*this.tally);
        let polled = this.call.poll(cx);
        *this.tally = scope.exit();
        let output = match polled {
            Poll::Ready(output) => output,
            Poll::Pending => {
                // The call goes on after an attempt finished (a retry
                // waiting out its backoff): the first failure was now. A
                // call that ends in the poll its first attempt ends in
                // reads no clock; the record's own time is that moment.
                if this.tally.finished > 0 && this.first_done.is_none() {
                    *this.first_done = Some(SystemTime::now());
                }
                return Poll::Pending;
            }
        };
        // Without a time, later attempts began in the poll the first one ended in.
        let first_done = this
            .first_done
            .or_else(|| (this.tally.started > 1).then(SystemTime::now));
        let attempts = Attempts {
            started: this.tally.started,
            first_done,
        };
        Poll::Ready((output, attempts))
    }
}

/// Places [`CountAttempts`] below a retry layer.
///
/// ```text
/// DeadLetterLayer → RetryLayer → CountAttemptsLayer → service
/// ```
///
/// Each attempt counts towards the nearest dead-letter call above it on
/// the same task (retry layers make their attempts in the caller's task).
/// tower-retry-budget's retry and hedge layers, called by the dead-letter
/// layer, report their attempts themselves and need none: called directly,
/// or through layers that call their inner service in their own `call`, as
/// the breaker does (when both are stacked, the outer one reports); not
/// when they are only polled under the dead-letter call (a client that a
/// handler under a server-side dead-letter layer calls). Right under the
/// layer that reports, this layer counts nothing twice (see
/// [`tower_classify::attempts`]), but under a hedge layer it counts every
/// hedge too. Use it under another retry layer, such as tower's own. Across
/// a `Buffer` or a spawned task, carry an [`AttemptCounter`] in the request
/// instead.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountAttemptsLayer {
    _priv: (),
}

impl CountAttemptsLayer {
    /// The layer.
    pub const fn new() -> Self {
        CountAttemptsLayer { _priv: () }
    }
}

impl<S> Layer<S> for CountAttemptsLayer {
    type Service = CountAttempts<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CountAttempts { inner }
    }
}

/// Counts every call as an attempt of the dead-letter call above it (see
/// [`CountAttemptsLayer`]), or in the [`AttemptCounter`] the request
/// carries, when it carries one.
#[derive(Debug, Clone)]
pub struct CountAttempts<S> {
    inner: S,
}

impl<S> CountAttempts<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B> Service<http::Request<B>> for CountAttempts<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = CountedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let counter = request.extensions().get::<AttemptCounter>().cloned();
        match &counter {
            Some(counter) => counter.record_attempt(),
            None => attempts::attempt_started(),
        }
        CountedFuture {
            future: self.inner.call(request),
            counter,
        }
    }
}

pin_project! {
    /// Response future of [`CountAttempts`].
    #[derive(Debug)]
    pub struct CountedFuture<F> {
        #[pin]
        future: F,
        counter: Option<AttemptCounter>,
    }
}

impl<F: Future> Future for CountedFuture<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let output = std::task::ready!(this.future.poll(cx));
        match this.counter.take() {
            Some(counter) => counter.record_done(SystemTime::now()),
            // No clock read here, on every attempt: the dead-letter call
            // reads one only if it goes on after its first attempt.
            None => attempts::attempt_finished(),
        }
        Poll::Ready(output)
    }
}
