//! Every state change is traced and reported through the `metrics` facade.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use tower::{service_fn, Layer, Service};
use tower_breaker::Policy;
use tower_breaker::{CircuitBreakerLayer, Mode};
use tower_classify::{BoxError, ErrorChainClassifier};

mod support;

/// Metric values by `name{label=value,…}`.
#[derive(Clone, Default)]
struct Store(Arc<Mutex<HashMap<String, f64>>>);

struct Cell {
    key: String,
    store: Store,
}

impl Cell {
    fn update(&self, f: impl FnOnce(&mut f64)) {
        f(self
            .store
            .0
            .lock()
            .unwrap()
            .entry(self.key.clone())
            .or_default());
    }
}

impl metrics::CounterFn for Cell {
    fn increment(&self, value: u64) {
        self.update(|v| *v += value as f64);
    }
    fn absolute(&self, value: u64) {
        self.update(|v| *v = value as f64);
    }
}

impl metrics::GaugeFn for Cell {
    fn increment(&self, value: f64) {
        self.update(|v| *v += value);
    }
    fn decrement(&self, value: f64) {
        self.update(|v| *v -= value);
    }
    fn set(&self, value: f64) {
        self.update(|v| *v = value);
    }
}

impl Store {
    fn cell(&self, key: &Key) -> Arc<Cell> {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        Arc::new(Cell {
            key: format!("{}{{{}}}", key.name(), labels.join(",")),
            store: self.clone(),
        })
    }

    fn get(&self, key: &str) -> Option<f64> {
        self.0.lock().unwrap().get(key).copied()
    }
}

impl Recorder for Store {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.cell(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.cell(key))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn call(svc: &mut impl Service<bool, Error = BoxError>, fails: bool) -> Result<(), BoxError> {
    svc.call(fails).now_or_never().unwrap().map(drop)
}

fn service(mode: Mode) -> impl Service<bool, Error = BoxError> {
    CircuitBreakerLayer::builder()
        .name("payments")
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::ZERO)
        .mode(mode)
        .build(ErrorChainClassifier::new())
        .unwrap()
        .layer(service_fn(|fails: bool| async move {
            if fails {
                Err(io::Error::from(io::ErrorKind::ConnectionAborted))
            } else {
                Ok(())
            }
        }))
}

#[test]
fn state_gauge_and_open_and_rejection_counters() {
    let store = Store::default();
    support::capture();
    {
        metrics::with_local_recorder(&store, || {
            let mut svc = service(Mode::Enforce);
            let state = "tower_breaker_state{breaker=payments}";
            assert_eq!(store.get(state), Some(0.0));
            call(&mut svc, true).unwrap_err(); // closed → open
            assert_eq!(store.get(state), Some(2.0));
            assert_eq!(
                store.get("tower_breaker_opened_total{breaker=payments}"),
                Some(1.0)
            );

            // Recovery timeout zero: the next call is the probe; hold it.
            let probe = svc.call(false);
            assert_eq!(store.get(state), Some(1.0), "half-open");
            call(&mut svc, false).unwrap_err(); // half-open, slot taken
            call(&mut svc, false).unwrap_err();
            assert_eq!(
                store.get("tower_breaker_rejected_total{breaker=payments}"),
                Some(2.0)
            );
            probe.now_or_never().unwrap().unwrap(); // half-open → closed
            assert_eq!(store.get(state), Some(0.0));
        });
    }
    let events = support::events();
    let changes: Vec<_> = events
        .iter()
        .filter(|(level, text)| *level != tracing::Level::DEBUG && text.contains("circuit breaker"))
        .map(|(level, text)| {
            let to = text.split("to=").nth(1).unwrap().split(' ').next().unwrap();
            (*level, to.to_owned())
        })
        .collect();
    use tracing::Level;
    assert_eq!(
        changes,
        [
            (Level::WARN, "open".to_owned()),
            (Level::INFO, "half_open".to_owned()),
            (Level::INFO, "closed".to_owned())
        ]
    );
    assert!(events
        .iter()
        .all(|(_, text)| !text.contains("circuit breaker") || text.contains("breaker=payments")));
    // A plain breaker's key is its name: no `key` field repeating it.
    assert!(events.iter().all(|(_, text)| !text.contains("key=")));
    assert!(
        events.iter().any(
            |(level, text)| *level == tracing::Level::DEBUG && text.contains("rejected a call")
        ),
        "each rejection is a debug event: {events:?}"
    );
}

#[test]
fn metrics_only_mode_counts_would_be_rejections() {
    let store = Store::default();
    support::capture();
    metrics::with_local_recorder(&store, || {
        let mut svc = service(Mode::MetricsOnly);
        call(&mut svc, true).unwrap_err();
        let probe = svc.call(true); // the probe, held
        call(&mut svc, false).unwrap(); // admitted although half-open and busy
        drop(probe);
    });
    assert_eq!(
        store.get("tower_breaker_would_reject_total{breaker=payments}"),
        Some(1.0)
    );
    assert_eq!(
        store.get("tower_breaker_rejected_total{breaker=payments}"),
        None
    );
}
