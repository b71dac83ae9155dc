//! Durable enqueue throughput: entries per second acknowledged by the store.
//!
//! Every `put` measured here returns only after its entry is durable (redb
//! commit with `Durability::Immediate`), the same rule the layer relies on.
//! Each iteration enqueues `CONCURRENCY` entries from as many tasks at once,
//! as a busy service's failing calls would, so group commit has something to
//! batch:
//!
//! - `redb_group_commit`: the default store (up to 256 entries per commit);
//! - `redb_commit_per_entry`: `max_batch(1)`, one commit (one fsync) each;
//! - `memory`: the in-memory store, for reference;
//! - `layer_redb_group_commit`: the same through `DeadLetterLayer` over a
//!   failing service (capture, classify, redact, store).
//!
//! Run (the figures are in the crate's BENCHMARKS.md):
//! `cargo bench -p tower-poison --bench enqueue --no-run`, then the printed
//! binary with `--bench --warm-up-time 1 --measurement-time 3`.

use std::time::SystemTime;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use http::{Request, Response};
use http_body_util::Full;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_classify::{BoxError, FailureKind};
use tower_poison::store::{DeadLetterStore, MemoryStore, RedbStore};
use tower_poison::{DeadLetterEntry, DeadLetterLayer, ReplayBody, StoredHeader};

const CONCURRENCY: usize = 64;

fn entry() -> DeadLetterEntry {
    let mut entry = DeadLetterEntry::new(
        "orders",
        FailureKind::ServerError,
        vec!["HTTP 503 Service Unavailable".into()],
        SystemTime::now(),
    );
    entry.method = Some("POST".into());
    entry.uri = Some("http://orders.internal/orders".into());
    entry.headers.push(StoredHeader {
        name: "content-type".into(),
        value: "application/json".into(),
    });
    entry.body = vec![b'x'; 1024].into();
    entry.attempts = 3;
    entry
}

async fn enqueue_concurrently<St: DeadLetterStore>(store: &St) {
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.put(entry()).await.unwrap() })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // On the build disk, not a tmpfs: fsync must cost what it costs.
    let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();

    let mut group = c.benchmark_group("enqueue");
    group.throughput(Throughput::Elements(CONCURRENCY as u64));
    group.sample_size(10);

    let _guard = runtime.enter();
    // A run writes more entries than the default limits allow; the limits
    // are checked in the same transaction either way, so lifting them
    // measures the same commits.
    let unbounded = || {
        RedbStore::builder()
            .max_entries(u64::MAX)
            .max_bytes(u64::MAX)
    };
    let grouped = unbounded().open(dir.path().join("grouped.redb")).unwrap();
    group.bench_function("redb_group_commit", |b| {
        b.iter(|| runtime.block_on(enqueue_concurrently(&grouped)))
    });
    let single = unbounded()
        .max_batch(1)
        .open(dir.path().join("single.redb"))
        .unwrap();
    group.bench_function("redb_commit_per_entry", |b| {
        b.iter(|| runtime.block_on(enqueue_concurrently(&single)))
    });
    let memory = MemoryStore::new(usize::MAX);
    group.bench_function("memory", |b| {
        b.iter(|| runtime.block_on(enqueue_concurrently(&memory)))
    });

    let layered = unbounded().open(dir.path().join("layer.redb")).unwrap();
    let service = DeadLetterLayer::new(layered).layer(service_fn(
        |_req: Request<ReplayBody<Full<Bytes>>>| async {
            Ok::<_, BoxError>(Response::builder().status(503).body(Bytes::new()).unwrap())
        },
    ));
    group.bench_function("layer_redb_group_commit", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let calls: Vec<_> = (0..CONCURRENCY)
                    .map(|_| {
                        let mut service = service.clone();
                        tokio::spawn(async move {
                            let req = Request::post("http://orders.internal/orders")
                                .header("authorization", "Bearer secret")
                                .body(Full::new(Bytes::from(vec![b'x'; 1024])))
                                .unwrap();
                            service.ready().await.unwrap().call(req).await.unwrap()
                        })
                    })
                    .collect();
                for call in calls {
                    call.await.unwrap();
                }
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
