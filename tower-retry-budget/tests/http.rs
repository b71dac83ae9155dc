//! HTTP: idempotency, `Retry-After`, presets, attempt headers and replayable bodies.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_classify::BoxError;
use tower_retry_budget::backoff::{Backoff, Jitter};
use tower_retry_budget::body::{ReplayBody, ReplayBodyLayer};
use tower_retry_budget::presets::{default_retry, default_retry_non_idempotent};
use tower_retry_budget::replay::HttpReplay;
use tower_retry_budget::RetryLayer;

const S: fn(u64) -> Duration = Duration::from_secs;

/// What the server saw: one entry per call, with its time and request.
#[derive(Debug)]
struct Seen {
    at: Instant,
    method: http::Method,
    headers: http::HeaderMap,
    body: Bytes,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// A server that answers the n-th call (0-based) with `respond(n)`, after
/// reading the whole request body.
fn server<B>(
    respond: impl Fn(usize) -> Result<Response<()>, BoxError> + Clone + Send + Sync + 'static,
) -> (
    impl Service<Request<B>, Response = Response<()>, Error = BoxError, Future = impl Send> + Clone,
    Log,
)
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let log: Log = Arc::default();
    let seen = log.clone();
    let service = tower::service_fn(move |request: Request<B>| {
        let seen = seen.clone();
        let respond = respond.clone();
        async move {
            let at = Instant::now();
            let (parts, body) = request.into_parts();
            let body = body.collect().await.map_err(Into::into)?.to_bytes();
            let n = {
                let mut seen = seen.lock().unwrap();
                seen.push(Seen {
                    at,
                    method: parts.method,
                    headers: parts.headers,
                    body,
                });
                seen.len() - 1
            };
            respond(n)
        }
    });
    (service, log)
}

fn status(code: u16) -> Result<Response<()>, BoxError> {
    Ok(Response::builder().status(code).body(()).unwrap())
}

fn unavailable_then_ok(
    failures: usize,
) -> impl Fn(usize) -> Result<Response<()>, BoxError> + Clone {
    move |n| status(if n < failures { 503 } else { 200 })
}

fn fast() -> Backoff {
    Backoff::fixed(Duration::from_millis(10)).with_jitter(Jitter::None)
}

fn gaps(log: &Log) -> Vec<Duration> {
    let log = log.lock().unwrap();
    log.windows(2).map(|w| w[1].at - w[0].at).collect()
}

#[tokio::test(start_paused = true)]
async fn post_is_not_retried_post_with_idempotency_key_is() {
    let layer = RetryLayer::http_builder().backoff(fast()).build().unwrap();

    let (inner, log) = server::<String>(unavailable_then_ok(usize::MAX));
    let post = Request::post("/pay").body("€10".to_owned()).unwrap();
    let response = layer.layer(inner).oneshot(post).await.unwrap();
    assert_eq!(
        response.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "the response comes back as is"
    );
    assert_eq!(log.lock().unwrap().len(), 1, "POST: exactly one attempt");

    let (inner, log) = server::<String>(unavailable_then_ok(2));
    let keyed = Request::post("/pay")
        .header("idempotency-key", "k-42")
        .body("€10".to_owned())
        .unwrap();
    let response = layer.layer(inner).oneshot(keyed).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 3);
    assert!(log
        .iter()
        .all(|seen| seen.method == http::Method::POST && seen.body == "€10"));
    assert!(log
        .iter()
        .all(|seen| seen.headers["idempotency-key"] == "k-42"));
}

#[tokio::test(start_paused = true)]
async fn patch_is_retried_only_when_opted_in() {
    let (inner, log) = server::<String>(unavailable_then_ok(1));
    let layer = RetryLayer::http_builder()
        .backoff(fast())
        .map_replay(|_| HttpReplay::new().retry_non_idempotent(true))
        .build()
        .unwrap();
    let patch = Request::patch("/doc").body("x".to_owned()).unwrap();
    assert_eq!(
        layer.layer(inner).oneshot(patch).await.unwrap().status(),
        200
    );
    assert_eq!(log.lock().unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn retry_after_seconds_overrides_the_backoff() {
    let (inner, log) = server::<String>(|n| {
        if n == 0 {
            Ok(Response::builder()
                .status(503)
                .header("retry-after", "3")
                .body(())
                .unwrap())
        } else {
            status(200)
        }
    });
    let layer = RetryLayer::http_builder().backoff(fast()).build().unwrap();
    let get = Request::get("/").body(String::new()).unwrap();
    assert_eq!(layer.layer(inner).oneshot(get).await.unwrap().status(), 200);
    assert_eq!(gaps(&log), [S(3)]);
}

#[tokio::test(start_paused = true)]
async fn retry_after_http_date_overrides_the_backoff() {
    // Measured against the response's own `Date`, so the local clock (here
    // paused and far from 2026) does not matter.
    let (inner, log) = server::<String>(|n| {
        if n == 0 {
            Ok(Response::builder()
                .status(429)
                .header("date", "Wed, 21 Oct 2026 07:28:00 GMT")
                .header("retry-after", "Wed, 21 Oct 2026 07:28:05 GMT")
                .body(())
                .unwrap())
        } else {
            status(200)
        }
    });
    let layer = RetryLayer::http_builder().backoff(fast()).build().unwrap();
    let get = Request::get("/").body(String::new()).unwrap();
    assert_eq!(layer.layer(inner).oneshot(get).await.unwrap().status(), 200);
    assert_eq!(gaps(&log), [S(5)]);
}

#[tokio::test(start_paused = true)]
async fn retry_after_above_max_wait_fails_at_once_naming_the_wait() {
    let (inner, log) = server::<String>(|_| {
        Ok(Response::builder()
            .status(429)
            .header("retry-after", "86400")
            .body(())
            .unwrap())
    });
    let layer = RetryLayer::http_builder().build().unwrap();
    let start = Instant::now();
    let err = layer
        .layer(inner)
        .oneshot(Request::get("/").body(String::new()).unwrap())
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(log.lock().unwrap().len(), 1);
    assert_eq!(
        err.to_string(),
        "server asked to wait 1d, longer than max_wait 1h"
    );
}

#[tokio::test(start_paused = true)]
async fn attempt_header_marks_retries() {
    let (inner, log) = server::<String>(unavailable_then_ok(2));
    let layer = RetryLayer::http_builder()
        .backoff(fast())
        .map_replay(|_| {
            HttpReplay::new()
                .attempt_header(http::HeaderName::from_static("grpc-previous-rpc-attempts"))
        })
        .build()
        .unwrap();
    layer
        .layer(inner)
        .oneshot(Request::get("/").body(String::new()).unwrap())
        .await
        .unwrap();
    let marks: Vec<Option<String>> = log
        .lock()
        .unwrap()
        .iter()
        .map(|seen| {
            seen.headers
                .get("grpc-previous-rpc-attempts")
                .map(|v| v.to_str().unwrap().to_owned())
        })
        .collect();
    assert_eq!(marks, [None, Some("1".into()), Some("2".into())]);
}

/// Seed 001: `default_retry` retries 429, 502, 503, 504, connection errors and
/// timeouts, 5 times, 1 s × 1.25 up to 60 s.
#[tokio::test(start_paused = true)]
async fn google_default_retry_preset() {
    let layer = default_retry().build().unwrap();

    for (code, attempts) in [
        (429, 6),
        (502, 6),
        (503, 6),
        (504, 6),
        (500, 1),
        (408, 1),
        (404, 1),
    ] {
        let (inner, log) = server::<String>(move |_| status(code));
        layer
            .layer(inner)
            .oneshot(Request::get("/").body(String::new()).unwrap())
            .await
            .unwrap();
        assert_eq!(log.lock().unwrap().len(), attempts, "status {code}");
        if attempts == 6 {
            let millis: Vec<u128> = gaps(&log).iter().map(Duration::as_millis).collect();
            // 1 s × 1.25ⁿ; tokio's timer rounds each sleep up to the millisecond.
            assert_eq!(millis, [1000, 1250, 1563, 1954, 2442]);
        }
    }
    // Connection errors and timeouts.
    for error in [
        BoxError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
        BoxError::from(tower::timeout::error::Elapsed::new()),
    ] {
        let error = Arc::new(Mutex::new(Some(error)));
        let (inner, log) = server::<String>(move |_| match error.lock().unwrap().take() {
            Some(err) => Err(err),
            None => status(200),
        });
        let response = layer
            .layer(inner)
            .oneshot(Request::get("/").body(String::new()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(log.lock().unwrap().len(), 2);
    }
}

/// Seed 001: `default_retry_non_idempotent` retries 429, 503 and connection
/// failures only, POST included.
#[tokio::test(start_paused = true)]
async fn google_default_retry_non_idempotent_preset() {
    let layer = default_retry_non_idempotent().build().unwrap();
    for (code, attempts) in [(429, 6), (503, 6), (502, 1), (504, 1), (500, 1)] {
        let (inner, log) = server::<String>(move |_| status(code));
        layer
            .layer(inner)
            .oneshot(Request::post("/").body(String::new()).unwrap())
            .await
            .unwrap();
        assert_eq!(log.lock().unwrap().len(), attempts, "status {code}");
    }
    let (inner, log) = server::<String>(|_| Err(tower::timeout::error::Elapsed::new().into()));
    layer
        .layer(inner)
        .oneshot(Request::post("/").body(String::new()).unwrap())
        .await
        .unwrap_err();
    assert_eq!(
        log.lock().unwrap().len(),
        1,
        "a timed-out POST may have been applied"
    );
    let (inner, log) = server::<String>(|_| {
        Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into())
    });
    layer
        .layer(inner)
        .oneshot(Request::post("/").body(String::new()).unwrap())
        .await
        .unwrap_err();
    assert_eq!(log.lock().unwrap().len(), 6);
}

/// A streaming body: frames yielded one per poll.
struct Chunks(VecDeque<Frame<Bytes>>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }
}

fn chunks(parts: &[&'static str]) -> Chunks {
    Chunks(
        parts
            .iter()
            .map(|p| Frame::data(Bytes::from_static(p.as_bytes())))
            .collect(),
    )
}

#[tokio::test(start_paused = true)]
async fn an_over_limit_body_is_sent_exactly_once_and_whole() {
    let (inner, log) = server::<ReplayBody<Chunks>>(unavailable_then_ok(usize::MAX));
    let service = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(16))
        .layer(RetryLayer::http_builder().backoff(fast()).build().unwrap())
        .service(inner);
    let put = Request::put("/blob")
        .body(chunks(&["0123456789", "abcdefghij", "ABCDEFGHIJ"]))
        .unwrap();
    let response = service.oneshot(put).await.unwrap();
    assert_eq!(response.status(), 503);
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 1, "too big to replay: one attempt");
    assert_eq!(
        log[0].body, "0123456789abcdefghijABCDEFGHIJ",
        "never truncated"
    );
}

#[tokio::test(start_paused = true)]
async fn a_body_within_the_limit_is_replayed_whole() {
    let (inner, log) = server::<ReplayBody<Chunks>>(unavailable_then_ok(2));
    let service = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(16))
        .layer(RetryLayer::http_builder().backoff(fast()).build().unwrap())
        .service(inner);
    let put = Request::put("/blob")
        .body(chunks(&["01234567", "89abcdef"]))
        .unwrap();
    assert_eq!(service.oneshot(put).await.unwrap().status(), 200);
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 3);
    assert!(log.iter().all(|seen| seen.body == "0123456789abcdef"));
}

#[tokio::test(start_paused = true)]
async fn a_retry_replays_the_trailers_too() {
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let inner = tower::service_fn(move |req: Request<ReplayBody<Chunks>>| {
        let log = log.clone();
        async move {
            let collected = req.into_body().collect().await?;
            let mut log = log.lock().unwrap();
            log.push((collected.trailers().cloned(), collected.to_bytes()));
            let status = if log.len() == 1 { 503 } else { 200 };
            Ok::<_, BoxError>(Response::builder().status(status).body(()).unwrap())
        }
    });
    let service = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(100))
        .layer(RetryLayer::http_builder().backoff(fast()).build().unwrap())
        .service(inner);
    let body = Chunks(VecDeque::from([
        Frame::data(Bytes::from_static(b"hi")),
        Frame::trailers(trailers.clone()),
    ]));
    let put = Request::put("/").body(body).unwrap();
    assert_eq!(service.oneshot(put).await.unwrap().status(), 200);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    for (got, bytes) in seen.iter() {
        assert_eq!(got.as_ref(), Some(&trailers));
        assert_eq!(bytes, "hi");
    }
}

/// The layer stacks where axum and tonic need it: `Send + Sync + 'static`
/// services with `Send` futures.
#[test]
fn services_and_futures_are_send() {
    fn assert_send_sync<T: Send + Sync + 'static>(_: &T) {}
    fn assert_send<T: Send>(_: &T) {}
    let (inner, _) = server::<ReplayBody<http_body_util::Full<Bytes>>>(|_| status(200));
    let mut service = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(1024))
        .layer(RetryLayer::http_builder().build().unwrap())
        .service(inner);
    assert_send_sync(&service);
    let future = service.call(
        Request::get("/")
            .body(http_body_util::Full::new(Bytes::new()))
            .unwrap(),
    );
    assert_send(&future);
}

/// gRPC: `grpc-retry-pushback-ms` replaces the backoff; a negative pushback
/// means "do not retry".
#[tokio::test(start_paused = true)]
async fn grpc_pushback_is_a_hint() {
    fn unavailable(pushback: &'static str) -> Result<Response<()>, BoxError> {
        Ok(Response::builder()
            .header("grpc-status", "14")
            .header("grpc-retry-pushback-ms", pushback)
            .body(())
            .unwrap())
    }
    let layer = RetryLayer::http_builder()
        .classifier(tower_classify::GrpcClassifier::new())
        .backoff(fast())
        .build()
        .unwrap();

    let (inner, log) = server::<String>(|n| {
        if n == 0 {
            unavailable("2500")
        } else {
            status(200)
        }
    });
    let response = layer
        .layer(inner)
        .oneshot(
            Request::post("/pkg.Svc/Get")
                .header("idempotency-key", "1")
                .body(String::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(gaps(&log), [Duration::from_millis(2500)]);

    let (inner, log) = server::<String>(|_| unavailable("-1"));
    let response = layer
        .layer(inner)
        .oneshot(Request::get("/pkg.Svc/Get").body(String::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.headers()["grpc-status"], "14");
    assert_eq!(log.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_a_partial_read_sends_every_byte() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    // Attempt 1 reads one frame and fails; later attempts read everything.
    let inner = tower::service_fn(move |req: Request<ReplayBody<Chunks>>| {
        let log = log.clone();
        async move {
            let mut body = req.into_body();
            let first = log.lock().unwrap().is_empty();
            if first {
                let frame = body.frame().await.unwrap()?;
                log.lock().unwrap().push(frame.into_data().unwrap());
                return status(503);
            }
            let bytes = body.collect().await?.to_bytes();
            log.lock().unwrap().push(bytes);
            status(200)
        }
    });
    let service = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(64))
        .layer(RetryLayer::http_builder().backoff(fast()).build().unwrap())
        .service(inner);
    let put = Request::put("/").body(chunks(&["ab", "cd", "ef"])).unwrap();
    assert_eq!(service.oneshot(put).await.unwrap().status(), 200);
    assert_eq!(*seen.lock().unwrap(), ["ab", "abcdef"]);
}

/// A request's extension, to see that retries carry the extensions too.
#[derive(Clone, Debug, PartialEq)]
struct Tenant(&'static str);

/// Each retry is rebuilt from a copy of the head: it must be the request
/// the caller made, to the order of the headers and each value's
/// sensitivity, with its extensions, and with the attempt header replaced
/// rather than repeated.
#[tokio::test(start_paused = true)]
async fn a_retry_sends_the_head_the_caller_made() {
    type Head = (
        http::Method,
        http::Uri,
        http::Version,
        Vec<(String, Vec<u8>, bool)>,
        Option<Tenant>,
    );
    let seen: Arc<Mutex<Vec<Head>>> = Arc::default();
    let log = seen.clone();
    let inner = tower::service_fn(move |request: Request<String>| {
        let (parts, _) = request.into_parts();
        let headers = parts
            .headers
            .iter()
            .map(|(name, value)| {
                (
                    name.to_string(),
                    value.as_bytes().to_vec(),
                    value.is_sensitive(),
                )
            })
            .collect();
        let mut log = log.lock().unwrap();
        log.push((
            parts.method,
            parts.uri,
            parts.version,
            headers,
            parts.extensions.get::<Tenant>().cloned(),
        ));
        let code = if log.len() < 3 { 503 } else { 200 };
        std::future::ready(status(code))
    });
    let layer = RetryLayer::http_builder()
        .backoff(fast())
        .map_replay(|_| {
            HttpReplay::new().attempt_header(http::HeaderName::from_static("x-attempt"))
        })
        .build()
        .unwrap();
    let mut secret = http::HeaderValue::from_static("Bearer s3cret");
    secret.set_sensitive(true);
    let mut request = Request::put("https://orders.internal:8443/orders/7?notify=false")
        .version(http::Version::HTTP_2)
        .header("x-tag", "a")
        .header("accept", "application/json")
        .header("x-tag", "b")
        .header("authorization", secret)
        .header("x-attempt", "from upstream")
        .header("x-raw", http::HeaderValue::from_bytes(b"caf\xe9").unwrap())
        .body(String::from("{}"))
        .unwrap();
    request.extensions_mut().insert(Tenant("acme"));
    let (original, body) = request.into_parts();
    let request = Request::from_parts(original.clone(), body);
    let response = layer.layer(inner).oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);

    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    for (attempt, (method, uri, version, headers, tenant)) in seen.iter().enumerate() {
        assert_eq!(method, original.method, "attempt {attempt}");
        assert_eq!(uri, &original.uri, "attempt {attempt}");
        assert_eq!(
            uri.to_string(),
            original.uri.to_string(),
            "attempt {attempt}"
        );
        assert_eq!(*version, http::Version::HTTP_2, "attempt {attempt}");
        assert_eq!(tenant, &Some(Tenant("acme")), "attempt {attempt}");
        let attempt_mark = match attempt {
            0 => b"from upstream".to_vec(),
            n => n.to_string().into_bytes(),
        };
        let expected: Vec<(String, Vec<u8>, bool)> = original
            .headers
            .iter()
            .map(|(name, value)| {
                let value = if name == "x-attempt" {
                    attempt_mark.clone()
                } else {
                    value.as_bytes().to_vec()
                };
                (name.to_string(), value, name == "authorization")
            })
            .collect();
        assert_eq!(headers, &expected, "attempt {attempt}");
    }
}

// ===== item 7: an upload still streaming when its attempt failed

/// A 503 that says which attempt answered it.
fn unavailable_from(attempt: usize) -> Result<Response<()>, BoxError> {
    Ok(Response::builder()
        .status(503)
        .header("x-attempt", attempt)
        .body(())
        .unwrap())
}

/// The retry is decided while the body can still be replayed, but a reader
/// that goes on streaming it (a task the failed attempt left behind, as
/// hyper's connection goes on sending an upload after an early answer)
/// takes it past its recording during the backoff: no retry is sent, and
/// the caller gets the server's 503, marked, rather than "cannot be
/// replayed".
#[tokio::test(start_paused = true)]
async fn item_7_an_upload_that_outgrows_its_limit_during_the_backoff_gets_the_503_back() {
    use tower_retry_budget::{RetryStopped, StopReason};
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    let inner = tower::service_fn(move |request: Request<ReplayBody<Chunks>>| {
        let attempt = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        async move {
            let mut body = request.into_body();
            // Two bytes read before the answer: still replayable.
            body.frame().await.unwrap()?;
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                while let Some(Ok(_)) = body.frame().await {}
            });
            unavailable_from(attempt)
        }
    });
    let service = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(4))
        .layer(RetryLayer::http_builder().backoff(fast()).build().unwrap())
        .service(inner);
    let put = Request::put("/").body(chunks(&["ab", "cd", "ef"])).unwrap();
    let response = service
        .oneshot(put)
        .await
        .expect("the server's answer, not the replay error");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["x-attempt"], "1");
    let stopped = response.extensions().get::<RetryStopped>().unwrap();
    assert_eq!(
        (stopped.reason, stopped.attempts),
        (StopReason::NotReplayable, 1)
    );
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "no attempt with a broken body"
    );
}

type Upload = http_body_util::channel::Channel<Bytes, std::io::Error>;
type Streamed = ReplayBody<Upload>;

/// The body is asked again as soon as the backoff ends: a body that
/// outgrew its recording during it ends the call then, without waiting for
/// the service to be ready for a retry that cannot be sent (a concurrency
/// slot, a connection). Asked only when the retry is made, the call waited
/// for a readiness that never came.
#[tokio::test(start_paused = true)]
async fn item_7_the_body_is_asked_again_after_the_backoff_before_readiness() {
    use tower_retry_budget::{RetryStopped, StopReason};
    let (mock, mut handle) = tower_test::mock::pair::<Request<Streamed>, Response<()>>();
    let service = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(4))
        .layer(
            RetryLayer::http_builder()
                .backoff(Backoff::fixed(Duration::from_millis(100)).with_jitter(Jitter::None))
                .build()
                .unwrap(),
        )
        .service(mock);
    handle.allow(1);
    let (mut upload, original) = Upload::new(4);
    let call = tokio::spawn(service.oneshot(Request::put("/").body(original).unwrap()));
    upload.send_data(Bytes::from("ab")).await.unwrap();
    let (request, answer) = handle.next_request().await.unwrap();
    let mut body = request.into_body();
    assert_eq!(
        body.frame().await.unwrap().unwrap().into_data().unwrap(),
        "ab"
    );
    // An early answer: two bytes read, the body can be replayed yet.
    answer.send_response(unavailable_from(1).unwrap());
    tokio::time::sleep(Duration::from_millis(10)).await;
    // The first attempt's upload goes on during the backoff, past the limit.
    upload.send_data(Bytes::from("cdef")).await.unwrap();
    assert_eq!(
        body.frame().await.unwrap().unwrap().into_data().unwrap(),
        "cdef"
    );
    // No allowance is ever given for a retry.
    let response = tokio::time::timeout(Duration::from_secs(1), call)
        .await
        .expect("the call ends when the backoff does")
        .unwrap()
        .expect("the server's answer, not the replay error");
    assert_eq!(response.headers()["x-attempt"], "1");
    let stopped = response.extensions().get::<RetryStopped>().unwrap();
    assert_eq!(
        (stopped.reason, stopped.attempts),
        (StopReason::NotReplayable, 1)
    );
}

/// The retry is sent while the body can still be replayed (no backoff), but
/// the first attempt's upload runs past the limit before the retry reads
/// it: the retry's copy fails, which says nothing of the request, and the
/// caller gets the server's 503 to the first attempt, marked with the two
/// attempts made, rather than "cannot be replayed".
#[tokio::test(start_paused = true)]
async fn item_7_a_retry_that_lost_its_copy_of_the_upload_answers_with_the_first_503() {
    use tower_retry_budget::{RetryStopped, StopReason};
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    let inner = tower::service_fn(move |request: Request<Streamed>| {
        let attempt = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        async move {
            let mut body = request.into_body();
            if attempt == 1 {
                body.frame().await.unwrap()?;
                // Answered early; the upload goes on, as hyper's
                // connection goes on sending it.
                tokio::spawn(async move { while let Some(Ok(_)) = body.frame().await {} });
                return unavailable_from(attempt);
            }
            // A slow connect: the retry reads the body after the first
            // attempt's upload ran past the limit.
            tokio::time::sleep(Duration::from_millis(50)).await;
            body.collect().await?;
            status(200)
        }
    });
    let service = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(4))
        .layer(
            RetryLayer::http_builder()
                .backoff(Backoff::none())
                .build()
                .unwrap(),
        )
        .service(inner);
    let (mut upload, original) = Upload::new(4);
    let call = tokio::spawn(service.oneshot(Request::put("/").body(original).unwrap()));
    upload.send_data(Bytes::from("ab")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "retried"
    );
    upload.send_data(Bytes::from("cdef")).await.unwrap();
    upload.send_data(Bytes::from("gh")).await.unwrap();
    drop(upload);
    let response = call
        .await
        .unwrap()
        .expect("the server's answer, not the replay error");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["x-attempt"], "1");
    let stopped = response.extensions().get::<RetryStopped>().unwrap();
    assert_eq!(
        (stopped.reason, stopped.attempts),
        (StopReason::NotReplayable, 2)
    );
}

/// The answer kept while the upload streamed still names its head when the
/// loop's deadline ends the call under the retry.
#[tokio::test(start_paused = true)]
async fn a_deadline_under_a_retry_names_the_kept_answers_head() {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let inner = tower::service_fn(move |request: Request<Streamed>| {
        let attempt = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        async move {
            let mut body = request.into_body();
            body.frame().await.unwrap()?;
            if attempt > 1 {
                // The retry: a server that never answers.
                std::future::pending::<()>().await;
            }
            tokio::spawn(async move { while let Some(Ok(_)) = body.frame().await {} });
            unavailable_from(attempt)
        }
    });
    let service = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(4))
        .layer(
            RetryLayer::http_builder()
                .backoff(Backoff::none())
                .deadline(S(1))
                .build()
                .unwrap(),
        )
        .service(inner);
    let (mut upload, original) = Upload::new(4);
    let call = tokio::spawn(service.oneshot(Request::put("/").body(original).unwrap()));
    upload.send_data(Bytes::from("ab")).await.unwrap();
    let error = call.await.unwrap().unwrap_err();
    let exceeded = error
        .downcast_ref::<tower_retry_budget::error::DeadlineExceeded>()
        .unwrap_or_else(|| panic!("not the deadline: {error}"));
    assert_eq!(exceeded.attempts(), 2);
    let head = exceeded.response_head().expect("the first answer's head");
    let parts = head.downcast_ref::<http::response::Parts>().unwrap();
    assert_eq!(parts.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(parts.headers["x-attempt"], "1");
}

/// A response body that says when it is dropped.
struct Tracked(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A server whose first attempt reads the body as `first` does, then
/// answers 503 with a [`Tracked`] body; the retry reads the whole body and
/// says whether the first answer was dropped before it was sent.
fn tracked_server<B>(
    first: fn(B) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
) -> (
    impl Service<Request<B>, Response = Response<Option<Tracked>>, Error = BoxError, Future: Send>
        + Clone,
    Arc<std::sync::atomic::AtomicBool>,
)
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let was_dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = was_dropped.clone();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let inner = tower::service_fn(move |request: Request<B>| {
        let dropped = dropped.clone();
        let seen = seen.clone();
        let attempt = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        async move {
            if attempt == 1 {
                first(request.into_body()).await;
                let tracked = Some(Tracked(dropped));
                return Ok(Response::builder().status(503).body(tracked).unwrap());
            }
            let was = dropped.load(std::sync::atomic::Ordering::SeqCst);
            seen.store(was, std::sync::atomic::Ordering::SeqCst);
            request.into_body().collect().await.map_err(Into::into)?;
            Ok::<_, BoxError>(Response::new(None))
        }
    });
    (inner, was_dropped)
}

/// A failed answer is kept only while the body may still be lost: once it
/// is recorded whole, the answer (its body, the connection it holds) is
/// dropped before the backoff, as it always was.
#[tokio::test(start_paused = true)]
async fn a_failed_answer_is_dropped_before_the_backoff_once_the_body_is_recorded() {
    let (inner, dropped) = tracked_server::<ReplayBody<Chunks>>(|body| {
        Box::pin(async move {
            body.collect().await.unwrap();
        })
    });
    let service = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(4))
        .layer(RetryLayer::http_builder().backoff(fast()).build().unwrap())
        .service(inner);
    let put = Request::put("/").body(chunks(&["ab", "cd"])).unwrap();
    let response = service.oneshot(put).await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        dropped.load(std::sync::atomic::Ordering::SeqCst),
        "the first answer is not held through the retry"
    );
}

/// Nor is it kept for an upload that the failed attempt stopped reading (it
/// dropped its copy): the body can only be read on by the retry, which
/// cannot lose it.
#[tokio::test(start_paused = true)]
async fn a_failed_answer_is_dropped_when_the_failed_attempt_let_go_of_the_upload() {
    let (inner, dropped) = tracked_server::<Streamed>(|mut body| {
        Box::pin(async move {
            body.frame().await.unwrap().unwrap();
        })
    });
    let service = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(4))
        .layer(RetryLayer::http_builder().backoff(fast()).build().unwrap())
        .service(inner);
    upload_after_a_first_answer(service, &dropped).await;
}

/// Sends a 4-byte upload in two frames, 20 ms apart, through `service`, and
/// checks that its first attempt's answer was let go before the call ended.
async fn upload_after_a_first_answer<S>(service: S, dropped: &std::sync::atomic::AtomicBool)
where
    S: Service<Request<Upload>, Response = Response<Option<Tracked>>, Error = BoxError>
        + Send
        + 'static,
    S::Future: Send,
{
    let (mut upload, original) = Upload::new(4);
    let call = tokio::spawn(service.oneshot(Request::put("/").body(original).unwrap()));
    upload.send_data(Bytes::from("ab")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    upload.send_data(Bytes::from("cd")).await.unwrap();
    drop(upload);
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        dropped.load(std::sync::atomic::Ordering::SeqCst),
        "the first answer is not held through the retry"
    );
}

/// The same with a copy of the body held above the retry layer for the
/// whole call, as a dead-letter layer's is: that copy never reads the
/// upload, so it does not make the first answer look still streaming.
#[tokio::test(start_paused = true)]
async fn a_failed_answer_is_dropped_when_only_an_idle_copy_of_the_upload_is_left() {
    let (inner, dropped) = tracked_server::<Streamed>(|mut body| {
        Box::pin(async move {
            body.frame().await.unwrap().unwrap();
        })
    });
    let retry = ServiceBuilder::new()
        .layer(RetryLayer::http_builder().backoff(fast()).build().unwrap())
        .service(inner);
    let holding_a_copy = tower::service_fn(move |request: Request<Streamed>| {
        let idle_copy = request.body().clone();
        let call = retry.clone().oneshot(request);
        async move {
            let answer = call.await;
            drop(idle_copy);
            answer
        }
    });
    let service = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(4))
        .service(holding_a_copy);
    upload_after_a_first_answer(service, &dropped).await;
}

#[tokio::test]
async fn the_inner_service_is_called_before_the_body_arrives() {
    let (mut upload, body) = http_body_util::channel::Channel::<Bytes, BoxError>::new(1);
    let (called_tx, called_rx) = tokio::sync::oneshot::channel();
    let called_tx = Arc::new(Mutex::new(Some(called_tx)));
    let inner = tower::service_fn(move |req: Request<ReplayBody<_>>| {
        let called_tx = called_tx.clone();
        async move {
            if let Some(tx) = called_tx.lock().unwrap().take() {
                let _ = tx.send(());
            }
            // Echo: the response is the first frame, read after the call.
            let mut body = req.into_body();
            let frame = body.frame().await.unwrap()?.into_data().unwrap();
            Ok::<_, BoxError>(Response::new(frame))
        }
    });
    let service = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(1024))
        .layer(RetryLayer::http_builder().build().unwrap())
        .service(inner);
    let call = tokio::spawn(service.oneshot(Request::put("/").body(body).unwrap()));
    // Not one byte sent yet, and the service below already runs.
    called_rx.await.unwrap();
    upload.send_data(Bytes::from("first")).await.unwrap();
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.into_body(), "first");
}

/// What one attempt read: its bytes, its trailers, whether it reached the end.
type Attempt = (Vec<u8>, Option<http::HeaderMap>, bool);

proptest::proptest! {
    /// Random bodies, random chunking, attempt 1 failing after reading a
    /// random number of bytes: every later attempt receives exactly the
    /// original bytes and trailers. A body that attempt 1 read past the
    /// limit is sent once, intact, and its failure comes back as it is.
    #[test]
    fn every_retry_sends_the_original_body_exactly(
        chunks in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..48), 0..12),
        with_trailers in proptest::bool::ANY,
        first_reads in 0usize..700,
        limit in 0usize..700,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let whole: Vec<u8> = chunks.concat();
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-checksum", whole.len().into());
        let mut frames: VecDeque<_> = chunks.iter().map(|c| Frame::data(Bytes::from(c.clone()))).collect();
        if with_trailers {
            frames.push_back(Frame::trailers(trailers.clone()));
        }
        let seen: Arc<Mutex<Vec<Attempt>>> = Arc::default();
        let log = seen.clone();
        // Attempt 1 reads `first_reads` bytes (at least), then fails; every
        // later attempt reads everything, then fails.
        let inner = tower::service_fn(move |req: Request<ReplayBody<Chunks>>| {
            let log = log.clone();
            async move {
                let first = log.lock().unwrap().is_empty();
                let mut body = req.into_body();
                let mut read = Vec::new();
                let mut got_trailers = None;
                let mut ended = false;
                while !first || read.len() < first_reads {
                    match body.frame().await {
                        None => { ended = true; break; }
                        Some(frame) => match frame?.into_data() {
                            Ok(data) => read.extend_from_slice(&data),
                            Err(frame) => got_trailers = frame.into_trailers().ok(),
                        },
                    }
                }
                log.lock().unwrap().push((read, got_trailers, ended));
                status(503)
            }
        });
        let service = ServiceBuilder::new()
            .layer(ReplayBodyLayer::new(limit))
            .layer(RetryLayer::http_builder().max_retries(2).backoff(fast()).no_budget().build().unwrap())
            .service(inner);
        let response = runtime
            .block_on(service.oneshot(Request::put("/").body(Chunks(frames)).unwrap()))
            .unwrap();
        proptest::prop_assert_eq!(response.status(), 503);
        let seen = seen.lock().unwrap();
        let (first, _, _) = &seen[0];
        proptest::prop_assert_eq!(&first[..], &whole[..first.len()]);
        for (bytes, got_trailers, ended) in &seen[1..] {
            proptest::prop_assert!(*ended);
            proptest::prop_assert_eq!(bytes, &whole);
            proptest::prop_assert_eq!(got_trailers.as_ref(), with_trailers.then_some(&trailers));
        }
        // Attempts stop at the first one that read past the limit.
        let read_past = |read: usize| whole.len() > limit && read > limit;
        let expected = if read_past(first.len()) {
            1
        } else if whole.len() > limit {
            2
        } else {
            3
        };
        proptest::prop_assert_eq!(seen.len(), expected);
    }
}

// ===== What the caller gets when retrying stops

fn unavailable_for(seconds: &'static str) -> Result<Response<()>, BoxError> {
    Ok(Response::builder()
        .status(503)
        .header("retry-after", seconds)
        .body(())
        .unwrap())
}

fn spent_budget() -> tower_retry_budget::budget::TpsBudget {
    tower_retry_budget::budget::TpsBudget::new(S(1), 0, 0.0).unwrap()
}

#[tokio::test(start_paused = true)]
async fn item_10_a_spent_budget_hands_back_the_upstreams_response_marked() {
    use tower_retry_budget::{RetryStopped, StopReason};
    let (inner, log) = server::<String>(|_| unavailable_for("1"));
    let layer = RetryLayer::http_builder()
        .budget(Arc::new(spent_budget()))
        .build()
        .unwrap();
    let response = layer
        .layer(inner)
        .oneshot(Request::get("/").body(String::new()).unwrap())
        .await
        .expect("the upstream's response, not an error");
    assert_eq!(log.lock().unwrap().len(), 1);
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
    let stopped = response.extensions().get::<RetryStopped>().unwrap();
    assert_eq!((stopped.reason, stopped.attempts), (StopReason::Budget, 1));
}

#[tokio::test(start_paused = true)]
async fn item_10_every_failed_response_handed_back_says_why() {
    use tower_retry_budget::{RetryStopped, StopReason};
    let (inner, _) = server::<String>(|_| status(503));
    let layer = RetryLayer::http_builder()
        .max_retries(2)
        .backoff(fast())
        .no_budget()
        .build()
        .unwrap();
    let response = layer
        .layer(inner)
        .oneshot(Request::get("/").body(String::new()).unwrap())
        .await
        .unwrap();
    let stopped = response.extensions().get::<RetryStopped>().unwrap();
    assert_eq!(
        (stopped.reason, stopped.attempts),
        (StopReason::Attempts, 3)
    );

    let (inner, _) = server::<String>(|_| status(404));
    let response = RetryLayer::http_builder()
        .build()
        .unwrap()
        .layer(inner)
        .oneshot(Request::get("/").body(String::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        response.extensions().get::<RetryStopped>().unwrap().reason,
        StopReason::NotRetried
    );
}

#[tokio::test(start_paused = true)]
async fn item_10_an_outer_retry_hands_back_a_response_the_inner_budget_refused() {
    let (inner, log) = server::<String>(|_| status(503));
    let inner_retry = RetryLayer::http_builder()
        .budget(Arc::new(spent_budget()))
        .build()
        .unwrap();
    let outer_retry = RetryLayer::http_builder()
        .max_retries(3)
        .backoff(fast())
        .no_budget()
        .build()
        .unwrap();
    let response = ServiceBuilder::new()
        .layer(outer_retry)
        .layer(inner_retry)
        .service(inner)
        .oneshot(Request::get("/").body(String::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        log.lock().unwrap().len(),
        1,
        "no storm from the outer layer"
    );
}

#[tokio::test(start_paused = true)]
async fn item_10_wait_too_long_keeps_the_response_head() {
    use tower_retry_budget::error::WaitTooLong;
    let (inner, _) = server::<String>(|_| unavailable_for("86400"));
    let err = RetryLayer::http_builder()
        .build()
        .unwrap()
        .layer(inner)
        .oneshot(Request::get("/").body(String::new()).unwrap())
        .await
        .unwrap_err();
    let too_long = err.downcast_ref::<WaitTooLong>().unwrap();
    let head = too_long
        .response_head()
        .and_then(|head| head.downcast_ref::<http::response::Parts>())
        .unwrap();
    assert_eq!(head.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(head.headers["retry-after"], "86400");
}

#[tokio::test(start_paused = true)]
async fn item_12_a_throttled_2xx_after_the_last_retry_fails_instead_of_being_data() {
    use tower_classify::http::ResponseRule;
    use tower_classify::{FailureKind, HttpClassifier};
    use tower_retry_budget::error::FailedSuccess;
    use tower_retry_budget::StopReason;

    let throttled = ResponseRule::builder()
        .match_success(true)
        .header_equals("x-throttled", ["true"])
        .build()
        .unwrap();
    let (inner, log) = server::<String>(|_| {
        Ok(Response::builder()
            .status(200)
            .header("x-throttled", "true")
            .body(())
            .unwrap())
    });
    let layer = RetryLayer::http_builder()
        .classifier(HttpClassifier::new().with_rules([throttled]))
        .max_retries(2)
        .backoff(fast())
        .no_budget()
        .build()
        .unwrap();
    let err = layer
        .layer(inner)
        .oneshot(Request::get("/").body(String::new()).unwrap())
        .await
        .expect_err("a throttled 200 is not data");
    assert_eq!(log.lock().unwrap().len(), 3, "retried twice first");
    let failed = err.downcast_ref::<FailedSuccess>().unwrap();
    assert_eq!(failed.stopped().failure.kind, FailureKind::RateLimited);
    assert_eq!(failed.stopped().reason, StopReason::Attempts);
    assert_eq!(failed.stopped().attempts, 3);
    let head = failed
        .response_head()
        .downcast_ref::<http::response::Parts>()
        .unwrap();
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.headers["x-throttled"], "true");
}

/// Issue 31, item 5: the first attempt carries the request's
/// `RefusalToken`, no retry does (its other extensions it keeps), so a layer
/// below that refuses a retry cannot claim the service never saw the
/// request: the first attempt may have reached it.
#[tokio::test(start_paused = true)]
async fn item_5_no_retry_carries_the_refusal_token() {
    use tower_classify::RefusalToken;

    #[derive(Clone, Debug, PartialEq)]
    struct Tenant(&'static str);

    let seen = Arc::new(Mutex::new(Vec::new()));
    let inner = tower::service_fn({
        let seen = Arc::clone(&seen);
        move |request: Request<String>| {
            let mut seen = seen.lock().unwrap();
            let extensions = request.extensions();
            seen.push((
                extensions.get::<RefusalToken>().copied(),
                extensions.get::<Tenant>().cloned(),
            ));
            std::future::ready(status(if seen.len() < 3 { 503 } else { 200 }))
        }
    });
    let layer = RetryLayer::http_builder().backoff(fast()).build().unwrap();
    let token = RefusalToken::issue();
    let mut request = Request::get("/orders").body(String::new()).unwrap();
    request.extensions_mut().insert(token);
    request.extensions_mut().insert(Tenant("acme"));

    let response = layer.layer(inner).oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let tenant = Some(Tenant("acme"));
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (Some(token), tenant.clone()),
            (None, tenant.clone()),
            (None, tenant)
        ]
    );
}

/// A retry sent while the upload still streams, whose own answer comes
/// once the body is recorded whole: that answer, not the first one, is the
/// attempt being retried. The first answer (its body, its connection) is let
/// go then, and a deadline ending the call later names the second answer's
/// head, not the first's.
#[tokio::test(start_paused = true)]
async fn a_retry_answering_after_the_upload_ended_replaces_the_kept_answer() {
    let first_dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tracked = first_dropped.clone();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let inner = tower::service_fn(move |request: Request<Streamed>| {
        let attempt = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let tracked = tracked.clone();
        async move {
            let mut body = request.into_body();
            let answer = |body| {
                Response::builder()
                    .status(503)
                    .header("x-attempt", attempt)
                    .body(body)
                    .unwrap()
            };
            match attempt {
                1 => {
                    // Answered early; the upload goes on under it.
                    body.frame().await.unwrap()?;
                    tokio::spawn(async move { while let Some(Ok(_)) = body.frame().await {} });
                    Ok::<_, BoxError>(answer(Some(Tracked(tracked))))
                }
                // Sent while the upload streams; answers once it ended.
                2 => {
                    body.collect().await?;
                    Ok(answer(None))
                }
                // A server that never answers: the deadline ends the call.
                _ => std::future::pending().await,
            }
        }
    });
    let service = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(16))
        .layer(
            RetryLayer::http_builder()
                .backoff(Backoff::fixed(Duration::from_millis(100)).with_jitter(Jitter::None))
                .no_budget()
                .deadline(S(1))
                .build()
                .unwrap(),
        )
        .service(inner);
    let (mut upload, original) = Upload::new(4);
    let call = tokio::spawn(service.oneshot(Request::put("/").body(original).unwrap()));
    upload.send_data(Bytes::from("ab")).await.unwrap();
    // The first answer at 0 ms, the retry sent at 100 ms, the upload ended
    // at 150 ms, the retry's answer then, the next retry at 250 ms.
    tokio::time::sleep(Duration::from_millis(150)).await;
    upload.send_data(Bytes::from("cd")).await.unwrap();
    drop(upload);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let dropped_in_backoff = first_dropped.load(std::sync::atomic::Ordering::SeqCst);
    let Err(error) = call.await.unwrap() else {
        panic!("the deadline ends the call")
    };
    let exceeded = error
        .downcast_ref::<tower_retry_budget::error::DeadlineExceeded>()
        .unwrap_or_else(|| panic!("not the deadline: {error}"));
    assert_eq!(exceeded.attempts(), 3);
    let head = exceeded.response_head().expect("the last answer's head");
    let parts = head.downcast_ref::<http::response::Parts>().unwrap();
    assert_eq!(
        (
            parts.headers["x-attempt"].to_str().unwrap(),
            dropped_in_backoff
        ),
        ("2", true),
        "(the head the deadline names, the first answer let go once the retry answered)"
    );
}
