//! A full store, seen from the outside: the call fails with `StoreFull`, the
//! counter `tower_poison_dlq_store_full_total{label}` counts every refusal,
//! and a `warn` is logged at most once per 10 s per label (the rest at
//! `debug`). In its own test binary because tracing caches per-callsite
//! interest process-wide (see `logging.rs`).

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tower::{service_fn, Layer, ServiceExt};
use tower_classify::BoxError;
use tower_poison::store::{DeadLetterStore, MemoryStore};
use tower_poison::{DeadLetterLayer, ReplayBody, StoreFailed, StoreFull};

mod events;
use events::Events;

#[test]
fn a_full_store_fails_calls_with_store_full_counts_each_and_warns_once() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let events = Events::default();
    let store = MemoryStore::new(1);
    tracing::subscriber::with_default(events.clone(), || {
        metrics::with_local_recorder(&recorder, || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    let dlq = DeadLetterLayer::new(store.clone())
                        .label("store-full-test")
                        .layer(service_fn(
                            |_request: Request<ReplayBody<Full<Bytes>>>| async {
                                Ok::<_, BoxError>(
                                    Response::builder().status(503).body(Bytes::new()).unwrap(),
                                )
                            },
                        ));
                    let call = || {
                        dlq.clone()
                            .oneshot(Request::post("http://x/").body(Full::default()).unwrap())
                    };
                    // The first fits, and is acknowledged with its 503.
                    assert_eq!(call().await.unwrap().status(), 503);
                    for _ in 0..3 {
                        let error = call().await.unwrap_err();
                        assert!(error.is::<StoreFull>(), "{error}");
                        assert!(!error.is::<StoreFailed>());
                    }
                })
        })
    });
    let store_depth = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(store.depth())
        .unwrap();
    assert_eq!(store_depth, 1, "the acknowledged entry is kept");

    let counters: Vec<(String, Vec<String>, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => Some((
                key.key().name().to_owned(),
                key.key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect(),
                n,
            )),
            _ => None,
        })
        .collect();
    let count = |name: &str| {
        counters
            .iter()
            .find(|(n, ..)| n == name)
            .map(|(_, labels, n)| (labels.clone(), *n))
    };
    assert_eq!(
        count("tower_poison_dlq_store_full_total"),
        Some((vec!["label=store-full-test".to_owned()], 3)),
        "{counters:?}"
    );
    // Refused calls are not reported as dead-lettered.
    assert_eq!(
        count("tower_poison_dead_lettered_total").map(|(_, n)| n),
        Some(1)
    );

    let events = events.0.lock().unwrap();
    let full = |level: tracing::Level| {
        events
            .iter()
            .filter(|(l, message, ..)| *l == level && message.contains("dead-letter store is full"))
            .count()
    };
    assert_eq!(full(tracing::Level::WARN), 1, "{events:?}");
    assert_eq!(full(tracing::Level::DEBUG), 2, "{events:?}");
    assert!(
        !events.iter().any(|(l, ..)| *l == tracing::Level::ERROR),
        "a full store is not a broken one: {events:?}"
    );
}
