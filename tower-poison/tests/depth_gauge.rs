//! The depth gauge comes from the write itself: a dead-lettered call costs
//! the store one `put`, not a `put` and a `depth` query; and it is the depth
//! of the layer's own label, whatever other layers share the store.

#[cfg(feature = "redis")]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tower::{service_fn, Layer, Service, ServiceExt};
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

/// The `tower_poison_dlq_depth` gauges in `snapshotter` set since the last
/// snapshot, merged into `gauges` (a snapshot resets the gauges it reads to
/// zero, and no depth this test reads is zero).
fn depth_gauges(
    snapshotter: &metrics_util::debugging::Snapshotter,
    gauges: &mut std::collections::BTreeMap<String, f64>,
) -> std::collections::BTreeMap<String, f64> {
    let fresh: Vec<(String, f64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Gauge(depth) if key.key().name() == "tower_poison_dlq_depth" => {
                let label = key
                    .key()
                    .labels()
                    .find(|label| label.key() == "label")?
                    .value()
                    .to_owned();
                Some((label, depth.into_inner())).filter(|(_, depth)| *depth != 0.0)
            }
            _ => None,
        })
        .collect();
    gauges.extend(fresh);
    gauges.clone()
}

/// The body of a dead-letter layer's answer.
type Answer = tower_poison::SettleBody<Bytes, tower_poison::OpenCall>;

/// A layer labelled `label` over `store` whose every call fails with a 500.
fn failing<St: DeadLetterStore>(
    store: St,
    label: &'static str,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<Answer>,
    Error = BoxError,
    Future: Send,
> + Clone {
    DeadLetterLayer::new(store).label(label).layer(service_fn(
        |_: Request<ReplayBody<Full<Bytes>>>| async {
            Ok::<_, BoxError>(Response::builder().status(500).body(Bytes::new()).unwrap())
        },
    ))
}

async fn fail(
    mut service: impl Service<Request<Full<Bytes>>, Response = Response<Answer>, Error = BoxError>,
    times: usize,
) {
    for _ in 0..times {
        let request = Request::post("http://x/").body(Full::default()).unwrap();
        let response = service.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(response.status(), 500);
    }
}

/// Two layers with different labels on one store each report their own
/// depth; a removal counts when the label's next entry is written, and a
/// third label on another store of the same kind starts from zero.
fn two_labels_on_one_store_report_their_own_depths<St, Open>(open: impl FnOnce() -> Open)
where
    St: DeadLetterStore,
    Open: std::future::Future<Output = St>,
{
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let seen = metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let store = open().await;
                let mut gauges = std::collections::BTreeMap::new();
                fail(failing(store.clone(), "orders"), 3).await;
                fail(failing(store.clone(), "billing"), 1).await;
                let first = depth_gauges(&snapshotter, &mut gauges);

                let orders = store
                    .list(ListQuery {
                        label: Some("orders".into()),
                        ..ListQuery::default()
                    })
                    .await
                    .unwrap()
                    .entries;
                assert!(store.remove(orders[0].id).await.unwrap());
                fail(failing(store.clone(), "orders"), 1).await;
                let after_remove = depth_gauges(&snapshotter, &mut gauges);

                // A replacement that moves an entry to another label moves
                // its count.
                let mut moved = orders[1].clone();
                moved.label = "billing".into();
                assert_eq!(store.put_with_depth(moved).await.unwrap(), Some(2));
                fail(failing(store.clone(), "orders"), 1).await;
                let after_move = depth_gauges(&snapshotter, &mut gauges);

                store.purge(PurgeFilter::default()).await.unwrap();
                fail(failing(store.clone(), "billing"), 1).await;
                let after_purge = depth_gauges(&snapshotter, &mut gauges);
                let stats = store.stats(SystemTime::now()).await.unwrap();
                (first, after_remove, after_move, after_purge, stats)
            })
    });
    let (first, after_remove, after_move, after_purge, stats) = seen;
    let gauges = |pairs: &[(&str, f64)]| {
        pairs
            .iter()
            .map(|(label, depth)| (label.to_string(), *depth))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    assert_eq!(first, gauges(&[("billing", 1.0), ("orders", 3.0)]));
    assert_eq!(after_remove, gauges(&[("billing", 1.0), ("orders", 3.0)]));
    // The move went straight to the store (it returned billing's 2): the
    // billing gauge is untouched, and orders' next entry counts 3, not 4.
    assert_eq!(after_move, gauges(&[("billing", 1.0), ("orders", 3.0)]));
    assert_eq!(after_purge["billing"], 1.0);
    assert_eq!(stats.by_label.get("billing"), Some(&1));
    assert_eq!(stats.by_label.get("orders"), None);
}

#[test]
fn memory_store_depth_is_per_label() {
    two_labels_on_one_store_report_their_own_depths(|| async { MemoryStore::new(100) });
}

#[cfg(feature = "redb")]
#[test]
fn redb_store_depth_is_per_label() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dlq.redb");
    two_labels_on_one_store_report_their_own_depths(|| async {
        tower_poison::store::RedbStore::builder()
            .open(&path)
            .unwrap()
    });
}

/// A redb file written before there were label counts gets them when it is
/// opened: the counts cover its older entries too.
#[cfg(feature = "redb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_label_counts_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dlq.redb");
    let entry = |label: &str| {
        DeadLetterEntry::new(
            label,
            tower_classify::FailureKind::ServerError,
            vec![],
            SystemTime::now(),
        )
    };
    {
        let store = tower_poison::store::RedbStore::builder()
            .open(&path)
            .unwrap();
        for label in ["a", "a", "b"] {
            store.put(entry(label)).await.unwrap();
        }
    }
    let store = tower_poison::store::RedbStore::builder()
        .open(&path)
        .unwrap();
    assert_eq!(store.put_with_depth(entry("a")).await.unwrap(), Some(3));
    assert_eq!(store.put_with_depth(entry("b")).await.unwrap(), Some(2));
}

#[cfg(feature = "redis")]
#[test]
fn redis_store_depth_is_per_label() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let Some(url) = runtime.block_on(support::shared_redis()) else {
        return;
    };
    let name = support::unique("label-depths");
    let _cleanup = support::Cleanup::queue(&url, &name);
    drop(runtime);
    // Connected inside the test's runtime, where the connection manager's
    // task then runs.
    two_labels_on_one_store_report_their_own_depths(|| async move {
        tower_poison::store::RedisDeadLetterStore::builder()
            .connect(&url, name)
            .await
            .unwrap()
    });
}
