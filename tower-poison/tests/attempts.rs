//! `CountAttempts` counts a retry layer's attempts into the dead-letter call
//! above it on the same task, with nothing put into the request; a request
//! that carries an `AttemptCounter` is counted in it, across tasks too.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::retry::{Policy, RetryLayer};
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};
use tower_classify::BoxError;
use tower_poison::store::{DeadLetterStore, ListQuery, MemoryStore};
use tower_poison::{
    AttemptCounter, CountAttemptsLayer, DeadLetterEntry, DeadLetterLayer, ReplayBody,
};

type Body = ReplayBody<Full<Bytes>>;

/// Retries every result, `remaining` attempts in all, waiting `backoff`
/// before each retry (a paused clock makes the wait exact).
#[derive(Clone)]
struct Backoff {
    remaining: usize,
    backoff: Duration,
}

impl<B: Clone, Res> Policy<Request<B>, Res, BoxError> for Backoff {
    type Future = Pin<Box<dyn Future<Output = ()> + Send>>;

    fn retry(&mut self, _: &mut Request<B>, _: &mut Result<Res, BoxError>) -> Option<Self::Future> {
        (self.remaining > 1).then(|| {
            self.remaining -= 1;
            Box::pin(tokio::time::sleep(self.backoff)) as Self::Future
        })
    }

    fn clone_request(&mut self, request: &Request<B>) -> Option<Request<B>> {
        let mut copy = Request::new(request.body().clone());
        *copy.method_mut() = request.method().clone();
        *copy.uri_mut() = request.uri().clone();
        *copy.extensions_mut() = request.extensions().clone();
        Some(copy)
    }
}

fn request() -> Request<Full<Bytes>> {
    Request::put("http://orders.internal/orders/7")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

fn unavailable() -> Response<Bytes> {
    Response::builder()
        .status(StatusCode::SERVICE_UNAVAILABLE)
        .body(Bytes::new())
        .unwrap()
}

async fn only_entry(store: &MemoryStore) -> DeadLetterEntry {
    let mut entries = store.list(ListQuery::default()).await.unwrap().entries;
    assert_eq!(entries.len(), 1);
    entries.remove(0)
}

#[tokio::test(start_paused = true)]
async fn attempts_count_into_the_call_above_and_the_first_failure_is_the_first_attempts() {
    let store = MemoryStore::new(10);
    let first_ended = Arc::new(Mutex::new(None));
    let seen = Arc::clone(&first_ended);
    let service = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(RetryLayer::new(Backoff {
            remaining: 3,
            backoff: Duration::from_secs(5),
        }))
        .layer(CountAttemptsLayer::new())
        .service(service_fn(move |request: Request<Body>| {
            // The count travels in no extension: a retry copies nothing for it.
            assert!(request.extensions().get::<AttemptCounter>().is_none());
            let mut first_ended = seen.lock().unwrap();
            match *first_ended {
                None => *first_ended = Some(SystemTime::now()),
                // Entries keep milliseconds, and a paused tokio clock does
                // not move `SystemTime`: the last attempt ends 3 ms of wall
                // clock after the first, so that the two times differ.
                Some(first) => {
                    while SystemTime::now() < first + Duration::from_millis(3) {
                        std::hint::spin_loop();
                    }
                }
            }
            std::future::ready(Ok::<_, BoxError>(unavailable()))
        }));
    let response = service.oneshot(request()).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);

    let entry = only_entry(&store).await;
    assert_eq!(entry.attempts, 3);
    let first = first_ended.lock().unwrap().unwrap();
    let ms = Duration::from_millis(1);
    // When the first attempt ended (it waited out a backoff after it), not
    // when the call did.
    assert!(entry.first_failed_at <= first + ms, "{entry:?}");
    assert!(entry.first_failed_at + ms >= first);
    assert!(entry.last_failed_at >= first + 2 * ms);
}

#[tokio::test(start_paused = true)]
async fn a_dead_letter_call_inside_another_counts_its_own_attempts() {
    let outer_store = MemoryStore::new(10);
    let inner_store = MemoryStore::new(10);
    // outer DeadLetter → Retry (2) → CountAttempts → inner DeadLetter →
    // Retry (3) → CountAttempts → service.
    let inner = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(inner_store.clone()))
        .layer(RetryLayer::new(Backoff {
            remaining: 3,
            backoff: Duration::from_secs(1),
        }))
        .layer(CountAttemptsLayer::new())
        .service(service_fn(|_: Request<ReplayBody<Body>>| async {
            Ok::<_, BoxError>(unavailable())
        }));
    let service = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(outer_store.clone()))
        .layer(RetryLayer::new(Backoff {
            remaining: 2,
            backoff: Duration::from_secs(1),
        }))
        .layer(CountAttemptsLayer::new())
        .service(inner);
    service.oneshot(request()).await.unwrap();

    assert_eq!(only_entry(&outer_store).await.attempts, 2);
    let inner_entries = inner_store
        .list(ListQuery::default())
        .await
        .unwrap()
        .entries;
    assert_eq!(inner_entries.len(), 2, "one per outer attempt");
    assert!(inner_entries.iter().all(|entry| entry.attempts == 3));
}

/// A service that makes two attempts of each call on a task of its own, as
/// a `Buffer` worker does, through `CountAttempts`.
fn on_another_task() -> impl Service<
    Request<Body>,
    Response = Response<Bytes>,
    Error = BoxError,
    Future = impl Future<Output = Result<Response<Bytes>, BoxError>> + Send,
> + Clone {
    service_fn(|request: Request<Body>| async move {
        let attempts = tokio::spawn(async move {
            let mut counted =
                CountAttemptsLayer::new().layer(service_fn(|_: Request<Body>| async {
                    Ok::<_, BoxError>(unavailable())
                }));
            let mut last = None;
            for _ in 0..2 {
                let mut copy = Request::new(request.body().clone());
                *copy.extensions_mut() = request.extensions().clone();
                last = Some(counted.ready().await?.call(copy).await?);
            }
            Ok::<_, BoxError>(last.unwrap())
        });
        attempts.await?
    })
}

#[tokio::test(start_paused = true)]
async fn a_counter_in_the_request_counts_attempts_made_on_another_task() {
    let store = MemoryStore::new(10);
    let service = DeadLetterLayer::new(store.clone()).layer(on_another_task());

    // Without one the attempts on the other task are not seen: the entry
    // says one.
    service.clone().oneshot(request()).await.unwrap();
    assert_eq!(only_entry(&store).await.attempts, 1);
    store
        .purge(tower_poison::store::PurgeFilter::default())
        .await
        .unwrap();

    let mut carrying = request();
    carrying.extensions_mut().insert(AttemptCounter::default());
    service.oneshot(carrying).await.unwrap();
    assert_eq!(only_entry(&store).await.attempts, 2);
}
