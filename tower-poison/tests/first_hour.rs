//! The dead-letter layer in an outage (issue 36): refusals that never
//! reached the dependency neither fill a bounded store nor, when stored,
//! lose their meaning once it is full.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tower::{service_fn, Layer, ServiceExt};
use tower_classify::status::HttpStatusLayer;
use tower_classify::{BoxError, Classified, ErrorChainClassifier, FailureKind};
use tower_poison::config::DeadLetterConfig;
use tower_poison::store::{DeadLetterStore, ListQuery, MemoryStore};
use tower_poison::{DeadLetterLayer, ReplayBody, SettleBody, StoreFull};

type Body = ReplayBody<Full<Bytes>>;

/// What a breaker in an outage answers every call: a refusal with a wait.
async fn open_circuit(_: Request<Body>) -> Result<Response<Bytes>, BoxError> {
    Err(Classified::shed("circuit open", Some(Duration::from_secs(3))).into())
}

fn call() -> Request<Full<Bytes>> {
    Request::post("http://inventory.internal/reserve")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

async fn stored(store: &MemoryStore) -> usize {
    store
        .list(ListQuery::default())
        .await
        .unwrap()
        .entries
        .len()
}

/// Item 4: on the default, every refusal of an outage comes back to the
/// caller as the refusal it is, and a bounded store stays empty, so the
/// outage never ends in `StoreFull`. The configuration's default is the
/// layer's.
#[tokio::test]
async fn first_hour_4_an_outage_of_refusals_does_not_fill_a_bounded_store() {
    let config: DeadLetterConfig = serde_json::from_str("{}").unwrap();
    assert!(!config.store_refusals);
    let (own, configured) = (MemoryStore::new(3), MemoryStore::new(3));
    for (store, layer) in [
        (own.clone(), DeadLetterLayer::new(own)),
        (configured.clone(), config.build(configured).unwrap()),
    ] {
        let service = layer.layer(service_fn(open_circuit));
        for _ in 0..10 {
            let error = service.clone().oneshot(call()).await.unwrap_err();
            assert!(!error.is::<StoreFull>(), "{error}");
            assert!(error.is::<Classified>(), "the refusal itself: {error}");
        }
        assert_eq!(stored(&store).await, 0, "refusals are passed through");
    }

    // Stored on request, from the builder or the configuration.
    let config: DeadLetterConfig = serde_json::from_str(r#"{"store_refusals": true}"#).unwrap();
    let (own, configured) = (MemoryStore::new(3), MemoryStore::new(3));
    for (store, layer) in [
        (own.clone(), DeadLetterLayer::new(own).store_refusals(true)),
        (configured.clone(), config.build(configured).unwrap()),
    ] {
        let service = layer.layer(service_fn(open_circuit));
        let _ = service.oneshot(call()).await.unwrap_err();
        assert_eq!(stored(&store).await, 1);
    }
}

/// Item 3: when refusals are stored and the store is full, the
/// `StoreFull` stays a refusal: classified as shed with the refusal's wait
/// (not rejected), and answered `503` with `Retry-After` by the HTTP error
/// layer.
#[tokio::test]
async fn first_hour_3_store_full_of_a_refusal_keeps_the_refusals_meaning() {
    let store = MemoryStore::new(1);
    let layer = DeadLetterLayer::new(store.clone()).store_refusals(true);
    let service = layer.layer(service_fn(open_circuit));
    let _ = service.clone().oneshot(call()).await.unwrap_err();
    assert_eq!(stored(&store).await, 1);

    let error = service.clone().oneshot(call()).await.unwrap_err();
    let full = error
        .downcast_ref::<StoreFull>()
        .expect("the store is full");
    assert!(full.original().is_some_and(|e| e.is::<Classified>()));
    let outcome = ErrorChainClassifier::new().classify_error(&*error);
    let failure = outcome.as_failure().expect("a failure");
    assert_eq!(failure.kind, FailureKind::Shed);
    assert_eq!(failure.retry_after(), Some(Duration::from_secs(3)));

    let answered =
        HttpStatusLayer::new().layer(service.map_response(|r| r.map(SettleBody::into_inner)));
    let response = answered.oneshot(call()).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "3");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
}
