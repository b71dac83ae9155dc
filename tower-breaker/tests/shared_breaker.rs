//! One breaker shared by every clone of a layer's service, for every flavour
//! of the service and for its handle. (These cases once ran on a leaked
//! breaker, held by `&'static`; `leak()` is gone and they run on the one
//! way services hold their breaker.)

use std::io;
use std::time::Duration;

use tower::{service_fn, Layer, Service, ServiceExt};
use tower_breaker::Policy;
use tower_breaker::{CircuitBreakerLayer, CircuitOpen, State};
use tower_classify::ErrorChainClassifier;

/// Answers `Ok(n)` for even `n`, a refused connection for odd `n`.
async fn dependency(n: u32) -> Result<u32, io::Error> {
    if n % 2 == 0 {
        Ok(n)
    } else {
        Err(io::ErrorKind::ConnectionRefused.into())
    }
}

#[tokio::test(start_paused = true)]
async fn a_shared_breaker_opens_refuses_probes_and_closes() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(2))
        .recovery_timeout(Duration::from_secs(10))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let handle = layer.handle();
    let service = layer.layer(service_fn(dependency));

    // Each call on its own clone, as axum makes them: they share one breaker.
    assert_eq!(service.clone().oneshot(2).await.unwrap(), 2);
    for n in [1, 3] {
        let err = service.clone().oneshot(n).await.unwrap_err();
        assert!(err.is::<io::Error>(), "{err}");
    }
    assert_eq!(handle.get("default").unwrap().state, State::Open);

    let err = service.clone().oneshot(4).await.unwrap_err();
    let open = err
        .downcast_ref::<CircuitOpen>()
        .expect("refused while open");
    assert!(open.remaining().unwrap() <= Duration::from_secs(10));
    assert_eq!(handle.get("default").unwrap().rejected, 1);

    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(service.clone().oneshot(6).await.unwrap(), 6);
    assert_eq!(handle.get("default").unwrap().state, State::Closed);
}

#[tokio::test(start_paused = true)]
async fn the_handle_forces_and_resets_a_shared_breaker() {
    let layer = CircuitBreakerLayer::new(ErrorChainClassifier::new());
    let handle = layer.handle();
    let service = layer.layer(service_fn(dependency));

    assert!(handle.force_open("default"));
    let err = service.clone().oneshot(2).await.unwrap_err();
    assert!(err.is::<CircuitOpen>(), "{err}");

    assert!(handle.reset("default"));
    assert_eq!(service.clone().oneshot(2).await.unwrap(), 2);
}

#[cfg(feature = "http")]
#[tokio::test(start_paused = true)]
async fn a_shared_http_breaker_answers_503_while_open() {
    use http::{Request, Response, StatusCode};
    use tower_classify::{BoxError, HttpClassifier};

    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .build(HttpClassifier::new())
        .unwrap()
        .answer(tower_breaker::answer::Http503);
    let handle = layer.handle();
    let service = layer.layer(service_fn(|request: Request<u16>| async move {
        let mut response = Response::new(String::new());
        *response.status_mut() = StatusCode::from_u16(*request.body()).unwrap();
        Ok::<_, BoxError>(response)
    }));

    let failed = service.clone().oneshot(Request::new(503)).await.unwrap();
    assert_eq!(failed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(handle.get("default").unwrap().state, State::Open);

    let refused = service.clone().oneshot(Request::new(200)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        refused.body().contains("CIRCUIT_OPEN"),
        "{}",
        refused.body()
    );
    assert_eq!(handle.get("default").unwrap().rejected, 1);
}

#[tokio::test]
async fn shared_services_cross_threads() {
    let layer = CircuitBreakerLayer::new(ErrorChainClassifier::new());
    let service = layer.layer(service_fn(dependency));
    let calls: Vec<_> = (0..4u32)
        .map(|n| {
            let mut service = service.clone();
            tokio::spawn(async move { service.ready().await?.call(n * 2).await })
        })
        .collect();
    for (n, call) in calls.into_iter().enumerate() {
        assert_eq!(call.await.unwrap().unwrap(), n as u32 * 2);
    }
}
