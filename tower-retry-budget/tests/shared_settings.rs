//! A layer's settings are shared by its services and its clones: a
//! service retries, keeps its deadline, and clones of the layer share its
//! budget. (These cases once ran on a leaked layer, its settings held by
//! `&'static`; `leak()` is gone and they run on the one shared `Arc`.)

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower::{service_fn, Layer, ServiceExt};
use tower_classify::BoxError;
use tower_retry_budget::backoff::Backoff;
use tower_retry_budget::budget::TpsBudget;
use tower_retry_budget::error::{BudgetExhausted, DeadlineExceeded};
use tower_retry_budget::RetryLayer;

fn reset() -> BoxError {
    io::Error::from(io::ErrorKind::ConnectionReset).into()
}

#[tokio::test(start_paused = true)]
async fn a_layer_retries_until_an_attempt_succeeds() {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let layer = RetryLayer::builder()
        .max_retries(3)
        .backoff(Backoff::fixed(Duration::from_millis(10)))
        .build()
        .unwrap();
    let service = layer.layer(service_fn(move |n: u32| {
        let call = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            if call < 2 {
                Err(reset())
            } else {
                Ok(n)
            }
        }
    }));
    assert_eq!(service.oneshot(7).await.unwrap(), 7);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_layer_keeps_its_deadline() {
    let layer = RetryLayer::builder()
        .max_retries(3)
        .deadline(Duration::from_millis(250))
        .build()
        .unwrap();
    let service = layer.layer(service_fn(|n: u32| async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok::<_, BoxError>(n)
    }));
    let start = tokio::time::Instant::now();
    let error = service.oneshot(7).await.unwrap_err();
    let exceeded = error
        .downcast_ref::<DeadlineExceeded>()
        .expect("cut at the deadline");
    assert_eq!(exceeded.attempts(), 1);
    assert_eq!(start.elapsed(), Duration::from_millis(250));
}

#[tokio::test(start_paused = true)]
async fn clones_of_a_layer_share_its_budget() {
    // One retry in reserve (one a second over one second) and none earned
    // by traffic, for the layer and every clone of it.
    let budget = TpsBudget::new(Duration::from_secs(1), 1, 0.0).unwrap();
    let layer = RetryLayer::builder()
        .max_retries(3)
        .backoff(Backoff::none())
        .budget(Arc::new(budget))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let failing = |calls: Arc<AtomicU32>| {
        service_fn(move |_: u32| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<u32, _>(reset()) }
        })
    };
    let first = layer.layer(failing(calls.clone()));
    let error = first.oneshot(7).await.unwrap_err();
    assert!(error.downcast_ref::<BudgetExhausted>().is_some(), "{error}");
    assert_eq!(calls.swap(0, Ordering::SeqCst), 2, "the one retry");

    let second = layer.clone().layer(failing(calls.clone()));
    let error = second.oneshot(7).await.unwrap_err();
    assert!(error.downcast_ref::<BudgetExhausted>().is_some(), "{error}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no retry left");
}
