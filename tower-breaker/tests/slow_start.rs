//! Slow start (SPEC 5b): after a probe closes the breaker, a share of calls
//! rising from a tenth to all of them is admitted over the window.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_breaker::Policy;
use tower_breaker::{BreakerHandle, CircuitBreakerLayer, CircuitOpen, State};
use tower_classify::{BoxError, ErrorChainClassifier};

const WINDOW: Duration = Duration::from_secs(10);

/// A breaker opened by one failure, then closed by a probe: its slow start
/// begins now. `failing` switches the dependency's answer.
async fn just_closed() -> (
    impl Service<u32, Response = (), Error = BoxError> + Clone,
    BreakerHandle,
    Arc<AtomicBool>,
) {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::from_secs(1))
        .slow_start(WINDOW)
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let failing = Arc::new(AtomicBool::new(true));
    let svc = layer.layer(service_fn({
        let failing = Arc::clone(&failing);
        move |_: u32| {
            let fail = failing.load(Ordering::Relaxed);
            async move {
                if fail {
                    Err::<(), BoxError>(io::Error::from(io::ErrorKind::ConnectionRefused).into())
                } else {
                    Ok(())
                }
            }
        }
    }));
    svc.clone().oneshot(0).await.unwrap_err();
    assert_eq!(admin.get("default").unwrap().state, State::Open);
    tokio::time::advance(Duration::from_secs(1)).await;
    failing.store(false, Ordering::Relaxed);
    svc.clone().oneshot(1).await.expect("the probe succeeds");
    assert_eq!(admin.get("default").unwrap().state, State::Closed);
    (svc, admin, failing)
}

/// The share of `calls` calls admitted now (paused time stands still),
/// `left` before the slow start ends.
fn admitted_share(
    svc: &(impl Service<u32, Error = BoxError> + Clone),
    calls: u32,
    left: Duration,
) -> f64 {
    let mut admitted = 0;
    for id in 0..calls {
        match svc
            .clone()
            .oneshot(id)
            .now_or_never()
            .expect("ready at once")
        {
            Ok(_) => admitted += 1,
            Err(error) => {
                let open = error.downcast::<CircuitOpen>().expect("only refusals fail");
                assert_eq!(open.remaining(), None, "the breaker is closed");
                let back = open
                    .failure()
                    .retry_after()
                    .expect("told when to come back");
                assert!(back <= left, "within what is left of the window: {back:?}");
            }
        }
    }
    f64::from(admitted) / f64::from(calls)
}

#[tokio::test(start_paused = true)]
async fn the_admitted_share_rises_from_a_tenth_to_all_over_the_window() {
    fastrand::seed(21);
    let (svc, _admin, _failing) = just_closed().await;
    let mut shares = Vec::new();
    let mut elapsed = Duration::ZERO;
    for step in [0, 3, 3, 3] {
        tokio::time::advance(Duration::from_secs(step)).await;
        elapsed += Duration::from_secs(step);
        shares.push(admitted_share(&svc, 2_000, WINDOW - elapsed));
    }
    // At 0, 3, 6 and 9 s of a 10 s window: 0.1 (the floor), 0.3, 0.6, 0.9.
    for (share, expected) in shares.iter().zip([0.1, 0.3, 0.6, 0.9]) {
        assert!((share - expected).abs() < 0.04, "{shares:?}");
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        admitted_share(&svc, 2_000, Duration::ZERO),
        1.0,
        "the window is over"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failure_during_the_slow_start_counts() {
    fastrand::seed(22);
    let (svc, admin, failing) = just_closed().await;
    tokio::time::advance(Duration::from_secs(5)).await;
    failing.store(true, Ordering::Relaxed);
    let reached = (0..100).find(|id| {
        let result = svc
            .clone()
            .oneshot(*id)
            .now_or_never()
            .expect("ready at once");
        matches!(result, Err(error) if !error.is::<CircuitOpen>())
    });
    assert!(reached.is_some(), "some call was admitted");
    assert_eq!(
        admin.get("default").unwrap().state,
        State::Open,
        "its failure reopened the breaker"
    );
}
