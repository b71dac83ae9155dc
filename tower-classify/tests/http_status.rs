//! Errors answered as HTTP problem responses: the mapping (the gRPC one,
//! read as HTTP statuses), `Retry-After`, the classification carried along,
//! and the two calls a handler makes itself.

use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_classify::status::{not_run, HttpStatusLayer, Problem};
use tower_classify::{
    BoxError, Classified, ErrorChainClassifier, Failure, FailureKind, Outcome, RefusalToken,
    RetryHint,
};

async fn answer_with(layer: HttpStatusLayer, error: BoxError) -> Response<String> {
    let error = std::sync::Mutex::new(Some(error));
    let failing = service_fn(move |_req: Request<()>| {
        let error = error.lock().unwrap().take().expect("called once");
        async move { Err::<Response<String>, BoxError>(error) }
    });
    let answer: Result<Response<String>, Infallible> =
        layer.layer(failing).oneshot(Request::new(())).await;
    answer.unwrap()
}

async fn answer(error: BoxError) -> Response<String> {
    answer_with(HttpStatusLayer::new(), error).await
}

fn failure(kind: FailureKind) -> Failure {
    Failure::new(kind)
}

/// Item 3: each kind gets the status of its gRPC code, and the response is
/// problem+json carrying the classification for the layers around it.
#[tokio::test]
async fn first_hour_3_each_failure_kind_gets_its_http_status() {
    let cases: Vec<(BoxError, u16)> = vec![
        (Classified::shed("circuit open", None).into(), 503),
        (
            Classified::new(failure(FailureKind::ServerError), "upstream 503").into(),
            503,
        ),
        (
            std::io::Error::from(std::io::ErrorKind::ConnectionReset).into(),
            503,
        ),
        (
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into(),
            503,
        ),
        (
            Classified::new(failure(FailureKind::RateLimited), "slow down").into(),
            429,
        ),
        (tower::timeout::error::Elapsed::new().into(), 504),
        (
            Classified::new(failure(FailureKind::Poison), "bad input").into(),
            400,
        ),
        (
            Classified::new(failure(FailureKind::Rejected), "no such sku").into(),
            400,
        ),
        ("something nobody recognises".into(), 500),
    ];
    for (error, status) in cases {
        let text = error.to_string();
        let response = answer(error).await;
        assert_eq!(response.status(), status, "{text}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        let body: serde_json::Value = serde_json::from_str(response.body()).unwrap();
        assert_eq!(body["status"], status, "{text}");
        assert_eq!(body["detail"], text.as_str());
        // An unrecognised error is left to be read by its 500.
        assert_eq!(
            response.extensions().get::<Failure>().is_some(),
            status != 500,
            "{text}"
        );
    }
}

#[tokio::test]
async fn a_wait_is_sent_as_retry_after_where_the_status_invites_a_retry() {
    let shed =
        answer(Classified::shed("circuit open", Some(Duration::from_millis(2100))).into()).await;
    assert_eq!(shed.headers()["retry-after"], "3", "rounded up");
    let failure = shed.extensions().get::<Failure>().unwrap();
    assert_eq!(failure.kind, FailureKind::Shed);
    assert_eq!(failure.retry_after(), Some(Duration::from_millis(2100)));

    let throttled =
        Failure::new(FailureKind::RateLimited).with_hint(RetryHint::After(Duration::from_secs(5)));
    let response = answer(Classified::new(throttled, "slow down").into()).await;
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "5");

    // Retrying stopped (a spent budget): no wait is offered.
    let given_up = Failure::new(FailureKind::ServerError).with_hint(RetryHint::DoNotRetry);
    let response = answer(Classified::new(given_up, "budget exhausted").into()).await;
    assert_eq!(response.status(), 503);
    assert!(!response.headers().contains_key("retry-after"));

    // A wait on a status that invites no retry is not sent.
    let rejected =
        Failure::new(FailureKind::Rejected).with_hint(RetryHint::After(Duration::from_secs(5)));
    let response = answer(Classified::new(rejected, "no").into()).await;
    assert!(!response.headers().contains_key("retry-after"));
}

#[tokio::test]
async fn the_classifier_and_details_are_the_layers_to_choose() {
    let layer = HttpStatusLayer::new()
        .classifier(
            ErrorChainClassifier::new().unknown_as(Outcome::failure(FailureKind::ServerError)),
        )
        .without_details();
    let response = answer_with(layer, "db at 10.0.0.7 is down".into()).await;
    assert_eq!(response.status(), 503);
    assert!(!response.body().contains("10.0.0.7"), "{}", response.body());
    assert_eq!(
        response.extensions().get::<Failure>().map(|f| f.kind),
        Some(FailureKind::ServerError)
    );
}

/// The two outcomes that are not failures: ignored is 499 "client closed
/// request", a success an error cannot be and is answered as `UNKNOWN`'s 500;
/// neither carries a failure.
#[tokio::test]
async fn an_error_made_ignored_or_a_success_answers_499_or_500() {
    for (outcome, status) in [(Outcome::Ignored, 499), (Outcome::Success, 500)] {
        let classifier = ErrorChainClassifier::new().unknown_as(outcome);
        let layer = HttpStatusLayer::new().classifier(classifier);
        let response = answer_with(layer, "gone".into()).await;
        assert_eq!(response.status(), status, "{outcome:?}");
        assert!(response.extensions().get::<Failure>().is_none());
    }
}

#[tokio::test]
async fn a_refusal_keeps_the_token_it_carries() {
    let token = RefusalToken::issue();
    let refused = Failure::new(FailureKind::Shed).with_refusal(Some(token));
    let response = answer(Classified::new(refused, "circuit open").into()).await;
    assert_eq!(
        response.extensions().get::<Failure>().unwrap().refusal,
        Some(token)
    );
}

/// After `poll_ready` fails, the inner service is left alone and every call
/// gets that error's answer.
#[tokio::test]
async fn a_failed_readiness_answers_every_call() {
    #[derive(Clone)]
    struct NeverReady;
    impl Service<Request<()>> for NeverReady {
        type Response = Response<String>;
        type Error = BoxError;
        type Future = std::future::Ready<Result<Response<String>, BoxError>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Err(Classified::shed(
                "overloaded",
                Some(Duration::from_secs(1)),
            )
            .into()))
        }
        fn call(&mut self, _: Request<()>) -> Self::Future {
            panic!("called after its readiness failed")
        }
    }
    let mut service = HttpStatusLayer::new().layer(NeverReady);
    for _ in 0..2 {
        let response = service
            .ready()
            .await
            .unwrap()
            .call(Request::new(()))
            .await
            .unwrap();
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["retry-after"], "1");
    }
}

/// Item 2: what a handler answers itself. `Problem::for_error` keeps the key of a
/// guard in front (no token); `not_run` carries the request's token, even
/// for an error nothing recognises (then it is a refusal, `Shed`).
#[test]
fn first_hour_2_not_run_marks_the_answer_as_a_refusal_of_this_request() {
    let error: BoxError = Classified::shed("circuit open", Some(Duration::from_secs(4))).into();
    let kept: Response<String> = Problem::for_error(&error).response();
    assert_eq!(kept.status(), 503);
    assert_eq!(kept.extensions().get::<Failure>().unwrap().refusal, None);

    let token = RefusalToken::issue();
    let freed: Response<String> = not_run(&error, Some(token));
    assert_eq!(freed.status(), 503);
    assert_eq!(freed.headers()["retry-after"], "4");
    assert_eq!(
        freed.extensions().get::<Failure>().unwrap().refusal,
        Some(token)
    );

    let unknown: BoxError = "the inventory client is not configured".into();
    let freed: Response<String> = not_run(&unknown, Some(token));
    assert_eq!(freed.status(), 500);
    let failure = freed.extensions().get::<Failure>().unwrap();
    assert_eq!(
        (failure.kind, failure.refusal),
        (FailureKind::Shed, Some(token))
    );
}

/// A wait told to remote callers takes the place of the hint in the answer,
/// wrapped or not, and leaves the hint a retry layer reads alone; it is
/// rounded up to at least a second.
#[tokio::test]
async fn the_answer_wait_is_the_retry_after_and_the_hint_stays_as_it_was() {
    let early = Classified::shed("circuit open", None).with_answer_wait(Duration::from_millis(300));
    let outcome = ErrorChainClassifier::new().classify_error(&early);
    assert_eq!(outcome.as_failure().unwrap().hint, None);
    let response = answer(early.into()).await;
    assert_eq!(response.status(), 503);
    assert_eq!(
        response.headers()["retry-after"],
        "1",
        "300 ms rounds up to 1 s"
    );
    assert_eq!(response.extensions().get::<Failure>().unwrap().hint, None);

    // It replaces a hint that is there, and is found under a wrapper.
    let ramp = Classified::shed("circuit open", Some(Duration::from_secs(9)))
        .with_answer_wait(Duration::from_millis(4200));
    let wrapped: BoxError = Classified::new(Failure::new(FailureKind::Shed), "inner")
        .with_source(ramp)
        .into();
    let response = answer(wrapped).await;
    assert!(
        !response.headers().contains_key("retry-after"),
        "the first Classified decides, and it names no wait"
    );
    let ramp = Classified::shed("circuit open", Some(Duration::from_secs(9)))
        .with_answer_wait(Duration::from_millis(4200));
    let response = answer(std::io::Error::other(ramp).into()).await;
    assert_eq!(response.headers()["retry-after"], "5");

    // Not on a status that invites no retry.
    let rejected = Classified::new(Failure::new(FailureKind::Rejected), "no")
        .with_answer_wait(Duration::from_secs(5));
    assert!(!answer(rejected.into())
        .await
        .headers()
        .contains_key("retry-after"));
}

/// The builder the family's other HTTP answers use: status, title, members,
/// `Retry-After` at least one second, no failure unless made for an error.
#[test]
fn a_problem_is_built_with_its_members_and_wait() {
    let response: Response<String> = Problem::new(http::StatusCode::UNPROCESSABLE_ENTITY)
        .member("type", "https://example.com/problems/reused")
        .member("code", "reused")
        .retry_after(Duration::ZERO)
        .response();
    assert_eq!(response.status(), 422);
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    assert!(response.extensions().get::<Failure>().is_none());
    let body: serde_json::Value = serde_json::from_str(response.body()).unwrap();
    assert_eq!(
        body,
        serde_json::json!({
            "type": "https://example.com/problems/reused",
            "title": "Unprocessable Entity",
            "status": 422,
            "code": "reused",
        })
    );

    let error = Classified::shed("circuit open", Some(Duration::from_secs(2)));
    let built: Response<String> = Problem::for_error(&error).member("code", "X").response();
    let plain: Response<String> = Problem::for_error(&error).response();
    assert_eq!(built.headers(), plain.headers());
    assert_eq!(
        built.extensions().get::<Failure>(),
        plain.extensions().get::<Failure>()
    );
    let mut built: serde_json::Value = serde_json::from_str(built.body()).unwrap();
    built.as_object_mut().unwrap().remove("code");
    assert_eq!(
        built,
        serde_json::from_str::<serde_json::Value>(plain.body()).unwrap()
    );
}
