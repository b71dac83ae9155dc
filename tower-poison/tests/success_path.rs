//! A call that succeeds costs the dead-letter layer nothing it would only
//! need on failure: two allocations, for what a failure's entry could not
//! be written without (counted by an allocator that counts the test
//! thread's allocations), no store call, no metric and no log event. Each rule is shown next to a failing call
//! that does allocate, write, count and log, so the counters are known to
//! count.

use std::convert::Infallible;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use bench_support::alloc::{allocations, Counting};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::Full;
use metrics_util::debugging::DebuggingRecorder;
use tower::{Layer, Service};
use tower_poison::store::{DeadLetterStore, ListQuery, MemoryStore, Page, PurgeFilter, StoreError};
use tower_poison::{Claim, ClaimToken, DeadLetterEntry, DeadLetterLayer, EntryId};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Answers with `status` at once, after reading the request body to its end
/// (the bodies here are in memory, so a no-op waker reads them whole).
#[derive(Clone, Copy)]
struct Answer(StatusCode);

impl<B: Body + Unpin> Service<Request<B>> for Answer {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let mut body = request.into_body();
        let mut cx = Context::from_waker(Waker::noop());
        while let Poll::Ready(Some(Ok(_))) = Pin::new(&mut body).poll_frame(&mut cx) {}
        assert!(body.is_end_stream(), "the handler read the body whole");
        let mut response = Response::new(Full::new(Bytes::from_static(b"ok")));
        *response.status_mut() = self.0;
        std::future::ready(Ok(response))
    }
}

fn get() -> Request<Full<Bytes>> {
    Request::get("http://orders.internal/orders/7?expand=lines")
        .header("accept", "application/json")
        .header("x-request-id", "0b6c9f3e")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn post() -> Request<Full<Bytes>> {
    Request::post("http://orders.internal/orders")
        .header("content-type", "application/json")
        .header("x-request-id", "0b6c9f3e")
        .body(Full::new(Bytes::from_static(&[b'x'; 300])))
        .unwrap()
}

/// Polls one call through `service` to its end: it must be ready at once.
fn call_through<S, B>(
    service: &mut S,
    request: Request<Full<Bytes>>,
) -> Result<StatusCode, S::Error>
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
{
    let mut cx = Context::from_waker(Waker::noop());
    assert!(service.poll_ready(&mut cx).is_ready());
    let future = pin!(service.call(request));
    match future.poll(&mut cx) {
        Poll::Ready(result) => result.map(|response| response.status()),
        Poll::Pending => panic!("the call is ready at once"),
    }
}

/// Allocations the layer makes for one successful call of each request, on
/// top of what the bare service makes.
fn success_allocations<S, B>(mut layered: S) -> Vec<usize>
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    let mut bare = Answer(StatusCode::OK);
    [get as fn() -> _, post]
        .into_iter()
        .map(|request| {
            // Built outside the count: the request is the caller's.
            let (bare_made, status) = {
                let request = request();
                allocations(|| call_through(&mut bare, request).unwrap())
            };
            assert_eq!(status, StatusCode::OK);
            assert_eq!(bare_made, 0, "the bare service allocates nothing");
            let request = request();
            let (made, status) = allocations(|| call_through(&mut layered, request).unwrap());
            assert_eq!(status, StatusCode::OK);
            made - bare_made
        })
        .collect()
}

/// The allocations a successful call costs the layer, for a `GET` and a
/// `POST`, both with headers: what the entry of a failure needs and cannot
/// get back from the request once the inner service has it. One buffer
/// holding a copy of the URI and the headers, and for the `POST` the body's
/// recording (the `Arc` a `ReplayBody` shares between its copies; the
/// `GET`'s body had ended, and an ended body needs none). No boxed future,
/// no request extension, no formatting or redaction.
const SUCCESS_ALLOCATIONS: [usize; 2] = [1, 2];

/// The two tests run one at a time: tracing caches each callsite's
/// interest process-wide, so a callsite first reached by the other test's
/// thread (with no subscriber) would stay silent for this one's scoped
/// subscriber; the allocation count wants no other thread allocating, too.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_call_that_succeeds_allocates_only_the_body_recording_and_a_copy_of_the_head() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let store = MemoryStore::new(100);
    let layered = DeadLetterLayer::new(store.clone()).layer(Answer(StatusCode::OK));
    assert_eq!(success_allocations(layered), SUCCESS_ALLOCATIONS);
    let for_server = DeadLetterLayer::for_server(store.clone()).layer(Answer(StatusCode::OK));
    assert_eq!(success_allocations(for_server), SUCCESS_ALLOCATIONS);

    // The counter counts: a call that fails builds and stores an entry.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let mut failing = DeadLetterLayer::new(store.clone()).layer(Answer(StatusCode::BAD_GATEWAY));
    let request = post();
    let (made, status) = allocations(|| call_through(&mut failing, request).unwrap());
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert!(made > 10, "an entry was built: {made} allocations");
    assert_eq!(
        runtime.block_on(store.depth()).unwrap(),
        1,
        "only the failed call was stored"
    );
}

/// A memory store that counts every call made to it.
#[derive(Clone)]
struct CountingStore {
    inner: MemoryStore,
    calls: Arc<AtomicUsize>,
}

impl CountingStore {
    fn count(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

impl DeadLetterStore for CountingStore {
    async fn put(&self, entry: DeadLetterEntry) -> Result<(), StoreError> {
        self.count();
        self.inner.put(entry).await
    }
    async fn put_with_depth(&self, entry: DeadLetterEntry) -> Result<Option<u64>, StoreError> {
        self.count();
        self.inner.put_with_depth(entry).await
    }
    async fn get(&self, id: EntryId) -> Result<Option<DeadLetterEntry>, StoreError> {
        self.count();
        self.inner.get(id).await
    }
    async fn list(&self, query: ListQuery) -> Result<Page, StoreError> {
        self.count();
        self.inner.list(query).await
    }
    async fn remove(&self, id: EntryId) -> Result<bool, StoreError> {
        self.count();
        self.inner.remove(id).await
    }
    async fn purge(&self, filter: PurgeFilter) -> Result<u64, StoreError> {
        self.count();
        self.inner.purge(filter).await
    }
    async fn claim(
        &self,
        id: EntryId,
        now: SystemTime,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.count();
        self.inner.claim(id, now, lease).await
    }
    async fn release(&self, id: EntryId, token: ClaimToken) -> Result<(), StoreError> {
        self.count();
        self.inner.release(id, token).await
    }
    async fn depth(&self) -> Result<u64, StoreError> {
        self.count();
        self.inner.depth().await
    }
    async fn oldest_age(&self, now: SystemTime) -> Result<Option<Duration>, StoreError> {
        self.count();
        self.inner.oldest_age(now).await
    }
}

/// A `tracing` subscriber that counts the events and spans it is given.
#[derive(Clone, Default)]
struct CountingSubscriber {
    seen: Arc<AtomicUsize>,
}

impl tracing::Subscriber for CountingSubscriber {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        self.seen.fetch_add(1, Ordering::SeqCst);
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {
        self.seen.fetch_add(1, Ordering::SeqCst);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn a_call_that_succeeds_touches_no_store_metric_or_log() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let store = CountingStore {
        inner: MemoryStore::new(100),
        calls: Arc::default(),
    };
    let subscriber = CountingSubscriber::default();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // Built outside the recorder: building a layer describes the metrics.
    let mut ok = DeadLetterLayer::new(store.clone()).layer(Answer(StatusCode::OK));
    let mut failing = DeadLetterLayer::new(store.clone()).layer(Answer(StatusCode::BAD_GATEWAY));

    let observed = |service: &mut dyn FnMut() -> StatusCode| {
        tracing::subscriber::with_default(subscriber.clone(), || {
            // Interest cached while no subscriber was set is asked again.
            tracing::callsite::rebuild_interest_cache();
            metrics::with_local_recorder(&recorder, service)
        })
    };
    for request in [get as fn() -> _, post] {
        let status = observed(&mut || call_through(&mut ok, request()).unwrap());
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(store.calls.load(Ordering::SeqCst), 0, "no store call");
    assert!(snapshotter.snapshot().into_vec().is_empty(), "no metric");
    assert_eq!(
        subscriber.seen.load(Ordering::SeqCst),
        0,
        "no event or span"
    );

    // The counters count: a failed call is stored, counted and logged.
    let _entered = runtime.enter();
    let status = observed(&mut || call_through(&mut failing, post()).unwrap());
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(store.calls.load(Ordering::SeqCst), 1, "one put");
    assert!(!snapshotter.snapshot().into_vec().is_empty());
    assert!(subscriber.seen.load(Ordering::SeqCst) > 0);
}
