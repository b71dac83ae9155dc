//! Loom model of the half-open probe claim: every interleaving of concurrent
//! claims, releases and results.
//!
//! Run with
//! `RUSTFLAGS="--cfg breaker_loom" CARGO_TARGET_DIR=target/loom cargo test -p tower-breaker --release --test loom`.
//! The crate-specific cfg swaps the state machine's atomics for loom's
//! (`src/sync.rs`) without turning on tokio's own `--cfg loom` code.
#![cfg(breaker_loom)]

use std::future::{pending, ready, Future};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::task::noop_waker_ref;
use loom::thread;
use tower::{service_fn, Layer, Service};
use tower_breaker::Policy;
use tower_breaker::{BreakerHandle, CircuitBreakerLayer, CircuitOpen, State};
use tower_classify::{BoxError, ErrorChainClassifier};

type Call = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

/// What the dependency does with a request.
#[derive(Clone, Copy)]
enum Req {
    Fail,
    /// Never answers: an admitted probe stays in flight.
    Hang,
    Succeed,
}

/// A service whose breaker is open with a zero recovery timeout: the next
/// call turns it half-open and claims the probe.
fn tripped(
    probes: u32,
) -> (
    impl Service<
            Req,
            Future = impl Future<Output = Result<(), BoxError>> + Send + 'static,
            Error = BoxError,
        > + Clone
        + Send
        + 'static,
    BreakerHandle,
) {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .probes(probes)
        .recovery_timeout(Duration::ZERO)
        .build(ErrorChainClassifier::new())
        .unwrap();
    let handle = layer.handle();
    let mut svc = layer.layer(service_fn(|req: Req| -> Call {
        match req {
            Req::Fail => Box::pin(ready(Err(
                io::Error::from(io::ErrorKind::ConnectionReset).into()
            ))),
            Req::Hang => Box::pin(pending()),
            Req::Succeed => Box::pin(ready(Ok(()))),
        }
    }));
    let mut first = svc.call(Req::Fail);
    assert!(poll(&mut first).is_some());
    assert_eq!(handle.get("default").unwrap().state, State::Open);
    (svc, handle)
}

/// Polls once: `None` while pending, else whether it was refused.
fn poll<F: Future<Output = Result<(), BoxError>> + Unpin>(future: &mut F) -> Option<bool> {
    let mut cx = Context::from_waker(noop_waker_ref());
    match Pin::new(future).poll(&mut cx) {
        Poll::Pending => None,
        Poll::Ready(result) => Some(result.is_err_and(|e| e.is::<CircuitOpen>())),
    }
}

#[test]
fn concurrent_claims_admit_exactly_one_probe() {
    loom::model(|| {
        let (svc, handle) = tripped(1);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let mut svc = svc.clone();
                thread::spawn(move || {
                    let mut call = Box::pin(svc.call(Req::Hang));
                    // Pending = admitted (the probe hangs); ready = refused.
                    let admitted = poll(&mut call).is_none();
                    (admitted, call)
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let admitted = results.iter().filter(|(admitted, _)| *admitted).count();
        assert_eq!(admitted, 1);
        let snapshot = handle.get("default").unwrap();
        assert_eq!(
            (snapshot.state, snapshot.probes_in_flight),
            (State::HalfOpen, 1)
        );
    });
}

#[test]
fn concurrent_claims_of_the_last_of_two_slots_admit_one() {
    loom::model(|| {
        let (svc, handle) = tripped(2);
        let mut first = svc.clone();
        let mut held = Box::pin(first.call(Req::Hang));
        assert!(poll(&mut held).is_none(), "the first probe takes one slot");
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let mut svc = svc.clone();
                thread::spawn(move || {
                    let mut call = Box::pin(svc.call(Req::Hang));
                    (poll(&mut call).is_none(), call)
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(results.iter().filter(|(admitted, _)| *admitted).count(), 1);
        assert_eq!(handle.get("default").unwrap().probes_in_flight, 2);
    });
}

#[test]
fn a_dropped_probe_racing_a_claim_never_leaks_or_doubles_the_slot() {
    loom::model(|| {
        let (svc, handle) = tripped(1);
        let mut first = svc.clone();
        let mut probe = Box::pin(first.call(Req::Hang));
        assert!(poll(&mut probe).is_none(), "the first call is the probe");

        let dropper = thread::spawn(move || drop(probe));
        let mut second = svc.clone();
        let claimer = thread::spawn(move || {
            let mut call = Box::pin(second.call(Req::Hang));
            (poll(&mut call).is_none(), call)
        });
        dropper.join().unwrap();
        let (admitted, call) = claimer.join().unwrap();
        // Either the claim came after the release (admitted, holding the
        // slot) or before it (refused, and the slot is free again).
        let in_flight = handle.get("default").unwrap().probes_in_flight;
        assert_eq!(in_flight, u32::from(admitted));
        drop(call);
        assert_eq!(handle.get("default").unwrap().probes_in_flight, 0);
    });
}

#[test]
fn a_probe_result_racing_a_claim_closes_once() {
    loom::model(|| {
        let (svc, handle) = tripped(1);
        let mut first = svc.clone();
        let mut probe = Box::pin(first.call(Req::Succeed));
        let mut second = svc.clone();
        let claimer = thread::spawn(move || {
            let mut call = Box::pin(second.call(Req::Succeed));
            poll(&mut call)
        });
        // The probe completes (and closes the breaker) concurrently.
        assert_eq!(poll(&mut probe), Some(false));
        let other = claimer.join().unwrap();
        let snapshot = handle.get("default").unwrap();
        assert_eq!(snapshot.state, State::Closed);
        assert_eq!(snapshot.probes_in_flight, 0);
        // The racing call was refused (half-open, slot taken) or, after the
        // close, admitted and succeeded; never anything else.
        assert!(matches!(other, Some(_)));
        assert_eq!(snapshot.opened, 1, "the close did not reopen");
    });
}
