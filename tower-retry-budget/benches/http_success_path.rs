//! The success path of an HTTP retry, side by side with tower's: what each
//! costs a request that succeeds at once, awaited the way a server drives a
//! service (clone, `oneshot` on a current-thread runtime).
//!
//! - `bare`: the service alone (it reads the body to its end);
//! - `tower_retry_budget`: `RetryLayer::http_builder()` with a `TpsBudget`;
//! - `tower_retry`: tower's `Retry` with a `TpsBudget` policy whose
//!   `clone_request` copies the request the usual way (method, URI,
//!   version, headers, extensions and the body: `http::Request` is not
//!   `Clone`), made for every request as tower's `Retry` does.
//!
//! A small `GET` and a `POST` with a 300-byte JSON body, built inside every
//! iteration, bare included. A POST without an `Idempotency-Key` is never
//! retried by ours (it keeps nothing); tower's policy here copies every
//! request, as a policy that does not look at the method does.
//!
//! Run: `cargo bench -p tower-retry-budget --bench http_success_path -- --warm-up-time 1 --measurement-time 3`;
//! instructions: `bash tower-retry-budget/benches/count_instructions.sh http`.

use std::sync::Arc;

use bench_support::{bench, count_spec, drive, Handler};
use bytes::Bytes;
use criterion::{criterion_group, Criterion};
use http::Request;
use http_body_util::Full;
use tower::retry::budget::{Budget, TpsBudget};
use tower::retry::Retry;
use tower::Layer;
use tower_retry_budget::RetryLayer;

/// tower's budget policy over HTTP requests.
#[derive(Clone)]
struct TowerHttpPolicy {
    budget: Arc<TpsBudget>,
}

impl<Res, E> tower::retry::Policy<Request<Full<Bytes>>, Res, E> for TowerHttpPolicy {
    type Future = std::future::Ready<()>;

    fn retry(
        &mut self,
        _: &mut Request<Full<Bytes>>,
        result: &mut Result<Res, E>,
    ) -> Option<Self::Future> {
        match result {
            Ok(_) => {
                self.budget.deposit();
                None
            }
            Err(_) => self.budget.withdraw().then(|| std::future::ready(())),
        }
    }

    fn clone_request(&mut self, request: &Request<Full<Bytes>>) -> Option<Request<Full<Bytes>>> {
        let mut copy = Request::new(request.body().clone());
        *copy.method_mut() = request.method().clone();
        *copy.uri_mut() = request.uri().clone();
        *copy.version_mut() = request.version();
        *copy.headers_mut() = request.headers().clone();
        *copy.extensions_mut() = request.extensions().clone();
        Some(copy)
    }
}

fn ours() -> tower_retry_budget::Retry<
    Handler,
    tower_classify::HttpClassifier,
    tower_retry_budget::replay::HttpReplay,
> {
    RetryLayer::http_builder()
        .budget(std::sync::Arc::new(
            tower_retry_budget::budget::TpsBudget::default(),
        ))
        .build()
        .unwrap()
        .layer(Handler)
}

fn towers() -> Retry<TowerHttpPolicy, Handler> {
    let budget = Arc::new(TpsBudget::default());
    Retry::new(TowerHttpPolicy { budget }, Handler)
}

fn http_success_path(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    bench(c, &runtime, "http/bare", Handler);
    bench(c, &runtime, "http/tower_retry_budget", ours());
    bench(c, &runtime, "http/tower_retry", towers());
}

criterion_group!(benches, http_success_path);

/// `BENCH_COUNT=<bare|ours|tower>,<GET|POST>,<calls>`: that many calls of
/// one case, then exit, for `benches/count_instructions.sh http`.
fn main() {
    if let Ok(spec) = std::env::var("BENCH_COUNT") {
        let (case, request, calls) = count_spec(&spec);
        match case {
            "bare" => drive(Handler, request, calls),
            "ours" => drive(ours(), request, calls),
            "tower" => drive(towers(), request, calls),
            other => panic!("case is bare, ours or tower, not {other:?}"),
        }
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
