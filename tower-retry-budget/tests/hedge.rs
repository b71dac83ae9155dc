//! The hedge layer's rules, each on paused time.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower::{Service, ServiceExt};
use tower_classify::deadline::Deadline;
use tower_classify::{BoxError, Classified, FailureKind};
use tower_layer::Layer;
use tower_retry_budget::budget::TpsBudget;
use tower_retry_budget::hedge::HedgeLayer;
use tower_retry_budget::replay::HttpReplay;

type Answer = Result<&'static str, BoxError>;

fn reset() -> BoxError {
    io::Error::from(io::ErrorKind::ConnectionReset).into()
}

fn rejected() -> BoxError {
    Box::new(Classified::new(FailureKind::Rejected, "bad request"))
}

/// One attempt's script: how long it takes and what it answers.
#[derive(Clone)]
struct Step {
    after: Duration,
    answer: fn() -> Answer,
}

fn ok(ms: u64, body: &'static str) -> Step {
    // A `fn` pointer cannot capture `body`, so the answers are fixed names.
    let answer: fn() -> Answer = match body {
        "first" => || Ok("first"),
        "second" => || Ok("second"),
        "third" => || Ok("third"),
        _ => || Ok("other"),
    };
    Step {
        after: Duration::from_millis(ms),
        answer,
    }
}

fn fail(ms: u64, answer: fn() -> Answer) -> Step {
    Step {
        after: Duration::from_millis(ms),
        answer,
    }
}

/// What the service saw: when each attempt started and ended, and how many
/// are still running.
#[derive(Default)]
struct Seen {
    started: Mutex<Vec<Duration>>,
    dropped: Mutex<Vec<(usize, Duration)>>,
    alive: AtomicUsize,
}

struct Guard {
    seen: Arc<Seen>,
    attempt: usize,
    epoch: Instant,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.seen.alive.fetch_sub(1, Ordering::SeqCst);
        self.seen
            .dropped
            .lock()
            .unwrap()
            .push((self.attempt, self.epoch.elapsed()));
    }
}

/// A service whose attempt `n` follows `script[n]`, call after call.
fn scripted(
    script: Vec<Step>,
) -> (
    impl Service<&'static str, Response = &'static str, Error = BoxError, Future: Send> + Clone,
    Arc<Seen>,
) {
    let seen = Arc::new(Seen::default());
    let epoch = Instant::now();
    let log = seen.clone();
    let service = tower::service_fn(move |_: &'static str| {
        let attempt = {
            let mut started = log.started.lock().unwrap();
            started.push(epoch.elapsed());
            started.len() - 1
        };
        log.alive.fetch_add(1, Ordering::SeqCst);
        let step = script[attempt % script.len()].clone();
        let guard = Guard {
            seen: log.clone(),
            attempt: attempt + 1,
            epoch,
        };
        async move {
            let _guard = guard;
            tokio::time::sleep(step.after).await;
            (step.answer)()
        }
    });
    (service, seen)
}

fn fixed(ms: u64) -> HedgeLayer {
    HedgeLayer::builder()
        .delay(Duration::from_millis(ms))
        .build()
        .unwrap()
}

fn started(seen: &Seen) -> Vec<u64> {
    seen.started
        .lock()
        .unwrap()
        .iter()
        .map(|d| d.as_millis() as u64)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_hedge_is_sent_after_the_delay_and_the_first_answer_wins() {
    let (service, seen) = scripted(vec![ok(1000, "first"), ok(10, "second")]);
    let start = Instant::now();
    let answer = fixed(50).layer(service).oneshot("req").await.unwrap();
    assert_eq!(answer, "second");
    assert_eq!(start.elapsed(), Duration::from_millis(60));
    assert_eq!(started(&seen), [0, 50]);
    // The first attempt was dropped the moment the hedge answered.
    assert_eq!(seen.alive.load(Ordering::SeqCst), 0);
    assert_eq!(
        *seen.dropped.lock().unwrap(),
        [
            (2, Duration::from_millis(60)),
            (1, Duration::from_millis(60))
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn an_answer_before_the_delay_sends_no_hedge() {
    let (service, seen) = scripted(vec![ok(40, "first"), ok(10, "second")]);
    let answer = fixed(50).layer(service).oneshot("req").await.unwrap();
    assert_eq!(answer, "first");
    assert_eq!(started(&seen), [0]);
}

#[tokio::test(start_paused = true)]
async fn a_retryable_failure_waits_for_the_other_attempts_and_stops_hedging() {
    // Attempt 1 fails at 80 ms while attempt 2 (sent at 50 ms) runs; attempt
    // 3 would be due at 100 ms but is never sent after a failure answer.
    let (service, seen) = scripted(vec![
        fail(80, || Err(reset())),
        ok(100, "second"),
        ok(1, "third"),
    ]);
    let layer = HedgeLayer::builder()
        .delay(Duration::from_millis(50))
        .max_attempts(3)
        .build()
        .unwrap();
    let start = Instant::now();
    let answer = layer.layer(service).oneshot("req").await.unwrap();
    assert_eq!(answer, "second");
    assert_eq!(start.elapsed(), Duration::from_millis(150));
    assert_eq!(started(&seen), [0, 50]);
}

#[tokio::test(start_paused = true)]
async fn a_failure_no_attempt_can_fix_wins_at_once() {
    let (service, seen) = scripted(vec![ok(1000, "first"), fail(5, || Err(rejected()))]);
    let start = Instant::now();
    let error = fixed(50).layer(service).oneshot("req").await.unwrap_err();
    assert_eq!(error.to_string(), "bad request");
    assert_eq!(start.elapsed(), Duration::from_millis(55));
    assert_eq!(seen.alive.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn when_every_attempt_fails_the_latest_failure_is_the_answer() {
    let (service, _) = scripted(vec![
        fail(80, || Err(reset())),
        fail(70, || Err(io::Error::from(io::ErrorKind::TimedOut).into())),
    ]);
    let start = Instant::now();
    let error = fixed(50).layer(service).oneshot("req").await.unwrap_err();
    let io = error.downcast_ref::<io::Error>().unwrap();
    assert_eq!(io.kind(), io::ErrorKind::TimedOut);
    assert_eq!(start.elapsed(), Duration::from_millis(120));
}

#[tokio::test(start_paused = true)]
async fn a_hedge_that_fails_fast_stops_further_hedges() {
    // The first hedge (50 ms) fails at 51 ms; the third attempt, due at
    // 100 ms, is never sent, and the first attempt's answer is the call's.
    let (service, seen) = scripted(vec![
        ok(300, "first"),
        fail(1, || Err(reset())),
        ok(1, "third"),
    ]);
    let layer = HedgeLayer::builder()
        .delay(Duration::from_millis(50))
        .max_attempts(3)
        .build()
        .unwrap();
    let start = Instant::now();
    assert_eq!(layer.layer(service).oneshot("req").await.unwrap(), "first");
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert_eq!(started(&seen), [0, 50]);
}

#[tokio::test(start_paused = true)]
async fn up_to_max_attempts_are_in_flight_one_delay_apart() {
    let (service, seen) = scripted(vec![ok(1000, "first"), ok(1000, "second"), ok(10, "third")]);
    let layer = HedgeLayer::builder()
        .delay(Duration::from_millis(50))
        .max_attempts(3)
        .build()
        .unwrap();
    let start = Instant::now();
    assert_eq!(layer.layer(service).oneshot("req").await.unwrap(), "third");
    assert_eq!(start.elapsed(), Duration::from_millis(110));
    assert_eq!(started(&seen), [0, 50, 100]);
    assert_eq!(seen.alive.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_call_drops_every_attempt() {
    let (service, seen) = scripted(vec![ok(1000, "first"), ok(1000, "second")]);
    let call = fixed(50).layer(service).oneshot("req");
    let timed_out = tokio::time::timeout(Duration::from_millis(70), call).await;
    assert!(timed_out.is_err());
    assert_eq!(started(&seen), [0, 50]);
    assert_eq!(seen.alive.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn the_budget_caps_hedges_at_max_extra_load() {
    // Every call's first attempt is slow, so every call wants a hedge.
    let seen_ids = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let attempts = Arc::new(AtomicUsize::new(0));
    let (ids, count) = (seen_ids.clone(), attempts.clone());
    let service = tower::service_fn(move |id: u32| {
        count.fetch_add(1, Ordering::SeqCst);
        let first = ids.lock().unwrap().insert(id);
        async move {
            let wait = if first { 1000 } else { 10 };
            tokio::time::sleep(Duration::from_millis(wait)).await;
            Ok::<_, BoxError>(first)
        }
    });
    let layer = HedgeLayer::builder()
        .delay(Duration::from_millis(50))
        .max_extra_load(0.05)
        .min_hedges_per_sec(0)
        .build()
        .unwrap();
    let service = layer.layer(service);
    // 100 calls, one per millisecond.
    let mut calls = Vec::new();
    for id in 0..100 {
        calls.push(tokio::spawn(service.clone().oneshot(id)));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut hedged = 0;
    for call in calls {
        if !call.await.unwrap().unwrap() {
            hedged += 1;
        }
    }
    // 5 % of 100 calls; every other call waited out its slow first attempt.
    assert_eq!(hedged, 5);
    assert_eq!(attempts.load(Ordering::SeqCst), 105);
}

#[tokio::test(start_paused = true)]
async fn a_shared_budget_that_says_no_stops_hedges() {
    let (service, seen) = scripted(vec![ok(1000, "first"), ok(10, "second")]);
    let empty = Arc::new(TpsBudget::new(Duration::from_secs(10), 0, 0.0).unwrap());
    let layer = HedgeLayer::builder()
        .delay(Duration::from_millis(50))
        .shared_budget(empty)
        .build()
        .unwrap();
    assert_eq!(layer.layer(service).oneshot("req").await.unwrap(), "first");
    assert_eq!(started(&seen), [0]);
}

#[tokio::test(start_paused = true)]
async fn no_hedge_is_sent_too_close_to_the_callers_deadline() {
    let (service, seen) = scripted(vec![ok(1000, "first"), ok(10, "second")]);
    let layer = HedgeLayer::http_builder()
        .delay(Duration::from_millis(50))
        .min_attempt_time(Duration::from_millis(20))
        .build()
        .unwrap();
    let service = tower::service_fn(move |_: http::Request<String>| {
        let mut service = service.clone();
        async move {
            service
                .ready()
                .await?
                .call("req")
                .await
                .map(|body| http::Response::new(body.to_owned()))
        }
    });
    let mut hedged = layer.layer(service);

    // 60 ms left at the start: 10 ms at the hedge, below the 20 ms minimum.
    let mut request = http::Request::get("/").body(String::new()).unwrap();
    request
        .extensions_mut()
        .insert(Deadline::after(Duration::from_millis(60)));
    let response = hedged.ready().await.unwrap().call(request).await.unwrap();
    assert_eq!(response.body(), "first");
    assert_eq!(started(&seen), [0]);

    // 100 ms left: 50 ms at the hedge, enough.
    let mut request = http::Request::get("/").body(String::new()).unwrap();
    request
        .extensions_mut()
        .insert(Deadline::after(Duration::from_millis(100)));
    let response = hedged.ready().await.unwrap().call(request).await.unwrap();
    assert_eq!(response.body(), "second");
}

/// An HTTP service that answers the attempt-number header it got, after
/// `slow_first` for the first attempt of each call and 10 ms for the rest.
fn http_echo(
    slow_first: Duration,
) -> impl Service<
    http::Request<String>,
    Response = http::Response<String>,
    Error = BoxError,
    Future: Send,
> + Clone {
    tower::service_fn(move |request: http::Request<String>| {
        let attempt = request
            .headers()
            .get("grpc-previous-rpc-attempts")
            .map(|value| value.to_str().unwrap().to_owned());
        let wait = if attempt.is_none() {
            slow_first
        } else {
            Duration::from_millis(10)
        };
        async move {
            tokio::time::sleep(wait).await;
            Ok(http::Response::new(format!(
                "{} {attempt:?}",
                request.method()
            )))
        }
    })
}

#[tokio::test(start_paused = true)]
async fn http_hedges_carry_the_attempt_header_and_spare_non_idempotent_requests() {
    let layer = HedgeLayer::http_builder()
        .delay(Duration::from_millis(50))
        .map_replay(|_| {
            HttpReplay::new()
                .attempt_header(http::HeaderName::from_static("grpc-previous-rpc-attempts"))
        })
        .build()
        .unwrap();
    let mut service = layer.layer(http_echo(Duration::from_secs(1)));
    let get = http::Request::get("/").body(String::new()).unwrap();
    let response = service.ready().await.unwrap().call(get).await.unwrap();
    assert_eq!(
        response.body(),
        "GET Some(\"1\")",
        "the hedge answered, marked"
    );

    // A POST is never hedged: the first attempt's answer, a second later.
    let start = Instant::now();
    let post = http::Request::post("/").body(String::from("pay")).unwrap();
    let response = service.ready().await.unwrap().call(post).await.unwrap();
    assert_eq!(response.body(), "POST None");
    assert_eq!(start.elapsed(), Duration::from_secs(1));

    // Unless it carries an Idempotency-Key...
    let keyed = http::Request::post("/")
        .header("idempotency-key", "k1")
        .body(String::from("pay"))
        .unwrap();
    let response = service.ready().await.unwrap().call(keyed).await.unwrap();
    assert_eq!(response.body(), "POST Some(\"1\")");

    // ...or the layer is told the endpoint deduplicates.
    let layer = HedgeLayer::http_builder()
        .delay(Duration::from_millis(50))
        .map_replay(|_| {
            HttpReplay::new()
                .retry_non_idempotent(true)
                .attempt_header(http::HeaderName::from_static("grpc-previous-rpc-attempts"))
        })
        .build()
        .unwrap();
    let post = http::Request::post("/").body(String::from("pay")).unwrap();
    let response = layer
        .layer(http_echo(Duration::from_secs(1)))
        .oneshot(post)
        .await
        .unwrap();
    assert_eq!(response.body(), "POST Some(\"1\")");
}

#[tokio::test(start_paused = true)]
async fn the_percentile_delay_starts_after_min_samples_and_follows_latency() {
    let layer = HedgeLayer::builder()
        .percentile(0.5)
        .min_samples(10)
        .build()
        .unwrap();
    assert_eq!(layer.current_delay(), None);
    // Ten calls of 20 ms: no hedge, and the window learns the median.
    let (fast, seen) = scripted(vec![ok(20, "first")]);
    let service = layer.layer(fast);
    for _ in 0..10 {
        service.clone().oneshot("req").await.unwrap();
    }
    assert_eq!(seen.started.lock().unwrap().len(), 10);
    let delay = layer.current_delay().unwrap();
    assert!(
        (Duration::from_millis(19)..=Duration::from_millis(21)).contains(&delay),
        "{delay:?}"
    );

    // A slow first attempt is now hedged after about 20 ms.
    let (slow, seen) = scripted(vec![ok(1000, "first"), ok(10, "second")]);
    let start = Instant::now();
    assert_eq!(layer.layer(slow).oneshot("req").await.unwrap(), "second");
    assert!(
        start.elapsed() <= Duration::from_millis(32),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(seen.started.lock().unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_hedge_waits_for_its_service_to_be_ready() {
    let (mock, mut handle) = tower_test::mock::pair::<&'static str, &'static str>();
    handle.allow(1);
    let layer = fixed(50);
    let mut service = layer.layer(mock);
    let mut call =
        tokio_test::task::spawn(async move { service.ready().await.unwrap().call("req").await });
    assert!(call.poll().is_pending());
    let (_, first) = handle.next_request().await.unwrap();

    // The delay passes, but the clone has no capacity: nothing is sent.
    tokio::time::advance(Duration::from_millis(60)).await;
    assert!(call.poll().is_pending());
    assert!(handle.poll_request().is_pending());

    // Capacity comes back: the hedge goes out, answers, and wins.
    handle.allow(1);
    assert!(call.is_woken());
    assert!(call.poll().is_pending());
    let (request, hedge) = handle.next_request().await.unwrap();
    assert_eq!(request, "req");
    hedge.send_response("from the hedge");
    match call.poll() {
        std::task::Poll::Ready(Ok(answer)) => assert_eq!(answer, "from the hedge"),
        other => panic!("{other:?}"),
    }
    drop(first);
}

#[test]
fn bad_settings_name_their_field() {
    let field = |result: Result<HedgeLayer, tower_classify::ConfigError>| {
        result.unwrap_err().field().to_owned()
    };
    assert_eq!(
        field(HedgeLayer::builder().max_attempts(1).build()),
        "max_attempts"
    );
    assert_eq!(
        field(HedgeLayer::builder().max_attempts(6).build()),
        "max_attempts"
    );
    assert_eq!(
        field(HedgeLayer::builder().max_extra_load(0.0).build()),
        "max_extra_load"
    );
    assert_eq!(
        field(HedgeLayer::builder().max_extra_load(f64::NAN).build()),
        "max_extra_load"
    );
    assert_eq!(
        field(HedgeLayer::builder().percentile(1.0).build()),
        "percentile"
    );
    assert_eq!(
        field(HedgeLayer::builder().window(Duration::ZERO).build()),
        "window"
    );
    assert_eq!(
        field(HedgeLayer::builder().min_samples(0).build()),
        "min_samples"
    );
    assert_eq!(
        field(HedgeLayer::builder().min_hedges_per_sec(5000).build()),
        "min_hedges_per_sec"
    );
}

type Upload = http_body_util::channel::Channel<bytes::Bytes, io::Error>;
type Streamed = tower_retry_budget::body::ReplayBody<Upload>;

/// Attempt 1 reads the first frame and then hangs; any other attempt reads
/// the whole body and answers it.
fn upload_server(
    attempts: Arc<AtomicUsize>,
) -> impl Service<
    http::Request<Streamed>,
    Response = http::Response<String>,
    Error = BoxError,
    Future: Send,
> + Clone {
    tower::service_fn(move |request: http::Request<Streamed>| {
        let attempt = attempts.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            use http_body_util::BodyExt;
            let mut body = request.into_body();
            if attempt == 1 {
                let _first = body.frame().await;
                std::future::pending::<()>().await;
            }
            let bytes = body.collect().await?.to_bytes();
            Ok(http::Response::new(String::from_utf8(bytes.to_vec())?))
        }
    })
}

/// A PUT of a streamed body recorded up to `limit` bytes, sent through a
/// hedge layer (50 ms) to [`upload_server`]: the upload's sender, the call,
/// and the attempts counter.
type UploadSender = http_body_util::channel::Sender<bytes::Bytes, io::Error>;
type UploadCall = tokio::task::JoinHandle<Result<http::Response<String>, BoxError>>;

fn start_upload(limit: usize) -> (UploadSender, UploadCall, Arc<AtomicUsize>) {
    let (upload, original) = Upload::new(4);
    let body = Streamed::new(original, limit);
    let attempts = Arc::new(AtomicUsize::new(0));
    let layer = HedgeLayer::http_builder()
        .delay(Duration::from_millis(50))
        .build()
        .unwrap();
    let service = layer.layer(upload_server(attempts.clone()));
    let request = http::Request::put("/file").body(body).unwrap();
    (upload, tokio::spawn(service.oneshot(request)), attempts)
}

#[tokio::test(start_paused = true)]
async fn a_hedge_streams_a_body_the_first_attempt_is_still_reading() {
    let (mut upload, call, attempts) = start_upload(64 * 1024);
    // The first frame goes to attempt 1 as it is sent; the upload goes on
    // after the hedge started, and the hedge gets all of it.
    upload
        .send_data(bytes::Bytes::from("hello, "))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(attempts.load(Ordering::SeqCst), 2, "the hedge was sent");
    upload.send_data(bytes::Bytes::from("world")).await.unwrap();
    drop(upload);
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.body(), "hello, world");
}

#[tokio::test(start_paused = true)]
async fn a_body_past_its_recording_limit_is_not_hedged() {
    // A 4-byte recording: the first frame alone outgrows it.
    let (mut upload, call, attempts) = start_upload(4);
    upload
        .send_data(bytes::Bytes::from("hello, "))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        1,
        "no hedge of a released body"
    );
    call.abort();
}

#[tokio::test(start_paused = true)]
async fn a_call_past_its_deadline_sends_nothing() {
    let (service, seen) = scripted(vec![ok(10, "first")]);
    let service = tower::service_fn(move |_: http::Request<String>| {
        let mut service = service.clone();
        async move {
            service
                .ready()
                .await?
                .call("req")
                .await
                .map(|body| http::Response::new(body.to_owned()))
        }
    });
    let layer = HedgeLayer::http_builder()
        .delay(Duration::from_millis(50))
        .min_attempt_time(Duration::from_millis(20))
        .build()
        .unwrap();
    let mut request = http::Request::get("/").body(String::new()).unwrap();
    request
        .extensions_mut()
        .insert(Deadline::after(Duration::from_millis(15)));
    let error = layer.layer(service).oneshot(request).await.unwrap_err();
    let exceeded = error
        .downcast_ref::<tower_retry_budget::error::DeadlineExceeded>()
        .expect("DeadlineExceeded");
    assert_eq!(exceeded.attempts(), 0);
    assert!(started(&seen).is_empty());
}

fn shed() -> BoxError {
    Box::new(Classified::new(FailureKind::Shed, "circuit open"))
}

#[tokio::test(start_paused = true)]
async fn a_hedge_refused_below_does_not_cancel_the_first_attempt() {
    // The hedge meets an open circuit (a local refusal) at 51 ms; the first
    // attempt answers at 100 ms and is the call's answer.
    let (service, seen) = scripted(vec![ok(100, "first"), fail(1, || Err(shed()))]);
    let start = Instant::now();
    let answer = fixed(50).layer(service).oneshot("req").await.unwrap();
    assert_eq!(answer, "first");
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    assert_eq!(started(&seen), [0, 50]);
}

#[tokio::test(start_paused = true)]
async fn the_losers_are_dropped_before_the_call_resolves() {
    let (service, seen) = scripted(vec![ok(1000, "first"), ok(1000, "second"), ok(10, "third")]);
    let layer = HedgeLayer::builder()
        .delay(Duration::from_millis(50))
        .max_attempts(3)
        .build()
        .unwrap();
    let mut service = layer.layer(service);
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    // The response future itself, kept alive after it resolves.
    let mut call = tokio_test::task::spawn(service.call("req"));
    let answer = loop {
        if let std::task::Poll::Ready(answer) = call.poll() {
            break answer.unwrap();
        }
        tokio::time::advance(Duration::from_millis(10)).await;
    };
    assert_eq!(answer, "third");
    assert_eq!(started(&seen), [0, 50, 100]);
    assert_eq!(
        seen.alive.load(Ordering::SeqCst),
        0,
        "both losers gone while the resolved future still exists"
    );
    drop(call);
}

#[tokio::test(start_paused = true)]
async fn a_readiness_stall_does_not_bunch_the_next_hedges() {
    let (mock, mut handle) = tower_test::mock::pair::<&'static str, &'static str>();
    handle.allow(1);
    let layer = HedgeLayer::builder()
        .delay(Duration::from_millis(50))
        .max_attempts(3)
        .build()
        .unwrap();
    let mut service = layer.layer(mock);
    let start = Instant::now();
    let mut call =
        tokio_test::task::spawn(async move { service.ready().await.unwrap().call("req").await });
    assert!(call.poll().is_pending());
    let _first = handle.next_request().await.unwrap();
    // Due at 50 ms, but the service is not ready until 200 ms.
    tokio::time::advance(Duration::from_millis(200)).await;
    assert!(call.poll().is_pending());
    handle.allow(2);
    assert!(call.poll().is_pending());
    let _second = handle.next_request().await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    // The third is due a delay after the second went out, not at once.
    assert!(call.poll().is_pending());
    assert!(handle.poll_request().is_pending(), "no catch-up burst");
    tokio::time::advance(Duration::from_millis(50)).await;
    assert!(call.poll().is_pending());
    let (_, third) = handle.next_request().await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(250));
    third.send_response("third");
    match call.poll() {
        std::task::Poll::Ready(Ok(answer)) => assert_eq!(answer, "third"),
        other => panic!("{other:?}"),
    }
}

/// A budget that refuses its first `refusals` withdrawals, then allows.
struct RefusesFirst {
    refusals: std::sync::atomic::AtomicU32,
}

impl tower::retry::budget::Budget for RefusesFirst {
    fn deposit(&self) {}
    fn withdraw(&self) -> bool {
        self.refusals
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_err()
    }
}

#[tokio::test(start_paused = true)]
async fn a_shared_refusal_gives_the_own_budget_its_withdrawal_back() {
    // 50 % of 10 calls: 5 hedges in the layer's own budget. Calls 1 to 9
    // find a token in it (call 0 has half of one), and the shared budget
    // refuses those 9; the own budget must still have all 5 afterwards.
    let seen_ids = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let ids = seen_ids.clone();
    let service = tower::service_fn(move |id: u32| {
        let first = ids.lock().unwrap().insert(id);
        async move {
            tokio::time::sleep(Duration::from_millis(if first { 100 } else { 10 })).await;
            Ok::<_, BoxError>(first)
        }
    });
    let layer = HedgeLayer::builder()
        .delay(Duration::from_millis(50))
        .max_extra_load(0.5)
        .min_hedges_per_sec(0)
        .shared_budget(Arc::new(RefusesFirst {
            refusals: std::sync::atomic::AtomicU32::new(9),
        }))
        .build()
        .unwrap();
    let service = layer.layer(service);
    for id in 0..10 {
        assert!(
            service.clone().oneshot(id).await.unwrap(),
            "refused by the shared budget"
        );
    }
    let mut hedged = 0;
    for id in 10..15 {
        if !service.clone().oneshot(id).await.unwrap() {
            hedged += 1;
        }
    }
    // 5 kept + 0.5 per new call: each of the 5 is hedged. Without the
    // refund the 9 refusals would have spent it, and only 2 would be.
    assert_eq!(hedged, 5, "the own budget kept its tokens");
}

#[tokio::test(start_paused = true)]
async fn every_hedge_carries_the_number_of_attempts_before_it() {
    let headers = Arc::new(Mutex::new(Vec::new()));
    let log = headers.clone();
    let service = tower::service_fn(move |request: http::Request<String>| {
        let attempt = request
            .headers()
            .get("grpc-previous-rpc-attempts")
            .map(|value| value.to_str().unwrap().to_owned());
        log.lock().unwrap().push(attempt.clone());
        async move {
            let wait = if attempt.as_deref() == Some("2") {
                10
            } else {
                1000
            };
            tokio::time::sleep(Duration::from_millis(wait)).await;
            Ok::<_, BoxError>(http::Response::new(attempt))
        }
    });
    let layer = HedgeLayer::http_builder()
        .delay(Duration::from_millis(50))
        .max_attempts(3)
        .map_replay(|_| {
            HttpReplay::new()
                .attempt_header(http::HeaderName::from_static("grpc-previous-rpc-attempts"))
        })
        .build()
        .unwrap();
    let get = http::Request::get("/").body(String::new()).unwrap();
    let response = layer.layer(service).oneshot(get).await.unwrap();
    assert_eq!(response.body().as_deref(), Some("2"));
    assert_eq!(
        *headers.lock().unwrap(),
        [None, Some("1".to_owned()), Some("2".to_owned())]
    );
}

/// Attempt 1 reads every frame 100 ms after the previous one (a slow
/// server); any other attempt reads at once.
fn slow_reader_server(
    attempts: Arc<AtomicUsize>,
) -> impl Service<
    http::Request<Streamed>,
    Response = http::Response<String>,
    Error = BoxError,
    Future: Send,
> + Clone {
    tower::service_fn(move |request: http::Request<Streamed>| {
        let attempt = attempts.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            use http_body_util::BodyExt;
            let mut body = request.into_body();
            let mut all = Vec::new();
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame?.into_data() {
                    all.extend_from_slice(&data);
                }
                if attempt == 1 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Ok(http::Response::new(String::from_utf8(all)?))
        }
    })
}

/// A streamed upload still under its limit when the hedge goes out, then
/// read past it by the hedge while the first attempt lags: the first
/// attempt's copy cannot be sent whole, and its error is not the call's
/// answer. Taken as one, it cancelled the hedge that was sending the whole
/// body, and an upload that succeeds unhedged failed.
#[tokio::test(start_paused = true)]
async fn an_attempt_that_lost_its_body_to_another_does_not_answer_the_call() {
    let (mut upload, original) = Upload::new(4);
    let body = Streamed::new(original, 10);
    let attempts = Arc::new(AtomicUsize::new(0));
    let layer = HedgeLayer::http_builder()
        .delay(Duration::from_millis(50))
        .build()
        .unwrap();
    let service = layer.layer(slow_reader_server(attempts.clone()));
    let request = http::Request::put("/file").body(body).unwrap();
    let call = tokio::spawn(service.oneshot(request));
    upload
        .send_data(bytes::Bytes::from("hello, "))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(attempts.load(Ordering::SeqCst), 2, "the hedge was sent");
    upload
        .send_data(bytes::Bytes::from("world!!!"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    upload.send_data(bytes::Bytes::from(" end")).await.unwrap();
    drop(upload);
    let response = call.await.unwrap().expect("the hedge sends the whole body");
    assert_eq!(response.body(), "hello, world!!! end");
}

type Declared = tower_retry_budget::body::ReplayBody<http_body_util::Full<bytes::Bytes>>;

/// Sends a PUT of "hello world", declared over its 4-byte recording limit
/// (so no copy keeps it), hedged after 50 ms, to a server whose first
/// attempt starts reading 100 ms late (a slow connect) and whose hedge
/// reads at once and answers `status` with the body it read, after `after`.
/// The call's answer, once the hedge was seen to be sent.
async fn hedged_declared_body(
    status: http::StatusCode,
    after: Duration,
) -> Result<http::Response<String>, BoxError> {
    let attempts = Arc::new(AtomicUsize::new(0));
    let counter = attempts.clone();
    let server = tower::service_fn(move |request: http::Request<Declared>| {
        let attempt = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            use http_body_util::BodyExt;
            if attempt == 1 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let bytes = request.into_body().collect().await?.to_bytes();
            if attempt != 1 {
                tokio::time::sleep(after).await;
            }
            let response = http::Response::builder()
                .status(status)
                .body(String::from_utf8(bytes.to_vec())?)?;
            Ok::<_, BoxError>(response)
        }
    });
    let layer = HedgeLayer::http_builder()
        .delay(Duration::from_millis(50))
        .build()
        .unwrap();
    let whole = http_body_util::Full::new(bytes::Bytes::from("hello world"));
    let request = http::Request::put("/file")
        .body(Declared::new(whole, 4))
        .unwrap();
    let response = layer.layer(server).oneshot(request).await;
    assert_eq!(attempts.load(Ordering::SeqCst), 2, "the hedge was sent");
    response
}

/// A body that declares more than its limit is kept by no copy: whichever
/// attempt reads first streams it, and the other's "cannot be replayed"
/// waits for that one's answer.
#[tokio::test(start_paused = true)]
async fn a_body_over_its_limit_is_answered_by_the_attempt_that_read_it() {
    let response = hedged_declared_body(http::StatusCode::OK, Duration::from_millis(150))
        .await
        .expect("the hedge read the whole body");
    assert_eq!(response.body(), "hello world");
}

/// The attempt that read the body failed (a 503) before the other found its
/// copy could not be sent: the call's answer is the 503, not the "cannot be
/// replayed" error that said nothing of the request.
#[tokio::test(start_paused = true)]
async fn a_lost_body_does_not_hide_the_failure_of_the_attempt_that_read_it() {
    let response = hedged_declared_body(http::StatusCode::SERVICE_UNAVAILABLE, Duration::ZERO)
        .await
        .expect("the hedge's answer, not the lost body");
    assert_eq!(response.status(), http::StatusCode::SERVICE_UNAVAILABLE);
}

/// Issue 31, item 5: a refusal that proves the first attempt went no
/// further (it carries the caller's `RefusalToken`) says nothing of a hedge
/// that was sent: it never replaces the hedge's failure as the call's
/// answer, or a guard above would free a key whose handler the hedge
/// reached. Here the hedge fails at 60 ms; the first attempt, queued, is
/// refused at 100 ms.
#[tokio::test(start_paused = true)]
async fn item_5_a_first_attempts_proven_refusal_never_replaces_a_hedges_failure() {
    use tower_classify::{Failure, RefusalToken};
    let service = tower::service_fn(|request: http::Request<String>| async move {
        match request.extensions().get::<RefusalToken>().copied() {
            Some(token) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let refused = Failure::new(FailureKind::Shed).with_refusal(Some(token));
                Err::<http::Response<String>, BoxError>(Box::new(Classified::new(
                    refused,
                    "circuit open",
                )))
            }
            None => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                Err(Box::new(io::Error::from(io::ErrorKind::ConnectionReset)) as BoxError)
            }
        }
    });
    let layer = HedgeLayer::http_builder()
        .delay(Duration::from_millis(50))
        .build()
        .unwrap();
    let mut request = http::Request::get("/").body(String::new()).unwrap();
    request.extensions_mut().insert(RefusalToken::issue());
    let error = layer.layer(service).oneshot(request).await.unwrap_err();
    assert!(
        error.is::<io::Error>(),
        "the hedge's failure is the answer, not the first attempt's refusal: {error}"
    );
}
