//! The retry loop on paused time: backoff, deadline, hints, shed errors,
//! readiness and cancellation, for any `Clone` request.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tokio_test::{assert_pending, assert_ready_err, assert_ready_ok, task};
use tower::{Layer, Service, ServiceExt};
use tower_classify::{BoxError, Classified, Failure, FailureKind, RetryHint};
use tower_retry_budget::backoff::{Backoff, Jitter};
use tower_retry_budget::budget::TpsBudget;
use tower_retry_budget::error::{DeadlineExceeded, WaitLimit, WaitTooLong};
use tower_retry_budget::{RetryEvent, RetryLayer};

const MS: fn(u64) -> Duration = Duration::from_millis;
const S: fn(u64) -> Duration = Duration::from_secs;

type Script = Arc<dyn Fn(u32) -> Result<&'static str, BoxError> + Send + Sync>;

/// A service whose n-th call (0-based) takes `latency` and then answers
/// `script(n)`. It records when each call started and counts its live clones.
#[derive(Clone)]
struct Scripted {
    script: Script,
    latency: Duration,
    calls: Arc<Mutex<Vec<Instant>>>,
    live: Arc<()>,
}

impl Scripted {
    fn new(script: impl Fn(u32) -> Result<&'static str, BoxError> + Send + Sync + 'static) -> Self {
        Scripted {
            script: Arc::new(script),
            latency: Duration::ZERO,
            calls: Arc::default(),
            live: Arc::new(()),
        }
    }

    fn latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    fn count(&self) -> usize {
        self.calls.lock().unwrap().len()
    }

    /// Time between consecutive call starts.
    fn gaps(&self) -> Vec<Duration> {
        let calls = self.calls.lock().unwrap();
        calls.windows(2).map(|w| w[1] - w[0]).collect()
    }
}

impl Service<&'static str> for Scripted {
    type Response = &'static str;
    type Error = BoxError;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<&'static str, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: &'static str) -> Self::Future {
        let n = {
            let mut calls = self.calls.lock().unwrap();
            calls.push(Instant::now());
            calls.len() as u32 - 1
        };
        let answer = (self.script)(n);
        let latency = self.latency;
        Box::pin(async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            answer
        })
    }
}

fn reset() -> BoxError {
    io::Error::from(io::ErrorKind::ConnectionReset).into()
}

fn always_reset() -> Scripted {
    Scripted::new(|_| Err(reset()))
}

fn no_jitter(backoff: Backoff) -> Backoff {
    backoff.with_jitter(Jitter::None)
}

async fn call<S>(service: S) -> Result<&'static str, BoxError>
where
    S: Service<&'static str, Response = &'static str, Error = BoxError>,
{
    service.oneshot("req").await
}

#[tokio::test(start_paused = true)]
async fn exact_backoff_sequence_without_jitter() {
    let inner = always_reset();
    let layer = RetryLayer::builder()
        .max_retries(7)
        .backoff(no_jitter(Backoff::exponential(S(1))).with_max_delay(S(60)))
        .no_budget()
        .build()
        .unwrap();
    let start = Instant::now();
    let err = call(layer.layer(inner.clone())).await.unwrap_err();
    // Seed 001: 1, 2, 4, 8, 16, 32, 60 (capped), … seconds.
    assert_eq!(inner.gaps(), [1, 2, 4, 8, 16, 32, 60].map(S));
    assert_eq!(start.elapsed(), S(123));
    // Retries exhausted: the last error comes back as it is.
    assert_eq!(
        err.downcast_ref::<io::Error>().unwrap().kind(),
        io::ErrorKind::ConnectionReset
    );
}

#[tokio::test(start_paused = true)]
async fn linear_and_fixed_sequences() {
    let inner = always_reset();
    let layer = RetryLayer::builder()
        .max_retries(4)
        .backoff(no_jitter(Backoff::linear(MS(100))).with_max_delay(MS(250)))
        .no_budget()
        .build()
        .unwrap();
    call(layer.layer(inner.clone())).await.unwrap_err();
    assert_eq!(inner.gaps(), [100, 200, 250, 250].map(MS));

    let inner = always_reset();
    let layer = RetryLayer::builder()
        .max_retries(2)
        .backoff(no_jitter(Backoff::fixed(MS(700))))
        .no_budget()
        .build()
        .unwrap();
    call(layer.layer(inner.clone())).await.unwrap_err();
    assert_eq!(inner.gaps(), [700, 700].map(MS));
}

/// Every jitter kind, end to end: the sleeps the layer really takes stay in
/// the kind's bounds around the un-jittered delay.
#[tokio::test(start_paused = true)]
async fn jitter_bounds_for_every_kind_on_paused_time() {
    let base = Backoff::exponential(MS(100)).with_max_delay(S(1));
    let unjittered: Vec<Duration> = (1..=8).map(|n| base.delay(n)).collect();
    type Bounds = fn(Duration) -> (Duration, Duration);
    let cases: [(Jitter, Bounds); 5] = [
        (Jitter::None, |d| (d, d)),
        (Jitter::Full, |d| (Duration::ZERO, d)),
        (Jitter::Equal, |d| (d / 2, d)),
        (
            Jitter::Proportional {
                low: 0.5,
                high: 1.5,
            },
            |d| (d / 2, d.mul_f64(1.5)),
        ),
        (
            Jitter::Proportional {
                low: 0.5,
                high: 1.0,
            },
            |d| (d / 2, d),
        ),
    ];
    for (jitter, bounds) in cases {
        for _ in 0..20 {
            let inner = always_reset();
            let layer = RetryLayer::builder()
                .max_retries(8)
                .backoff(base.with_jitter(jitter))
                .no_budget()
                .build()
                .unwrap();
            call(layer.layer(inner.clone())).await.unwrap_err();
            for (gap, d) in inner.gaps().into_iter().zip(&unjittered) {
                let (low, high) = bounds(*d);
                // Paused time resolves timers to the millisecond.
                assert!(
                    low.saturating_sub(MS(1)) <= gap && gap <= high + MS(1),
                    "{jitter}: slept {gap:?} for a delay of {d:?}"
                );
            }
        }
    }
    // Decorrelated: within [initial, 3 × previous], capped.
    for _ in 0..20 {
        let inner = always_reset();
        let layer = RetryLayer::builder()
            .max_retries(8)
            .backoff(base.with_jitter(Jitter::Decorrelated))
            .no_budget()
            .build()
            .unwrap();
        call(layer.layer(inner.clone())).await.unwrap_err();
        let mut previous = MS(100);
        for gap in inner.gaps() {
            assert!(
                gap >= MS(100) && gap <= S(1) + MS(1),
                "decorrelated slept {gap:?}"
            );
            assert!(gap <= previous * 3 + MS(1), "{gap:?} > 3 × {previous:?}");
            previous = gap;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_sleep_that_would_cross_the_deadline_is_not_started() {
    // Attempts take 300 ms; sleeps are 400 ms; the deadline is 2 s.
    // 0–0.3 attempt, 0.7–1.0 attempt, 1.4–1.7 attempt, and a sleep to 2.1
    // would cross the deadline: the last error is returned at 1.7 s.
    let inner = always_reset().latency(MS(300));
    let layer = RetryLayer::builder()
        .max_retries(10)
        .backoff(no_jitter(Backoff::fixed(MS(400))))
        .deadline(S(2))
        .no_budget()
        .build()
        .unwrap();
    let start = Instant::now();
    let err = call(layer.layer(inner.clone())).await.unwrap_err();
    assert_eq!(start.elapsed(), MS(1700));
    assert_eq!(inner.count(), 3);
    assert!(err.is::<io::Error>(), "the last attempt's own error: {err}");
}

#[tokio::test(start_paused = true)]
async fn the_deadline_is_never_crossed() {
    for latency in [0, 90, 250, 600, 1100] {
        for delay in [0, 50, 333, 800] {
            for deadline in [500, 1000, 2500] {
                let inner = always_reset().latency(MS(latency));
                let layer = RetryLayer::builder()
                    .max_retries(16)
                    .backoff(Backoff::exponential(MS(delay)).with_jitter(Jitter::Full))
                    .deadline(MS(deadline))
                    .no_budget()
                    .build()
                    .unwrap();
                let start = Instant::now();
                let result = call(layer.layer(inner.clone())).await;
                let elapsed = start.elapsed();
                assert!(
                    elapsed <= MS(deadline),
                    "latency {latency} delay {delay} deadline {deadline}: took {elapsed:?}"
                );
                let err = result.unwrap_err();
                if latency >= deadline {
                    assert!(err.is::<DeadlineExceeded>(), "{err}");
                }
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_attempt_in_flight_is_cut_at_the_deadline() {
    let inner = always_reset().latency(S(5));
    let layer = RetryLayer::builder()
        .deadline(S(2))
        .no_budget()
        .build()
        .unwrap();
    let start = Instant::now();
    let err = call(layer.layer(inner.clone())).await.unwrap_err();
    assert_eq!(start.elapsed(), S(2));
    let deadline = err.downcast_ref::<DeadlineExceeded>().unwrap();
    assert_eq!(deadline.attempts(), 1);
    assert_eq!(
        err.to_string(),
        "retry deadline of 2s exceeded after 1 attempt"
    );
}

/// Seed 000: `timeout × (max_retries + 1)` in one setting, a
/// configuration's `deadline_from_attempt_timeout`.
#[cfg(feature = "serde")]
#[tokio::test(start_paused = true)]
async fn seed_000_deadline_in_one_call() {
    let hang = Scripted::new(|_| Err(reset())).latency(S(3600));
    let mut config = tower_retry_budget::config::RetryConfig::default();
    config.max_retries = Some(2);
    config.attempt_timeout = Some(S(1));
    config.deadline_from_attempt_timeout = true;
    let layer = config
        .apply(RetryLayer::builder())
        .unwrap()
        .backoff(Backoff::none())
        .no_budget()
        .build()
        .unwrap();
    let start = Instant::now();
    let err = call(layer.layer(hang.clone())).await.unwrap_err();
    assert_eq!(start.elapsed(), S(3));
    assert_eq!(hang.count(), 3, "each timed-out attempt was retried");
    assert!(err.is::<DeadlineExceeded>());
}

#[tokio::test(start_paused = true)]
async fn per_attempt_timeout_is_a_retryable_timeout() {
    // The first attempt hangs for a minute; the second answers at once.
    let calls = Arc::new(AtomicU32::new(0));
    let service = tower::service_fn(move |_: &'static str| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                tokio::time::sleep(S(60)).await;
            }
            Ok::<_, BoxError>("fast")
        }
    });
    let layer = RetryLayer::builder()
        .backoff(no_jitter(Backoff::fixed(MS(100))))
        .attempt_timeout(S(1))
        .no_budget()
        .build()
        .unwrap();
    let start = Instant::now();
    assert_eq!(call(layer.layer(service)).await.unwrap(), "fast");
    assert_eq!(start.elapsed(), MS(1100));

    // When every attempt times out, the caller gets tower's `Elapsed`.
    let hang = always_reset().latency(S(60));
    let layer = RetryLayer::builder()
        .max_retries(1)
        .backoff(Backoff::none())
        .attempt_timeout(S(1))
        .no_budget()
        .build()
        .unwrap();
    let err = call(layer.layer(hang.clone())).await.unwrap_err();
    assert!(err.is::<tower::timeout::error::Elapsed>(), "{err}");
    assert_eq!(hang.count(), 2);
}

fn hinted(kind: FailureKind, hint: RetryHint) -> BoxError {
    Box::new(Classified::new(
        Failure::new(kind).with_hint(hint),
        "hinted",
    ))
}

#[tokio::test(start_paused = true)]
async fn a_hint_replaces_the_backoff_for_that_attempt() {
    let inner = Scripted::new(|n| match n {
        0 => Err(hinted(FailureKind::RateLimited, RetryHint::After(S(7)))),
        1 => Err(reset()),
        _ => Ok("done"),
    });
    let layer = RetryLayer::builder()
        .backoff(no_jitter(Backoff::exponential(MS(100))))
        .no_budget()
        .build()
        .unwrap();
    assert_eq!(call(layer.layer(inner.clone())).await.unwrap(), "done");
    // The hint replaced retry 1's 100 ms; retry 2 uses the sequence's 200 ms.
    assert_eq!(inner.gaps(), [S(7), MS(200)]);
}

#[tokio::test(start_paused = true)]
async fn a_hint_above_max_wait_fails_at_once_naming_the_wait() {
    let inner = Scripted::new(|_| Err(hinted(FailureKind::RateLimited, RetryHint::After(S(7200)))));
    let layer = RetryLayer::builder().no_budget().build().unwrap();
    let start = Instant::now();
    let err = call(layer.layer(inner.clone())).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(inner.count(), 1);
    let too_long = err.downcast_ref::<WaitTooLong>().unwrap();
    assert_eq!(too_long.wait(), S(7200));
    assert_eq!(too_long.reason(), WaitLimit::MaxWait);
    assert_eq!(
        err.to_string(),
        "server asked to wait 2h, longer than max_wait 1h"
    );

    // A smaller max_wait, a smaller hint.
    let inner = Scripted::new(|_| Err(hinted(FailureKind::ServerError, RetryHint::After(S(90)))));
    let layer = RetryLayer::builder()
        .max_wait(S(60))
        .no_budget()
        .build()
        .unwrap();
    let err = call(layer.layer(inner)).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "server asked to wait 90s, longer than max_wait 1m"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hint_past_the_deadline_fails_at_once_naming_the_wait() {
    let inner = Scripted::new(|_| Err(hinted(FailureKind::RateLimited, RetryHint::After(S(30)))));
    let layer = RetryLayer::builder()
        .deadline(S(10))
        .no_budget()
        .build()
        .unwrap();
    let start = Instant::now();
    let err = call(layer.layer(inner)).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO);
    let too_long = err.downcast_ref::<WaitTooLong>().unwrap();
    assert_eq!(too_long.reason(), WaitLimit::Deadline);
    assert_eq!(too_long.wait(), S(30));
    assert!(err.to_string().contains("wait 30s"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn do_not_retry_stops() {
    let inner = Scripted::new(|_| Err(hinted(FailureKind::ServerError, RetryHint::DoNotRetry)));
    let layer = RetryLayer::builder().no_budget().build().unwrap();
    let err = call(layer.layer(inner.clone())).await.unwrap_err();
    assert_eq!(inner.count(), 1);
    assert!(err.is::<Classified>());
}

#[tokio::test(start_paused = true)]
async fn rejected_failures_are_not_retried() {
    let inner = Scripted::new(|_| Err(io::Error::from(io::ErrorKind::InvalidData).into()));
    let layer = RetryLayer::builder().no_budget().build().unwrap();
    call(layer.layer(inner.clone())).await.unwrap_err();
    assert_eq!(inner.count(), 1);
}

/// A breaker's `CircuitOpen` below the retry layer is a `Shed` failure: never
/// retried at once, its hint waited out once if it fits.
#[tokio::test(start_paused = true)]
async fn shed_errors_are_waited_out_once_or_returned() {
    fn open(remaining: Option<Duration>) -> BoxError {
        Box::new(Classified::shed("circuit open", remaining))
    }
    let layer = RetryLayer::builder()
        .max_retries(5)
        .backoff(Backoff::none())
        .deadline(S(10))
        .no_budget()
        .build()
        .unwrap();

    // Opens for 3 s, then answers: one wait of 3 s and up to a quarter more.
    let inner = Scripted::new(|n| {
        if n == 0 {
            Err(open(Some(S(3))))
        } else {
            Ok("closed")
        }
    });
    let start = Instant::now();
    assert_eq!(call(layer.layer(inner.clone())).await.unwrap(), "closed");
    // tokio's timer rounds a deadline up to its next millisecond.
    assert!(
        start.elapsed() >= S(3) && start.elapsed() <= MS(3_751),
        "{:?}",
        start.elapsed()
    );

    // Still open after the wait: returned, not spun on.
    let inner = Scripted::new(|_| Err(open(Some(S(2)))));
    let err = call(layer.layer(inner.clone())).await.unwrap_err();
    assert_eq!(inner.count(), 2);
    assert_eq!(err.to_string(), "circuit open");

    // No hint, or a hint past the deadline: returned at once.
    for remaining in [None, Some(S(30))] {
        let inner = Scripted::new(move |_| Err(open(remaining)));
        let start = Instant::now();
        call(layer.layer(inner.clone())).await.unwrap_err();
        assert_eq!(inner.count(), 1, "{remaining:?}");
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}

/// A refusal whose remaining time is exactly `max_wait` is waited out: the
/// jitter added to a shed wait stays within `max_wait`, and is not taken
/// for a server asking to wait longer than allowed.
#[tokio::test(start_paused = true)]
async fn a_shed_wait_of_exactly_max_wait_is_waited_out() {
    let layer = RetryLayer::builder()
        .max_retries(5)
        .backoff(Backoff::none())
        .deadline(S(10))
        .max_wait(S(1))
        .no_budget()
        .build()
        .unwrap();
    // The jitter is random: enough calls that one without the cap would
    // (almost surely) draw some.
    for _ in 0..20 {
        let inner = Scripted::new(|n| {
            if n == 0 {
                Err(Box::new(Classified::shed("circuit open", Some(S(1)))) as BoxError)
            } else {
                Ok("closed")
            }
        });
        let start = Instant::now();
        assert_eq!(call(layer.layer(inner.clone())).await.unwrap(), "closed");
        assert!(start.elapsed() <= MS(1_001), "{:?}", start.elapsed());
    }
}

/// A retry layer outside another never retries the inner one's give-up: the
/// `DoNotRetry` hint stops the storm from compounding.
#[tokio::test(start_paused = true)]
async fn an_outer_retry_does_not_retry_an_inner_budget_exhaustion() {
    let inner = always_reset();
    let empty = TpsBudget::new(S(1), 0, 0.0).unwrap();
    let inner_layer = RetryLayer::builder()
        .budget(Arc::new(empty))
        .backoff(Backoff::none())
        .build()
        .unwrap();
    let outer_layer = RetryLayer::builder()
        .max_retries(3)
        .backoff(Backoff::none())
        .no_budget()
        .build()
        .unwrap();
    let service = outer_layer.layer(inner_layer.layer(inner.clone()));
    let err = call(service).await.unwrap_err();
    assert!(
        err.is::<tower_retry_budget::error::BudgetExhausted>(),
        "{err}"
    );
    assert_eq!(inner.count(), 1);
}

#[tokio::test(start_paused = true)]
async fn custom_predicates_and_class_sets() {
    let inner = always_reset();
    let layer = RetryLayer::builder()
        .retry_if(|failure| failure.kind == FailureKind::RateLimited)
        .no_budget()
        .build()
        .unwrap();
    call(layer.layer(inner.clone())).await.unwrap_err();
    assert_eq!(
        inner.count(),
        1,
        "connection failures are not in the predicate"
    );

    let inner = always_reset();
    let layer = RetryLayer::builder()
        .retry_on(tower_classify::RetryOn::from_names(["timeout"]).unwrap())
        .no_budget()
        .build()
        .unwrap();
    call(layer.layer(inner.clone())).await.unwrap_err();
    assert_eq!(inner.count(), 1);
}

#[tokio::test(start_paused = true)]
async fn on_retry_sees_every_retry() {
    let events = Arc::new(Mutex::new(Vec::<RetryEvent>::new()));
    let seen = events.clone();
    let inner = Scripted::new(|n| if n < 2 { Err(reset()) } else { Ok("ok") });
    let layer = RetryLayer::builder()
        .backoff(no_jitter(Backoff::exponential(MS(10))))
        .on_retry(move |event| seen.lock().unwrap().push(*event))
        .no_budget()
        .build()
        .unwrap();
    call(layer.layer(inner)).await.unwrap();
    let events = events.lock().unwrap();
    let summary: Vec<_> = events
        .iter()
        .map(|e| (e.attempt, e.failure.kind, e.wait))
        .collect();
    assert_eq!(
        summary,
        [
            (2, FailureKind::Connection, MS(10)),
            (3, FailureKind::Connection, MS(20))
        ]
    );
}

/// Before each retry the clone used for it is driven ready again: the mock
/// refuses to be called without `poll_ready`, and holds the retry until
/// `allow` lets it through.
#[tokio::test]
async fn readiness_is_polled_again_before_each_retry() {
    let (mock, mut handle) = tower_test::mock::pair::<&'static str, &'static str>();
    let layer = RetryLayer::builder()
        .backoff(Backoff::none())
        .no_budget()
        .build()
        .unwrap();
    let mut service = layer.layer(mock);

    handle.allow(1);
    let mut ready = task::spawn(service.ready());
    assert_ready_ok!(ready.poll());
    drop(ready);
    let mut response = task::spawn(service.call("hello"));
    assert_pending!(response.poll());
    let (request, send) = handle.next_request().await.unwrap();
    assert_eq!(request, "hello");
    send.send_error(io::Error::from(io::ErrorKind::ConnectionReset));

    // The retry waits for readiness: no allowance, no second call.
    assert_pending!(response.poll());
    assert!(handle.poll_request().is_pending());

    handle.allow(1);
    assert!(response.is_woken(), "readiness wakes the retry");
    assert_pending!(response.poll());
    let (request, send) = handle.next_request().await.unwrap();
    assert_eq!(request, "hello");
    send.send_response("world");
    assert_eq!(assert_ready_ok!(response.poll()), "world");
}

type Mocked = tower_test::mock::Handle<&'static str, &'static str>;

/// The give-ups reported so far: attempts, why, and how the last failed.
fn gave_up(
    events: &Mutex<Vec<tower_retry_budget::RetryStopped>>,
) -> Vec<(u32, tower_retry_budget::StopReason, FailureKind)> {
    let events = events.lock().unwrap();
    let summary = |event: &tower_retry_budget::RetryStopped| {
        (event.attempts, event.reason, event.failure.kind)
    };
    events.iter().map(summary).collect()
}

/// A call through a retry layer (deadline 1 s, minimum attempt time 200 ms,
/// no backoff) whose first attempt failed at time zero, now waiting for the
/// service to be ready for its retry; and the give-ups reported.
async fn waiting_for_readiness() -> (
    task::Spawn<impl std::future::Future<Output = Result<&'static str, BoxError>>>,
    Mocked,
    Arc<Mutex<Vec<tower_retry_budget::RetryStopped>>>,
) {
    let give_ups = Arc::new(Mutex::new(Vec::new()));
    let (mock, mut handle) = tower_test::mock::pair::<&'static str, &'static str>();
    let layer = RetryLayer::builder()
        .backoff(Backoff::none())
        .deadline(S(1))
        .min_attempt_time(MS(200))
        .no_budget()
        .on_give_up({
            let give_ups = give_ups.clone();
            move |event| give_ups.lock().unwrap().push(*event)
        })
        .build()
        .unwrap();
    let mut service = layer.layer(mock);

    handle.allow(1);
    assert_ready_ok!(task::spawn(service.ready()).poll());
    let mut response = task::spawn(service.call("hello"));
    assert_pending!(response.poll());
    let (_, send) = handle.next_request().await.unwrap();
    send.send_error(io::Error::from(io::ErrorKind::ConnectionReset));
    // Retried at once (no backoff), but the service is not ready.
    assert_pending!(response.poll());
    (response, handle, give_ups)
}

/// Readiness that comes late does not send a retry the deadline no longer
/// leaves the minimum attempt time for: the call ends on its deadline.
#[tokio::test(start_paused = true)]
async fn a_retry_ready_too_late_for_the_minimum_attempt_time_is_not_sent() {
    let (mut response, mut handle, _) = waiting_for_readiness().await;
    tokio::time::advance(MS(950)).await;
    handle.allow(1);
    let error = assert_ready_err!(response.poll());
    assert!(error.is::<DeadlineExceeded>(), "{error}");
    assert!(
        handle.poll_request().is_pending(),
        "no retry sent with 50 ms left"
    );
}

/// A service that stays unready ends the call as soon as no retry could
/// start with the minimum attempt time left, not at the deadline itself;
/// the give-up names how the last attempt failed.
#[tokio::test(start_paused = true)]
async fn a_service_unready_past_the_last_moment_for_a_retry_ends_the_call_then() {
    use tower_retry_budget::StopReason;
    let (mut response, _handle, give_ups) = waiting_for_readiness().await;
    tokio::time::advance(MS(799)).await;
    assert_pending!(response.poll());
    tokio::time::advance(MS(1)).await;
    let error = assert_ready_err!(response.poll());
    assert!(error.is::<DeadlineExceeded>(), "{error}");
    assert_eq!(
        gave_up(&give_ups),
        [(1, StopReason::Deadline, FailureKind::Connection)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_dropped_future_leaves_nothing_running() {
    let inner = always_reset();
    let live_before = Arc::strong_count(&inner.live);
    let layer = RetryLayer::builder()
        .backoff(no_jitter(Backoff::fixed(S(10))))
        .deadline(S(60))
        .no_budget()
        .build()
        .unwrap();
    let mut service = layer.layer(inner.clone());
    let mut response = task::spawn(service.call("req"));
    // The first attempt fails at once; the future is now sleeping 10 s.
    assert_pending!(response.poll());
    assert_eq!(inner.count(), 1);
    assert!(
        Arc::strong_count(&inner.live) > live_before + 1,
        "the future holds a clone"
    );
    drop(response);

    // Everything the future owned (the service clone, the request copy and
    // the boxed `Sleep`, which deregisters its timer on drop) is gone...
    assert_eq!(Arc::strong_count(&inner.live), live_before + 1);
    // ...and nothing calls the service when the sleep would have ended.
    tokio::time::advance(S(120)).await;
    tokio::task::yield_now().await;
    assert_eq!(inner.count(), 1);
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        0,
        "no task was spawned to keep sleeping"
    );
}

#[tokio::test(start_paused = true)]
async fn success_needs_one_attempt_and_no_timer() {
    let inner = Scripted::new(|_| Ok("ok"));
    let layer = RetryLayer::builder().build().unwrap();
    assert_eq!(call(layer.layer(inner.clone())).await.unwrap(), "ok");
    assert_eq!(inner.count(), 1);
}

/// Clones of a layer and of its services share one budget.
#[tokio::test(start_paused = true)]
async fn clones_share_the_budget() {
    let budget = Arc::new(TpsBudget::new(S(10), 0, 0.5).unwrap());
    let layer = RetryLayer::builder()
        .max_retries(1)
        .backoff(Backoff::none())
        .budget(budget.clone())
        .build()
        .unwrap();
    let inner = always_reset();
    let a = layer.clone().layer(inner.clone());
    let b = layer.layer(inner.clone());
    for i in 0..10 {
        let service = if i % 2 == 0 { a.clone() } else { b.clone() };
        call(service).await.unwrap_err();
    }
    // 10 deposits at 50 % allow 5 retries in total, whichever clone asks.
    assert_eq!(inner.count(), 15);
}

/// A service that never becomes ready again cannot hold the call past the
/// deadline.
#[tokio::test(start_paused = true)]
async fn waiting_for_readiness_respects_the_deadline() {
    let (mock, mut handle) = tower_test::mock::pair::<&'static str, &'static str>();
    let layer = RetryLayer::builder()
        .backoff(no_jitter(Backoff::fixed(MS(100))))
        .deadline(S(1))
        .no_budget()
        .build()
        .unwrap();
    let mut service = layer.layer(mock);
    handle.allow(1);
    service.ready().await.unwrap();
    let start = Instant::now();
    let response = tokio::spawn(service.call("hello"));
    let (_, send) = handle.next_request().await.unwrap();
    send.send_error(io::Error::from(io::ErrorKind::ConnectionReset));
    // No further allowance: the retry waits for readiness until the deadline.
    let err = response.await.unwrap().unwrap_err();
    assert_eq!(start.elapsed(), S(1));
    assert!(err.is::<DeadlineExceeded>(), "{err}");
    assert!(handle.poll_request().is_pending());
}

#[test]
fn invalid_builder_settings_name_the_field() {
    let field = |result: Result<_, tower_classify::ConfigError>| {
        result.map(drop).unwrap_err().field().to_owned()
    };
    assert_eq!(
        field(RetryLayer::builder().max_retries(17).build()),
        "max_retries"
    );
    assert_eq!(
        field(
            RetryLayer::builder()
                .backoff(Backoff::exponential(S(1)).with_multiplier(0.9))
                .build()
        ),
        "backoff.multiplier"
    );
    assert_eq!(
        field(RetryLayer::builder().deadline(Duration::ZERO).build()),
        "deadline"
    );
}

/// 16 retries is the limit, and 17 attempts is the same as 16 retries.
#[tokio::test(start_paused = true)]
async fn sixteen_retries_are_allowed_and_seventeen_attempts_mean_sixteen_retries() {
    #[allow(unused_mut)]
    let mut builders = vec![RetryLayer::builder().max_retries(16)];
    // A configuration's `max_attempts: 17`.
    #[cfg(feature = "serde")]
    {
        let mut attempts = tower_retry_budget::config::RetryConfig::default();
        attempts.max_attempts = Some(17);
        builders.push(attempts.apply(RetryLayer::builder()).unwrap());
    }
    for builder in builders {
        let failing = Scripted::new(|_| Err(reset()));
        let layer = builder
            .backoff(Backoff::none())
            .no_budget()
            .build()
            .unwrap();
        call(layer.layer(failing.clone())).await.unwrap_err();
        assert_eq!(failing.count(), 17);
    }
}

// ===== Semantics the peers' suites rely on (tower, Resilience4j, Polly)

fn circuit_open(remaining: Duration) -> BoxError {
    Box::new(Classified::shed("circuit open", Some(remaining)))
}

#[tokio::test(start_paused = true)]
async fn item_9_without_a_deadline_an_open_circuit_is_returned_at_once() {
    let layer = RetryLayer::builder()
        .max_retries(5)
        .no_budget()
        .build()
        .unwrap();
    let inner = Scripted::new(|_| Err(circuit_open(S(30))));
    let start = Instant::now();
    let err = call(layer.layer(inner.clone())).await.unwrap_err();
    assert_eq!(err.to_string(), "circuit open");
    assert_eq!(inner.count(), 1);
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "no sleep through the recovery"
    );
}

#[tokio::test(start_paused = true)]
async fn item_9_an_open_circuit_longer_than_max_delay_is_returned_at_once() {
    let layer = RetryLayer::builder()
        .max_retries(5)
        .backoff(Backoff::exponential(MS(100)).with_max_delay(S(2)))
        .deadline(S(60))
        .no_budget()
        .build()
        .unwrap();
    let inner = Scripted::new(|_| Err(circuit_open(S(3))));
    let start = Instant::now();
    call(layer.layer(inner.clone())).await.unwrap_err();
    assert_eq!(inner.count(), 1);
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn item_9_callers_refused_together_do_not_come_back_together() {
    let layer = RetryLayer::builder()
        .max_retries(1)
        .backoff(Backoff::none())
        .deadline(S(10))
        .no_budget()
        .build()
        .unwrap();
    let mut waits = Vec::new();
    for _ in 0..20 {
        let inner = Scripted::new(|n| {
            if n == 0 {
                Err(circuit_open(S(2)))
            } else {
                Ok("ok")
            }
        });
        let start = Instant::now();
        call(layer.layer(inner)).await.unwrap();
        let waited = start.elapsed();
        // tokio's timer rounds a deadline up to its next millisecond.
        assert!(waited >= S(2) && waited <= MS(2_501), "{waited:?}");
        waits.push(waited);
    }
    waits.sort();
    waits.dedup();
    assert!(waits.len() > 10, "jittered: {waits:?}");
}

#[tokio::test(start_paused = true)]
async fn item_11_deadline_exceeded_keeps_the_failure_before_it() {
    // Attempt 1 is reset; attempt 2 hangs past the deadline.
    let inner = Scripted::new(|n| if n == 0 { Err(reset()) } else { Ok("late") });
    let hanging = tower::service_fn({
        let inner = inner.clone();
        move |req| {
            let mut inner = inner.clone();
            async move {
                let n = inner.count();
                let answer = inner.call(req).await;
                if n > 0 {
                    tokio::time::sleep(S(60)).await;
                }
                answer
            }
        }
    });
    let layer = RetryLayer::builder()
        .backoff(Backoff::none())
        .deadline(S(5))
        .no_budget()
        .build()
        .unwrap();
    let err = call(layer.layer(hanging)).await.unwrap_err();
    let exceeded = err
        .downcast_ref::<DeadlineExceeded>()
        .expect("DeadlineExceeded");
    assert_eq!(exceeded.attempts(), 2);
    assert_eq!(
        exceeded.previous_failure().map(|failure| failure.kind),
        Some(FailureKind::Connection)
    );
    let mut source = std::error::Error::source(exceeded);
    let mut chain = Vec::new();
    while let Some(err) = source {
        chain.push(err.to_string());
        if let Some(io) = err.downcast_ref::<io::Error>() {
            assert_eq!(io.kind(), io::ErrorKind::ConnectionReset);
        }
        source = err.source();
    }
    assert!(
        chain.iter().any(|message| message.contains("reset")),
        "the reset is in the chain: {chain:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn item_7_every_listener_is_called_for_retries_give_ups_and_recoveries() {
    use tower_retry_budget::{RetryStopped, StopReason, SuccessAfterRetries};
    let retries = Arc::new(Mutex::new(Vec::new()));
    let give_ups = Arc::new(Mutex::new(Vec::<RetryStopped>::new()));
    let recovered = Arc::new(Mutex::new(Vec::<SuccessAfterRetries>::new()));
    let layer = RetryLayer::builder()
        .max_retries(2)
        .backoff(Backoff::none())
        .no_budget()
        .on_retry({
            let retries = retries.clone();
            move |event| retries.lock().unwrap().push(("first", event.attempt))
        })
        .on_retry({
            let retries = retries.clone();
            move |event| retries.lock().unwrap().push(("second", event.attempt))
        })
        .on_give_up({
            let give_ups = give_ups.clone();
            move |event| give_ups.lock().unwrap().push(*event)
        })
        .on_success_after_retries({
            let recovered = recovered.clone();
            move |event| recovered.lock().unwrap().push(*event)
        })
        .build()
        .unwrap();

    // Recovers on the second attempt.
    let inner = Scripted::new(|n| if n == 0 { Err(reset()) } else { Ok("ok") });
    call(layer.layer(inner)).await.unwrap();
    assert_eq!(*retries.lock().unwrap(), [("first", 2), ("second", 2)]);
    assert_eq!(recovered.lock().unwrap().len(), 1);
    assert_eq!(recovered.lock().unwrap()[0].attempts, 2);

    // Never recovers: gives up after three attempts.
    call(layer.layer(always_reset())).await.unwrap_err();
    assert_eq!(
        gave_up(&give_ups),
        [(3, StopReason::Attempts, FailureKind::Connection)]
    );
    // A first-attempt success is not a recovery.
    call(layer.layer(Scripted::new(|_| Ok("ok"))))
        .await
        .unwrap();
    assert_eq!(recovered.lock().unwrap().len(), 1);
}

/// A replay that keeps every request and then cannot make the retry, as a
/// streamed body that outgrew its recording during the attempt.
struct FailsAtReplay;

impl tower_retry_budget::replay::Replay<&'static str> for FailsAtReplay {
    type Kept = ();

    fn keep(&self, _: &&'static str) -> Option<()> {
        Some(())
    }

    fn replay(&self, _: &(), _: u32) -> Result<&'static str, BoxError> {
        Err("the body outgrew its recording".into())
    }
}

impl tower_retry_budget::replay::StopReport<&'static str> for FailsAtReplay {}

#[tokio::test(start_paused = true)]
async fn a_retry_that_cannot_be_made_is_a_give_up() {
    use tower_retry_budget::{RetryStopped, StopReason};
    let give_ups = Arc::new(Mutex::new(Vec::<RetryStopped>::new()));
    let layer = RetryLayer::builder()
        .map_replay(|_| FailsAtReplay)
        .backoff(Backoff::none())
        .no_budget()
        .on_give_up({
            let give_ups = give_ups.clone();
            move |event| give_ups.lock().unwrap().push(*event)
        })
        .build()
        .unwrap();
    let inner = always_reset();
    let err = call(layer.layer(inner.clone())).await.unwrap_err();
    assert_eq!(err.to_string(), "the body outgrew its recording");
    assert_eq!(inner.count(), 1);
    assert_eq!(
        gave_up(&give_ups),
        [(1, StopReason::NotReplayable, FailureKind::Connection)]
    );
}

#[tokio::test(start_paused = true)]
async fn item_15_waiting_out_a_refusal_spends_no_budget() {
    // An empty budget (no floor, no share): no retry of a real failure is
    // affordable, yet the attempt after an open circuit's remaining time is,
    // because the refused attempt never reached the dependency.
    let layer = RetryLayer::builder()
        .max_retries(3)
        .backoff(Backoff::none())
        .deadline(S(10))
        .budget(Arc::new(TpsBudget::new(S(1), 0, 0.0).unwrap()))
        .build()
        .unwrap();
    let inner = Scripted::new(|n| {
        if n == 0 {
            Err(circuit_open(S(1)))
        } else {
            Ok("closed")
        }
    });
    assert_eq!(call(layer.layer(inner.clone())).await.unwrap(), "closed");
    assert_eq!(inner.count(), 2);
    let inner = always_reset();
    let err = call(layer.layer(inner.clone())).await.unwrap_err();
    assert!(
        err.is::<tower_retry_budget::error::BudgetExhausted>(),
        "{err}"
    );
    assert_eq!(inner.count(), 1, "a real failure still needs the budget");
}

/// A finished attempt's future goes (with what it holds: a connection, a
/// concurrency permit) before the listeners hear how the call ended, as it
/// does before a retry's sleep.
#[tokio::test]
async fn a_finished_attempt_is_dropped_before_the_listeners_hear_of_it() {
    /// An attempt's future that counts its drop, as a permit would free.
    struct Holding(Option<Result<&'static str, BoxError>>, Arc<AtomicU32>);
    impl std::future::Future for Holding {
        type Output = Result<&'static str, BoxError>;
        fn poll(mut self: std::pin::Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
            Poll::Ready(self.0.take().expect("polled once"))
        }
    }
    impl Drop for Holding {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }
    for succeed_on in [2, u32::MAX] {
        let (calls, dropped) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let heard = Arc::new(Mutex::new(Vec::new()));
        let hear = |heard: &Arc<Mutex<Vec<u32>>>, dropped: &Arc<AtomicU32>| {
            let (heard, dropped) = (heard.clone(), dropped.clone());
            move || heard.lock().unwrap().push(dropped.load(Ordering::SeqCst))
        };
        let (on_give_up, on_recovered) = (hear(&heard, &dropped), hear(&heard, &dropped));
        let layer = RetryLayer::builder()
            .backoff(Backoff::none())
            .max_retries(1)
            .no_budget()
            .on_give_up(move |_| on_give_up())
            .on_success_after_retries(move |_| on_recovered())
            .build()
            .unwrap();
        let service = tower::service_fn({
            let (calls, dropped) = (calls.clone(), dropped.clone());
            move |_: &'static str| {
                let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
                let result = if call == succeed_on {
                    Ok("done")
                } else {
                    Err(io::Error::from(io::ErrorKind::ConnectionReset).into())
                };
                Holding(Some(result), dropped.clone())
            }
        });
        let _ = layer.layer(service).oneshot("hello").await;
        assert_eq!(*heard.lock().unwrap(), [2], "succeed on {succeed_on}");
    }
}
