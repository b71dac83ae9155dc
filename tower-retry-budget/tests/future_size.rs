//! The response future stays small: everything a call needs only when it
//! has a limit, spans or a retry is boxed, so the future a caller moves
//! around holds the first attempt, the service, what is kept of the request, the
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

/// An HTTP retry keeps a copy of the head in one buffer, not a second
/// `http::Request`: the future that carries it through every layer above
/// stays small.
#[test]
fn an_http_retry_keeps_far_less_than_a_second_request() {
    use bytes::Bytes;
    use http::Request;
    use http_body_util::Full;
    use tower_classify::HttpClassifier;
    use tower_retry_budget::replay::{HttpReplay, KeptRequest};

    #[derive(Clone, Copy)]
    struct Ok200;

    impl Service<Request<Full<Bytes>>> for Ok200 {
        type Response = http::Response<()>;
        type Error = std::io::Error;
        type Future = Ready<Result<http::Response<()>, std::io::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<Full<Bytes>>) -> Self::Future {
            std::future::ready(Ok(http::Response::new(())))
        }
    }

    type Future = ResponseFuture<Ok200, Request<Full<Bytes>>, HttpClassifier, HttpReplay>;
    let request = size_of::<Request<Full<Bytes>>>();
    let kept = size_of::<Option<KeptRequest<Full<Bytes>>>>();
    let attempt = size_of::<<Ok200 as Service<Request<Full<Bytes>>>>::Future>();
    let ours = size_of::<Future>();
    println!(
        "HTTP response future: {ours} bytes (attempt {attempt}, kept {kept}, a request {request})"
    );
    assert!(kept * 2 < request, "kept {kept} bytes, a request {request}");
    assert!(ours <= attempt + kept + 8 + 8 + 8 + 8, "{ours} bytes");
}
