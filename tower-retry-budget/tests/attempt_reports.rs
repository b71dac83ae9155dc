//! The retry layer reports its attempts to the recording layer (a
//! dead-letter layer) that called it, through `tower_classify::attempts`,
//! and to no other.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use tower::{service_fn, Layer, Service};
use tower_classify::attempts::{AttemptTally, TallyScope};
use tower_classify::BoxError;
use tower_retry_budget::backoff::Backoff;
use tower_retry_budget::RetryLayer;

type Call = Pin<Box<dyn Future<Output = Result<u32, BoxError>> + Send>>;

/// A retry layer over a service whose first `failures` calls are refused.
fn retried(failures: u32) -> impl Service<u32, Response = u32, Error = BoxError, Future = Call> {
    let calls = Arc::new(AtomicU32::new(0));
    let inner = service_fn(move |n: u32| {
        let call = calls.fetch_add(1, Ordering::Relaxed);
        async move {
            if call < failures {
                Err::<u32, BoxError>(io::Error::from(io::ErrorKind::ConnectionRefused).into())
            } else {
                Ok(n)
            }
        }
    });
    let layer = RetryLayer::builder()
        .max_retries(3)
        .backoff(Backoff::none())
        .build()
        .expect("valid");
    let service = layer.layer(inner);
    tower::util::MapFuture::new(service, |future| Box::pin(future) as Call)
}

/// Calls a retry layer over a service whose first `failures` calls fail,
/// inside the scope `called_in` makes, then polls the call to its end with
/// each poll inside a polling scope, as a dead-letter layer does: the
/// call's result and what the retry layer reported.
fn call_in(
    called_in: fn(AttemptTally) -> TallyScope,
    failures: u32,
) -> (Result<u32, BoxError>, AttemptTally) {
    let mut service = retried(failures);
    let scope = called_in(AttemptTally::default());
    let mut call = service.call(7);
    let mut tally = scope.exit();
    assert_eq!(tally, AttemptTally::default(), "nothing reported at call");
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        let scope = TallyScope::enter(tally);
        let polled = call.as_mut().poll(&mut cx);
        tally = scope.exit();
        if let Poll::Ready(result) = polled {
            return (result, tally);
        }
    }
}

#[test]
fn a_retry_called_by_the_recording_layer_reports_every_attempt() {
    let (result, tally) = call_in(TallyScope::calling, 2);
    assert_eq!(result.unwrap(), 7);
    assert_eq!(
        tally,
        AttemptTally {
            started: 3,
            finished: 2
        }
    );
}

#[test]
fn a_call_that_succeeds_at_once_reports_nothing() {
    let (result, tally) = call_in(TallyScope::calling, 0);
    assert_eq!(result.unwrap(), 7);
    assert_eq!(tally, AttemptTally::default());
}

#[test]
fn a_retry_called_only_while_the_recorder_polls_reports_nothing() {
    // A client called by a handler under a server's dead-letter layer: its
    // call happens inside the dead-letter layer's poll, not its call, and
    // its attempts are not the dead-letter call's.
    let (result, tally) = call_in(TallyScope::enter, 2);
    assert_eq!(result.unwrap(), 7);
    assert_eq!(tally, AttemptTally::default());
}
