//! The metrics the layer emits through the `metrics` facade.
//!
//! One test in its own binary: it installs a global recorder.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{
    Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use tower::{Layer, ServiceExt};
use tower_classify::BoxError;
use tower_retry_budget::backoff::{Backoff, Jitter};
use tower_retry_budget::budget::TpsBudget;
use tower_retry_budget::hedge::HedgeLayer;
use tower_retry_budget::RetryLayer;

/// Every value recorded, by `name{label=value,…}`.
#[derive(Default)]
struct Capture {
    values: Mutex<BTreeMap<String, Vec<f64>>>,
    // Metric name to (unit, description).
    descriptions: Mutex<BTreeMap<String, (Option<Unit>, String)>>,
}

impl Capture {
    fn describe(&self, name: KeyName, unit: Option<Unit>, description: SharedString) {
        self.descriptions
            .lock()
            .unwrap()
            .insert(name.as_str().to_owned(), (unit, description.to_string()));
    }
}

struct Handle {
    capture: Arc<Capture>,
    key: String,
}

impl CounterFn for Handle {
    fn increment(&self, value: u64) {
        let mut values = self.capture.values.lock().unwrap();
        let entry = values.entry(self.key.clone()).or_default();
        match entry.first_mut() {
            Some(total) => *total += value as f64,
            None => entry.push(value as f64),
        }
    }

    fn absolute(&self, value: u64) {
        self.capture
            .values
            .lock()
            .unwrap()
            .insert(self.key.clone(), vec![value as f64]);
    }
}

impl HistogramFn for Handle {
    fn record(&self, value: f64) {
        let mut values = self.capture.values.lock().unwrap();
        values.entry(self.key.clone()).or_default().push(value);
    }
}

struct CaptureRecorder(Arc<Capture>);

impl CaptureRecorder {
    fn handle(&self, key: &Key) -> Arc<Handle> {
        let labels: Vec<String> = key
            .labels()
            .map(|label| format!("{}={}", label.key(), label.value()))
            .collect();
        let key = if labels.is_empty() {
            key.name().to_owned()
        } else {
            format!("{}{{{}}}", key.name(), labels.join(","))
        };
        Arc::new(Handle {
            capture: self.0.clone(),
            key,
        })
    }
}

impl Recorder for CaptureRecorder {
    fn describe_counter(&self, name: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe(name, unit, description);
    }
    fn describe_gauge(&self, name: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe(name, unit, description);
    }
    fn describe_histogram(&self, name: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe(name, unit, description);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.handle(key))
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.handle(key))
    }
}

#[tokio::test(start_paused = true)]
async fn retries_give_ups_budget_and_sleeps_are_counted() {
    let capture = Arc::new(Capture::default());
    metrics::set_global_recorder(CaptureRecorder(capture.clone())).unwrap();

    // Fails twice (a 429-like rate limit, then a reset), then answers.
    let calls = Arc::new(Mutex::new(0));
    let counter = calls.clone();
    let flaky = tower::service_fn(move |_: ()| {
        let n = {
            let mut n = counter.lock().unwrap();
            *n += 1;
            *n
        };
        async move {
            match n {
                1 => Err::<(), BoxError>(Box::new(tower_classify::Classified::new(
                    tower_classify::FailureKind::RateLimited,
                    "slow down",
                ))),
                2 => Err(io::Error::from(io::ErrorKind::ConnectionReset).into()),
                _ => Ok(()),
            }
        }
    });
    let layer = RetryLayer::builder()
        .name("search")
        .backoff(Backoff::fixed(Duration::from_millis(250)).with_jitter(Jitter::None))
        .no_budget()
        .build()
        .unwrap();
    layer.layer(flaky).oneshot(()).await.unwrap();

    // An empty budget: the first retry is refused.
    let outage = tower::service_fn(|_: ()| async {
        Err::<(), BoxError>(io::Error::from(io::ErrorKind::ConnectionReset).into())
    });
    let layer = RetryLayer::builder()
        .name("payments")
        .budget(Arc::new(
            TpsBudget::new(Duration::from_secs(1), 0, 0.0).unwrap(),
        ))
        .build()
        .unwrap();
    layer.layer(outage).oneshot(()).await.unwrap_err();

    {
        // Each downstream's series under its own name: none merged.
        let values = capture.values.lock().unwrap();
        let get = |key: &str| values.get(key).cloned().unwrap_or_default();
        assert_eq!(
            get("tower_retry_retries_total{retry=search,class=rate_limited}"),
            [1.0]
        );
        assert_eq!(
            get("tower_retry_retries_total{retry=search,class=connection}"),
            [1.0]
        );
        assert_eq!(get("tower_retry_sleep_seconds{retry=search}"), [0.25, 0.25]);
        assert_eq!(
            get("tower_retry_budget_exhausted_total{retry=payments}"),
            [1.0]
        );
        assert_eq!(
            get("tower_retry_giveups_total{retry=payments,reason=budget}"),
            [1.0]
        );
        assert_eq!(values.len(), 5, "no other series: {values:?}");

        // Every series emitted is described, with its unit.
        let descriptions = capture.descriptions.lock().unwrap();
        for key in values.keys() {
            let name = key.split('{').next().unwrap();
            let (unit, description) = descriptions
                .get(name)
                .unwrap_or_else(|| panic!("{name} has no description"));
            assert!(!description.is_empty());
            let expected = if name.ends_with("_seconds") {
                Unit::Seconds
            } else {
                Unit::Count
            };
            assert_eq!(*unit, Some(expected), "{name}");
        }
    }

    // Hedges: one call whose hedge wins (the first attempt cancelled), and
    // one whose hedge the empty shared budget refuses.
    let attempts = Arc::new(Mutex::new(0));
    let counter = attempts.clone();
    let slow_first = tower::service_fn(move |_: ()| {
        let n = {
            let mut n = counter.lock().unwrap();
            *n += 1;
            *n
        };
        async move {
            let wait = if n % 2 == 1 { 1000 } else { 10 };
            tokio::time::sleep(Duration::from_millis(wait)).await;
            Ok::<_, BoxError>(())
        }
    });
    let hedge = HedgeLayer::builder()
        .name("search")
        .delay(Duration::from_millis(50))
        .min_hedges_per_sec(10)
        .build()
        .unwrap();
    hedge.layer(slow_first.clone()).oneshot(()).await.unwrap();
    let refusing = HedgeLayer::builder()
        .name("payments")
        .delay(Duration::from_millis(50))
        .shared_budget(Arc::new(
            TpsBudget::new(Duration::from_secs(1), 0, 0.0).unwrap(),
        ))
        .build()
        .unwrap();
    *attempts.lock().unwrap() = 0;
    refusing.layer(slow_first).oneshot(()).await.unwrap();

    let values = capture.values.lock().unwrap();
    let get = |key: &str| values.get(key).cloned().unwrap_or_default();
    assert_eq!(get("tower_hedge_sent_total{hedge=search}"), [1.0]);
    assert_eq!(get("tower_hedge_won_total{hedge=search}"), [1.0]);
    assert_eq!(get("tower_hedge_cancelled_total{hedge=search}"), [1.0]);
    assert_eq!(
        get("tower_hedge_refused_total{hedge=payments,reason=budget}"),
        [1.0]
    );
    assert!(get("tower_hedge_sent_total{hedge=payments}").is_empty());
    let descriptions = capture.descriptions.lock().unwrap();
    for key in values.keys().filter(|key| key.starts_with("tower_hedge")) {
        let name = key.split('{').next().unwrap();
        let (unit, _) = descriptions
            .get(name)
            .unwrap_or_else(|| panic!("{name} has no description"));
        assert_eq!(*unit, Some(Unit::Count), "{name}");
    }
    assert!(descriptions.contains_key("tower_hedge_delay_seconds"));
}
