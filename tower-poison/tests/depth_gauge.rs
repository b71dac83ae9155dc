//! The depth gauge comes from the write itself: a dead-lettered call costs
//! the store one `put`, not a `put` and a `depth` query.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tower::{service_fn, Layer, ServiceExt};
use tower_classify::BoxError;
use tower_poison::store::{DeadLetterStore, ListQuery, MemoryStore, Page, PurgeFilter, StoreError};
use tower_poison::{Claim, ClaimToken, DeadLetterEntry, DeadLetterLayer, EntryId, ReplayBody};

/// A memory store that counts `depth` queries.
#[derive(Clone)]
struct CountingDepth {
    inner: MemoryStore,
    depth_queries: Arc<AtomicUsize>,
}

impl DeadLetterStore for CountingDepth {
    async fn put(&self, entry: DeadLetterEntry) -> Result<(), StoreError> {
        self.inner.put(entry).await
    }
    async fn put_with_depth(&self, entry: DeadLetterEntry) -> Result<Option<u64>, StoreError> {
        self.inner.put_with_depth(entry).await
    }
    async fn get(&self, id: EntryId) -> Result<Option<DeadLetterEntry>, StoreError> {
        self.inner.get(id).await
    }
    async fn list(&self, query: ListQuery) -> Result<Page, StoreError> {
        self.inner.list(query).await
    }
    async fn remove(&self, id: EntryId) -> Result<bool, StoreError> {
        self.inner.remove(id).await
    }
    async fn purge(&self, filter: PurgeFilter) -> Result<u64, StoreError> {
        self.inner.purge(filter).await
    }
    async fn claim(
        &self,
        id: EntryId,
        now: SystemTime,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.inner.claim(id, now, lease).await
    }
    async fn release(&self, id: EntryId, token: ClaimToken) -> Result<(), StoreError> {
        self.inner.release(id, token).await
    }
    async fn depth(&self) -> Result<u64, StoreError> {
        self.depth_queries.fetch_add(1, Ordering::SeqCst);
        self.inner.depth().await
    }
    async fn oldest_age(&self, now: SystemTime) -> Result<Option<Duration>, StoreError> {
        self.inner.oldest_age(now).await
    }
}

#[test]
fn the_depth_gauge_is_set_from_the_put_without_a_depth_query() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let store = CountingDepth {
        inner: MemoryStore::new(100),
        depth_queries: Arc::new(AtomicUsize::new(0)),
    };
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(async {
                let dlq = DeadLetterLayer::new(store.clone())
                    .label("gauge")
                    .layer(service_fn(|_: Request<ReplayBody<Full<Bytes>>>| async {
                        Ok::<_, BoxError>(
                            Response::builder().status(500).body(Bytes::new()).unwrap(),
                        )
                    }));
                for _ in 0..3 {
                    let request = Request::post("http://x/").body(Full::default()).unwrap();
                    assert_eq!(dlq.clone().oneshot(request).await.unwrap().status(), 500);
                }
            })
    });
    assert_eq!(store.depth_queries.load(Ordering::SeqCst), 0);
    let gauge = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find_map(|(key, _, _, value)| match value {
            DebugValue::Gauge(depth) if key.key().name() == "tower_poison_dlq_depth" => {
                Some(depth.into_inner())
            }
            _ => None,
        });
    assert_eq!(gauge, Some(3.0));
}
