//! Every metric the crate emits is described (help text and unit) to the
//! recorder when a layer is built. In its own test binary: the descriptions
//! are registered with the global recorder by each layer built.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use tower::{service_fn, Layer, ServiceExt};
use tower_classify::BoxError;
use tower_poison::store::MemoryStore;
use tower_poison::{Action, DeadLetterLayer, ReplayBody};

/// Each described metric's unit and help text, by name.
type Described = BTreeMap<String, (Option<Unit>, String)>;

/// Keeps the description of each metric and the name of each one emitted.
#[derive(Default, Clone)]
struct Descriptions {
    described: Arc<Mutex<Described>>,
    emitted: Arc<Mutex<BTreeSet<String>>>,
}

impl Descriptions {
    fn describe(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        let name = key.as_str().to_owned();
        self.described
            .lock()
            .unwrap()
            .insert(name, (unit, text.into_owned()));
    }

    fn emit(&self, key: &Key) {
        self.emitted.lock().unwrap().insert(key.name().to_owned());
    }
}

impl Recorder for Descriptions {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        self.describe(key, unit, text);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        self.describe(key, unit, text);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        self.describe(key, unit, text);
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.emit(key);
        Counter::noop()
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.emit(key);
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.emit(key);
        Histogram::noop()
    }
}

#[test]
fn every_emitted_metric_has_a_description_and_a_unit() {
    let recorder = Descriptions::default();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                // One entry fits: the second call finds the store full.
                let store = MemoryStore::new(1);
                for action in [Action::Dlq, Action::Drop, Action::Fail] {
                    let service = DeadLetterLayer::new(store.clone())
                        .label("described")
                        .action(action)
                        .layer(service_fn(|_: Request<ReplayBody<Full<Bytes>>>| async {
                            Ok::<_, BoxError>(
                                Response::builder().status(503).body(Bytes::new()).unwrap(),
                            )
                        }));
                    for _ in 0..2 {
                        let request = Request::post("http://x/").body(Full::default()).unwrap();
                        let _ = service.clone().oneshot(request).await;
                    }
                }
            })
    });
    let emitted = recorder.emitted.lock().unwrap().clone();
    let described = recorder.described.lock().unwrap().clone();
    for name in [
        "tower_poison_dead_lettered_total",
        "tower_poison_dlq_depth",
        "tower_poison_dlq_store_full_total",
    ] {
        assert!(
            emitted.contains(name),
            "{name} was not emitted: {emitted:?}"
        );
    }
    for name in &emitted {
        let (unit, text) = described
            .get(name)
            .unwrap_or_else(|| panic!("{name} is emitted but not described: {described:?}"));
        assert_eq!(*unit, Some(Unit::Count), "{name}");
        assert!(text.len() > 20, "{name}: {text:?}");
    }
}
