//! The admin handle: list, reset, force.

use std::io;
use std::time::Duration;

use futures_util::FutureExt;
use tower::{service_fn, Layer, Service};
use tower_breaker::Policy;
use tower_breaker::{BreakerHandle, CircuitBreakerLayer, CircuitOpen, State};
use tower_classify::{BoxError, ErrorChainClassifier};

type Req = (&'static str, bool);

fn keyed() -> (impl Service<Req, Error = BoxError>, BreakerHandle) {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(2))
        .recovery_timeout(Duration::from_secs(30))
        .build_keyed(ErrorChainClassifier::new(), |req: &Req| req.0)
        .unwrap();
    let handle = layer.handle();
    let inner = service_fn(|(_, fails): Req| async move {
        if fails {
            Err(io::Error::from(io::ErrorKind::TimedOut))
        } else {
            Ok(())
        }
    });
    (layer.layer(inner), handle)
}

fn call(svc: &mut impl Service<Req, Error = BoxError>, req: Req) -> Result<(), BoxError> {
    svc.call(req).now_or_never().expect("immediate").map(drop)
}

#[tokio::test(start_paused = true)]
async fn list_shows_key_state_counters_and_time_in_state() {
    let (mut svc, handle) = keyed();
    call(&mut svc, ("b", true)).unwrap_err();
    call(&mut svc, ("a", true)).unwrap_err();
    call(&mut svc, ("a", true)).unwrap_err();
    tokio::time::advance(Duration::from_secs(5)).await;
    call(&mut svc, ("a", false)).unwrap_err();

    let list = handle.list();
    assert_eq!(list.len(), 2);
    let (a, b) = (&list[0], &list[1]);
    assert_eq!((a.key.as_str(), a.state), ("a", State::Open));
    assert_eq!(a.time_in_state, Duration::from_secs(5));
    assert_eq!(a.remaining_open, Some(Duration::from_secs(25)));
    assert_eq!((a.failures, a.rejected, a.opened), (2, 1, 1));
    assert_eq!((b.key.as_str(), b.state), ("b", State::Closed));
    assert_eq!((b.consecutive_failures, b.failures, b.opened), (1, 1, 0));
    assert_eq!(b.time_in_state, Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn reset_closes_one_breaker_or_all() {
    let (mut svc, handle) = keyed();
    for key in ["x", "y"] {
        call(&mut svc, (key, true)).unwrap_err();
        call(&mut svc, (key, true)).unwrap_err();
    }
    assert!(handle.reset("x"));
    call(&mut svc, ("x", false)).unwrap();
    assert!(call(&mut svc, ("y", false))
        .unwrap_err()
        .is::<CircuitOpen>());
    let x = handle.get("x").unwrap();
    assert_eq!((x.state, x.consecutive_failures), (State::Closed, 0));
    assert_eq!(x.failures, 2, "lifetime totals survive a reset");

    assert_eq!(handle.reset_all(), 2);
    call(&mut svc, ("y", false)).unwrap();
    assert!(!handle.reset("unknown"));
}

#[tokio::test(start_paused = true)]
async fn force_open_rejects_until_reset_even_after_the_recovery_timeout() {
    let (mut svc, handle) = keyed();
    call(&mut svc, ("svc", false)).unwrap();
    assert!(handle.force_open("svc"));
    let err = call(&mut svc, ("svc", false)).unwrap_err();
    assert_eq!(err.downcast_ref::<CircuitOpen>().unwrap().remaining(), None);
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(call(&mut svc, ("svc", false))
        .unwrap_err()
        .is::<CircuitOpen>());
    assert_eq!(handle.get("svc").unwrap().state, State::ForcedOpen);
    handle.reset("svc");
    call(&mut svc, ("svc", false)).unwrap();
}

#[tokio::test(start_paused = true)]
async fn force_closed_admits_everything_and_never_trips() {
    let (mut svc, handle) = keyed();
    call(&mut svc, ("svc", true)).unwrap_err();
    call(&mut svc, ("svc", true)).unwrap_err();
    assert!(handle.force_closed("svc"));
    for _ in 0..10 {
        let err = call(&mut svc, ("svc", true)).unwrap_err();
        assert!(err.is::<io::Error>(), "reaches the dependency");
    }
    assert_eq!(handle.get("svc").unwrap().state, State::ForcedClosed);
    handle.reset("svc");
    call(&mut svc, ("svc", true)).unwrap_err();
    call(&mut svc, ("svc", true)).unwrap_err();
    assert_eq!(handle.get("svc").unwrap().state, State::Open);
    assert!(!handle.force_closed("unknown") && !handle.force_open("unknown"));
}

#[tokio::test(start_paused = true)]
async fn the_handle_of_a_plain_breaker_controls_it() {
    let layer = CircuitBreakerLayer::new(ErrorChainClassifier::new());
    let handle = layer.handle();
    let mut svc = layer.layer(service_fn(|()| async { Ok::<_, io::Error>(()) }));
    assert!(handle.force_open("default"));
    let err = svc.call(()).now_or_never().unwrap().unwrap_err();
    assert!(err.is::<CircuitOpen>());
    assert_eq!(handle.list()[0].rejected, 1);
}
