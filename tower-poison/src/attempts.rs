//! Counting the attempts a retry layer makes below the dead-letter layer.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

/// A shared attempt count, carried in a request's extensions.
///
/// [`HttpCapture`](crate::HttpCapture) puts one into every request; a retry
/// layer that copies request extensions to each attempt (http 1's
/// `Extensions` is `Clone`) carries it down to [`CountAttempts`], which
/// counts each attempt and notes when the first one finished. The
/// dead-letter entry then holds the real attempt count and first failure time.
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
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one attempt.
    pub fn record_attempt(&self) {
        self.inner.started.fetch_add(1, Ordering::Relaxed);
    }

    /// Notes that an attempt finished at `now` (only the first is kept).
    pub fn record_done(&self, now: SystemTime) {
        let millis = now
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        let _ = self.inner.first_done.compare_exchange(
            0,
            millis.max(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// How many attempts were counted.
    pub fn attempts(&self) -> u32 {
        self.inner.started.load(Ordering::Relaxed)
    }

    /// When the first attempt finished, if one did.
    pub fn first_done(&self) -> Option<SystemTime> {
        match self.inner.first_done.load(Ordering::Relaxed) {
            0 => None,
            millis => Some(UNIX_EPOCH + Duration::from_millis(millis)),
        }
    }
}

/// Places [`CountAttempts`] below a retry layer.
///
/// ```text
/// DeadLetterLayer → RetryLayer → CountAttemptsLayer → service
/// ```
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

/// Counts every call that carries an [`AttemptCounter`] in its extensions.
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
        if let Some(counter) = &counter {
            counter.record_attempt();
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
        if let Some(counter) = this.counter.take() {
            counter.record_done(SystemTime::now());
        }
        Poll::Ready(output)
    }
}
