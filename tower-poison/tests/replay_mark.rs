//! The replay mark is a claim made by whoever sends the request: a request
//! that copies another entry's mark is stored as itself, and the entry it
//! names keeps its request and history.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_classify::BoxError;
use tower_poison::replay::REPLAY_HEADER;
use tower_poison::store::{DeadLetterStore, ListQuery, MemoryStore};
use tower_poison::{DeadLetterLayer, ReplayBody};

#[tokio::test]
async fn a_copied_mark_on_another_request_neither_loses_it_nor_rewrites_the_named_entry() {
    let store = MemoryStore::new(10);
    let handler = service_fn(|_req: Request<ReplayBody<Full<Bytes>>>| async {
        Ok::<_, BoxError>(
            Response::builder()
                .status(StatusCode::SERVICE_UNAVAILABLE)
                .body(Bytes::new())
                .unwrap(),
        )
    });
    let mut service = DeadLetterLayer::new(store.clone())
        .label("orders")
        .layer(handler);
    let send = |path: &str, body: &'static str, mark: Option<String>| {
        let mut request = Request::post(format!("http://orders.internal{path}"));
        if let Some(mark) = mark {
            request = request.header(REPLAY_HEADER, mark);
        }
        request
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };

    let response = service
        .ready()
        .await
        .unwrap()
        .call(send("/orders", "victim", None))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let victim = store
        .list(ListQuery::default())
        .await
        .unwrap()
        .entries
        .remove(0);

    // Same label, another request, the victim's id as its mark.
    let response = service
        .ready()
        .await
        .unwrap()
        .call(send(
            "/other",
            "attacker-payload",
            Some(victim.id.to_string()),
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);

    let entries = store.list(ListQuery::default()).await.unwrap().entries;
    assert_eq!(
        entries.len(),
        2,
        "the second failure was not kept as itself"
    );
    assert_eq!(store.get(victim.id).await.unwrap().unwrap(), victim);
    let kept = entries.iter().find(|e| e.id != victim.id).unwrap();
    assert_eq!(kept.body, "attacker-payload");
    assert_eq!(kept.uri.as_deref(), Some("http://orders.internal/other"));
}
