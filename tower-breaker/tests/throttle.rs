//! Adaptive throttling (`Policy::AdaptiveThrottle`): what counts as an
//! accept, that it refuses as an open circuit does, that it never opens, and
//! that it lets traffic back in as accepts return. The refusal probability
//! itself is checked against the formula in the crate's unit tests.

use std::io;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::FutureExt;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_breaker::Policy;
use tower_breaker::{CallKind, CircuitBreakerLayer, CircuitOpen, State, Window};
use tower_classify::{BoxError, Classified, ErrorChainClassifier, Failure, FailureKind};

/// What the dependency answers, switched while the test runs.
const OK: u8 = 0;
const TRANSIENT: u8 = 1;
const REJECTED: u8 = 2;
const SHED: u8 = 3;

struct Dependency {
    answer: Arc<AtomicU8>,
    reached: Arc<AtomicUsize>,
}

impl Dependency {
    fn new(answer: u8) -> Self {
        Dependency {
            answer: Arc::new(AtomicU8::new(answer)),
            reached: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn service(&self) -> impl Service<u32, Response = (), Error = BoxError, Future: Send> + Clone {
        let answer = Arc::clone(&self.answer);
        let reached = Arc::clone(&self.reached);
        service_fn(move |_: u32| {
            reached.fetch_add(1, Ordering::Relaxed);
            let answer = answer.load(Ordering::Relaxed);
            async move {
                match answer {
                    OK => Ok(()),
                    TRANSIENT => Err(io::Error::from(io::ErrorKind::ConnectionRefused).into()),
                    REJECTED => Err(Classified::new(
                        Failure::new(FailureKind::Rejected),
                        "validation failed",
                    )
                    .into()),
                    _ => Err(Classified::shed("a layer below shed it", None).into()),
                }
            }
        })
    }
}

/// Makes `calls` calls; returns how many the throttle refused.
async fn refusals<S>(svc: &mut S, calls: u32) -> usize
where
    S: Service<u32, Response = (), Error = BoxError> + Clone,
{
    let mut refused = 0;
    for id in 0..calls {
        if let Err(error) = svc.clone().oneshot(id).await {
            if error.is::<CircuitOpen>() {
                refused += 1;
            }
        }
    }
    refused
}

fn throttle(window: u32) -> CircuitBreakerLayer<ErrorChainClassifier> {
    CircuitBreakerLayer::builder()
        .policy(Policy::adaptive_throttle(2.0, Window::count(window)))
        .build(ErrorChainClassifier::new())
        .unwrap()
}

#[tokio::test]
async fn while_the_backend_accepts_nothing_is_refused() {
    fastrand::seed(1);
    let dependency = Dependency::new(OK);
    let mut svc = throttle(20).layer(dependency.service());
    assert_eq!(refusals(&mut svc, 1_000).await, 0);
    assert_eq!(dependency.reached.load(Ordering::Relaxed), 1_000);
}

#[tokio::test]
async fn an_answer_refusing_the_request_is_an_accept() {
    fastrand::seed(2);
    let dependency = Dependency::new(REJECTED);
    let mut svc = throttle(20).layer(dependency.service());
    assert_eq!(
        refusals(&mut svc, 1_000).await,
        0,
        "the backend answered every call, if only to refuse it"
    );
}

#[tokio::test]
async fn transient_failures_are_not_accepts_and_the_throttle_never_opens() {
    fastrand::seed(3);
    let dependency = Dependency::new(TRANSIENT);
    let layer = throttle(20);
    let admin = layer.handle();
    let mut svc = layer.layer(dependency.service());
    let refused = refusals(&mut svc, 1_000).await;
    // Once the window is full of failures, about 20 in 21 calls are
    // refused: the rest is the trickle that would see the backend return.
    assert!((900..1_000).contains(&refused), "{refused}");
    let reached = dependency.reached.load(Ordering::Relaxed);
    assert_eq!(reached, 1_000 - refused);
    assert!(
        reached > 10,
        "a trickle still reaches the backend: {reached}"
    );
    let snapshot = admin.get("default").unwrap();
    assert_eq!(snapshot.state, State::Closed, "a throttle never opens");
    assert_eq!(snapshot.opened, 0);
    assert_eq!(snapshot.rejected, refused as u64);
}

#[tokio::test]
async fn shed_answers_from_below_are_not_accepts() {
    fastrand::seed(4);
    let dependency = Dependency::new(SHED);
    let mut svc = throttle(20).layer(dependency.service());
    assert!(refusals(&mut svc, 1_000).await > 900);
}

#[tokio::test]
async fn a_refusal_is_an_open_circuits_without_a_remaining_time() {
    fastrand::seed(5);
    let calls = Arc::new(Mutex::new(Vec::new()));
    let dependency = Dependency::new(TRANSIENT);
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::adaptive_throttle(2.0, Window::count(10)))
        .on_call({
            let calls = Arc::clone(&calls);
            move |event| calls.lock().unwrap().push(event.kind)
        })
        .build(ErrorChainClassifier::new())
        .unwrap();
    let svc = layer.layer(dependency.service());
    let open = (0..1_000)
        .find_map(|id| {
            match svc
                .clone()
                .oneshot(id)
                .now_or_never()
                .expect("ready at once")
            {
                Err(error) if error.is::<CircuitOpen>() => {
                    Some(*error.downcast::<CircuitOpen>().unwrap())
                }
                _ => None,
            }
        })
        .expect("a window of failures refuses calls");
    assert_eq!(open.remaining(), None);
    let failure = open.failure();
    assert_eq!(failure.kind, FailureKind::Shed);
    assert_eq!(failure.retry_after(), None);
    assert_eq!(
        calls.lock().unwrap().last(),
        Some(&CallKind::Rejected(None)),
        "the same per-call event as an open circuit's refusal"
    );
}

#[tokio::test]
async fn traffic_comes_back_as_the_backend_accepts_again() {
    fastrand::seed(6);
    let dependency = Dependency::new(TRANSIENT);
    let mut svc = throttle(20).layer(dependency.service());
    assert!(refusals(&mut svc, 500).await > 450);
    dependency.answer.store(OK, Ordering::Relaxed);
    // The trickle's accepts fill the window within a few windows' worth of
    // calls; after that, nothing is refused.
    let during = refusals(&mut svc, 200).await;
    assert!(during > 0, "the window still remembered the outage");
    assert_eq!(refusals(&mut svc, 1_000).await, 0);
}

#[cfg(feature = "http")]
#[tokio::test]
async fn over_http_a_refusal_is_the_open_circuits_503() {
    fastrand::seed(7);
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::adaptive_throttle(2.0, Window::count(10)))
        .build(tower_classify::HttpClassifier::new())
        .unwrap()
        .answer(tower_breaker::answer::Http503);
    let svc = layer.layer(service_fn(|_: http::Request<()>| async {
        Ok::<_, BoxError>(
            http::Response::builder()
                .status(503)
                .body(String::new())
                .unwrap(),
        )
    }));
    let mut refusal = None;
    for _ in 0..1_000 {
        let response = svc.clone().oneshot(http::Request::new(())).await.unwrap();
        // The dependency's own 503 has no body; the refusal's is JSON.
        if !response.body().is_empty() {
            refusal = Some(response);
            break;
        }
    }
    let response = refusal.expect("a window of 503s refuses calls");
    assert_eq!(response.status(), 503);
    assert!(
        response.body().contains("CIRCUIT_OPEN"),
        "{}",
        response.body()
    );
    assert!(
        !response.headers().contains_key("retry-after"),
        "a throttle cannot say when to come back"
    );
}
