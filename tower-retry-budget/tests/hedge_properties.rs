//! The hedge future as a state machine, against a reference model, on
//! random schedules: which attempt answers and when, when each attempt is
//! sent, that none is sent after a failure answer, and that no attempt is
//! alive once the call resolved.
//!
//! Times are chosen so that no two events share a millisecond: hedges fall
//! due on multiples of 10 ms, and attempt `i` answers on a millisecond
//! ending in `i + 1`, so the model needs no tie-breaking rule.

use std::collections::BTreeSet;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;
use tower::Service;
use tower_classify::{BoxError, Classified, FailureKind};
use tower_layer::Layer;
use tower_retry_budget::hedge::HedgeLayer;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Ok,
    /// A connection reset: transient, waits for the others.
    Reset,
    /// A request the server refused: wins.
    Rejected,
    /// A local refusal below: waits for the others.
    Shed,
}

impl Answer {
    fn wins(self) -> bool {
        matches!(self, Answer::Ok | Answer::Rejected)
    }
}

#[derive(Clone, Debug)]
struct Schedule {
    max_attempts: u32,
    delay_ms: u64,
    /// Attempt `i` answers `answers[i]` after `latency_ms[i]`.
    latency_ms: Vec<u64>,
    answers: Vec<Answer>,
}

fn schedules() -> impl Strategy<Value = Schedule> {
    (
        2u32..=5,
        1u64..=10,
        prop::collection::vec(0u64..=30, 5),
        prop::collection::vec(
            prop_oneof![
                3 => Just(Answer::Ok),
                2 => Just(Answer::Reset),
                1 => Just(Answer::Rejected),
                1 => Just(Answer::Shed),
            ],
            5,
        ),
    )
        .prop_map(|(max_attempts, delay_tens, tens, answers)| Schedule {
            max_attempts,
            delay_ms: delay_tens * 10,
            // Attempt i answers on a millisecond ending in i + 1.
            latency_ms: tens
                .iter()
                .enumerate()
                .map(|(i, tens)| tens * 10 + i as u64 + 1)
                .collect(),
            answers,
        })
}

/// What the model says: the attempt whose answer the call returns, when,
/// and when each attempt was sent.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    answered_by: usize,
    at_ms: u64,
    sent_at_ms: Vec<u64>,
}

fn model(schedule: &Schedule) -> Outcome {
    let mut sent_at = vec![0u64];
    let mut outstanding: BTreeSet<usize> = BTreeSet::from([0]);
    let mut stopped = false;
    let mut next_due = schedule.delay_ms;
    loop {
        let (done_at, attempt) = outstanding
            .iter()
            .map(|&i| (sent_at[i] + schedule.latency_ms[i], i))
            .min()
            .expect("an attempt in flight");
        let can_send = !stopped && sent_at.len() < schedule.max_attempts as usize;
        if can_send && next_due < done_at {
            sent_at.push(next_due);
            outstanding.insert(sent_at.len() - 1);
            next_due += schedule.delay_ms;
            continue;
        }
        outstanding.remove(&attempt);
        if schedule.answers[attempt].wins() || outstanding.is_empty() {
            return Outcome {
                answered_by: attempt,
                at_ms: done_at,
                sent_at_ms: sent_at,
            };
        }
        stopped = true;
    }
}

fn run(schedule: &Schedule) -> (Outcome, usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let start = Instant::now();
        let sent_at = Arc::new(Mutex::new(Vec::new()));
        let alive = Arc::new(AtomicUsize::new(0));
        let (log, live) = (sent_at.clone(), alive.clone());
        let script = schedule.clone();
        let service = tower::service_fn(move |_: ()| {
            let attempt = {
                let mut log = log.lock().unwrap();
                log.push(start.elapsed().as_millis() as u64);
                log.len() - 1
            };
            live.fetch_add(1, Ordering::SeqCst);
            let guard = Guard(live.clone());
            let latency = Duration::from_millis(script.latency_ms[attempt]);
            let answer = script.answers[attempt];
            async move {
                let _guard = guard;
                tokio::time::sleep(latency).await;
                let tag = attempt.to_string();
                match answer {
                    Answer::Ok => Ok(attempt),
                    Answer::Reset => Err(BoxError::from(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        tag,
                    ))),
                    Answer::Rejected => {
                        Err(Box::new(Classified::new(FailureKind::Rejected, tag)) as BoxError)
                    }
                    Answer::Shed => {
                        Err(Box::new(Classified::new(FailureKind::Shed, tag)) as BoxError)
                    }
                }
            }
        });
        let layer = HedgeLayer::builder()
            .delay(Duration::from_millis(schedule.delay_ms))
            .max_attempts(schedule.max_attempts)
            .no_budget()
            .build()
            .unwrap();
        let mut hedged = layer.layer(service);
        std::future::poll_fn(|cx| hedged.poll_ready(cx))
            .await
            .unwrap();
        let mut call = tokio_test::task::spawn(hedged.call(()));
        let result = loop {
            if let std::task::Poll::Ready(result) = call.poll() {
                break result;
            }
            // To the next millisecond at which something may happen.
            tokio::time::advance(Duration::from_millis(1)).await;
        };
        // Read while the resolved future still exists.
        let alive_after = alive.load(Ordering::SeqCst);
        let answered_by = match result {
            Ok(attempt) => attempt,
            Err(error) => error
                .to_string()
                .parse()
                .unwrap_or_else(|_| panic!("an error tagged with its attempt: {error}")),
        };
        let outcome = Outcome {
            answered_by,
            at_ms: start.elapsed().as_millis() as u64,
            sent_at_ms: sent_at.lock().unwrap().clone(),
        };
        (outcome, alive_after)
    })
}

struct Guard(Arc<AtomicUsize>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_hedge_future_follows_the_model(schedule in schedules()) {
        let expected = model(&schedule);
        let (actual, alive_after) = run(&schedule);
        prop_assert_eq!(&actual, &expected, "{:?}", schedule);
        prop_assert_eq!(alive_after, 0, "losers dropped before the call resolved");
    }
}
