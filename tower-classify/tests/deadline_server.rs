//! The server side of deadlines: `DeadlineLayer` reads `grpc-timeout` into a
//! `Deadline` extension and ends the call when it passes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Request, Response};
use tokio::time::Instant;
use tower::{service_fn, Layer, ServiceExt};
use tower_classify::deadline::{Deadline, DeadlineLayer};
use tower_classify::status::GrpcStatusLayer;
use tower_classify::BoxError;

/// Sets its flag when dropped: the handler's future was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A handler that takes 1 s and reports the deadline it saw.
fn slow_handler(
    dropped: Arc<AtomicBool>,
) -> impl tower::Service<
    Request<()>,
    Response = Response<String>,
    Error = BoxError,
    Future = impl Send,
> + Clone {
    service_fn(move |request: Request<()>| {
        let flag = DropFlag(dropped.clone());
        async move {
            let _flag = flag;
            let seen = request
                .extensions()
                .get::<Deadline>()
                .map(Deadline::remaining);
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(Response::new(format!("{seen:?}")))
        }
    })
}

fn request(headers: &[(&str, &str)]) -> Request<()> {
    let mut builder = Request::post("/shop.Orders/Place");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_call_past_its_grpc_timeout_ends_and_drops_the_handler() {
    let dropped = Arc::new(AtomicBool::new(false));
    let service = DeadlineLayer::new().layer(slow_handler(dropped.clone()));
    let start = Instant::now();
    let error = service
        .oneshot(request(&[("grpc-timeout", "200m")]))
        .await
        .unwrap_err();
    assert!(error.is::<tower::timeout::error::Elapsed>(), "{error}");
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    assert!(
        dropped.load(Ordering::SeqCst),
        "the handler stopped with the caller"
    );
}

#[tokio::test(start_paused = true)]
async fn hostile_timeouts_are_ignored_and_the_earliest_deadline_wins() {
    for hostile in ["-1S", "999999999S", "1s", "", "1.5S", "0x1S"] {
        let service = DeadlineLayer::new().layer(slow_handler(Default::default()));
        let response = service
            .oneshot(request(&[("grpc-timeout", hostile)]))
            .await
            .unwrap();
        assert_eq!(response.body(), "None", "{hostile:?} sets no deadline");
    }

    // grpc-timeout 5 s, the HTTP header 300 ms, the cap 2 s: 300 ms.
    let service = DeadlineLayer::new()
        .header(HeaderName::from_static("x-request-timeout"))
        .max_timeout(Duration::from_secs(2))
        .layer(slow_handler(Default::default()));
    let start = Instant::now();
    let _ = service
        .oneshot(request(&[
            ("grpc-timeout", "5S"),
            ("x-request-timeout", "300m"),
        ]))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_millis(300));

    // No header at all: the cap.
    let service = DeadlineLayer::new()
        .max_timeout(Duration::from_millis(700))
        .layer(slow_handler(Default::default()));
    let start = Instant::now();
    let _ = service.oneshot(request(&[])).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_millis(700));
}

#[tokio::test(start_paused = true)]
async fn under_the_grpc_status_layer_a_passed_deadline_is_deadline_exceeded() {
    let service =
        GrpcStatusLayer::new().layer(DeadlineLayer::new().layer(slow_handler(Default::default())));
    let response = service
        .oneshot(request(&[("grpc-timeout", "50m")]))
        .await
        .unwrap();
    assert_eq!(response.headers()["grpc-status"], "4");
}
