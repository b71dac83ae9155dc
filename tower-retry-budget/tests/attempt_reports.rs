//! The retry and hedge layers report their attempts to the recording layer
//! (a dead-letter layer) that called them, through
//! `tower_classify::attempts`, and to no other.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tower::{service_fn, Layer, Service};
use tower_classify::attempts::{attempt_finished, attempt_started, AttemptTally, TallyScope};
use tower_classify::BoxError;
use tower_retry_budget::backoff::Backoff;
use tower_retry_budget::RetryLayer;

type Call = Pin<Box<dyn Future<Output = Result<u32, BoxError>> + Send>>;

/// The tally of `started` attempts, `finished` of them ended.
fn attempts(started: u32, finished: u32) -> AttemptTally {
    AttemptTally { started, finished }
}

/// A retry layer over a service whose first `failures` calls are refused.
fn retried(failures: u32) -> impl Service<u32, Response = u32, Error = BoxError, Future = Call> {
    retried_counting(failures, false)
}

/// [`retried`], with a layer under the retry layer that counts the
/// attempts going by when `counting` (as tower-poison's `CountAttempts`
/// does: started when called, finished when answered).
fn retried_counting(
    failures: u32,
    counting: bool,
) -> impl Service<u32, Response = u32, Error = BoxError, Future = Call> {
    let calls = Arc::new(AtomicU32::new(0));
    let inner = service_fn(move |n: u32| {
        if counting {
            attempt_started();
        }
        let call = calls.fetch_add(1, Ordering::Relaxed);
        async move {
            if counting {
                attempt_finished();
            }
            if call < failures {
                Err::<u32, BoxError>(io::Error::from(io::ErrorKind::ConnectionRefused).into())
            } else {
                Ok(n)
            }
        }
    });
    let layer = RetryLayer::builder()
        .max_retries(3)
        .backoff(Backoff::none())
        .build()
        .expect("valid");
    let service = layer.layer(inner);
    tower::util::MapFuture::new(service, |future| Box::pin(future) as Call)
}

/// Calls a retry layer over a service whose first `failures` calls fail,
/// inside the scope `called_in` makes, then polls the call to its end with
/// each poll inside a polling scope, as a dead-letter layer does: the
/// call's result and what the retry layer reported.
fn call_in(
    called_in: fn(AttemptTally) -> TallyScope,
    failures: u32,
) -> (Result<u32, BoxError>, AttemptTally) {
    call_service_in(retried(failures), called_in, AttemptTally::default())
}

/// [`call_in`], for any service, whose call leaves the tally at `at_call`.
fn call_service_in(
    mut service: impl Service<u32, Response = u32, Error = BoxError, Future = Call>,
    called_in: fn(AttemptTally) -> TallyScope,
    at_call: AttemptTally,
) -> (Result<u32, BoxError>, AttemptTally) {
    let scope = called_in(AttemptTally::default());
    let mut call = service.call(7);
    let mut tally = scope.exit();
    assert_eq!(tally, at_call, "reported at call");
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        let scope = TallyScope::enter(tally);
        let polled = call.as_mut().poll(&mut cx);
        tally = scope.exit();
        if let Poll::Ready(result) = polled {
            return (result, tally);
        }
    }
}

#[test]
fn a_retry_called_by_the_recording_layer_reports_every_attempt() {
    let (result, tally) = call_in(TallyScope::calling, 2);
    assert_eq!(result.unwrap(), 7);
    assert_eq!(tally, attempts(3, 2));
}

#[test]
fn with_a_counting_layer_under_the_retry_layer_each_attempt_counts_once() {
    // The counting layer counts an attempt as it is sent; the retry layer's
    // report raises the tally to its own count, never past it.
    let (result, tally) = call_service_in(
        retried_counting(2, true),
        TallyScope::calling,
        attempts(1, 0),
    );
    assert_eq!(result.unwrap(), 7);
    assert_eq!(tally, attempts(3, 3));
}

#[test]
fn a_call_that_succeeds_at_once_reports_nothing() {
    let (result, tally) = call_in(TallyScope::calling, 0);
    assert_eq!(result.unwrap(), 7);
    assert_eq!(tally, AttemptTally::default());
}

#[test]
fn a_retry_called_only_while_the_recorder_polls_reports_nothing() {
    // A client called by a handler under a server's dead-letter layer: its
    // call happens inside the dead-letter layer's poll, not its call, and
    // its attempts are not the dead-letter call's.
    let (result, tally) = call_in(TallyScope::enter, 2);
    assert_eq!(result.unwrap(), 7);
    assert_eq!(tally, AttemptTally::default());
}

/// A hedge layer (`max_attempts` 2) over a service whose attempts fail
/// after the given times.
fn hedged(
    layer: tower_retry_budget::hedge::HedgeLayer,
    fails_after_ms: &'static [u64],
) -> impl Service<u32, Response = u32, Error = BoxError, Future = Call> {
    let calls = Arc::new(AtomicU32::new(0));
    let inner = service_fn(move |_: u32| {
        let call = calls.fetch_add(1, Ordering::Relaxed) as usize;
        async move {
            let after = fails_after_ms[call.min(fails_after_ms.len() - 1)];
            tokio::time::sleep(Duration::from_millis(after)).await;
            Err::<u32, BoxError>(io::Error::from(io::ErrorKind::ConnectionReset).into())
        }
    });
    tower::util::MapFuture::new(layer.layer(inner), |future| Box::pin(future) as Call)
}

/// `call_in` for a call that runs on the tokio runtime's (paused) timers.
async fn call_on_timers(
    mut service: impl Service<u32, Response = u32, Error = BoxError, Future = Call>,
    called_in: fn(AttemptTally) -> TallyScope,
) -> (Result<u32, BoxError>, AttemptTally) {
    let scope = called_in(AttemptTally::default());
    let mut call = service.call(7);
    let mut tally = scope.exit();
    assert_eq!(tally, AttemptTally::default(), "nothing reported at call");
    let result = std::future::poll_fn(|cx| {
        let scope = TallyScope::enter(tally);
        let polled = call.as_mut().poll(cx);
        tally = scope.exit();
        polled
    })
    .await;
    (result, tally)
}

fn hedge_after_10ms() -> tower_retry_budget::hedge::HedgeLayer {
    tower_retry_budget::hedge::HedgeLayer::builder()
        .delay(Duration::from_millis(10))
        .max_attempts(2)
        .no_budget()
        .build()
        .expect("valid")
}

/// A hedge layer whose delay is not known yet: a percentile delay is
/// unknown until the window holds enough samples, and a call is sent alone.
fn hedge_not_yet_known() -> tower_retry_budget::hedge::HedgeLayer {
    tower_retry_budget::hedge::HedgeLayer::builder()
        .percentile(0.9)
        .min_samples(10)
        .no_budget()
        .build()
        .expect("valid")
}

#[tokio::test(start_paused = true)]
async fn a_hedge_called_by_the_recording_layer_reports_every_attempt() {
    // The first attempt fails at 100 ms; the hedge, sent at 10 ms, at 15.
    let service = hedged(hedge_after_10ms(), &[100, 5]);
    let (result, tally) = call_on_timers(service, TallyScope::calling).await;
    assert!(result.is_err());
    assert_eq!(tally, attempts(2, 2));
}

#[tokio::test(start_paused = true)]
async fn an_unhedged_call_that_fails_reports_its_one_attempt() {
    let layer = hedge_not_yet_known();
    let (result, tally) = call_on_timers(hedged(layer, &[5]), TallyScope::calling).await;
    assert!(result.is_err());
    assert_eq!(tally, attempts(1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_hedge_called_only_while_the_recorder_polls_reports_nothing() {
    let service = hedged(hedge_after_10ms(), &[100, 5]);
    let (result, tally) = call_on_timers(service, TallyScope::enter).await;
    assert!(result.is_err());
    assert_eq!(tally, AttemptTally::default());
}

#[tokio::test(start_paused = true)]
async fn under_a_retry_layer_a_hedge_leaves_the_report_to_it() {
    // The retry layer's one attempt (no retries: a budget spent, say) is
    // hedged: two requests are sent, and both fail. The call made one
    // attempt of the retry layer's; the hedge, called by the retry layer
    // after it claimed the call, reports nothing of its own (it would
    // report two, and the tally keeps the larger).
    let retry = RetryLayer::builder().max_retries(0).build().expect("valid");
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let inner = service_fn(move |_: u32| {
        let call = counter.fetch_add(1, Ordering::Relaxed);
        async move {
            let after = if call == 0 { 100 } else { 5 };
            tokio::time::sleep(Duration::from_millis(after)).await;
            Err::<u32, BoxError>(io::Error::from(io::ErrorKind::ConnectionReset).into())
        }
    });
    let stack = retry.layer(hedge_after_10ms().layer(inner));
    let service = tower::util::MapFuture::new(stack, |future| Box::pin(future) as Call);
    let (result, tally) = call_on_timers(service, TallyScope::calling).await;
    assert!(result.is_err());
    assert_eq!(
        calls.load(Ordering::Relaxed),
        2,
        "the attempt and its hedge"
    );
    assert_eq!(tally, attempts(1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_hedged_call_dropped_in_flight_has_reported_both_attempts_sent() {
    // A timeout above the hedge layer ends the call at 50 ms, while both
    // attempts run: both were sent, neither finished.
    let mut service = hedged(hedge_after_10ms(), &[100, 100]);
    let scope = TallyScope::calling(AttemptTally::default());
    let mut call = service.call(7);
    let mut tally = scope.exit();
    let deadline = tokio::time::sleep(Duration::from_millis(50));
    tokio::pin!(deadline);
    std::future::poll_fn(|cx| {
        let scope = TallyScope::enter(tally);
        let polled = call.as_mut().poll(cx);
        tally = scope.exit();
        assert!(polled.is_pending(), "both attempts take 100 ms");
        deadline.as_mut().poll(cx)
    })
    .await;
    drop(call);
    assert_eq!(tally, attempts(2, 0));
}

#[tokio::test(start_paused = true)]
async fn under_a_hedge_layer_the_retries_are_parts_of_its_attempts() {
    // The hedge layer, called first, has the call: its one attempt (no
    // delay known yet: unhedged) ran a retry loop of three attempts below,
    // which reports nothing of its own.
    let hedge = hedge_not_yet_known();
    let retry = RetryLayer::builder()
        .max_retries(2)
        .backoff(Backoff::none())
        .build()
        .expect("valid");
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let inner = service_fn(move |_: u32| {
        counter.fetch_add(1, Ordering::Relaxed);
        async { Err::<u32, BoxError>(io::Error::from(io::ErrorKind::ConnectionReset).into()) }
    });
    let stack = hedge.layer(retry.layer(inner));
    let service = tower::util::MapFuture::new(stack, |future| Box::pin(future) as Call);
    let (result, tally) = call_on_timers(service, TallyScope::calling).await;
    assert!(result.is_err());
    assert_eq!(
        calls.load(Ordering::Relaxed),
        3,
        "the retry loop's attempts"
    );
    assert_eq!(tally, attempts(1, 1));
}
