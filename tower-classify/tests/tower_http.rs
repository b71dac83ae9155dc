//! tower-http's classifiers, adapted.

use http::{Response, StatusCode};
use tower_classify::tower_http::{from_server_errors, TowerHttpClassifier};
use tower_classify::{BoxError, Classify, FailureKind, GrpcClassifier, Outcome};
use tower_http::classify::{GrpcCode, GrpcErrorsAsFailures, GrpcFailureClass};

fn status(code: u16) -> Response<()> {
    Response::builder().status(code).body(()).unwrap()
}

#[test]
fn server_errors_as_failures_keeps_this_crates_kinds() {
    let classifier = from_server_errors();
    let classify = |r: &Response<()>| Classify::<_, BoxError>::classify(&classifier, Ok(r));
    assert_eq!(classify(&status(200)), Outcome::Success);
    assert_eq!(
        classify(&status(503)),
        Outcome::failure(FailureKind::ServerError)
    );
    // tower-http counts only 5xx as failures: a 404 is a success to it.
    assert_eq!(classify(&status(404)), Outcome::Success);
    let reset: BoxError = std::io::Error::from(std::io::ErrorKind::ConnectionReset).into();
    assert_eq!(
        Classify::<Response<()>, _>::classify(&classifier, Err(&reset)),
        Outcome::failure(FailureKind::Connection),
        "errors are classified by their chain, not their Display"
    );
}

#[test]
fn grpc_errors_map_through_a_closure() {
    let classifier = TowerHttpClassifier::new(
        GrpcErrorsAsFailures::new().with_success(GrpcCode::NotFound),
        |class: GrpcFailureClass| match class {
            GrpcFailureClass::Status(status) => {
                GrpcClassifier::code_outcome(u32::try_from(status.code_raw()).unwrap_or(2))
            }
            _ => Outcome::failure(FailureKind::Connection),
        },
    );
    let grpc = |code: &str| {
        Response::builder()
            .status(StatusCode::OK)
            .header("grpc-status", code)
            .body(())
            .unwrap()
    };
    let classify = |r: &Response<()>| Classify::<_, BoxError>::classify(&classifier, Ok(r));
    assert_eq!(
        classify(&grpc("14")),
        Outcome::failure(FailureKind::ServerError)
    );
    assert_eq!(
        classify(&grpc("8")),
        Outcome::failure(FailureKind::RateLimited)
    );
    assert_eq!(
        classify(&grpc("5")),
        Outcome::Success,
        "configured as a success"
    );
    // Without grpc-status in the headers tower-http waits for trailers, which
    // a classifier of a response head cannot see: a success here.
    assert_eq!(classify(&status(200)), Outcome::Success);
}
