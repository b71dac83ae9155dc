//! Issue 14: every metric the crate registers is described (kind, unit,
//! text) to the recorder when a layer is built.
//!
//! Its own test binary: descriptions go out when a layer is built, to the
//! recorder installed at that moment, so this recorder must be the global
//! one before any layer exists.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_breaker::{CircuitBreakerLayer, MetricsLabel};
use tower_classify::{BoxError, ErrorChainClassifier};

/// A metric's kind, its unit, and how many times it was described.
type Description = (&'static str, Option<Unit>, usize);

#[derive(Default)]
struct Recording {
    /// By metric name.
    described: Mutex<HashMap<String, Description>>,
    /// (name, kind) of every registration.
    registered: Mutex<HashSet<(String, &'static str)>>,
}

impl Recording {
    fn describe(&self, kind: &'static str, key: KeyName, unit: Option<Unit>, text: SharedString) {
        assert!(
            !text.is_empty(),
            "{} has an empty description",
            key.as_str()
        );
        let mut described = self.described.lock().unwrap();
        let entry = described
            .entry(key.as_str().to_owned())
            .or_insert((kind, unit, 0));
        entry.2 += 1;
    }

    fn register(&self, kind: &'static str, key: &Key) {
        self.registered
            .lock()
            .unwrap()
            .insert((key.name().to_owned(), kind));
    }
}

impl Recorder for Recording {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        self.describe("counter", key, unit, text);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        self.describe("gauge", key, unit, text);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        self.describe("histogram", key, unit, text);
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.register("counter", key);
        Counter::noop()
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.register("gauge", key);
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.register("histogram", key);
        Histogram::noop()
    }
}

#[tokio::test]
async fn every_metric_is_described_with_its_kind_and_unit() {
    let recorder: &'static Recording = Box::leak(Box::default());
    metrics::set_global_recorder(recorder).expect("the only recorder of this binary");

    let plain = CircuitBreakerLayer::builder()
        .name("plain")
        .build(ErrorChainClassifier::new())
        .unwrap();
    let keyed = CircuitBreakerLayer::builder()
        .name("keyed")
        .max_breakers(1)
        .metrics_label(MetricsLabel::key())
        .build_keyed(ErrorChainClassifier::new(), |key: &&'static str| *key)
        .unwrap();
    let ok = service_fn(|_: &'static str| async { Ok::<_, BoxError>(()) });
    plain.layer(ok).oneshot("call").await.unwrap();
    let mut keyed = keyed.layer(ok);
    for key in ["a", "b"] {
        keyed.ready().await.unwrap().call(key).await.unwrap();
    }

    let described = recorder.described.lock().unwrap().clone();
    let registered = recorder.registered.lock().unwrap().clone();
    let names: HashSet<&str> = registered.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        HashSet::from([
            "tower_breaker_state",
            "tower_breaker_forced",
            "tower_breaker_opened_total",
            "tower_breaker_rejected_total",
            "tower_breaker_would_reject_total",
            "tower_breaker_evicted_total",
        ]),
        "the README's metric table lists exactly these"
    );
    for (name, kind) in &registered {
        let Some((described_kind, unit, times)) = described.get(name) else {
            panic!("{name} is registered but not described");
        };
        assert_eq!(described_kind, kind, "{name}");
        // Each layer built describes them again, which recorders take as
        // the same description.
        assert!(*times >= 1, "{name} described");
        let expected = if *kind == "counter" {
            Some(Unit::Count)
        } else {
            None // the state codes of the two gauges have no unit
        };
        assert_eq!(*unit, expected, "{name}");
    }
    assert_eq!(
        described.len(),
        names.len(),
        "nothing described that is never registered"
    );
}
