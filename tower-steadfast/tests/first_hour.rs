//! What a new user meets in the first hour behind a request handler: the
//! stack built from the defaults never holds a handler past its deadline.
//! Driven over an HTTP service on a paused clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::time::Instant;
use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
use tower_poison::store::MemoryStore;
use tower_poison::ReplayBody;
use tower_steadfast::ResilienceConfig;

type Body = ReplayBody<Full<Bytes>>;

/// The call deadline a handler gets on defaults, as the README promises.
const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);

fn get() -> Request<Full<Bytes>> {
    Request::get("http://upstream.test/orders/7")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// An upstream that always answers 429 with `Retry-After: seconds`, and
/// records when each request arrived.
fn rate_limited(
    seconds: u64,
    arrivals: Arc<Mutex<Vec<Instant>>>,
) -> impl Service<Request<Body>, Response = Response<Full<Bytes>>, Error = BoxError, Future: Send>
       + Clone
       + Send
       + 'static {
    service_fn(move |_request: Request<Body>| {
        arrivals.lock().unwrap().push(Instant::now());
        async move {
            Ok::<_, BoxError>(
                Response::builder()
                    .status(StatusCode::TOO_MANY_REQUESTS)
                    .header("retry-after", seconds.to_string())
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
        }
    })
}

/// Calls a stack built from the defaults over a downstream answering 429
/// with `Retry-After: seconds`; returns how long the call took, its
/// result, and when each attempt arrived (from the call's start).
async fn call_rate_limited(
    seconds: u64,
) -> (Duration, Result<StatusCode, BoxError>, Vec<Duration>) {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let stack = ServiceBuilder::new()
        .layer(ResilienceConfig::default().layer("orders", MemoryStore::new(100)))
        .service(rate_limited(seconds, Arc::clone(&arrivals)));
    let start = Instant::now();
    // Bounded here only so that a stack without a deadline fails the test
    // rather than hanging it.
    let result = tokio::time::timeout(Duration::from_secs(4 * 3600), stack.oneshot(get()))
        .await
        .expect("the call ends")
        .map(|response| response.status());
    let took = start.elapsed();
    let arrivals = arrivals
        .lock()
        .unwrap()
        .iter()
        .map(|t| *t - start)
        .collect();
    (took, result, arrivals)
}

/// `Retry-After: 2` fits in the deadline: each wait is honoured, and the
/// call ends well within the deadline.
#[tokio::test(start_paused = true)]
async fn first_hour_1_a_short_retry_after_is_honoured_within_the_deadline() {
    let (took, result, arrivals) = call_rate_limited(2).await;
    assert!(took <= DEFAULT_DEADLINE, "took {took:?}");
    assert!(arrivals.len() >= 2, "the hint was waited out: {arrivals:?}");
    for pair in arrivals.windows(2) {
        assert!(pair[1] - pair[0] >= Duration::from_secs(2), "{arrivals:?}");
    }
    // Whether the last 429 or the loop's refusal of a wait past the
    // deadline ends the call, it ends by the deadline.
    match result {
        Ok(status) => assert_eq!(status, StatusCode::TOO_MANY_REQUESTS),
        Err(error) => assert!(
            error
                .downcast_ref::<tower_retry_budget::error::WaitTooLong>()
                .is_some(),
            "{error}"
        ),
    }
}

/// A hint that cannot fit in the time left is not slept: the call answers
/// at once, at the attempt that got it.
#[tokio::test(start_paused = true)]
async fn first_hour_1_a_retry_after_past_the_deadline_answers_at_once() {
    // An hour: no attempt after the first, no wait at all.
    let (took, result, arrivals) = call_rate_limited(3600).await;
    assert_eq!(took, Duration::ZERO, "answered at once");
    assert_eq!(arrivals, [Duration::ZERO]);
    let error = result.unwrap_err();
    let too_long = error
        .downcast_ref::<tower_retry_budget::error::WaitTooLong>()
        .unwrap_or_else(|| panic!("{error}"));
    assert_eq!(too_long.wait(), Duration::from_secs(3600));
    assert_eq!(
        too_long
            .response_head()
            .and_then(|head| head.downcast_ref::<http::response::Parts>())
            .map(|parts| parts.status),
        Some(StatusCode::TOO_MANY_REQUESTS),
        "the downstream's answer is kept"
    );

    // Four seconds fit twice in ten, not three times: the third attempt's
    // hint is refused at once, at 8 s, rather than slept to 12 s.
    let (took, result, arrivals) = call_rate_limited(4).await;
    assert_eq!(
        arrivals,
        [0, 4, 8].map(Duration::from_secs),
        "two waits of 4 s"
    );
    assert_eq!(took, Duration::from_secs(8), "no third wait");
    let error = result.unwrap_err();
    assert!(
        error
            .downcast_ref::<tower_retry_budget::error::WaitTooLong>()
            .is_some(),
        "{error}"
    );
}

/// A downstream that never answers: each attempt is cut by the attempt
/// timeout and the whole call by the deadline.
#[tokio::test(start_paused = true)]
async fn first_hour_1_a_hung_downstream_is_cut_at_the_deadline() {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&arrivals);
    let hung = service_fn(move |_request: Request<Body>| {
        seen.lock().unwrap().push(Instant::now());
        std::future::pending::<Result<Response<Full<Bytes>>, BoxError>>()
    });
    let stack = ServiceBuilder::new()
        .layer(ResilienceConfig::default().layer("orders", MemoryStore::new(100)))
        .service(hung);
    let start = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(3600), stack.oneshot(get()))
        .await
        .expect("the stack ends the call itself");
    assert!(result.is_err());
    assert!(start.elapsed() <= DEFAULT_DEADLINE, "{:?}", start.elapsed());
    assert!(
        arrivals.lock().unwrap().len() >= 2,
        "an attempt that hangs is cut and retried"
    );
}

/// Calls the stack `config` builds over a downstream answering 429 with
/// `Retry-After: seconds`: returns when each attempt arrived (from the
/// call's start) and the wait the stack refused, with the time that was left.
async fn refused_hint(
    config: ResilienceConfig,
    seconds: u64,
) -> (Vec<Duration>, Duration, Duration) {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let stack = ServiceBuilder::new()
        .layer(config.layer("orders", MemoryStore::new(100)))
        .service(rate_limited(seconds, Arc::clone(&arrivals)));
    let start = Instant::now();
    let error = tokio::time::timeout(Duration::from_secs(3600), stack.oneshot(get()))
        .await
        .expect("the call ends")
        .unwrap_err();
    let too_long = error
        .downcast_ref::<tower_retry_budget::error::WaitTooLong>()
        .unwrap_or_else(|| panic!("{error}"));
    assert_eq!(
        too_long.reason(),
        tower_retry_budget::error::WaitLimit::Deadline,
        "{error}"
    );
    assert_eq!(
        start.elapsed(),
        *arrivals.lock().unwrap().last().unwrap() - start
    );
    let arrivals = arrivals
        .lock()
        .unwrap()
        .iter()
        .map(|t| *t - start)
        .collect();
    (arrivals, too_long.wait(), too_long.limit())
}

/// Calls the stack `config` builds over a downstream that never answers:
/// returns, for each attempt, when it arrived and when the stack cut it
/// (both from the call's start), and when the call ended.
async fn cut_attempts(config: ResilienceConfig) -> (Vec<(Duration, Duration)>, Duration) {
    /// When each attempt arrived, and when it was cut.
    type Attempts = Arc<Mutex<Vec<(Instant, Option<Instant>)>>>;
    /// Notes when the attempt it lives in is dropped, i.e. cut.
    struct Cut(Attempts, usize);
    impl Drop for Cut {
        fn drop(&mut self) {
            self.0.lock().unwrap()[self.1].1 = Some(Instant::now());
        }
    }
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&attempts);
    let hung = service_fn(move |_request: Request<Body>| {
        let index = {
            let mut seen = seen.lock().unwrap();
            seen.push((Instant::now(), None));
            seen.len() - 1
        };
        let cut = Cut(Arc::clone(&seen), index);
        async move {
            let _cut = cut;
            std::future::pending::<Result<Response<Full<Bytes>>, BoxError>>().await
        }
    });
    let stack = ServiceBuilder::new()
        .layer(config.layer("orders", MemoryStore::new(100)))
        .service(hung);
    let start = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(3600), stack.oneshot(get()))
        .await
        .expect("the stack ends the call itself");
    assert!(result.is_err());
    let took = start.elapsed();
    let attempts = attempts
        .lock()
        .unwrap()
        .iter()
        .map(|(arrived, cut)| (*arrived - start, cut.expect("every attempt is cut") - start))
        .collect();
    (attempts, took)
}

/// The block's keys set the retry layer's own deadline and attempt timeout:
/// measured on a paused clock, the deadline is what a server's hint is
/// refused against, and the attempt timeout is when a hung attempt is cut.
#[tokio::test(start_paused = true)]
async fn first_hour_1_the_block_sets_the_deadline_and_the_attempt_timeout() {
    let config = || {
        ResilienceConfig::from_yaml_str("retry: {deadline_ms: 4000, attempt_timeout_ms: 500}")
            .unwrap()
    };
    // A 3 s hint is waited out once; at 3 s the next one is refused by the
    // retry layer with 1 s left: a deadline of 4 s from the first attempt.
    let (arrivals, wait, left) = refused_hint(config(), 3).await;
    assert_eq!(arrivals, [0, 3].map(Duration::from_secs));
    assert_eq!(wait, Duration::from_secs(3));
    assert_eq!(left, Duration::from_secs(1), "a deadline of 4 s");
    // Each hung attempt is cut 500 ms after it started, and the last one
    // by the deadline at the latest; the call ends by the deadline.
    let (attempts, took) = cut_attempts(config()).await;
    assert!(attempts.len() >= 2, "{attempts:?}");
    let (last, others) = attempts.split_last().unwrap();
    for (arrived, cut) in others {
        assert_eq!(*cut - *arrived, Duration::from_millis(500), "{attempts:?}");
    }
    assert!(
        last.1 - last.0 <= Duration::from_millis(500),
        "{attempts:?}"
    );
    assert_eq!(took, last.1);
    assert!(took <= Duration::from_secs(4), "{took:?}");

    // Left out, the block's own defaults, which the README states: a 10 s
    // deadline (a 6 s hint is refused with 4 s left) and a 3 s attempt
    // timeout.
    let (arrivals, _, left) = refused_hint(ResilienceConfig::default(), 6).await;
    assert_eq!(arrivals, [0, 6].map(Duration::from_secs));
    assert_eq!(left, DEFAULT_DEADLINE - Duration::from_secs(6));
    let (attempts, took) = cut_attempts(ResilienceConfig::default()).await;
    assert!(attempts.len() >= 2, "{attempts:?}");
    let (first_arrived, first_cut) = attempts[0];
    assert_eq!(first_arrived, Duration::ZERO);
    assert_eq!(first_cut, Duration::from_secs(3), "{attempts:?}");
    assert!(took <= DEFAULT_DEADLINE, "{took:?}");
}

/// The crates a build compiles for `cargo tree`'s arguments `args`
/// (normal dependencies only), or `None` when cargo cannot be run here.
fn compiled_crates(args: &[&str]) -> Option<Vec<String>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = std::process::Command::new(cargo)
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    assert!(
        output.status.success(),
        "cargo tree {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    Some(
        text.lines()
            .filter_map(|line| line.split_whitespace().next())
            .map(str::to_owned)
            .collect(),
    )
}

/// The default features compile what reading a YAML file needs: a
/// maintained YAML crate, no TOML, no JSON Schema, no store; and the
/// memory store, from `tower-poison` without its default feature, compiles
/// no redb.
#[test]
fn first_hour_7_the_default_features_compile_only_the_common_path() {
    let Some(facade) = compiled_crates(&["-p", "tower-steadfast"]) else {
        eprintln!("cargo cannot be run here: skipped");
        return;
    };
    assert!(facade.iter().any(|name| name == "yaml_serde"), "{facade:?}");
    for heavy in [
        "serde_yaml",
        "unsafe-libyaml",
        "toml",
        "schemars",
        "redb",
        "redis",
    ] {
        assert!(
            !facade.iter().any(|name| name == heavy),
            "tower-steadfast's defaults compile {heavy}"
        );
    }

    let memory_store = compiled_crates(&["-p", "tower-poison", "--no-default-features"])
        .expect("cargo ran once already");
    assert!(
        !memory_store.iter().any(|name| name == "redb"),
        "{memory_store:?}"
    );
}

/// Records the message of every event emitted on this thread.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message<'a>(&'a mut String);
        impl tracing::field::Visit for Message<'_> {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    *self.0 = format!("{value:?}");
                }
            }
        }
        if *event.metadata().level() == tracing::Level::WARN {
            let mut text = String::new();
            event.record(&mut Message(&mut text));
            self.0.lock().unwrap().push(text);
        }
    }
}

/// Loads `yaml` and returns the warnings logged while loading it.
fn load_warnings(yaml: &str) -> (ResilienceConfig, Vec<String>) {
    use tracing_subscriber::layer::SubscriberExt;
    let seen = Warnings::default();
    let subscriber = tracing_subscriber::registry().with(seen.clone());
    let config = tracing::subscriber::with_default(subscriber, || {
        ResilienceConfig::from_yaml_str(yaml).unwrap()
    });
    let logged = seen.0.lock().unwrap().clone();
    (config, logged)
}

/// A key that does nothing given the others is said at load, not silently
/// ignored: the seed block's `max_row_attempts: 3` without a
/// `message_id_header`, retry settings with `max_attempts: 1` or
/// `backoff: none`, an attempt timeout the deadline always beats.
#[test]
fn first_hour_6_settings_that_do_nothing_are_warned_about_at_load() {
    let seed = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/seed.yaml"
    ))
    .unwrap();
    let (config, logged) = load_warnings(&seed);
    let expected = "poison.max_row_attempts has no effect without poison.message_id_header";
    assert_eq!(config.warnings().len(), 1, "{:?}", config.warnings());
    assert!(config.warnings()[0].starts_with(expected));
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert!(
        logged[0].contains(&format!("resilience.{expected}")),
        "the log names the key's path in the document: {logged:?}"
    );

    // With the header, the same key works: nothing to say.
    let (config, logged) =
        load_warnings("poison: {max_row_attempts: 3, message_id_header: x-message-id}");
    assert!(
        config.warnings().is_empty() && logged.is_empty(),
        "{logged:?}"
    );
    // The default stack, an empty block: nothing to say either.
    let (config, logged) = load_warnings("");
    assert!(
        config.warnings().is_empty() && logged.is_empty(),
        "{logged:?}"
    );

    let (config, _) =
        load_warnings("retry: {max_attempts: 1, backoff: fixed, retry_on: [timeout]}");
    assert_eq!(
        config.warnings(),
        [
            "retry.backoff has no effect with retry.max_attempts: 1, which makes no retry",
            "retry.retry_on has no effect with retry.max_attempts: 1, which makes no retry",
        ]
    );
    let (config, _) = load_warnings("retry: {backoff: none, base_ms: 100, jitter: full}");
    assert_eq!(
        config.warnings(),
        [
            "retry.base_ms has no effect with retry.backoff: none, which retries at once",
            "retry.jitter has no effect with retry.backoff: none, which retries at once",
        ]
    );
    let (config, _) = load_warnings("retry: {deadline_ms: 2000}");
    assert_eq!(
        config.warnings(),
        [
            "retry.attempt_timeout_ms (3000, its default) has no effect: retry.deadline_ms \
          (2000) ends every attempt first"
        ]
    );
    let (config, _) = load_warnings("retry: {deadline_ms: 5000, attempt_timeout_ms: 1000}");
    assert!(config.warnings().is_empty(), "{:?}", config.warnings());
}

/// The facade builds the one recommended order, retry inside the breaker:
/// the breaker counts whole calls (each after all its tries), and while it
/// is open a call reaches the upstream not once and waits for nothing.
#[tokio::test(start_paused = true)]
async fn first_hour_5_the_facade_builds_retry_inside_the_breaker() {
    let config = ResilienceConfig::from_yaml_str(
        "retry: {max_attempts: 3, backoff: none}\n\
         circuit_breaker: {consecutive_failures: 2, cooldown_secs: 30}",
    )
    .unwrap();
    let calls = Arc::new(Mutex::new(0usize));
    let seen = Arc::clone(&calls);
    let down = service_fn(move |_request: Request<Body>| {
        *seen.lock().unwrap() += 1;
        async {
            Ok::<_, BoxError>(
                Response::builder()
                    .status(StatusCode::SERVICE_UNAVAILABLE)
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
        }
    });
    let mut stack = ServiceBuilder::new()
        .layer(config.layer("orders", MemoryStore::new(100)))
        .service(down);

    for call in 1..=2 {
        let response = stack.ready().await.unwrap().call(get()).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        // Retry outside the breaker would have met an open circuit at the
        // second call's first attempt, after two attempts in all.
        assert_eq!(*calls.lock().unwrap(), 3 * call, "every try of call {call}");
    }
    let start = Instant::now();
    let refused = stack.ready().await.unwrap().call(get()).await.unwrap_err();
    assert!(
        refused
            .downcast_ref::<tower_breaker::CircuitOpen>()
            .is_some(),
        "{refused}"
    );
    assert_eq!(*calls.lock().unwrap(), 6, "no call reaches the upstream");
    assert_eq!(start.elapsed(), Duration::ZERO, "and none waits");
}
