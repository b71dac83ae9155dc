//! Every sample of the guard's counter carries the guard's name as its
//! `idempotency` label (SPEC §7: every layer's metrics are labelled with its
//! name), `"default"` when none was set. The memory store's eviction counter
//! carries none: a store may be shared by several guards.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use tower::{service_fn, Layer, ServiceExt};
use tower_idempotency::store::MemoryIdempotencyStore;
use tower_idempotency::{GuardBody, IdempotencyGuardLayer};

/// Each counter sample of the run: name, labels, count.
type Samples = Vec<(String, Vec<(String, String)>, u64)>;

/// Runs keys `a`, `a` (replayed), an empty key (refused) and `b` (evicting
/// `a` from a store with room for one) through `layer`.
fn run(layer: IdempotencyGuardLayer<MemoryIdempotencyStore>) -> Samples {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let service = layer.layer(service_fn(|_: Request<GuardBody<Full<Bytes>>>| async {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("done"))))
                }));
                for (key, status) in [
                    ("a", StatusCode::OK),
                    ("a", StatusCode::OK),
                    ("", StatusCode::BAD_REQUEST),
                    ("b", StatusCode::OK),
                ] {
                    let request = Request::post("/orders")
                        .header("idempotency-key", key)
                        .body(Full::new(Bytes::from("{}")))
                        .unwrap();
                    let response = service.clone().oneshot(request).await.unwrap();
                    assert_eq!(response.status(), status, "key {key:?}");
                    response.into_body().collect().await.unwrap();
                }
            })
    });
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.kind() == MetricKind::Counter)
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let DebugValue::Counter(count) = value else {
                unreachable!("a counter")
            };
            (key.name().to_owned(), labels, count)
        })
        .collect()
}

/// The outcomes counted under `tower_idempotency_total`, each checked to
/// carry `idempotency="{name}"`.
fn outcomes_named(samples: &Samples, name: &str) -> Vec<String> {
    let mut outcomes = Vec::new();
    for (metric, labels, _) in samples {
        if metric != "tower_idempotency_total" {
            continue;
        }
        let label = |k: &str| labels.iter().find(|(key, _)| key == k).map(|(_, v)| v);
        assert_eq!(
            label("idempotency").map(String::as_str),
            Some(name),
            "{metric} {labels:?}"
        );
        outcomes.push(label("outcome").expect("an outcome").clone());
    }
    outcomes.sort();
    outcomes
}

#[test]
fn every_guard_count_carries_the_guard_name() {
    let samples = run(IdempotencyGuardLayer::new(MemoryIdempotencyStore::new(1)).name("orders"));
    assert_eq!(
        outcomes_named(&samples, "orders"),
        ["claimed", "idempotency_key_invalid", "replayed", "stored"],
        "{samples:?}"
    );
    // The store evicted `a` for `b`; its counter names no guard.
    let evicted = samples
        .iter()
        .find(|(metric, ..)| metric == "tower_idempotency_evicted_total")
        .unwrap_or_else(|| panic!("no eviction counted: {samples:?}"));
    assert!(evicted.1.is_empty(), "{evicted:?}");
}

#[test]
fn an_unnamed_guard_is_named_default() {
    let samples = run(IdempotencyGuardLayer::new(MemoryIdempotencyStore::new(1)));
    assert_eq!(outcomes_named(&samples, "default").len(), 4, "{samples:?}");
}
