//! The dead-letter layer's success path, measured the way a server drives a
//! service: each call clones the service and awaits `oneshot` (`ready()`,
//! then `call()`) on a current-thread tokio runtime, as axum and tonic do.
//!
//! - `bare`: the service alone;
//! - `dead_letter`: `DeadLetterLayer::new` over a `MemoryStore` (every
//!   failure kind stored);
//! - `for_server`: `DeadLetterLayer::for_server` over a `MemoryStore`.
//!
//! Each for a small `GET` (no body) and a small `POST` (a 300-byte JSON
//! body), both with the few headers a client sends. The request is built
//! inside every iteration, bare included, so its cost cancels out of the
//! overhead (layer − bare); the service reads the request body to its end
//! and the response is dropped the same way in every variant.
//!
//! Run (the figures are in the crate's BENCHMARKS.md):
//! `cargo bench -p tower-poison --bench success_path -- --warm-up-time 1 --measurement-time 3`.

use bench_support::{bench, count_spec, drive, Handler};
use criterion::{criterion_group, Criterion};
use tower::Layer;
use tower_poison::store::MemoryStore;
use tower_poison::DeadLetterLayer;

fn success_path(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    bench(c, &runtime, "bare", Handler);
    let layer = DeadLetterLayer::new(MemoryStore::new(10_000));
    bench(c, &runtime, "dead_letter", layer.layer(Handler));
    let layer = DeadLetterLayer::for_server(MemoryStore::new(10_000));
    bench(c, &runtime, "for_server", layer.layer(Handler));
}

criterion_group!(benches, success_path);

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
    match variant {
        "bare" => drive(Handler, request, calls),
        "dead_letter" => drive(
            DeadLetterLayer::new(MemoryStore::new(10_000)).layer(Handler),
            request,
            calls,
        ),
        "for_server" => drive(
            DeadLetterLayer::for_server(MemoryStore::new(10_000)).layer(Handler),
            request,
            calls,
        ),
        other => panic!("no variant {other:?}"),
    }
}
