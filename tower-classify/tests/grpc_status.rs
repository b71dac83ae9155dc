//! Errors answered as gRPC statuses: the mapping, the pushback, and what is
//! left alone.

use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_classify::status::GrpcStatusLayer;
use tower_classify::{BoxError, Classified, Failure, FailureKind, RetryHint};

async fn answer(error: BoxError) -> Response<String> {
    let error = std::sync::Mutex::new(Some(error));
    let failing = service_fn(move |_req: Request<()>| {
        let error = error.lock().unwrap().take().expect("called once");
        async move { Err::<Response<String>, BoxError>(error) }
    });
    let answer: Result<Response<String>, Infallible> = GrpcStatusLayer::new()
        .layer(failing)
        .oneshot(Request::new(()))
        .await;
    answer.unwrap()
}

fn header<'a>(response: &'a Response<String>, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn each_failure_kind_gets_its_status() {
    let cases: Vec<(BoxError, &str)> = vec![
        (Classified::shed("circuit open", None).into(), "14"),
        (
            Classified::new(Failure::new(FailureKind::ServerError), "upstream 503").into(),
            "14",
        ),
        (
            std::io::Error::from(std::io::ErrorKind::ConnectionReset).into(),
            "14",
        ),
        (
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into(),
            "14",
        ),
        (
            Classified::new(Failure::new(FailureKind::RateLimited), "slow down").into(),
            "8",
        ),
        (tower::timeout::error::Elapsed::new().into(), "4"),
        (
            Classified::new(Failure::new(FailureKind::Poison), "bad input").into(),
            "3",
        ),
        (
            Classified::new(Failure::new(FailureKind::Rejected), "no such sku").into(),
            "3",
        ),
        ("something nobody recognises".into(), "2"),
    ];
    for (error, code) in cases {
        let text = error.to_string();
        let response = answer(error).await;
        assert_eq!(response.status(), 200, "{text}");
        assert_eq!(header(&response, "grpc-status"), Some(code), "{text}");
        assert_eq!(header(&response, "content-type"), Some("application/grpc"));
        assert_eq!(response.body(), "", "trailers-only: no body");
    }
}

/// The wait an error tells remote callers is the pushback, in place of the
/// hint (an open circuit early in its period carries none).
#[tokio::test]
async fn the_answer_wait_is_the_pushback() {
    let early = Classified::shed("circuit open", None).with_answer_wait(Duration::from_millis(700));
    let response = answer(early.into()).await;
    assert_eq!(header(&response, "grpc-status"), Some("14"));
    assert_eq!(header(&response, "grpc-retry-pushback-ms"), Some("700"));
}

#[tokio::test]
async fn a_wait_becomes_pushback_and_do_not_retry_becomes_minus_one() {
    let open =
        answer(Classified::shed("circuit open", Some(Duration::from_millis(1500))).into()).await;
    assert_eq!(header(&open, "grpc-retry-pushback-ms"), Some("1500"));

    // An exhausted retry budget: the caller must not retry either.
    let exhausted = Classified::new(
        Failure::new(FailureKind::ServerError).with_hint(RetryHint::DoNotRetry),
        "retry budget exhausted",
    );
    let response = answer(exhausted.into()).await;
    assert_eq!(header(&response, "grpc-status"), Some("14"));
    assert_eq!(header(&response, "grpc-retry-pushback-ms"), Some("-1"));

    // A wait of centuries is capped, not wrapped.
    let forever = answer(Classified::shed("closed for good", Some(Duration::MAX)).into()).await;
    assert_eq!(
        header(&forever, "grpc-retry-pushback-ms"),
        Some(i32::MAX.to_string().as_str())
    );

    // No pushback on a status a client does not retry.
    let rejected = Classified::new(
        Failure::new(FailureKind::Rejected).with_hint(RetryHint::After(Duration::from_secs(1))),
        "no",
    );
    assert_eq!(
        header(&answer(rejected.into()).await, "grpc-retry-pushback-ms"),
        None
    );
    let no_hint = answer(Classified::shed("full", None).into()).await;
    assert_eq!(header(&no_hint, "grpc-retry-pushback-ms"), None);
}

#[tokio::test]
async fn messages_are_encoded_or_left_out() {
    let response = answer("50% off: naïve".into()).await;
    assert_eq!(
        header(&response, "grpc-message"),
        Some("50%25 off: na%C3%AFve")
    );

    let quiet = GrpcStatusLayer::new()
        .without_details()
        .layer(service_fn(|_req: Request<()>| async {
            Err::<Response<String>, BoxError>("db01.internal refused".into())
        }))
        .oneshot(Request::new(()))
        .await
        .unwrap();
    assert_eq!(header(&quiet, "grpc-status"), Some("2"));
    assert_eq!(header(&quiet, "grpc-message"), None);
}

#[tokio::test]
async fn responses_pass_through_unchanged() {
    let ok = service_fn(|_req: Request<()>| async {
        let mut response = Response::new("payload".to_owned());
        response
            .headers_mut()
            .insert("grpc-status", "0".parse().unwrap());
        Ok::<_, BoxError>(response)
    });
    let response = GrpcStatusLayer::new()
        .layer(ok)
        .oneshot(Request::new(()))
        .await
        .unwrap();
    assert_eq!(response.body(), "payload");
    assert_eq!(header(&response, "grpc-status"), Some("0"));
}

/// A service whose readiness failed; calling it anyway would panic.
struct Broken;

impl Service<Request<()>> for Broken {
    type Response = Response<String>;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Response<String>, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Err(Classified::shed("worker gone", None).into()))
    }

    fn call(&mut self, _req: Request<()>) -> Self::Future {
        panic!("called after poll_ready failed")
    }
}

#[tokio::test]
async fn a_readiness_error_is_the_next_calls_status_without_calling_the_service() {
    let response = GrpcStatusLayer::new()
        .layer(Broken)
        .oneshot(Request::new(()))
        .await
        .unwrap();
    assert_eq!(header(&response, "grpc-status"), Some("14"));
    assert_eq!(header(&response, "grpc-message"), Some("worker gone"));
}

/// Issue 14: a service whose `poll_ready` failed is finished. Every later
/// call is answered with that error's status; the inner service is neither
/// called nor polled again.
#[tokio::test]
async fn after_a_readiness_error_the_inner_service_is_not_polled_again() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    struct FailsOnce(Arc<AtomicUsize>);
    impl Service<Request<()>> for FailsOnce {
        type Response = Response<String>;
        type Error = BoxError;
        type Future = std::future::Ready<Result<Response<String>, BoxError>>;
        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            if self.0.fetch_add(1, Ordering::Relaxed) == 0 {
                Poll::Ready(Err(Classified::shed("worker gone", None).into()))
            } else {
                Poll::Ready(Ok(())) // a second poll would hide the failure
            }
        }
        fn call(&mut self, _req: Request<()>) -> Self::Future {
            panic!("called after poll_ready failed")
        }
    }

    let polls = Arc::new(AtomicUsize::new(0));
    let mut service = GrpcStatusLayer::new().layer(FailsOnce(Arc::clone(&polls)));
    for _ in 0..3 {
        let response = service
            .ready()
            .await
            .unwrap()
            .call(Request::new(()))
            .await
            .unwrap();
        assert_eq!(header(&response, "grpc-status"), Some("14"));
        assert_eq!(header(&response, "grpc-message"), Some("worker gone"));
    }
    assert_eq!(polls.load(Ordering::Relaxed), 1, "polled after it failed");
}

/// Stands in for `tonic::Status`: an error that is a gRPC status.
#[derive(Debug)]
struct Status {
    code: i32,
    message: &'static str,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "status: {}, message: {:?}", self.code, self.message)
    }
}

impl std::error::Error for Status {}

/// Wraps an error, as a layer between the status and this one might.
#[derive(Debug)]
struct Wrapped(Status);

impl std::fmt::Display for Wrapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("call failed")
    }
}

impl std::error::Error for Wrapped {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

fn tonic_like(error: &(dyn std::error::Error + 'static)) -> Option<(u32, String)> {
    let status = error.downcast_ref::<Status>()?;
    Some((status.code as u32, status.message.to_owned()))
}

async fn answer_with(layer: GrpcStatusLayer, error: BoxError) -> Response<String> {
    let error = std::sync::Mutex::new(Some(error));
    let failing = service_fn(move |_req: Request<()>| {
        let error = error.lock().unwrap().take().expect("called once");
        async move { Err::<Response<String>, BoxError>(error) }
    });
    layer
        .layer(failing)
        .oneshot(Request::new(()))
        .await
        .unwrap()
}

/// Issue 14: an inner error that already is a gRPC status keeps its code
/// and message through `status_of`, also when wrapped; without the hook it
/// is `UNKNOWN`, and errors the hook does not recognise are classified.
#[tokio::test]
async fn an_error_that_is_a_grpc_status_keeps_it_through_status_of() {
    let not_found = || Status {
        code: 5,
        message: "no such user",
    };
    let layer = GrpcStatusLayer::new().status_of(tonic_like);

    let response = answer_with(layer, Box::new(not_found())).await;
    assert_eq!(header(&response, "grpc-status"), Some("5"));
    assert_eq!(header(&response, "grpc-message"), Some("no such user"));
    assert_eq!(header(&response, "grpc-retry-pushback-ms"), None);

    let response = answer_with(layer, Box::new(Wrapped(not_found()))).await;
    assert_eq!(
        header(&response, "grpc-status"),
        Some("5"),
        "found in the chain"
    );

    let response = answer_with(layer.without_details(), Box::new(not_found())).await;
    assert_eq!(header(&response, "grpc-message"), None);

    let response = answer_with(layer, Classified::shed("circuit open", None).into()).await;
    assert_eq!(header(&response, "grpc-status"), Some("14"), "classified");

    let response = answer_with(GrpcStatusLayer::new(), Box::new(not_found())).await;
    assert_eq!(
        header(&response, "grpc-status"),
        Some("2"),
        "without the hook"
    );
}

/// What the layer sends, a client's `GrpcClassifier` reads back as the same
/// kind of failure: a rejected request stays rejected (it used to go out as
/// `UNKNOWN`, a server error to the client, so bad requests opened the
/// client's breaker), and an error nothing recognises is a server error.
#[tokio::test]
async fn a_client_reads_back_what_the_layer_sent() {
    use tower_classify::{Classify, GrpcClassifier};
    let cases: Vec<(BoxError, FailureKind)> = vec![
        (
            Classified::new(Failure::new(FailureKind::Rejected), "no such sku").into(),
            FailureKind::Rejected,
        ),
        ("a bug nobody foresaw".into(), FailureKind::ServerError),
        (
            Classified::shed("circuit open", None).into(),
            FailureKind::ServerError,
        ),
        (
            tower::timeout::error::Elapsed::new().into(),
            FailureKind::Timeout,
        ),
    ];
    for (error, kind) in cases {
        let text = error.to_string();
        let response = answer(error).await;
        let read = Classify::<_, BoxError>::classify(&GrpcClassifier::new(), Ok(&response));
        let read = read.as_failure().map(|failure| failure.kind);
        assert_eq!(read, Some(kind), "{text}");
    }
}

/// A classifier given to the layer says what an unrecognised error sends:
/// the default sends `UNKNOWN`, a server error `UNAVAILABLE`, ignored
/// `CANCELLED`.
#[tokio::test]
async fn the_layers_classifier_decides_what_an_unrecognised_error_sends() {
    use tower_classify::{ErrorChainClassifier, Outcome};
    let cases = [
        (ErrorChainClassifier::new(), "2"),
        (
            ErrorChainClassifier::new().unknown_as(Outcome::failure(FailureKind::ServerError)),
            "14",
        ),
        (
            ErrorChainClassifier::new().unknown_as(Outcome::Ignored),
            "1",
        ),
    ];
    for (classifier, code) in cases {
        let failing = service_fn(|_req: Request<()>| async {
            Err::<Response<String>, BoxError>("a bug nobody foresaw".into())
        });
        let response = GrpcStatusLayer::new()
            .classifier(classifier)
            .layer(failing)
            .oneshot(Request::new(()))
            .await
            .unwrap();
        assert_eq!(
            header(&response, "grpc-status"),
            Some(code),
            "{classifier:?}"
        );
    }
}

/// An explicit `unknown_as(Rejected)` is a choice, not the default: an
/// error nothing recognises then sends the status a rejected request gets
/// (`INVALID_ARGUMENT`), which a client reads back as rejected, while the
/// default classifier still sends `UNKNOWN`. It used to send `UNKNOWN`
/// too, for the choice was the default's own value.
#[tokio::test]
async fn item_8_an_explicit_unknown_as_rejected_sends_invalid_argument() {
    use tower_classify::{ErrorChainClassifier, Outcome};
    let explicit = ErrorChainClassifier::new().unknown_as(Outcome::failure(FailureKind::Rejected));
    let cases = [
        (ErrorChainClassifier::new(), "2"),
        (ErrorChainClassifier::default(), "2"),
        (explicit, "3"),
    ];
    for (classifier, code) in cases {
        let failing = service_fn(|_req: Request<()>| async {
            Err::<Response<String>, BoxError>("a bug nobody foresaw".into())
        });
        let response = GrpcStatusLayer::new()
            .classifier(classifier)
            .layer(failing)
            .oneshot(Request::new(()))
            .await
            .unwrap();
        assert_eq!(
            header(&response, "grpc-status"),
            Some(code),
            "{classifier:?}"
        );
    }
    // Either way the classifier itself calls such an error rejected.
    let error: BoxError = "a bug nobody foresaw".into();
    for classifier in [ErrorChainClassifier::new(), explicit] {
        assert_eq!(
            classifier.classify_error(&*error),
            Outcome::failure(FailureKind::Rejected)
        );
    }
}
