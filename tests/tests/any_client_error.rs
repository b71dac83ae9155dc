//! Any client's error type plugs into the family without a `map_err`: each
//! layer boxes the error before its classifier sees it, so the default
//! classifiers walk the error's chain whatever its type.

use std::error::Error;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use integration_tests::{breaker, dead_letters, entries, retry};
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_classify::FailureKind;
use tower_poison::store::MemoryStore;
use tower_poison::ReplayBody;

/// An error type of some client library: it implements `Error` (with its
/// cause as `source()`) and nothing of ours.
#[derive(Debug)]
struct ClientError(std::io::Error);

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("client request failed")
    }
}

impl Error for ClientError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.0)
    }
}

#[tokio::test]
async fn a_foreign_error_type_is_classified_by_its_chain_in_every_layer() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    // Every call is reset by the peer: a connection failure, deep in the chain.
    let client = service_fn(move |_req: Request<ReplayBody<Full<Bytes>>>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async {
            Err::<Response<Full<Bytes>>, _>(ClientError(std::io::Error::from(
                std::io::ErrorKind::ConnectionReset,
            )))
        }
    });
    let store = MemoryStore::new(10);
    let (breaker, handle) = breaker(1, Duration::from_secs(30));
    let stack = ServiceBuilder::new()
        .layer(dead_letters(&store))
        .layer(breaker)
        .layer(retry(2))
        .service(client);

    let request = Request::get("http://upstream.internal/orders")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let error = stack.clone().oneshot(request).await.unwrap_err();

    // The retry layer saw a connection failure and retried a GET twice.
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert!(error.downcast_ref::<ClientError>().is_some(), "{error}");
    // The breaker counted it as a transient failure and opened.
    assert_eq!(handle.list()[0].state, tower_breaker::State::Open);
    // The dead-letter layer stored it as one.
    let stored = entries(&store).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].kind, FailureKind::Connection);
    assert_eq!(
        stored[0].error,
        ["client request failed", "connection reset"]
    );
}
