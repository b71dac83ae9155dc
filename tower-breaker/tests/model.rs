//! A property test of the breaker against a reference model.
//!
//! The model is the seeds' state machine written as plainly as possible: a
//! consecutive-failure count, an open deadline, one probe. Random sequences of
//! calls, cancelled calls, clock advances and operator actions run against
//! both; after every step admission, state, counters and the remaining open
//! time must agree.

use std::future::{ready, Ready};
use std::io;
use std::time::Duration;

use futures_util::FutureExt;
use proptest::prelude::*;
use tower::{service_fn, Layer, Service};
use tower_breaker::Policy;
use tower_breaker::{BreakerHandle, CircuitBreakerLayer, CircuitOpen, State};
use tower_classify::{BoxError, ErrorChainClassifier};

const THRESHOLD: u32 = 3;
const RECOVERY_MS: u64 = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Success,
    Transient,
    Rejected,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    /// A call that completes with this answer.
    Call(Answer),
    /// A call whose future is dropped before it completes.
    Cancel,
    Advance(u64),
    Reset,
    ForceOpen,
}

fn op() -> impl Strategy<Value = Op> {
    let answer = prop_oneof![
        2 => Just(Answer::Success),
        4 => Just(Answer::Transient),
        1 => Just(Answer::Rejected),
    ];
    prop_oneof![
        10 => answer.prop_map(Op::Call),
        2 => Just(Op::Cancel),
        4 => prop_oneof![0..2_000u64, 9_000..11_000u64].prop_map(Op::Advance),
        1 => Just(Op::Reset),
        1 => Just(Op::ForceOpen),
    ]
}

#[derive(Debug)]
struct Model {
    state: State,
    consecutive: u32,
    now: u64,
    until: u64,
    rejected: u64,
}

impl Model {
    /// `true` when the call is admitted.
    fn call(&mut self, answer: Option<Answer>) -> bool {
        let probe = match self.state {
            State::Closed => false,
            State::Open if self.now >= self.until => true,
            State::HalfOpen => true,
            _ => {
                self.rejected += 1;
                return false;
            }
        };
        if probe {
            // Every call here completes (or is dropped) before the next, so
            // the one slot is always free when a call arrives.
            self.state = State::HalfOpen;
            match answer {
                Some(Answer::Success) => {
                    self.state = State::Closed;
                    self.consecutive = 0;
                }
                Some(Answer::Transient) => self.open(),
                Some(Answer::Rejected) | None => {}
            }
        } else {
            match answer {
                Some(Answer::Success) => self.consecutive = 0,
                Some(Answer::Transient) => {
                    self.consecutive += 1;
                    if self.consecutive >= THRESHOLD {
                        self.open();
                    }
                }
                Some(Answer::Rejected) | None => {}
            }
        }
        true
    }

    fn open(&mut self) {
        self.state = State::Open;
        self.until = self.now + RECOVERY_MS;
    }
}

type Svc = tower_breaker::CircuitBreaker<
    tower::util::ServiceFn<fn(Answer) -> Ready<Result<(), io::Error>>>,
    ErrorChainClassifier,
>;

fn answer(answer: Answer) -> Ready<Result<(), io::Error>> {
    ready(match answer {
        Answer::Success => Ok(()),
        Answer::Transient => Err(io::Error::from(io::ErrorKind::ConnectionReset)),
        Answer::Rejected => Err(io::Error::from(io::ErrorKind::InvalidData)),
    })
}

fn outcome(result: Result<(), BoxError>) -> Result<(), Option<Duration>> {
    match result {
        Ok(()) => Ok(()),
        Err(err) => match err.downcast_ref::<CircuitOpen>() {
            Some(open) => Err(open.remaining()),
            None => Ok(()),
        },
    }
}

async fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(THRESHOLD))
        .recovery_timeout(Duration::from_millis(RECOVERY_MS))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let handle: BreakerHandle = layer.handle();
    let mut svc: Svc = layer.layer(service_fn(answer as fn(Answer) -> _));
    let mut model = Model {
        state: State::Closed,
        consecutive: 0,
        now: 0,
        until: 0,
        rejected: 0,
    };
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Call(a) => {
                let before = (model.state, model.now, model.until);
                let admitted = model.call(Some(a));
                let result = outcome(svc.call(a).now_or_never().unwrap());
                match result {
                    Ok(()) => prop_assert!(admitted, "step {step}: admitted, model refused"),
                    Err(remaining) => {
                        prop_assert!(!admitted, "step {step}: refused, model admitted");
                        let expected = match before.0 {
                            State::Open => Some(Duration::from_millis(before.2 - before.1)),
                            _ => None,
                        };
                        prop_assert_eq!(remaining, expected, "step {}", step);
                    }
                }
            }
            Op::Cancel => {
                model.call(None);
                drop(svc.call(Answer::Success));
            }
            Op::Advance(ms) => {
                model.now += ms;
                tokio::time::advance(Duration::from_millis(ms)).await;
            }
            Op::Reset => {
                model.state = State::Closed;
                model.consecutive = 0;
                handle.reset("default");
            }
            Op::ForceOpen => {
                model.state = State::ForcedOpen;
                handle.force_open("default");
            }
        }
        let real = handle.get("default").unwrap();
        prop_assert_eq!(real.state, model.state, "step {}: {:?}", step, op);
        prop_assert_eq!(real.rejected, model.rejected, "step {}", step);
        if model.state == State::Closed {
            prop_assert_eq!(
                real.consecutive_failures,
                model.consecutive,
                "step {}",
                step
            );
        }
        prop_assert_eq!(real.probes_in_flight, 0, "step {}", step);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn breaker_matches_the_reference_model(ops in proptest::collection::vec(op(), 1..80)) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(run(ops))?;
    }
}
