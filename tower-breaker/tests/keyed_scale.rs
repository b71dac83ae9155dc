//! Keyed breakers at scale: what a flood of distinct keys costs.

use std::future::ready;
use std::io;
use std::sync::Arc;
use std::time::Instant;

use futures_util::FutureExt;
use tower::{service_fn, Layer, Service};
use tower_breaker::CircuitBreakerLayer;
use tower_classify::ErrorChainClassifier;

/// 1M distinct keys through `max_breakers` 1 000: every key after the first
/// thousand evicts one. Not a pass/fail test (its time depends on the
/// machine); run it by name to measure:
/// `cargo test -p tower-breaker --test keyed_scale -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement; run by name"]
fn one_million_distinct_keys_through_a_thousand_breakers() {
    let keys: Vec<Arc<str>> = (0..1_000_000)
        .map(|n| Arc::from(format!("tenant-{n}")))
        .collect();
    let layer = CircuitBreakerLayer::builder()
        .max_breakers(1_000)
        .build_keyed(ErrorChainClassifier::new(), |key: &Arc<str>| {
            Arc::clone(key)
        })
        .unwrap();
    let handle = layer.handle();
    let mut svc = layer.layer(service_fn(|_: Arc<str>| ready(Ok::<_, io::Error>(()))));
    let start = Instant::now();
    for key in &keys {
        svc.call(Arc::clone(key))
            .now_or_never()
            .expect("immediate")
            .unwrap();
    }
    let elapsed = start.elapsed();
    assert_eq!(handle.list().len(), 1_000);
    println!("1M distinct keys through max_breakers 1000: {elapsed:?}");
}
