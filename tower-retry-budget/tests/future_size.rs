//! The response future stays small: everything a call needs only when it
//! has a limit, spans or a retry is boxed, so the future a caller moves
//! around holds the first attempt, the service, the request's copy, the
//! policy's `Arc` and a few bytes.

use std::future::Ready;
use std::mem::size_of;
use std::task::{Context, Poll};

use tower::Service;
use tower_classify::ErrorChainClassifier;
use tower_retry_budget::future::ResponseFuture;
use tower_retry_budget::replay::CloneRequest;

#[derive(Clone, Copy)]
struct Echo;

impl Service<u64> for Echo {
    type Response = u64;
    type Error = std::io::Error;
    type Future = Ready<Result<u64, std::io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: u64) -> Self::Future {
        std::future::ready(Ok(request))
    }
}

#[test]
fn the_response_future_holds_little_beyond_the_attempt_and_the_request() {
    type Future = ResponseFuture<Echo, u64, ErrorChainClassifier, CloneRequest>;
    let attempt = size_of::<Ready<Result<u64, std::io::Error>>>();
    let request = size_of::<Option<u64>>();
    let ours = size_of::<Future>();
    println!("response future: {ours} bytes (attempt {attempt}, request copy {request})");
    // The attempt, the copy, the `Arc`, the cold state's pointer, the
    // attempt count and the state's tags.
    assert!(ours <= attempt + request + 8 + 8 + 8 + 8, "{ours} bytes");
}
