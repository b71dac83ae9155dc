//! Retry budgets through the layer: a full outage cannot turn into a retry storm.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower::{Layer, ServiceExt};
use tower_classify::BoxError;
use tower_retry_budget::backoff::Backoff;
use tower_retry_budget::budget::{Budget, TokenBucketBudget, TpsBudget};
use tower_retry_budget::error::BudgetExhausted;
use tower_retry_budget::RetryLayer;

/// Counts calls; every call fails with a connection reset (a full outage).
#[derive(Clone, Default)]
struct Outage {
    calls: Arc<AtomicUsize>,
}

impl tower::Service<u32> for Outage {
    type Response = ();
    type Error = BoxError;
    type Future = std::future::Ready<Result<(), BoxError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: u32) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Err(io::Error::from(io::ErrorKind::ConnectionReset).into()))
    }
}

struct Storm {
    requests: usize,
    calls: usize,
    exhausted: usize,
}

impl Storm {
    fn retries(&self) -> usize {
        self.calls - self.requests
    }
}

/// Sends `requests` requests, one every `interval`, through a layer with
/// `max_retries` 3, no backoff, and `budget`.
async fn storm(
    budget: Option<Arc<dyn Budget + Send + Sync>>,
    requests: usize,
    interval: Duration,
) -> Storm {
    let outage = Outage::default();
    let builder = RetryLayer::builder()
        .max_retries(3)
        .backoff(Backoff::none());
    let builder = match budget {
        Some(budget) => builder.budget(budget),
        None => builder.no_budget(),
    };
    let service = builder.build().unwrap().layer(outage.clone());
    let mut exhausted = 0;
    for i in 0..requests {
        let err = service.clone().oneshot(i as u32).await.unwrap_err();
        if err.is::<BudgetExhausted>() {
            exhausted += 1;
        } else {
            assert!(err.is::<io::Error>(), "{err}");
        }
        tokio::time::advance(interval).await;
    }
    Storm {
        requests,
        calls: outage.calls.load(Ordering::SeqCst),
        exhausted,
    }
}

/// A full outage for 30 s at 100 requests/s with a 20 % budget (10 s ttl,
/// floor 1 retry/s): retries ≤ 20 % × 3000 + 1/s × (30 s + 10 s ttl) = 640,
/// where `max_retries` alone would allow 9000.
#[tokio::test(start_paused = true)]
async fn a_20_percent_budget_caps_retries_under_a_full_outage() {
    let budget = Arc::new(TpsBudget::new(Duration::from_secs(10), 1, 0.2).unwrap());
    let with_budget = storm(Some(budget), 3000, Duration::from_millis(10)).await;
    let bound = 3000 / 5 + 40;
    println!(
        "full outage, 3000 requests: {} retries, {} budget-exhausted errors",
        with_budget.retries(),
        with_budget.exhausted
    );
    assert!(
        with_budget.retries() <= bound,
        "{} retries for 3000 requests, bound {bound}",
        with_budget.retries()
    );
    // The budget is really 20 %, not far less: most of it is used.
    assert!(
        with_budget.retries() >= 570,
        "{} retries",
        with_budget.retries()
    );
    // Requests the budget refused end with the distinct error.
    assert!(with_budget.exhausted >= 3000 - with_budget.retries());

    let unbounded = storm(None, 3000, Duration::from_millis(10)).await;
    assert_eq!(unbounded.retries(), 9000);
}

#[tokio::test(start_paused = true)]
async fn a_token_bucket_stops_retries_below_half() {
    let budget = Arc::new(TokenBucketBudget::new(10, 0.1).unwrap());
    let result = storm(Some(budget.clone()), 1000, Duration::from_millis(10)).await;
    // 10 tokens: retries while more than 5 remain, then each request's 0.1
    // never outweighs the failed attempt's 1.
    assert!(result.retries() <= 5, "{} retries", result.retries());
    assert!(result.retries() >= 4);
    assert!(budget.tokens() <= 5.0);
}

/// Tower issue 857 through the layer: a 0.6 budget allows 60 % of requests
/// as retries. Tower's own `TpsBudget` (accepted by this layer too, through
/// the shared `Budget` trait) truncates 0.6 to 1.0 and allows all of them.
#[tokio::test(start_paused = true)]
async fn fractional_percent_is_honoured_through_the_layer() {
    let ours: Arc<dyn Budget + Send + Sync> =
        Arc::new(TpsBudget::new(Duration::from_secs(10), 0, 0.6).unwrap());
    let towers: Arc<dyn Budget + Send + Sync> = Arc::new(tower::retry::budget::TpsBudget::new(
        Duration::from_secs(10),
        0,
        0.6,
    ));

    let run = |budget| async move {
        let outage = Outage::default();
        let service = RetryLayer::builder()
            .max_retries(1)
            .backoff(Backoff::none())
            .budget(budget)
            .build()
            .unwrap()
            .layer(outage.clone());
        for i in 0..1000 {
            service.clone().oneshot(i).await.unwrap_err();
        }
        outage.calls.load(Ordering::SeqCst) - 1000
    };
    let ours = run(ours).await;
    assert!((599..=600).contains(&ours), "{ours} retries at 0.6");
    assert_eq!(run(towers).await, 1000, "tower's budget behaves as 1.0");
}
