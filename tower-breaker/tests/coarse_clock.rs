//! The time window's coarse clock with tokio's clock running (every other
//! test pauses it, which makes the breaker read tokio's clock instead; this
//! binary never does, so its breakers file successes by the coarse clock).
//!
//! This is the one test that waits for real time: the coarse clock is a
//! thread ticking with the real clock, and only real time moves it.

use std::future::{ready, Ready};
use std::io;
use std::time::{Duration, Instant};

use tower::{service_fn, Layer, ServiceExt};
use tower_breaker::Policy;
use tower_breaker::{CircuitBreakerLayer, State, Window};
use tower_classify::ErrorChainClassifier;

#[tokio::test]
async fn the_time_window_expires_old_failures_by_the_coarse_clock() {
    // Ten buckets of 10 ms: a reading late by up to ~90 ms still files the
    // success inside the window.
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::failure_rate(
            0.5,
            4,
            Window::time(Duration::from_millis(100)),
        ))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let svc = layer.layer(service_fn(|fail: bool| -> Ready<io::Result<()>> {
        ready(if fail {
            Err(io::ErrorKind::ConnectionReset.into())
        } else {
            Ok(())
        })
    }));
    let started = Instant::now();
    for _ in 0..3 {
        svc.clone().oneshot(true).await.unwrap_err();
    }
    assert_eq!(admin.get("default").unwrap().window_failures, 3);
    while started.elapsed() < Duration::from_millis(160) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A coarse tally still holding the three failures would make this
    // success the fourth call at 3 of 4.
    svc.clone().oneshot(false).await.unwrap();
    let snapshot = admin.get("default").unwrap();
    assert_eq!(snapshot.state, State::Closed);
    assert_eq!(
        (snapshot.window_calls, snapshot.window_failures),
        (1, 0),
        "the failures aged out and the success was filed in the current window"
    );
}
