//! Properties of the retry loop over random scripts of outcomes, on paused time.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_classify::{BoxError, Classified, Failure, FailureKind, RetryHint};
use tower_retry_budget::backoff::{Backoff, Jitter};
use tower_retry_budget::error::{DeadlineExceeded, WaitTooLong};
use tower_retry_budget::RetryLayer;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    Ok,
    /// A connection reset: transient.
    Transient,
    /// Invalid data: rejected, never retried.
    Rejected,
    /// Rate limited with a server-requested wait (ms).
    Hint(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => Just(Step::Ok),
        5 => Just(Step::Transient),
        1 => Just(Step::Rejected),
        2 => (0u64..400).prop_map(Step::Hint),
    ]
}

fn answer(step: Step) -> Result<u32, BoxError> {
    match step {
        Step::Ok => Ok(7),
        Step::Transient => Err(io::Error::from(io::ErrorKind::ConnectionReset).into()),
        Step::Rejected => Err(io::Error::from(io::ErrorKind::InvalidData).into()),
        Step::Hint(ms) => Err(Box::new(Classified::new(
            Failure::new(FailureKind::RateLimited)
                .with_hint(RetryHint::After(Duration::from_millis(ms))),
            "slow down",
        ))),
    }
}

fn retryable(step: Step) -> bool {
    matches!(step, Step::Transient | Step::Hint(_))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_loop_obeys_its_limits(
        script in proptest::collection::vec(step(), 1..20),
        max_retries in 0u32..8,
        latency in 0u64..300,
        delay in 0u64..200,
        deadline in proptest::option::of(100u64..3000),
        jitter in prop_oneof![Just(Jitter::None), Just(Jitter::Full), Just(Jitter::Equal), Just(Jitter::Proportional { low: 0.5, high: 1.5 })],
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            let calls: Arc<Mutex<Vec<Instant>>> = Arc::default();
            let seen = calls.clone();
            let script_for_service = script.clone();
            let service = tower::service_fn(move |_: ()| {
                let n = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(Instant::now());
                    seen.len() - 1
                };
                let step = script_for_service.get(n).copied().unwrap_or(Step::Transient);
                async move {
                    tokio::time::sleep(Duration::from_millis(latency)).await;
                    answer(step)
                }
            });
            let mut builder = RetryLayer::builder()
                .max_retries(max_retries)
                .backoff(Backoff::exponential(Duration::from_millis(delay)).with_jitter(jitter))
                .no_budget();
            if let Some(ms) = deadline {
                builder = builder.deadline(Duration::from_millis(ms));
            }
            let start = Instant::now();
            let result = builder.build().unwrap().layer(service).oneshot(()).await;
            let elapsed = start.elapsed();
            let calls = calls.lock().unwrap().clone();
            let steps: Vec<Step> = (0..calls.len())
                .map(|i| script.get(i).copied().unwrap_or(Step::Transient))
                .collect();

            // Never more than max_retries + 1 attempts.
            prop_assert!(calls.len() as u32 <= max_retries + 1);
            // Never past the deadline.
            if let Some(ms) = deadline {
                prop_assert!(elapsed <= Duration::from_millis(ms), "{elapsed:?} > {ms} ms");
            }
            // Only retryable failures are retried.
            for step in &steps[..steps.len() - 1] {
                prop_assert!(retryable(*step), "retried after {step:?}");
            }
            // A server's wait replaces the backoff exactly.
            for (i, pair) in calls.windows(2).enumerate() {
                if let Step::Hint(ms) = steps[i] {
                    prop_assert_eq!(pair[1] - pair[0], Duration::from_millis(latency + ms));
                }
            }
            // The result is the last attempt's, unless the layer ended the loop itself.
            let last = *steps.last().unwrap();
            match result {
                Ok(value) => {
                    prop_assert_eq!(value, 7);
                    prop_assert_eq!(last, Step::Ok);
                }
                Err(err) if err.is::<DeadlineExceeded>() || err.is::<WaitTooLong>() => {
                    prop_assert!(deadline.is_some());
                }
                Err(err) => {
                    prop_assert!(last != Step::Ok, "an error after a success: {err}");
                    if last == Step::Rejected {
                        let io = err.downcast_ref::<io::Error>().map(io::Error::kind);
                        prop_assert_eq!(io, Some(io::ErrorKind::InvalidData));
                    }
                }
            }
            Ok(())
        })?;
    }
}
