//! The breaker's behaviour, in paused time against `tower-test` mocks.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use tokio_test::{assert_pending, assert_ready_ok};
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_breaker::Policy;
use tower_breaker::{CircuitBreakerLayer, CircuitOpen, Mode, State, Window};
use tower_classify::{BoxError, Classified, ErrorChainClassifier, FailureKind, HttpClassifier};
use tower_test::mock;

type Handle = mock::Handle<u32, &'static str>;

fn refused() -> io::Error {
    io::Error::from(io::ErrorKind::ConnectionRefused)
}

/// One call that reaches the mock and fails with a refused connection.
async fn fail<S>(svc: &mut mock::Spawn<S>, handle: &mut Handle, id: u32) -> BoxError
where
    S: Service<u32, Response = &'static str, Error = BoxError>,
{
    assert_ready_ok!(svc.poll_ready());
    let future = svc.call(id);
    let (req, send) = handle
        .next_request()
        .await
        .expect("call reached the service");
    assert_eq!(req, id);
    send.send_error(refused());
    future.await.unwrap_err()
}

/// One call that reaches the mock and succeeds.
async fn succeed<S>(svc: &mut mock::Spawn<S>, handle: &mut Handle, id: u32)
where
    S: Service<u32, Response = &'static str, Error = BoxError>,
{
    assert_ready_ok!(svc.poll_ready());
    let future = svc.call(id);
    let (req, send) = handle
        .next_request()
        .await
        .expect("call reached the service");
    assert_eq!(req, id);
    send.send_response("ok");
    assert_eq!(future.await.unwrap(), "ok");
}

/// One call that must be refused without reaching the mock.
fn rejected<S>(svc: &mut mock::Spawn<S>, handle: &mut Handle) -> CircuitOpen
where
    S: Service<u32, Response = &'static str, Error = BoxError>,
{
    assert_ready_ok!(svc.poll_ready());
    let err = svc
        .call(999)
        .now_or_never()
        .expect("a refused call is ready at once")
        .unwrap_err();
    assert_pending!(handle.poll_request());
    *err.downcast::<CircuitOpen>().expect("a CircuitOpen error")
}

fn state_of(layer_handle: &tower_breaker::BreakerHandle) -> State {
    layer_handle.get("default").unwrap().state
}

#[tokio::test(start_paused = true)]
async fn opens_after_exactly_five_consecutive_transient_failures() {
    let layer = CircuitBreakerLayer::new(ErrorChainClassifier::new());
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    for id in 0..4 {
        let err = fail(&mut svc, &mut handle, id).await;
        assert!(
            err.is::<io::Error>(),
            "the dependency's own error passes through"
        );
        assert_eq!(state_of(&admin), State::Closed, "after {} failures", id + 1);
    }
    fail(&mut svc, &mut handle, 4).await;
    assert_eq!(state_of(&admin), State::Open);
    let open = rejected(&mut svc, &mut handle);
    let first = open.remaining().unwrap();
    assert!(
        (Duration::from_millis(200)..=Duration::from_millis(250)).contains(&first),
        "the default first open period is 250 ms, jittered down by up to 20 %: {first:?}"
    );
    assert_eq!(admin.get("default").unwrap().opened, 1);
}

#[tokio::test(start_paused = true)]
async fn four_failures_then_a_success_does_not_open() {
    let layer = CircuitBreakerLayer::new(ErrorChainClassifier::new());
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    for id in 0..4 {
        fail(&mut svc, &mut handle, id).await;
    }
    succeed(&mut svc, &mut handle, 4).await;
    for id in 5..9 {
        fail(&mut svc, &mut handle, id).await;
    }
    assert_eq!(
        state_of(&admin),
        State::Closed,
        "4 + success + 4 is not 5 in a row"
    );
    fail(&mut svc, &mut handle, 9).await;
    assert_eq!(state_of(&admin), State::Open);
}

#[tokio::test(start_paused = true)]
async fn client_errors_and_non_transient_failures_never_trip_it() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(2))
        .build(HttpClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer::<u32, http::Response<()>, _>(layer);
    let mut respond = async |status: u16| {
        assert_ready_ok!(svc.poll_ready());
        let future = svc.call(0);
        let (_, send) = handle.next_request().await.unwrap();
        send.send_response(http::Response::builder().status(status).body(()).unwrap());
        future.await.unwrap().status()
    };
    for status in [400, 401, 403, 404, 409, 422].repeat(10) {
        assert_eq!(respond(status).await, status);
    }
    assert_eq!(
        state_of(&admin),
        State::Closed,
        "4xx say nothing about health"
    );
    // The same breaker does open on server errors.
    respond(503).await;
    respond(500).await;
    assert_eq!(state_of(&admin), State::Open);
}

#[tokio::test(start_paused = true)]
async fn rejected_poison_and_shed_errors_never_trip_it() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer::<u32, &'static str, _>(layer);
    for id in 0..20 {
        assert_ready_ok!(svc.poll_ready());
        let future = svc.call(id);
        let (_, send) = handle.next_request().await.unwrap();
        match id % 3 {
            0 => send.send_error(io::Error::from(io::ErrorKind::InvalidData)),
            1 => send.send_error(Classified::new(FailureKind::Poison, "bad message")),
            _ => send.send_error(Classified::shed("budget exhausted", None)),
        }
        future.await.unwrap_err();
    }
    assert_eq!(state_of(&admin), State::Closed);
    assert_eq!(admin.get("default").unwrap().failures, 0);
}

#[tokio::test(start_paused = true)]
async fn open_calls_never_reach_the_service_and_fail_in_well_under_a_millisecond() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    fail(&mut svc, &mut handle, 0).await;
    // Timed on a shared machine: the median and the mean are robust to the
    // scheduler taking the core away once; a refusal costs nanoseconds.
    let mut times = Vec::with_capacity(1_000);
    for _ in 0..1_000 {
        assert_ready_ok!(svc.poll_ready());
        let started = std::time::Instant::now();
        let result = svc.call(7).now_or_never();
        times.push(started.elapsed());
        let err = result.expect("ready at once").unwrap_err();
        assert!(err.is::<CircuitOpen>());
    }
    times.sort();
    let mean = times.iter().sum::<Duration>() / 1_000;
    assert!(
        times[500] < Duration::from_micros(100),
        "median {:?}",
        times[500]
    );
    assert!(mean < Duration::from_millis(1), "mean {mean:?}");
    assert_pending!(handle.poll_request());
    assert_eq!(admin.get("default").unwrap().rejected, 1_000);
}

#[tokio::test(start_paused = true)]
async fn circuit_open_is_classified_as_shed_with_its_remaining_time() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::from_secs(12))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    fail(&mut svc, &mut handle, 0).await;
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_ready_ok!(svc.poll_ready());
    let err: BoxError = svc.call(1).await.unwrap_err();
    // What a retry layer outside the breaker sees, knowing nothing of this crate.
    let outcome = ErrorChainClassifier::new().classify_error(&*err);
    let failure = outcome.as_failure().unwrap();
    assert_eq!(failure.kind, FailureKind::Shed);
    // 2 s left of the period (within its last fifth), plus four times
    // that: its place in the release ramp.
    assert_eq!(failure.retry_after(), Some(Duration::from_secs(10)));
    assert!(!outcome.is_retryable());
    assert_eq!(err.to_string(), "circuit open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_one_probe_is_admitted_when_100_clones_call_concurrently() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::ZERO)
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let calls = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let svc = layer.layer(service_fn({
        let (calls, gate) = (Arc::clone(&calls), Arc::clone(&gate));
        move |_: ()| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            let gate = Arc::clone(&gate);
            async move {
                if n == 0 {
                    return Err::<&str, BoxError>(refused().into());
                }
                // The probe stays in flight until the test has counted.
                let _permit = gate.acquire().await.unwrap();
                Ok("ok")
            }
        }
    }));
    svc.clone().oneshot(()).await.unwrap_err();
    assert_eq!(state_of(&admin), State::Open);

    let barrier = Arc::new(tokio::sync::Barrier::new(100));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let mut svc = svc.clone();
        let barrier = Arc::clone(&barrier);
        tasks.spawn(async move {
            barrier.wait().await;
            svc.ready().await?.call(()).await
        });
    }
    let mut refused_calls = 0;
    while refused_calls < 99 {
        let result = tokio::time::timeout(Duration::from_secs(10), tasks.join_next())
            .await
            .expect("refusals come at once")
            .unwrap()
            .unwrap();
        let err = result.expect_err("only the probe may succeed, and it is held");
        assert!(err.is::<CircuitOpen>());
        refused_calls += 1;
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "one trip call + exactly one probe"
    );
    assert_eq!(admin.get("default").unwrap().probes_in_flight, 1);
    gate.add_permits(1);
    let probe = tokio::time::timeout(Duration::from_secs(10), tasks.join_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(probe.unwrap(), "ok");
    assert_eq!(state_of(&admin), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_probe_releases_its_slot() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::from_secs(1))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    fail(&mut svc, &mut handle, 0).await;
    tokio::time::advance(Duration::from_secs(1)).await;

    assert_ready_ok!(svc.poll_ready());
    let probe = svc.call(1);
    let (req, _send) = handle.next_request().await.unwrap();
    assert_eq!(req, 1);
    assert_eq!(state_of(&admin), State::HalfOpen);
    let busy = rejected(&mut svc, &mut handle);
    assert_eq!(busy.remaining(), None, "half-open and busy: no known wait");

    drop(probe);
    assert_eq!(admin.get("default").unwrap().probes_in_flight, 0);
    succeed(&mut svc, &mut handle, 2).await;
    assert_eq!(state_of(&admin), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn probe_success_closes_and_probe_failure_reopens() {
    let changes = Arc::new(Mutex::new(Vec::new()));
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::from_secs(30))
        .on_state_change({
            let changes = Arc::clone(&changes);
            move |change| changes.lock().unwrap().push((change.from, change.to))
        })
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    fail(&mut svc, &mut handle, 0).await;

    tokio::time::advance(Duration::from_millis(29_999)).await;
    rejected(&mut svc, &mut handle);
    tokio::time::advance(Duration::from_millis(1)).await;
    fail(&mut svc, &mut handle, 1).await;
    assert_eq!(state_of(&admin), State::Open, "a failed probe reopens");
    assert_eq!(
        rejected(&mut svc, &mut handle).remaining(),
        Some(Duration::from_secs(30))
    );

    tokio::time::advance(Duration::from_secs(30)).await;
    succeed(&mut svc, &mut handle, 2).await;
    assert_eq!(state_of(&admin), State::Closed, "a successful probe closes");
    succeed(&mut svc, &mut handle, 3).await;

    use State::*;
    assert_eq!(
        *changes.lock().unwrap(),
        [
            (Closed, Open),
            (Open, HalfOpen),
            (HalfOpen, Open),
            (Open, HalfOpen),
            (HalfOpen, Closed)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn several_probes_must_all_succeed() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::from_secs(1))
        .probes(2)
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    fail(&mut svc, &mut handle, 0).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_ready_ok!(svc.poll_ready());
    let first = svc.call(1);
    assert_ready_ok!(svc.poll_ready());
    let second = svc.call(2);
    let (_, send1) = handle.next_request().await.unwrap();
    let (_, send2) = handle.next_request().await.unwrap();
    rejected(&mut svc, &mut handle);
    send1.send_response("ok");
    first.await.unwrap();
    assert_eq!(
        state_of(&admin),
        State::HalfOpen,
        "one of two probes is not enough"
    );
    send2.send_response("ok");
    second.await.unwrap();
    assert_eq!(state_of(&admin), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn open_time_grows_while_probes_keep_failing_and_is_capped() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::from_secs(10))
        .max_recovery_timeout(Duration::from_secs(100))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    fail(&mut svc, &mut handle, 0).await;
    let mut waits = Vec::new();
    for id in 1..6 {
        let wait = rejected(&mut svc, &mut handle).remaining().unwrap();
        waits.push(wait.as_secs());
        tokio::time::advance(wait).await;
        fail(&mut svc, &mut handle, id).await;
    }
    assert_eq!(waits, [10, 20, 40, 80, 100]);
    // A success resets the growth.
    tokio::time::advance(Duration::from_secs(100)).await;
    succeed(&mut svc, &mut handle, 10).await;
    fail(&mut svc, &mut handle, 11).await;
    assert_eq!(
        rejected(&mut svc, &mut handle).remaining(),
        Some(Duration::from_secs(10))
    );
}

/// The default schedule (SPEC 5b): the first open period is a quarter of
/// a second, each failed probe doubles the next one, jittered down by up to
/// 20 %, up to half a second; a probe that succeeds starts it again.
#[tokio::test(start_paused = true)]
async fn by_default_open_periods_start_at_a_quarter_second_double_with_jitter_and_reset() {
    let mut jittered = 0;
    for _ in 0..20 {
        let layer = CircuitBreakerLayer::builder()
            .policy(Policy::consecutive_failures(1))
            .build(ErrorChainClassifier::new())
            .unwrap();
        let (mut svc, mut handle) = mock::spawn_layer(layer);
        fail(&mut svc, &mut handle, 0).await;
        let mut periods = Vec::new();
        for id in 1..6 {
            let wait = rejected(&mut svc, &mut handle).remaining().unwrap();
            periods.push(wait);
            tokio::time::advance(wait).await;
            fail(&mut svc, &mut handle, id).await;
        }
        for (period, full_ms) in periods.iter().zip([250u64, 500, 500, 500, 500]) {
            let full = Duration::from_millis(full_ms);
            assert!(
                *period <= full && *period >= full.mul_f64(0.8),
                "{periods:?}: each period in [0.8, 1] x 250 ms, then the 500 ms cap"
            );
            if *period < full {
                jittered += 1;
            }
        }
        let wait = rejected(&mut svc, &mut handle).remaining().unwrap();
        tokio::time::advance(wait).await;
        succeed(&mut svc, &mut handle, 10).await;
        fail(&mut svc, &mut handle, 11).await;
        let first = rejected(&mut svc, &mut handle).remaining().unwrap();
        assert!(
            first <= Duration::from_millis(250),
            "a success starts the schedule again: {first:?}"
        );
    }
    assert!(
        jittered > 50,
        "the periods are jittered: {jittered} of 100 shortened"
    );
}

/// Calls refused in the last fifth of an open period are told to come
/// back at its end plus four times the time it had left: over a ramp four
/// times as long as they arrived in, the last refused first, so at a steady
/// rate they add at most a quarter of the arrival rate to the new calls
/// (SPEC 5b, no herd), and all within four fifths of a period after it,
/// before a next period would end. Calls refused earlier get no hint.
#[tokio::test(start_paused = true)]
async fn refused_calls_are_released_over_a_ramp_last_refused_first() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::from_secs(4))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    fail(&mut svc, &mut handle, 0).await;
    let start = tokio::time::Instant::now();
    let mut releases = Vec::new();
    for step_ms in [0u64, 2_000, 1_000, 200, 400, 399] {
        tokio::time::advance(Duration::from_millis(step_ms)).await;
        let open = rejected(&mut svc, &mut handle);
        let now = tokio::time::Instant::now();
        assert_eq!(
            open.remaining(),
            Some(start + Duration::from_secs(4) - now),
            "the open time left is unchanged"
        );
        releases.push(
            open.failure()
                .retry_after()
                .map(|after| (now + after - start).as_millis()),
        );
    }
    // Refused with 4, 2, 1, 0.8, 0.4 and 0.001 s left of a period ending
    // at 4 s: the first three are more than a fifth of it from its end.
    assert_eq!(
        releases,
        [None, None, None, Some(7_200), Some(5_600), Some(4_004)]
    );
}

/// A fixed `recovery_timeout` is what it says: every open lasts exactly
/// that long, however many probes failed.
#[tokio::test(start_paused = true)]
async fn a_recovery_timeout_set_is_a_fixed_open_period() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::from_secs(7))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    fail(&mut svc, &mut handle, 0).await;
    for id in 1..5 {
        let wait = rejected(&mut svc, &mut handle).remaining().unwrap();
        assert_eq!(wait, Duration::from_secs(7));
        tokio::time::advance(wait).await;
        fail(&mut svc, &mut handle, id).await;
    }
}

#[tokio::test(start_paused = true)]
async fn jitter_only_shortens_the_open_time() {
    for _ in 0..20 {
        let layer = CircuitBreakerLayer::builder()
            .policy(Policy::consecutive_failures(1))
            .recovery_timeout(Duration::from_secs(10))
            .recovery_jitter(0.5)
            .build(ErrorChainClassifier::new())
            .unwrap();
        let (mut svc, mut handle) = mock::spawn_layer(layer);
        fail(&mut svc, &mut handle, 0).await;
        let wait = rejected(&mut svc, &mut handle).remaining().unwrap();
        assert!(
            wait <= Duration::from_secs(10) && wait >= Duration::from_secs(5),
            "{wait:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn failure_rate_respects_the_minimum_number_of_calls() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::failure_rate(0.5, 10, Window::count(20)))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    for id in 0..9 {
        fail(&mut svc, &mut handle, id).await;
    }
    assert_eq!(
        state_of(&admin),
        State::Closed,
        "9 of 9 failed, but 9 < minimum 10"
    );
    fail(&mut svc, &mut handle, 9).await;
    assert_eq!(state_of(&admin), State::Open);
}

#[tokio::test(start_paused = true)]
async fn failure_rate_opens_at_the_configured_share() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::failure_rate(0.5, 10, Window::count(20)))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    for id in 0..6 {
        succeed(&mut svc, &mut handle, id).await;
    }
    for id in 6..11 {
        fail(&mut svc, &mut handle, id).await;
    }
    let snapshot = admin.get("default").unwrap();
    assert_eq!((snapshot.window_calls, snapshot.window_failures), (11, 5));
    assert_eq!(snapshot.state, State::Closed, "5 of 11 is under half");
    fail(&mut svc, &mut handle, 11).await;
    assert_eq!(state_of(&admin), State::Open, "6 of 12 is half");
}

#[tokio::test(start_paused = true)]
async fn time_window_forgets_old_calls() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::failure_rate(
            0.5,
            4,
            Window::time(Duration::from_secs(10)),
        ))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    for id in 0..3 {
        fail(&mut svc, &mut handle, id).await;
    }
    tokio::time::advance(Duration::from_secs(11)).await;
    fail(&mut svc, &mut handle, 3).await;
    let snapshot = admin.get("default").unwrap();
    assert_eq!(snapshot.window_calls, 1, "the first three left the window");
    assert_eq!(snapshot.state, State::Closed);
    for id in 4..7 {
        fail(&mut svc, &mut handle, id).await;
    }
    assert_eq!(state_of(&admin), State::Open);
}

/// Under paused tokio time the window follows tokio's clock for successes
/// too: successes made after the clock moved dilute the new window. Filed at
/// a reading from before the move, they would have aged out with the old
/// failures and the three new failures would open it.
#[tokio::test(start_paused = true)]
async fn time_window_files_successes_at_paused_time() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::failure_rate(
            0.5,
            4,
            Window::time(Duration::from_secs(10)),
        ))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    for id in 0..3 {
        fail(&mut svc, &mut handle, id).await;
    }
    tokio::time::advance(Duration::from_secs(11)).await;
    for id in 3..7 {
        succeed(&mut svc, &mut handle, id).await;
    }
    for id in 7..10 {
        fail(&mut svc, &mut handle, id).await;
    }
    let snapshot = admin.get("default").unwrap();
    assert_eq!((snapshot.window_calls, snapshot.window_failures), (7, 3));
    assert_eq!(snapshot.state, State::Closed, "3 of 7 is under half");
}

#[tokio::test(start_paused = true)]
async fn slow_successes_count_as_failures_when_configured() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(2))
        .slow_call_threshold(Duration::from_secs(1))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    let mut call = async |delay: Duration| {
        assert_ready_ok!(svc.poll_ready());
        let future = svc.call(0);
        let (_, send) = handle.next_request().await.unwrap();
        tokio::time::advance(delay).await;
        send.send_response("ok");
        future.await.unwrap();
    };
    call(Duration::from_secs(2)).await;
    call(Duration::from_millis(10)).await;
    call(Duration::from_secs(2)).await;
    assert_eq!(
        state_of(&admin),
        State::Closed,
        "a fast success broke the run"
    );
    call(Duration::from_secs(1)).await;
    assert_eq!(state_of(&admin), State::Open);
}

#[tokio::test(start_paused = true)]
async fn metrics_only_mode_measures_but_never_rejects() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .mode(Mode::MetricsOnly)
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    fail(&mut svc, &mut handle, 0).await;
    assert_eq!(state_of(&admin), State::Open, "the state is still tracked");
    for id in 1..5 {
        succeed(&mut svc, &mut handle, id).await;
    }
    assert_eq!(admin.get("default").unwrap().rejected, 0);
    tokio::time::advance(Duration::from_secs(30)).await;
    succeed(&mut svc, &mut handle, 5).await;
    assert_eq!(
        state_of(&admin),
        State::Closed,
        "the probe logic runs as in enforce mode"
    );
}

#[tokio::test(start_paused = true)]
async fn disabled_mode_is_a_pass_through() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .mode(Mode::Disabled)
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    for id in 0..10 {
        fail(&mut svc, &mut handle, id).await;
    }
    let snapshot = admin.get("default").unwrap();
    assert_eq!((snapshot.state, snapshot.failures), (State::Closed, 0));
}

#[tokio::test(start_paused = true)]
async fn pending_mode_waits_in_poll_ready_until_the_recovery_timeout() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::from_secs(10))
        .pending_when_open(true)
        .build(ErrorChainClassifier::new())
        .unwrap();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    fail(&mut svc, &mut handle, 0).await;
    assert_pending!(svc.poll_ready());
    tokio::time::advance(Duration::from_secs(9)).await;
    assert!(!svc.is_woken());
    assert_pending!(svc.poll_ready());
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(svc.is_woken(), "the end of the open period wakes the task");
    assert_ready_ok!(svc.poll_ready());

    // Half-open with the one slot taken: a clone waits for the probe's result.
    let probe = svc.call(1);
    let (_, send) = handle.next_request().await.unwrap();
    let mut other = mock::Spawn::new(svc.get_ref().clone());
    assert_pending!(other.poll_ready());
    send.send_response("ok");
    probe.await.unwrap();
    assert!(other.is_woken(), "the state change wakes the waiting clone");
    assert_ready_ok!(other.poll_ready());
}

#[tokio::test(start_paused = true)]
async fn an_open_circuit_does_not_wait_for_an_unready_service() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::from_secs(5))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    fail(&mut svc, &mut handle, 0).await;
    // The dependency's client stops being ready (a full buffer, say).
    handle.allow(0);
    assert_ready_ok!(
        svc.poll_ready(),
        "open: no need to wait for the inner service"
    );
    let err = svc.call(1).await.unwrap_err();
    assert!(err.is::<CircuitOpen>());

    // Half-opening between poll_ready and call must not call an unready inner
    // service: that call is refused too.
    assert_ready_ok!(svc.poll_ready());
    tokio::time::advance(Duration::from_secs(5)).await;
    let err = svc.call(2).await.unwrap_err();
    assert!(err.is::<CircuitOpen>());
    assert_pending!(handle.poll_request());

    // Now the probe may go, once the inner service is ready again.
    assert_pending!(
        svc.poll_ready(),
        "half-open with a free slot: inner readiness counts"
    );
    handle.allow(1);
    assert_ready_ok!(svc.poll_ready());
    let probe = svc.call(3);
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req, 3);
    send.send_response("ok");
    probe.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn services_wrapped_by_one_layer_share_one_breaker() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(2))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let (mut first, mut first_handle) = mock::spawn_layer(layer.clone());
    let (mut second, mut second_handle) = mock::spawn_layer(layer);
    fail(&mut first, &mut first_handle, 0).await;
    fail(&mut second, &mut second_handle, 1).await;
    // Two failures across the two services open the one breaker for both.
    rejected(&mut first, &mut first_handle);
    rejected(&mut second, &mut second_handle);
}

// ===== Semantics the peers' suites rely on (Resilience4j, tower-resilience)

#[tokio::test(start_paused = true)]
async fn item_1_a_success_that_reaches_the_minimum_calls_trips_the_rate() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::failure_rate(0.5, 4, Window::count(10)))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    fail(&mut svc, &mut handle, 0).await;
    fail(&mut svc, &mut handle, 1).await;
    succeed(&mut svc, &mut handle, 2).await;
    assert_eq!(state_of(&admin), State::Closed, "3 calls < minimum 4");
    succeed(&mut svc, &mut handle, 3).await;
    assert_eq!(
        state_of(&admin),
        State::Open,
        "the fourth call, a success, makes 2 of 4: at the rate"
    );
}

/// The same over a time window, whose successes skip the tally only while
/// it holds no failure: here it holds two, and the fourth call opens it.
#[tokio::test(start_paused = true)]
async fn item_1_a_success_that_reaches_the_minimum_calls_trips_a_time_window() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::failure_rate(
            0.5,
            4,
            Window::time(Duration::from_secs(10)),
        ))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    fail(&mut svc, &mut handle, 0).await;
    fail(&mut svc, &mut handle, 1).await;
    tokio::time::advance(Duration::from_secs(5)).await;
    succeed(&mut svc, &mut handle, 2).await;
    assert_eq!(state_of(&admin), State::Closed, "3 calls < minimum 4");
    succeed(&mut svc, &mut handle, 3).await;
    assert_eq!(state_of(&admin), State::Open, "2 of 4, five seconds apart");
}

#[tokio::test(start_paused = true)]
async fn item_1_a_failure_share_exactly_at_the_rate_opens() {
    // 0.3 × 10 is 3.0000000000000004 in floating point: a multiplication
    // would leave 3 failures of 10 under a 0.3 rate.
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::failure_rate(0.3, 10, Window::count(10)))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    for id in 0..7 {
        succeed(&mut svc, &mut handle, id).await;
    }
    fail(&mut svc, &mut handle, 7).await;
    fail(&mut svc, &mut handle, 8).await;
    assert_eq!(state_of(&admin), State::Closed);
    fail(&mut svc, &mut handle, 9).await;
    assert_eq!(state_of(&admin), State::Open, "3 of 10 is 0.3");
}

/// A breaker in pending mode, opened once and half-open with its one probe
/// slot taken by `probe`; `other` is a clone parked in `poll_ready`.
async fn half_open_with_a_parked_clone() -> (
    mock::Spawn<tower_breaker::CircuitBreaker<mock::Mock<u32, &'static str>, ErrorChainClassifier>>,
    Handle,
    tower_breaker::BreakerHandle,
) {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::from_secs(1))
        .probe_timeout(Duration::from_secs(5))
        .pending_when_open(true)
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    fail(&mut svc, &mut handle, 0).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    (svc, handle, admin)
}

#[tokio::test(start_paused = true)]
async fn item_2_a_dropped_probe_wakes_the_callers_parked_in_poll_ready() {
    let (mut svc, mut handle, _admin) = half_open_with_a_parked_clone().await;
    assert_ready_ok!(svc.poll_ready());
    let probe = svc.call(1);
    handle.next_request().await.unwrap();
    let mut other = mock::Spawn::new(svc.get_ref().clone());
    assert_pending!(other.poll_ready());
    drop(probe);
    assert!(other.is_woken(), "the freed slot wakes the parked clone");
    assert_ready_ok!(other.poll_ready());
}

#[tokio::test(start_paused = true)]
async fn item_2_a_neutral_probe_wakes_the_callers_parked_in_poll_ready() {
    let (mut svc, mut handle, admin) = half_open_with_a_parked_clone().await;
    assert_ready_ok!(svc.poll_ready());
    let probe = svc.call(1);
    let (_, send) = handle.next_request().await.unwrap();
    let mut other = mock::Spawn::new(svc.get_ref().clone());
    assert_pending!(other.poll_ready());
    // A rejected request says nothing about the dependency.
    send.send_error(Classified::new(FailureKind::Rejected, "bad request"));
    probe.await.unwrap_err();
    assert_eq!(state_of(&admin), State::HalfOpen);
    assert!(
        other.is_woken(),
        "the slot given back wakes the parked clone"
    );
    assert_ready_ok!(other.poll_ready());
}

#[tokio::test(start_paused = true)]
async fn item_3_a_hung_probe_is_reclaimed_after_the_probe_timeout() {
    let (mut svc, mut handle, admin) = half_open_with_a_parked_clone().await;
    assert_ready_ok!(svc.poll_ready());
    let mut hung = svc.call(1);
    let (_, late_answer) = handle.next_request().await.unwrap();
    let mut other = mock::Spawn::new(svc.get_ref().clone());
    assert_pending!(other.poll_ready());

    tokio::time::advance(Duration::from_millis(4_999)).await;
    assert!(!other.is_woken());
    assert_eq!(state_of(&admin), State::HalfOpen);
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(
        other.is_woken(),
        "the probes' deadline wakes the parked clone"
    );
    assert_pending!(other.poll_ready(), "reopened: it waits out the open time");
    assert_eq!(state_of(&admin), State::Open, "the slot is reclaimed");

    // The hung probe's late success belongs to the lapsed period.
    late_answer.send_response("ok");
    assert_eq!((&mut hung).await.unwrap(), "ok");
    assert_eq!(state_of(&admin), State::Open);

    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(other.is_woken());
    assert_ready_ok!(other.poll_ready());
    let probe = other.call(2);
    let (_, send) = handle.next_request().await.unwrap();
    send.send_response("ok");
    probe.await.unwrap();
    assert_eq!(state_of(&admin), State::Closed, "a new probe decides");
}

/// `probe_timeout` counts from when the last slot is taken. It used to
/// count from the start of the half-open period: a probe given back (here
/// dropped by its caller) and a quiet spell left that long past, and the
/// next call lapsed the new, healthy probe 10 ms after it was admitted,
/// reopening the breaker with no failure seen.
#[tokio::test(start_paused = true)]
async fn item_3_a_probe_taken_later_gets_the_whole_probe_timeout() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::from_secs(1))
        .probe_timeout(Duration::from_secs(5))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    fail(&mut svc, &mut handle, 0).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_ready_ok!(svc.poll_ready());
    let given_back = svc.call(1);
    handle.next_request().await.unwrap();
    drop(given_back);
    assert_eq!(state_of(&admin), State::HalfOpen);

    tokio::time::advance(Duration::from_secs(10)).await;
    assert_ready_ok!(svc.poll_ready());
    let probe = svc.call(2);
    let (_, answer) = handle.next_request().await.unwrap();
    tokio::time::advance(Duration::from_millis(4_990)).await;
    let busy = rejected(&mut svc, &mut handle);
    assert_eq!(busy.remaining(), None, "half-open, its slot taken");
    assert_eq!(state_of(&admin), State::HalfOpen, "the probe is not lapsed");
    answer.send_response("ok");
    assert_eq!(probe.await.unwrap(), "ok");
    assert_eq!(state_of(&admin), State::Closed);
}

/// A success of a past closed period (admitted before the breaker opened,
/// answering after it closed again) leaves the new period's failure count
/// alone, as a failure of a past period does.
#[tokio::test(start_paused = true)]
async fn a_success_of_a_past_period_does_not_clear_the_failure_count() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(2))
        .recovery_timeout(Duration::from_secs(1))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    assert_ready_ok!(svc.poll_ready());
    let slow = svc.call(100);
    let (_, slow_answer) = handle.next_request().await.unwrap();
    fail(&mut svc, &mut handle, 0).await;
    fail(&mut svc, &mut handle, 1).await;
    assert_eq!(state_of(&admin), State::Open);
    tokio::time::advance(Duration::from_secs(1)).await;
    succeed(&mut svc, &mut handle, 2).await;
    assert_eq!(state_of(&admin), State::Closed);

    fail(&mut svc, &mut handle, 3).await;
    slow_answer.send_response("ok");
    slow.await.unwrap();
    assert_eq!(admin.get("default").unwrap().consecutive_failures, 1);
    fail(&mut svc, &mut handle, 4).await;
    assert_eq!(state_of(&admin), State::Open, "two in a row in this period");
}

#[tokio::test(start_paused = true)]
async fn item_3_without_pending_mode_the_next_call_reclaims_an_overdue_probe() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::from_secs(1))
        .probe_timeout(Duration::from_secs(5))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    fail(&mut svc, &mut handle, 0).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_ready_ok!(svc.poll_ready());
    let _hung = svc.call(1);
    handle.next_request().await.unwrap();
    assert_eq!(rejected(&mut svc, &mut handle).remaining(), None);
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(
        rejected(&mut svc, &mut handle).remaining(),
        Some(Duration::from_secs(1)),
        "reopened for a recovery timeout"
    );
    assert_eq!(state_of(&admin), State::Open);
}

#[tokio::test(start_paused = true)]
async fn item_4_counts_are_reset_when_the_breaker_opens() {
    for rate in [false, true] {
        let builder = CircuitBreakerLayer::builder().recovery_timeout(Duration::from_secs(1));
        let builder = if rate {
            builder.policy(Policy::failure_rate(0.5, 5, Window::count(10)))
        } else {
            builder.policy(Policy::consecutive_failures(5))
        };
        let layer = builder.build(ErrorChainClassifier::new()).unwrap();
        let admin = layer.handle();
        let (mut svc, mut handle) = mock::spawn_layer(layer);
        for id in 0..5 {
            fail(&mut svc, &mut handle, id).await;
        }
        let open = admin.get("default").unwrap();
        assert_eq!(open.state, State::Open);
        assert_eq!(
            (
                open.consecutive_failures,
                open.window_calls,
                open.window_failures
            ),
            (0, 0, 0),
            "rate policy: {rate}"
        );
        // Closed again by a probe: one failure is one failure, not the sixth.
        tokio::time::advance(Duration::from_secs(1)).await;
        succeed(&mut svc, &mut handle, 10).await;
        fail(&mut svc, &mut handle, 11).await;
        let closed = admin.get("default").unwrap();
        assert_eq!(closed.state, State::Closed);
        assert_eq!(
            closed.consecutive_failures + closed.window_failures,
            1,
            "rate policy: {rate}"
        );
    }
}

/// Opens a breaker with `probes` probe slots under a 50 % rate, waits out the
/// open time, admits every probe, and answers them in order: `true` is a
/// success.
async fn probe_round(answers: &[bool]) -> State {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::failure_rate(0.5, 2, Window::count(10)))
        .recovery_timeout(Duration::from_secs(1))
        .probes(answers.len() as u32)
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    fail(&mut svc, &mut handle, 0).await;
    fail(&mut svc, &mut handle, 1).await;
    assert_eq!(state_of(&admin), State::Open);
    tokio::time::advance(Duration::from_secs(1)).await;
    let mut probes = Vec::new();
    for id in 0..answers.len() as u32 {
        assert_ready_ok!(svc.poll_ready());
        let future = svc.call(100 + id);
        let (_, send) = handle.next_request().await.unwrap();
        probes.push((future, send));
    }
    rejected(&mut svc, &mut handle);
    for ((future, send), ok) in probes.into_iter().zip(answers) {
        if state_of(&admin) != State::HalfOpen {
            break;
        }
        if *ok {
            send.send_response("ok");
        } else {
            send.send_error(refused());
        }
        let _ = future.await;
    }
    state_of(&admin)
}

#[tokio::test(start_paused = true)]
async fn item_5_probes_are_judged_by_their_failure_rate() {
    assert_eq!(
        probe_round(&[true, false, true, true]).await,
        State::Closed,
        "1 of 4 probes failed: under the 50 % rate"
    );
    assert_eq!(
        probe_round(&[false, true, false, true]).await,
        State::Open,
        "2 of 4 failed: at the rate, reopened at once"
    );
    assert_eq!(
        probe_round(&[false]).await,
        State::Open,
        "one probe, failed"
    );
    assert_eq!(probe_round(&[true]).await, State::Closed, "one probe, fine");
}

/// One call that succeeds after `latency` of paused time.
async fn succeed_after<S>(svc: &mut mock::Spawn<S>, handle: &mut Handle, id: u32, latency: Duration)
where
    S: Service<u32, Response = &'static str, Error = BoxError>,
{
    assert_ready_ok!(svc.poll_ready());
    let future = svc.call(id);
    let (_, send) = handle.next_request().await.unwrap();
    tokio::time::advance(latency).await;
    send.send_response("ok");
    assert_eq!(future.await.unwrap(), "ok");
}

#[tokio::test(start_paused = true)]
async fn item_6_slow_calls_have_a_rate_of_their_own() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::failure_rate(0.5, 4, Window::count(10)))
        .slow_call_threshold(Duration::from_secs(1))
        .slow_call_rate(0.75)
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    succeed_after(&mut svc, &mut handle, 0, Duration::from_millis(10)).await;
    succeed_after(&mut svc, &mut handle, 1, Duration::from_secs(2)).await;
    succeed_after(&mut svc, &mut handle, 2, Duration::from_secs(2)).await;
    assert_eq!(state_of(&admin), State::Closed, "3 calls < minimum 4");
    succeed_after(&mut svc, &mut handle, 3, Duration::from_secs(2)).await;
    let snapshot = admin.get("default").unwrap();
    assert_eq!(
        snapshot.state,
        State::Open,
        "3 of 4 slow: at the 75 % slow rate"
    );
    assert_eq!(snapshot.failures, 0, "slow successes are not failures");
}

#[tokio::test(start_paused = true)]
async fn item_6_slow_calls_under_their_rate_do_not_open_and_are_not_failures() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::failure_rate(0.5, 4, Window::count(10)))
        .slow_call_threshold(Duration::from_secs(1))
        .slow_call_rate(0.9)
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    for id in 0..4 {
        succeed_after(&mut svc, &mut handle, id, Duration::from_secs(2)).await;
    }
    assert_eq!(state_of(&admin), State::Open, "4 of 4 slow");
    // Without a slow-call rate, slow successes are failures (the default).
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::failure_rate(0.5, 4, Window::count(10)))
        .slow_call_threshold(Duration::from_secs(1))
        .build(ErrorChainClassifier::new())
        .unwrap();
    let admin = layer.handle();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    succeed_after(&mut svc, &mut handle, 0, Duration::ZERO).await;
    succeed_after(&mut svc, &mut handle, 1, Duration::ZERO).await;
    succeed_after(&mut svc, &mut handle, 2, Duration::from_secs(2)).await;
    assert_eq!(state_of(&admin), State::Closed);
    succeed_after(&mut svc, &mut handle, 3, Duration::from_secs(2)).await;
    let snapshot = admin.get("default").unwrap();
    assert_eq!((snapshot.state, snapshot.failures), (State::Open, 2));
}

#[test]
fn item_6_a_slow_call_rate_needs_a_threshold_and_a_window() {
    let no_threshold = CircuitBreakerLayer::builder()
        .policy(Policy::failure_rate(0.5, 4, Window::count(10)))
        .slow_call_rate(0.5)
        .build(ErrorChainClassifier::new())
        .unwrap_err();
    assert_eq!(no_threshold.field(), "slow_call_rate");
    let no_window = CircuitBreakerLayer::builder()
        .slow_call_threshold(Duration::from_secs(1))
        .slow_call_rate(0.5)
        .build(ErrorChainClassifier::new())
        .unwrap_err();
    assert_eq!(no_window.field(), "slow_call_rate");
    let out_of_range = CircuitBreakerLayer::builder()
        .policy(Policy::failure_rate(0.5, 4, Window::count(10)))
        .slow_call_threshold(Duration::from_secs(1))
        .slow_call_rate(1.5)
        .build(ErrorChainClassifier::new())
        .unwrap_err();
    assert!(out_of_range.to_string().contains("1.5"), "{out_of_range}");
}

#[tokio::test(start_paused = true)]
async fn item_7_every_state_change_listener_is_called() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::from_secs(30))
        .on_state_change({
            let seen = Arc::clone(&seen);
            move |change| seen.lock().unwrap().push(("first", change.to))
        })
        .on_state_change({
            let seen = Arc::clone(&seen);
            move |change| seen.lock().unwrap().push(("second", change.to))
        })
        .build(ErrorChainClassifier::new())
        .unwrap();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    fail(&mut svc, &mut handle, 0).await;
    assert_eq!(
        *seen.lock().unwrap(),
        [("first", State::Open), ("second", State::Open)]
    );
}

#[tokio::test(start_paused = true)]
async fn item_7_per_call_events_report_success_failure_slow_and_rejected() {
    use tower_breaker::CallKind;
    let seen = Arc::new(Mutex::new(Vec::new()));
    // The slow success counts as a failure (no slow-call rate), so the
    // third counted failure opens it.
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(3))
        .slow_call_threshold(Duration::from_secs(1))
        .on_call({
            let seen = Arc::clone(&seen);
            move |event| seen.lock().unwrap().push((event.kind, event.elapsed))
        })
        .build(ErrorChainClassifier::new())
        .unwrap();
    let (mut svc, mut handle) = mock::spawn_layer(layer);
    succeed_after(&mut svc, &mut handle, 0, Duration::from_millis(5)).await;
    succeed_after(&mut svc, &mut handle, 1, Duration::from_secs(2)).await;
    fail(&mut svc, &mut handle, 2).await;
    assert_ready_ok!(svc.poll_ready());
    let future = svc.call(3);
    let (_, send) = handle.next_request().await.unwrap();
    send.send_error(Classified::new(FailureKind::Rejected, "bad request"));
    future.await.unwrap_err();
    fail(&mut svc, &mut handle, 4).await;
    let remaining = rejected(&mut svc, &mut handle).remaining();
    let ms = |n| Some(Duration::from_millis(n));
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (CallKind::Success, ms(5)),
            // Without a slow-call rate a slow success counts as a failure,
            // and is reported as the slow call it is.
            (CallKind::SlowCall, ms(2_000)),
            (CallKind::Failure(FailureKind::NotSent), ms(0)),
            (CallKind::Ignored, ms(0)),
            (CallKind::Failure(FailureKind::NotSent), ms(0)),
            (CallKind::Rejected(remaining), None),
        ]
    );
}
