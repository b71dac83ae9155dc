//! gRPC through the `HttpError` answer and a `GrpcClassifier`: a gRPC status
//! that arrives in the trailers is recorded where the body ends.
#![cfg(feature = "http")]

use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::{HeaderMap, Request, Response};
use http_body::Body as _;
use http_body_util::channel::{Channel, Sender};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use tower::util::BoxService;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_breaker::answer::HttpError;
use tower_breaker::Policy;
use tower_breaker::{BreakerHandle, CircuitBreakerLayer, CircuitOpen, OpenCall, State};
use tower_classify::{BoxError, GrpcClassifier, SettleBody};

type TestBody = UnsyncBoxBody<Bytes, BoxError>;
/// The response body of a gRPC breaker.
type GrpcBody<B> = SettleBody<B, OpenCall<GrpcClassifier>>;
type Svc = BoxService<Request<Response<TestBody>>, Response<GrpcBody<TestBody>>, BoxError>;

/// A breaker around a service that answers each request with the response it
/// carries, so each test decides every answer.
fn breaker(builder: tower_breaker::Builder) -> (Svc, BreakerHandle) {
    let layer = builder
        .build(GrpcClassifier::new())
        .unwrap()
        .answer(HttpError);
    let handle = layer.handle();
    let echo =
        service_fn(
            |req: Request<Response<TestBody>>| async move { Ok::<_, BoxError>(req.into_body()) },
        );
    (BoxService::new(layer.layer(echo)), handle)
}

fn threshold(n: u32) -> tower_breaker::Builder {
    CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(n))
        .recovery_timeout(Duration::from_secs(10))
}

async fn call(
    svc: &mut Svc,
    answer: Response<TestBody>,
) -> Result<Response<GrpcBody<TestBody>>, BoxError> {
    svc.ready().await?.call(Request::new(answer)).await
}

fn status(code: &str) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", code.parse().unwrap());
    trailers
}

fn grpc_head() -> http::response::Builder {
    Response::builder().header("content-type", "application/grpc")
}

/// `200`, one message, then trailers `grpc-status: code`.
fn in_trailers(code: &str) -> Response<TestBody> {
    let trailers = status(code);
    let body = Full::new(Bytes::from_static(b"\0\0\0\0\0"))
        .map_err(BoxError::from)
        .with_trailers(async move { Some(Ok(trailers)) })
        .boxed_unsync();
    grpc_head().body(body).unwrap()
}

/// A `200` gRPC head whose body the test streams through the returned sender.
fn streamed() -> (Sender<Bytes, BoxError>, Response<TestBody>) {
    let (tx, body) = Channel::<Bytes, BoxError>::new(1);
    (tx, grpc_head().body(body.boxed_unsync()).unwrap())
}

/// Reads a body to its end; its trailers, if any.
async fn read_to_end(response: Response<GrpcBody<TestBody>>) -> Option<HeaderMap> {
    let collected = response.into_body().collect().await.unwrap();
    collected.trailers().cloned()
}

fn snapshot(handle: &BreakerHandle) -> tower_breaker::BreakerSnapshot {
    handle.list().remove(0)
}

#[tokio::test(start_paused = true)]
async fn failures_that_arrive_only_in_trailers_open_the_breaker() {
    let (mut svc, handle) = breaker(threshold(3));
    let mut responses = Vec::new();
    for _ in 0..3 {
        let response = call(&mut svc, in_trailers("14")).await.unwrap();
        assert_eq!(response.status(), 200);
        assert!(response.body().awaits_end());
        responses.push(response);
    }
    // Three `200` heads: nothing is known until the trailers.
    assert_eq!(snapshot(&handle).state, State::Closed);
    assert_eq!(snapshot(&handle).consecutive_failures, 0);

    for response in responses {
        assert_eq!(read_to_end(response).await, Some(status("14")));
    }
    assert_eq!(snapshot(&handle).state, State::Open);
    let err = call(&mut svc, in_trailers("0")).await.unwrap_err();
    assert!(err.is::<CircuitOpen>(), "{err}");
}

#[tokio::test(start_paused = true)]
async fn ok_trailers_count_as_successes() {
    let (mut svc, handle) = breaker(threshold(2));
    // Two failures in a row would open it; the successes between them reset
    // the count.
    for code in ["14", "0", "14", "0", "14"] {
        let response = call(&mut svc, in_trailers(code)).await.unwrap();
        read_to_end(response).await;
    }
    let snap = snapshot(&handle);
    assert_eq!(snap.state, State::Closed);
    assert_eq!(snap.consecutive_failures, 1);
    assert_eq!(snap.failures, 3);
}

#[tokio::test(start_paused = true)]
async fn a_half_open_probe_is_judged_by_its_trailers() {
    let (mut svc, handle) = breaker(threshold(1));
    read_to_end(call(&mut svc, in_trailers("14")).await.unwrap()).await;
    assert_eq!(snapshot(&handle).state, State::Open);

    for (code, after) in [("14", State::Open), ("0", State::Closed)] {
        tokio::time::advance(Duration::from_secs(10)).await;
        let probe = call(&mut svc, in_trailers(code)).await.unwrap();
        // The probe's head is in; its slot stays taken while the body streams.
        let snap = snapshot(&handle);
        assert_eq!(snap.state, State::HalfOpen);
        assert_eq!(snap.probes_in_flight, 1);
        let err = call(&mut svc, in_trailers("0")).await.unwrap_err();
        assert!(err.is::<CircuitOpen>(), "only one probe: {err}");

        read_to_end(probe).await;
        assert_eq!(
            snapshot(&handle).state,
            after,
            "probe with grpc-status {code}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_body_dropped_mid_stream_records_nothing() {
    let (mut svc, handle) = breaker(threshold(1));

    // Closed: a call cancelled after its first message counts neither way.
    let (mut tx, answer) = streamed();
    let mut response = call(&mut svc, answer).await.unwrap();
    tx.send_data(Bytes::from_static(b"first")).await.unwrap();
    let frame = response.body_mut().frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "first");
    drop(response);
    let snap = snapshot(&handle);
    assert_eq!(snap.state, State::Closed);
    assert_eq!(snap.failures, 0);

    // Half-open: a dropped probe gives its slot back, unjudged.
    read_to_end(call(&mut svc, in_trailers("14")).await.unwrap()).await;
    tokio::time::advance(Duration::from_secs(10)).await;
    let (mut tx, answer) = streamed();
    let mut probe = call(&mut svc, answer).await.unwrap();
    tx.send_data(Bytes::from_static(b"first")).await.unwrap();
    probe.body_mut().frame().await.unwrap().unwrap();
    drop(probe);
    let snap = snapshot(&handle);
    assert_eq!(snap.state, State::HalfOpen);
    assert_eq!(snap.probes_in_flight, 0);
    assert_eq!(snap.failures, 1);

    // The slot is free for the next probe, which closes it.
    read_to_end(call(&mut svc, in_trailers("0")).await.unwrap()).await;
    assert_eq!(snapshot(&handle).state, State::Closed);
}

/// A caller that takes the inner body out (`SettleBody::into_inner`)
/// before its end settles the call as dropped: a half-open probe gives its
/// slot back, unjudged.
#[tokio::test(start_paused = true)]
async fn a_probe_whose_body_is_taken_out_gives_its_slot_back() {
    let (mut svc, handle) = breaker(threshold(1));
    read_to_end(call(&mut svc, in_trailers("14")).await.unwrap()).await;
    tokio::time::advance(Duration::from_secs(10)).await;
    let (_tx, answer) = streamed();
    let probe = call(&mut svc, answer).await.unwrap();
    assert_eq!(snapshot(&handle).probes_in_flight, 1);
    let inner = probe.into_body().into_inner();
    let snap = snapshot(&handle);
    assert_eq!(snap.state, State::HalfOpen);
    assert_eq!(snap.probes_in_flight, 0);
    assert_eq!(snap.failures, 1);
    drop(inner);

    read_to_end(call(&mut svc, in_trailers("0")).await.unwrap()).await;
    assert_eq!(snapshot(&handle).state, State::Closed);
}

#[tokio::test(start_paused = true)]
async fn frames_pass_through_as_they_arrive() {
    let (mut svc, handle) = breaker(threshold(1));
    let (mut tx, answer) = streamed();
    let response = call(&mut svc, answer).await.unwrap();
    let mut body = response.into_body();

    tx.send_data(Bytes::from_static(b"one")).await.unwrap();
    let first = body
        .frame()
        .now_or_never()
        .expect("the first frame passed on at once");
    let first = first.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "one");
    // Nothing more was sent: the reader waits, nothing is read ahead.
    assert!(body.frame().now_or_never().is_none());

    tx.send_data(Bytes::from_static(b"two")).await.unwrap();
    let second = body.frame().now_or_never().expect("the second frame too");
    let second = second.unwrap().unwrap();
    assert_eq!(second.into_data().unwrap(), "two");
    assert_eq!(snapshot(&handle).state, State::Closed, "no status yet");

    tx.send_trailers(status("14")).await.unwrap();
    let trailers = body.frame().await.unwrap().unwrap();
    assert_eq!(trailers.into_trailers().unwrap(), status("14"));
    // Recorded as the trailers passed, before the reader saw the end.
    assert_eq!(snapshot(&handle).state, State::Open);
    assert!(!body.awaits_end());
    drop(tx);
    assert!(body.frame().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_grpc_body_that_ends_without_a_status_is_a_failure() {
    let (mut svc, handle) = breaker(threshold(1));
    let body = Full::new(Bytes::from_static(b"12345"))
        .map_err(BoxError::from)
        .boxed_unsync();
    let mut response = call(&mut svc, grpc_head().body(body).unwrap())
        .await
        .unwrap();
    let body = response.body_mut();
    // The inner body's hint: five bytes.
    assert_eq!(body.size_hint().exact(), Some(5));
    assert!(!body.is_end_stream());

    body.frame().await.unwrap().unwrap();
    // The inner body says it is over: recorded now, as a reader may stop here.
    assert!(body.is_end_stream());
    assert_eq!(body.size_hint().exact(), Some(0));
    assert_eq!(snapshot(&handle).state, State::Open);
}

#[tokio::test(start_paused = true)]
async fn a_body_error_is_a_failure() {
    let (mut svc, handle) = breaker(threshold(1));
    let (mut tx, answer) = streamed();
    let mut response = call(&mut svc, answer).await.unwrap();
    tx.send_data(Bytes::from_static(b"first")).await.unwrap();
    response.body_mut().frame().await.unwrap().unwrap();
    tx.abort("stream reset".into());
    let err = response.body_mut().frame().await.unwrap().unwrap_err();
    assert_eq!(err.to_string(), "stream reset");
    assert_eq!(snapshot(&handle).state, State::Open);
}

#[tokio::test(start_paused = true)]
async fn the_head_decides_trailers_only_and_non_grpc_responses() {
    let empty = || Empty::<Bytes>::new().map_err(BoxError::from).boxed_unsync();
    let text = || {
        Full::new(Bytes::from_static(b"hello"))
            .map_err(BoxError::from)
            .boxed_unsync()
    };
    let (mut svc, handle) = breaker(threshold(1));

    // Trailers-only: `grpc-status` in the head decides at once.
    let trailers_only = |code| grpc_head().header("grpc-status", code).body(empty());
    let response = call(&mut svc, trailers_only("0").unwrap()).await.unwrap();
    assert!(!response.body().awaits_end());
    let response = call(&mut svc, trailers_only("14").unwrap()).await.unwrap();
    assert!(!response.body().awaits_end());
    assert_eq!(
        snapshot(&handle).state,
        State::Open,
        "before the body is read"
    );
    handle.reset_all();

    // Not gRPC: a 200 ending without trailers is a success, a 503 a failure.
    let plain = Response::builder().header("content-type", "text/plain");
    let response = call(&mut svc, plain.body(text()).unwrap()).await.unwrap();
    assert!(!response.body().awaits_end());
    assert_eq!(read_to_end(response).await, None);
    assert_eq!(snapshot(&handle).state, State::Closed);
    let unavailable = Response::builder().status(503).body(text()).unwrap();
    call(&mut svc, unavailable).await.unwrap();
    assert_eq!(snapshot(&handle).state, State::Open);
    handle.reset_all();

    // A gRPC `200` whose body is over before it began has no status to wait for.
    call(&mut svc, grpc_head().body(empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(snapshot(&handle).state, State::Open);
    handle.reset_all();

    // Any `application/grpc…` content type waits for its trailers.
    let proto = Response::builder()
        .header("content-type", "application/grpc+proto")
        .body(text())
        .unwrap();
    let response = call(&mut svc, proto).await.unwrap();
    assert!(response.body().awaits_end());
}

#[tokio::test(start_paused = true)]
async fn a_slow_call_is_timed_to_its_head_not_to_its_trailers() {
    let builder = threshold(1).slow_call_threshold(Duration::from_secs(1));

    // A long stream whose head came at once is not slow.
    let (mut svc, handle) = breaker(builder.clone());
    let (mut tx, answer) = streamed();
    let response = call(&mut svc, answer).await.unwrap();
    tokio::time::advance(Duration::from_secs(30)).await;
    tx.send_trailers(status("0")).await.unwrap();
    drop(tx);
    read_to_end(response).await;
    assert_eq!(snapshot(&handle).state, State::Closed);

    // A head that took 2 s is, even with `grpc-status: 0`.
    let layer = builder
        .build(GrpcClassifier::new())
        .unwrap()
        .answer(HttpError);
    let handle = layer.handle();
    let slow = layer.layer(service_fn(|_: Request<()>| async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok::<_, BoxError>(in_trailers("0"))
    }));
    let response = slow.oneshot(Request::new(())).await.unwrap();
    assert_eq!(snapshot(&handle).state, State::Closed, "success so far");
    read_to_end(response).await;
    assert_eq!(snapshot(&handle).state, State::Open);
}

/// The body and the future are `Send + Sync` where the inner ones are, as
/// `BodyExt::boxed` and `reqwest::Body::wrap` ask of a body; the body is
/// `Unpin` too.
#[test]
fn the_body_and_the_future_are_send_and_sync_where_the_inner_ones_are() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<GrpcBody<Full<Bytes>>>();
    send_sync::<
        tower_breaker::future::ResponseFuture<std::future::Ready<()>, GrpcClassifier, HttpError>,
    >();
    fn unpin<T: Unpin>() {}
    unpin::<GrpcBody<Full<Bytes>>>();
}

/// Issue 31, item 5: a gRPC breaker's `CircuitOpen` carries the refused
/// request's `RefusalToken`, and none when the request had none.
#[tokio::test(start_paused = true)]
async fn item_5_a_circuit_open_error_carries_the_refused_requests_token() {
    use tower_classify::{ErrorChainClassifier, RefusalToken};

    let (mut svc, handle) = breaker(threshold(1));
    assert!(handle.force_open("default"));
    let token = RefusalToken::issue();
    let mut request = Request::new(in_trailers("0"));
    request.extensions_mut().insert(token);
    let error = svc.ready().await.unwrap().call(request).await.unwrap_err();
    let open = error.downcast_ref::<CircuitOpen>().expect("a CircuitOpen");
    assert_eq!(open.failure().refusal, Some(token));
    let outcome = ErrorChainClassifier::new().classify_error(&*error);
    assert_eq!(outcome.as_failure().unwrap().refusal, Some(token));

    let error = call(&mut svc, in_trailers("0")).await.unwrap_err();
    let open = error.downcast_ref::<CircuitOpen>().expect("a CircuitOpen");
    assert_eq!(open.failure().refusal, None);
}

/// The classifier the user passed judges the end of the body, not a
/// `GrpcClassifier` of the breaker's own: one that calls every failure a
/// success never opens the breaker, however the trailers read.
#[tokio::test(start_paused = true)]
async fn the_users_classifier_judges_the_trailers() {
    use tower_classify::{ClassifyExt, Outcome};

    let lenient = GrpcClassifier::new().map(|outcome| match outcome {
        Outcome::Failure(_) => Outcome::Success,
        outcome => outcome,
    });
    let layer = threshold(1).build(lenient).unwrap().answer(HttpError);
    let handle = layer.handle();
    let svc = layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, BoxError>(in_trailers("14"))
    }));
    for _ in 0..3 {
        let response = svc.clone().oneshot(Request::new(())).await.unwrap();
        assert!(response.body().awaits_end(), "the head leaves it open");
        assert_eq!(
            response.into_body().collect().await.unwrap().trailers(),
            Some(&status("14"))
        );
    }
    let snap = snapshot(&handle);
    assert_eq!(snap.state, State::Closed);
    assert_eq!(snap.failures, 0);
}

/// A classifier that counts a body its caller dropped mid-stream as a
/// timeout: the breaker records what it says, where by default a drop
/// records nothing.
#[derive(Clone)]
struct DropIsATimeout(GrpcClassifier);

impl<B: 'static> tower_classify::Classify<Response<B>, BoxError> for DropIsATimeout {
    fn classify(&self, result: Result<&Response<B>, &BoxError>) -> tower_classify::Outcome {
        self.0.classify(result)
    }

    fn classify_head(
        &self,
        result: Result<&Response<B>, &BoxError>,
    ) -> Option<tower_classify::Outcome> {
        self.0.classify_head(result)
    }

    fn classify_end(&self, end: tower_classify::StreamEnd<'_>) -> tower_classify::Outcome {
        use tower_classify::{FailureKind, Outcome, StreamEnd};
        match end {
            StreamEnd::Dropped => Outcome::failure(FailureKind::Timeout),
            end => tower_classify::Classify::<Response<B>, BoxError>::classify_end(&self.0, end),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_drop_the_classifier_calls_a_failure_is_recorded() {
    let layer = threshold(1)
        .build(DropIsATimeout(GrpcClassifier::new()))
        .unwrap()
        .answer(HttpError);
    let handle = layer.handle();
    let mut svc = BoxService::new(layer.layer(service_fn(
        |req: Request<Response<TestBody>>| async move { Ok::<_, BoxError>(req.into_body()) },
    )));
    let (mut tx, answer) = streamed();
    let mut response = svc
        .ready()
        .await
        .unwrap()
        .call(Request::new(answer))
        .await
        .unwrap();
    tx.send_data(Bytes::from_static(b"first")).await.unwrap();
    response.body_mut().frame().await.unwrap().unwrap();
    assert_eq!(snapshot(&handle).state, State::Closed);
    drop(response);
    let snap = snapshot(&handle);
    assert_eq!(snap.state, State::Open);
    assert_eq!(snap.failures, 1);
}
