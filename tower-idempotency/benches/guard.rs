//! What the idempotency guard costs per request, next to the same request
//! without a key (which passes through the guard unboxed), each call awaited
//! through a clone of the service on a current-thread runtime, the way axum
//! and hyper drive it:
//!
//! - `bare`: the handler alone, no guard;
//! - `passthrough`: a POST without `Idempotency-Key` through the guard;
//! - `memory_first_call`: a new key each time (claim, call with the request
//!   body hashed as it is read, record the response as it is read) with the
//!   in-memory store;
//! - `memory_replay`: a repeat, its body compared with the first's, answered
//!   from the in-memory store;
//! - `redis_first_call` / `redis_replay`: the same on the Redis store at
//!   `TOWER_IDEMPOTENCY_REDIS_URL` (default `redis://127.0.0.1:6379`; skipped
//!   when none answers). Every Redis step is a round trip, on loopback here.
//!
//! Run: `cargo bench -p tower-idempotency --features redis --bench guard`.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};
use tower_classify::BoxError;
use tower_idempotency::store::{IdempotencyStore, MemoryIdempotencyStore};
use tower_idempotency::{GuardBody, IdempotencyGuardLayer};

type Guarded = BoxCloneService<Request<Full<Bytes>>, Response<GuardBody<Full<Bytes>>>, BoxError>;

/// An order handler that reads the request and answers 201 with a 256-byte
/// body.
async fn create_order<B>(req: Request<B>) -> Result<Response<Full<Bytes>>, BoxError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let body = req
        .into_body()
        .collect()
        .await
        .map_err(Into::into)?
        .to_bytes();
    Ok(Response::builder()
        .status(201)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(vec![b'r'; 256 + body.len() % 2])))
        .unwrap())
}

/// The guard over the order handler.
fn guarded<St: IdempotencyStore>(layer: IdempotencyGuardLayer<St>) -> Guarded {
    BoxCloneService::new(layer.layer(service_fn(create_order::<GuardBody<Full<Bytes>>>)))
}

fn request(key: Option<String>) -> Request<Full<Bytes>> {
    let mut builder = Request::post("http://orders.internal/orders");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder
        .body(Full::new(Bytes::from(vec![b'q'; 256])))
        .unwrap()
}

async fn call(service: &Guarded, key: Option<String>) {
    let response = service.clone().oneshot(request(key)).await.unwrap();
    assert_eq!(response.status(), 201);
    response.into_body().collect().await.unwrap();
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let fresh = AtomicU64::new(0);
    let new_key = || Some(format!("bench-{}", fresh.fetch_add(1, Ordering::Relaxed)));

    let mut group = c.benchmark_group("idempotency");
    let bare = BoxCloneService::new(service_fn(create_order::<Full<Bytes>>));
    group.bench_function("bare", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let response = bare.clone().oneshot(request(None)).await.unwrap();
                response.into_body().collect().await.unwrap();
            })
        })
    });
    // Large enough that the first-call bench never fills it.
    let memory = guarded(IdempotencyGuardLayer::new(
        MemoryIdempotencyStore::new(10_000_000).with_max_bytes(usize::MAX),
    ));
    group.bench_function("passthrough", |b| {
        b.iter(|| runtime.block_on(call(&memory, None)))
    });
    group.bench_function("memory_first_call", |b| {
        b.iter(|| runtime.block_on(call(&memory, new_key())))
    });
    runtime.block_on(call(&memory, Some("bench-replay".into())));
    group.bench_function("memory_replay", |b| {
        b.iter(|| runtime.block_on(call(&memory, Some("bench-replay".into()))))
    });

    #[cfg(feature = "redis")]
    {
        use tower_idempotency::store::RedisIdempotencyStore;
        let url = std::env::var("TOWER_IDEMPOTENCY_REDIS_URL")
            .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
        let prefix = format!("tower-idempotency-bench:{:x}:", fastrand::u64(..));
        match runtime.block_on(RedisIdempotencyStore::builder().connect(&url, prefix)) {
            Ok(store) => {
                // Keys expire after a minute instead of the default day.
                let redis = guarded(
                    IdempotencyGuardLayer::new(store).ttl(std::time::Duration::from_secs(60)),
                );
                group.bench_function("redis_first_call", |b| {
                    b.iter(|| runtime.block_on(call(&redis, new_key())))
                });
                runtime.block_on(call(&redis, Some("bench-replay".into())));
                group.bench_function("redis_replay", |b| {
                    b.iter(|| runtime.block_on(call(&redis, Some("bench-replay".into()))))
                });
            }
            Err(error) => eprintln!("redis benches skipped: {error}"),
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
