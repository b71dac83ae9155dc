//! Requests the guard does not guard (no key, or an idempotent method) pass
//! through it, and their responses back, with nothing allocated: an
//! allocator that counts the allocations of the test's own thread shows it,
//! next to a guarded request that does allocate.

use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bench_support::alloc::{allocations, Counting};
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use tower::{service_fn, Layer, Service};
use tower_idempotency::store::MemoryIdempotencyStore;
use tower_idempotency::{GuardBody, IdempotencyGuardLayer};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Calls `service` with `request`, polls the response future and then the
/// response body to their ends (both must be ready at once), and returns
/// the body's bytes in `received`.
fn call_through<S, B>(service: &mut S, request: Request<Full<Bytes>>, received: &mut usize)
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    assert!(service.poll_ready(&mut cx).is_ready());
    let future = pin!(service.call(request));
    let Poll::Ready(Ok(response)) = future.poll(&mut cx) else {
        panic!("the handler answers at once");
    };
    let mut body = pin!(response.into_body());
    while let Poll::Ready(Some(frame)) = body.as_mut().poll_frame(&mut cx) {
        *received += frame.unwrap().into_data().map_or(0, |d| d.len());
    }
    assert!(body.is_end_stream());
}

#[test]
fn unguarded_requests_and_responses_pass_through_without_allocating() {
    // The guard's keeper task needs a runtime for a guarded call.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let mut service = IdempotencyGuardLayer::new(MemoryIdempotencyStore::new(10)).layer(
        service_fn(|request: Request<GuardBody<Full<Bytes>>>| {
            // The handler echoes the request body, so the request's body
            // wrapper comes back out through the response's.
            std::future::ready(Ok::<_, Infallible>(Response::new(request.into_body())))
        }),
    );
    let body = || Full::new(Bytes::from_static(b"{\"sku\":42}"));
    let unkeyed = Request::post("/orders").body(body()).unwrap();
    let idempotent = Request::put("/orders/42")
        .header("idempotency-key", "k-put")
        .body(body())
        .unwrap();
    let guarded = Request::post("/orders")
        .header("idempotency-key", "k-post")
        .body(body())
        .unwrap();

    let mut received = 0;
    for request in [unkeyed, idempotent] {
        let (made, ()) = allocations(|| call_through(&mut service, request, &mut received));
        assert_eq!(made, 0, "an unguarded request allocated");
    }
    assert_eq!(received, 20, "both bodies came through whole");
    // The counter does count: a guarded call allocates (its key, its
    // claim, its boxed future).
    let (made, ()) = allocations(|| call_through(&mut service, guarded, &mut received));
    assert!(made > 0);
    assert_eq!(received, 30);
}
