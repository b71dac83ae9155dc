//! Issue 14: `.layer(breaker)` puts the breaker in a `ServiceBuilder`
//! stack, inside the layers added before it; a keyed one too.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_breaker::Policy;
use tower_breaker::{CircuitBreakerLayer, CircuitOpen, State};
use tower_classify::{BoxError, ErrorChainClassifier};

fn refused() -> io::Error {
    io::Error::from(io::ErrorKind::ConnectionRefused)
}

#[tokio::test]
async fn circuit_breaker_guards_the_service_inside_the_layers_before_it() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(2))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let handle = layer.handle();
    let reached = Arc::new(AtomicUsize::new(0));
    let mapped = Arc::new(AtomicUsize::new(0));
    let (reached_in, mapped_in) = (Arc::clone(&reached), Arc::clone(&mapped));
    let mut service = ServiceBuilder::new()
        .map_request(move |req: ()| {
            mapped_in.fetch_add(1, Ordering::Relaxed);
            req
        })
        .layer(layer)
        .service(service_fn(move |_: ()| {
            reached_in.fetch_add(1, Ordering::Relaxed);
            async { Err::<(), _>(refused()) }
        }));
    for _ in 0..2 {
        let err = service.ready().await.unwrap().call(()).await.unwrap_err();
        assert!(err.is::<io::Error>());
    }
    assert_eq!(handle.list()[0].state, State::Open);
    let err = service.ready().await.unwrap().call(()).await.unwrap_err();
    assert!(err.is::<CircuitOpen>());
    assert_eq!(
        reached.load(Ordering::Relaxed),
        2,
        "refused before the service"
    );
    assert_eq!(
        mapped.load(Ordering::Relaxed),
        3,
        "the layer added first is outside"
    );
}

#[tokio::test]
async fn keyed_circuit_breaker_keeps_one_breaker_per_key() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .build_keyed(ErrorChainClassifier::new(), |req: &(&'static str, bool)| {
            req.0
        })
        .unwrap();
    let handle = layer.handle();
    let mut service = ServiceBuilder::new().layer(layer).service(service_fn(
        |(_, fails): (&'static str, bool)| async move {
            if fails {
                Err::<(), BoxError>(refused().into())
            } else {
                Ok(())
            }
        },
    ));
    let mut send = |req| service.call(req);
    send(("down", true)).await.unwrap_err();
    assert!(send(("down", false)).await.unwrap_err().is::<CircuitOpen>());
    send(("up", false)).await.unwrap();
    assert_eq!(handle.get("down").unwrap().state, State::Open);
    assert_eq!(handle.get("up").unwrap().state, State::Closed);
}
