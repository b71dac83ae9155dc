//! The whole stack against the sum of its layers, on the success path,
//! awaited the way a server drives a service: each call clones the service
//! and awaits `oneshot` (`ready()`, then `call()`) on a current-thread
//! tokio runtime, as axum and tonic do.
//!
//! With `ResilienceConfig::default()`:
//!
//! - `bare`: the service alone;
//! - `dead_letter`: `config.dead_letter_layer(MemoryStore)` over it;
//! - `breaker`: `config.breaker_builder().build(HttpClassifier::new())`;
//! - `retry`: `config.retry_builder().build()`;
//! - `stack`: `config.layer("bench", MemoryStore)`, DeadLetter →
//!   CircuitBreaker → Retry (the retry layer reports its attempts to the
//!   dead-letter call itself).
//!
//! Each for a small `GET` and a `POST` with a 300-byte JSON body, built
//! inside every iteration (bare included) so the request's cost cancels
//! out of each overhead (variant − bare). The service reads the request
//! body to its end; the response is dropped the same way everywhere. The
//! figure to read is `(stack − bare) / Σ(layer − bare)`.
//!
//! Run (figures and the instruction-count command: the crate's BENCHMARKS.md):
//! `cargo bench -p tower-steadfast --bench stack -- --warm-up-time 1 --measurement-time 3`.

use bench_support::{bench, count_spec, drive, Handler};
use criterion::{criterion_group, Criterion};
use tower::Layer;
use tower_classify::HttpClassifier;
use tower_poison::store::MemoryStore;
use tower_steadfast::ResilienceConfig;

fn stack(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let config = ResilienceConfig::default();
    bench(c, &runtime, "bare", Handler);
    let dead_letter = config.dead_letter_layer(MemoryStore::new(10_000));
    bench(c, &runtime, "dead_letter", dead_letter.layer(Handler));
    let breaker = config
        .breaker_builder()
        .build(HttpClassifier::new())
        .unwrap();
    bench(c, &runtime, "breaker", breaker.layer(Handler));
    let retry = config.retry_builder().build().unwrap();
    bench(c, &runtime, "retry", retry.layer(Handler));
    let stack = config.layer("bench", MemoryStore::new(10_000));
    bench(c, &runtime, "stack", stack.layer(Handler));
}

criterion_group!(benches, stack);

/// `BENCH_COUNT=<variant>,<GET|POST>,<calls>` makes that many calls of one
/// variant and exits, for `benches/count_instructions.sh` (instructions
/// repeat exactly from run to run, unlike time on a shared machine).
fn main() {
    if let Ok(spec) = std::env::var("BENCH_COUNT") {
        count(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}

fn count(spec: &str) {
    let (variant, request, calls) = count_spec(spec);
    let config = ResilienceConfig::default();
    match variant {
        "bare" => drive(Handler, request, calls),
        "dead_letter" => drive(
            config
                .dead_letter_layer(MemoryStore::new(10_000))
                .layer(Handler),
            request,
            calls,
        ),
        "breaker" => drive(
            config
                .breaker_builder()
                .build(HttpClassifier::new())
                .unwrap()
                .layer(Handler),
            request,
            calls,
        ),
        "retry" => drive(
            config.retry_builder().build().unwrap().layer(Handler),
            request,
            calls,
        ),
        "stack" => drive(
            config
                .layer("bench", MemoryStore::new(10_000))
                .layer(Handler),
            request,
            calls,
        ),
        other => panic!("no variant {other:?}"),
    }
}
