//! The caller's deadline (`tower_classify::deadline::Deadline` in the
//! request's extensions) bounds the whole loop: no attempt starts without
//! the minimum time left, each attempt is cut at what is left, and
//! `grpc-timeout` carries what is left when the attempt is sent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_classify::deadline::{Deadline, GRPC_TIMEOUT};
use tower_classify::BoxError;
use tower_retry_budget::backoff::{Backoff, Jitter};
use tower_retry_budget::body::ReplayBody;
use tower_retry_budget::error::DeadlineExceeded;
use tower_retry_budget::replay::HttpReplay;
use tower_retry_budget::RetryLayer;

type Body = ReplayBody<Full<Bytes>>;

/// When each attempt arrived, and the `grpc-timeout` it carried.
type Arrivals = Arc<Mutex<Vec<(Duration, Option<Duration>)>>>;

/// An upstream that never answers: every attempt runs into its limit.
fn silent(
    start: Instant,
    arrivals: Arrivals,
) -> impl Service<Request<Body>, Response = Response<()>, Error = BoxError> + Clone {
    tower::service_fn(move |request: Request<Body>| {
        // Read on the paused clock at once: what is left is what was sent.
        let timeout = Deadline::from_header(request.headers(), GRPC_TIMEOUT)
            .map(|deadline| deadline.remaining());
        arrivals.lock().unwrap().push((start.elapsed(), timeout));
        std::future::pending::<Result<Response<()>, BoxError>>()
    })
}

fn layer(min_attempt_time: Duration) -> RetryLayer<tower_classify::HttpClassifier, HttpReplay> {
    RetryLayer::http_builder()
        .map_replay(|_| HttpReplay::new().grpc_timeout(true))
        .max_retries(3)
        .attempt_timeout(Duration::from_millis(100))
        .backoff(Backoff::fixed(Duration::from_millis(10)).with_jitter(Jitter::None))
        .min_attempt_time(min_attempt_time)
        .no_budget()
        .build()
        .unwrap()
}

fn get_within(timeout: Duration) -> Request<Body> {
    let mut request = Request::get("http://upstream/item")
        .body(ReplayBody::new(Full::new(Bytes::new()), 1024))
        .unwrap();
    request.extensions_mut().insert(Deadline::after(timeout));
    request
}

#[tokio::test(start_paused = true)]
async fn the_retry_gets_what_is_left_of_the_callers_deadline_minus_the_backoff() {
    // Finagle's case: 150 ms in all; the first attempt times out at 100 ms,
    // the retry starts after a 10 ms backoff with 40 ms left, and the
    // deadline ends it.
    let start = Instant::now();
    let arrivals = Arrivals::default();
    let service = layer(Duration::from_millis(20)).layer(silent(start, arrivals.clone()));

    let error = service
        .oneshot(get_within(Duration::from_millis(150)))
        .await
        .unwrap_err();

    assert!(error.is::<DeadlineExceeded>(), "{error}");
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(150),
        "the caller's deadline, not 3 × 100 ms"
    );
    let arrivals = arrivals.lock().unwrap().clone();
    assert_eq!(arrivals.len(), 2, "{arrivals:?}");
    let (first_at, first_timeout) = arrivals[0];
    assert_eq!(first_at, Duration::ZERO);
    assert_eq!(first_timeout, Some(Duration::from_millis(150)));
    let (second_at, second_timeout) = arrivals[1];
    // tokio's timer fires on whole milliseconds, rounding a deadline up.
    assert!(
        second_at >= Duration::from_millis(110) && second_at <= Duration::from_millis(112),
        "{second_at:?}"
    );
    let second_timeout = second_timeout.unwrap();
    assert!(
        second_timeout <= Duration::from_millis(150) - second_at,
        "grpc-timeout {second_timeout:?} is what is left or less"
    );
    assert!(
        second_timeout >= Duration::from_millis(37),
        "{second_timeout:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn no_retry_starts_with_less_than_the_minimum_left() {
    // The same call with a 45 ms minimum: 10 ms of backoff + 45 ms does not
    // fit in the 50 ms left, so the retry never starts and the first
    // attempt's timeout is the answer, at 100 ms.
    let start = Instant::now();
    let arrivals = Arrivals::default();
    let service = layer(Duration::from_millis(45)).layer(silent(start, arrivals.clone()));

    let error = service
        .oneshot(get_within(Duration::from_millis(150)))
        .await
        .unwrap_err();

    assert_eq!(arrivals.lock().unwrap().len(), 1, "no second attempt");
    assert!(
        !error.is::<DeadlineExceeded>(),
        "the attempt's own timeout: {error}"
    );
    assert!(
        start.elapsed() >= Duration::from_millis(100)
            && start.elapsed() <= Duration::from_millis(101)
    );
}

#[tokio::test(start_paused = true)]
async fn the_layers_own_deadline_and_the_callers_the_earlier_wins() {
    // Layer deadline 1 s, caller 120 ms: 120 ms. The attempt timeout is
    // cut to what is left: the first attempt ends at 100 ms (its own
    // limit), the second at 120 ms (the deadline).
    let start = Instant::now();
    let arrivals = Arrivals::default();
    let layer = RetryLayer::http_builder()
        .map_replay(|_| HttpReplay::new().grpc_timeout(true))
        .attempt_timeout(Duration::from_millis(100))
        .deadline(Duration::from_secs(1))
        .backoff(Backoff::none())
        .no_budget()
        .build()
        .unwrap();
    let service = layer.layer(silent(start, arrivals.clone()));
    let error = service
        .oneshot(get_within(Duration::from_millis(120)))
        .await
        .unwrap_err();
    let exceeded = error
        .downcast_ref::<DeadlineExceeded>()
        .expect("the deadline ended it");
    assert_eq!(exceeded.deadline(), Duration::from_millis(120));
    assert_eq!(start.elapsed(), Duration::from_millis(120));
    assert_eq!(
        arrivals.lock().unwrap()[0].1,
        Some(Duration::from_millis(120))
    );
}

#[tokio::test(start_paused = true)]
async fn without_a_deadline_no_grpc_timeout_is_written() {
    let start = Instant::now();
    let arrivals = Arrivals::default();
    let service = layer(Duration::ZERO).layer(silent(start, arrivals.clone()));
    let request = Request::get("http://upstream/item")
        .body(ReplayBody::new(Full::new(Bytes::new()), 1024))
        .unwrap();
    let _ = tokio::time::timeout(Duration::from_millis(50), service.oneshot(request)).await;
    assert_eq!(arrivals.lock().unwrap()[0].1, None);
}

#[tokio::test(start_paused = true)]
async fn no_first_attempt_is_sent_past_or_too_close_to_the_deadline() {
    let start = Instant::now();
    let arrivals = Arrivals::default();
    let service = layer(Duration::from_millis(20)).layer(silent(start, arrivals.clone()));

    // Already past: nothing is sent, and the call ends at once.
    let mut request = get_within(Duration::from_millis(10));
    tokio::time::advance(Duration::from_millis(30)).await;
    let error = service.clone().oneshot(request).await.unwrap_err();
    let exceeded = error
        .downcast_ref::<DeadlineExceeded>()
        .expect("DeadlineExceeded");
    assert_eq!(exceeded.attempts(), 0);
    assert!(error.to_string().contains("no attempt was sent"), "{error}");

    // 15 ms left, below the 20 ms minimum: not sent either.
    request = get_within(Duration::from_millis(15));
    let error = service.clone().oneshot(request).await.unwrap_err();
    assert!(error.is::<DeadlineExceeded>());
    assert!(
        arrivals.lock().unwrap().is_empty(),
        "no attempt reached the upstream"
    );

    // 25 ms left: sent, and cut at the deadline.
    let error = service
        .oneshot(get_within(Duration::from_millis(25)))
        .await
        .unwrap_err();
    assert!(error.is::<DeadlineExceeded>());
    assert_eq!(arrivals.lock().unwrap().len(), 1);
}

#[test]
fn a_minimum_attempt_time_at_or_above_the_deadline_is_refused() {
    let error = RetryLayer::builder()
        .deadline(Duration::from_millis(30))
        .min_attempt_time(Duration::from_millis(30))
        .build()
        .unwrap_err();
    assert_eq!(error.field(), "min_attempt_time");
    assert!(RetryLayer::builder()
        .deadline(Duration::from_millis(31))
        .min_attempt_time(Duration::from_millis(30))
        .build()
        .is_ok());
}

/// A call that sends nothing holds nothing `poll_ready` reserved: the
/// layer keeps the service it made ready (here a concurrency limit of one,
/// holding its one permit), and the next call needs no other permit, even
/// while the unsent call's future is still alive.
#[tokio::test(start_paused = true)]
async fn a_call_past_its_deadline_leaves_the_ready_service_ready() {
    let start = Instant::now();
    let arrivals = Arrivals::default();
    let limited = tower::limit::ConcurrencyLimit::new(silent(start, arrivals.clone()), 1);
    let mut service = layer(Duration::from_millis(20)).layer(limited);

    let request = get_within(Duration::from_millis(10));
    tokio::time::advance(Duration::from_millis(30)).await;
    service.ready().await.unwrap();
    let unsent = service.call(request);

    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(
        service.poll_ready(&mut cx).is_ready(),
        "the permit stayed with the layer's service"
    );
    let error = unsent.await.unwrap_err();
    assert!(error.is::<DeadlineExceeded>(), "{error}");
    assert!(arrivals.lock().unwrap().is_empty());
}

/// A `grpc-timeout` the caller set (tonic's `set_timeout`) is part of the
/// loop's deadline: the header each attempt carries is what is left of it,
/// never the longer deadline of the caller's `Deadline`, which used to
/// overwrite it.
#[tokio::test(start_paused = true)]
async fn a_grpc_timeout_the_caller_set_is_never_lengthened() {
    let start = Instant::now();
    let arrivals = Arrivals::default();
    let service = layer(Duration::from_millis(20)).layer(silent(start, arrivals.clone()));
    let mut request = get_within(Duration::from_secs(10));
    request
        .headers_mut()
        .insert("grpc-timeout", http::HeaderValue::from_static("150m"));
    let error = service.oneshot(request).await.unwrap_err();
    assert!(error.is::<DeadlineExceeded>(), "{error}");
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(150),
        "the header's 150 ms"
    );
    let timeouts: Vec<_> = arrivals.lock().unwrap().iter().map(|(_, t)| *t).collect();
    assert_eq!(
        timeouts,
        [
            Some(Duration::from_millis(150)),
            Some(Duration::from_millis(40))
        ]
    );
}
