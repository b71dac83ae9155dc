//! Keyed breakers: one breaker per key, a bounded map, closed-first eviction.

use std::collections::HashMap;
use std::future::{ready, Ready};
use std::io;

use futures_util::FutureExt;
use tower::{service_fn, Layer, Service};
use tower_breaker::Policy;
use tower_breaker::{BreakerHandle, CircuitBreakerLayer, CircuitOpen, State};
use tower_classify::{BoxError, ErrorChainClassifier};

mod support;

/// A request: the dependency it goes to, and whether that dependency fails.
type Req = (&'static str, bool);

fn keyed(max: usize) -> (impl Service<Req, Error = BoxError>, BreakerHandle) {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .max_breakers(max)
        .build_keyed(ErrorChainClassifier::new(), |req: &Req| req.0)
        .unwrap();
    let handle = layer.handle();
    let inner = service_fn(|(_, fails): Req| -> Ready<Result<(), io::Error>> {
        ready(if fails {
            Err(io::Error::from(io::ErrorKind::ConnectionReset))
        } else {
            Ok(())
        })
    });
    (layer.layer(inner), handle)
}

fn call(svc: &mut impl Service<Req, Error = BoxError>, req: Req) -> Result<(), BoxError> {
    svc.call(req).now_or_never().expect("immediate").map(drop)
}

fn keys(handle: &BreakerHandle) -> Vec<(String, State)> {
    handle
        .list()
        .into_iter()
        .map(|b| (b.key, b.state))
        .collect()
}

#[test]
fn each_key_has_its_own_breaker() {
    let (mut svc, handle) = keyed(10);
    call(&mut svc, ("ai-api", true)).unwrap_err();
    let err = call(&mut svc, ("ai-api", false)).unwrap_err();
    assert_eq!(err.downcast_ref::<CircuitOpen>().unwrap().key(), "ai-api");
    call(&mut svc, ("crm-api", false)).unwrap();
    assert_eq!(
        keys(&handle),
        [
            ("ai-api".to_owned(), State::Open),
            ("crm-api".to_owned(), State::Closed)
        ]
    );
}

#[test]
fn eviction_prefers_a_closed_victim_over_an_older_open_one() {
    let (mut svc, handle) = keyed(2);
    call(&mut svc, ("down", true)).unwrap_err(); // oldest, open
    call(&mut svc, ("healthy", false)).unwrap(); // newer, closed
    call(&mut svc, ("new", false)).unwrap(); // map full: evict
    assert_eq!(
        keys(&handle),
        [
            ("down".to_owned(), State::Open),
            ("new".to_owned(), State::Closed)
        ],
        "the closed breaker went although the open one was used less recently"
    );
    // The open breaker kept its state: the broken dependency stays shed.
    assert!(call(&mut svc, ("down", false))
        .unwrap_err()
        .is::<CircuitOpen>());
}

#[test]
fn among_closed_breakers_the_least_recently_used_goes() {
    let (mut svc, handle) = keyed(2);
    call(&mut svc, ("a", false)).unwrap();
    call(&mut svc, ("b", false)).unwrap();
    call(&mut svc, ("a", false)).unwrap(); // `a` is now the most recent
    call(&mut svc, ("c", false)).unwrap();
    let names: Vec<_> = keys(&handle).into_iter().map(|(k, _)| k).collect();
    assert_eq!(names, ["a", "c"]);
}

#[test]
fn when_every_breaker_is_open_plain_lru_applies_with_a_warning() {
    support::capture();
    let (mut svc, handle) = keyed(2);
    call(&mut svc, ("first", true)).unwrap_err();
    call(&mut svc, ("second", true)).unwrap_err();
    assert_eq!(
        support::warnings().len(),
        2,
        "each opening is a warning too"
    );

    call(&mut svc, ("third", false)).unwrap();
    assert_eq!(
        keys(&handle),
        [
            ("second".to_owned(), State::Open),
            ("third".to_owned(), State::Closed)
        ],
        "the least recently used open breaker was evicted"
    );
    let warnings = support::warnings();
    assert_eq!(warnings.len(), 3);
    assert!(
        warnings[2].contains("every circuit breaker is open") && warnings[2].contains("first"),
        "{}",
        warnings[2]
    );
}

#[test]
fn without_pressure_no_eviction_warning_is_logged() {
    support::capture();
    let (mut svc, _handle) = keyed(2);
    call(&mut svc, ("open", true)).unwrap_err();
    call(&mut svc, ("closed", false)).unwrap();
    call(&mut svc, ("new", false)).unwrap();
    let warnings = support::warnings();
    assert_eq!(warnings.len(), 1, "only the opening: {warnings:?}");
}

/// Issue 13: an operator's forced breakers are never evicted, whatever the
/// number of new keys; when every breaker is forced, new keys still get a
/// breaker, one that is not kept, and the map stays bounded.
#[test]
fn forced_breakers_survive_any_number_of_new_keys() {
    let layer = CircuitBreakerLayer::builder()
        .max_breakers(3)
        .build_keyed(ErrorChainClassifier::new(), |req: &String| req.clone())
        .unwrap();
    let handle = layer.handle();
    let mut svc = layer.layer(service_fn(|_: String| ready(Ok::<_, io::Error>(()))));
    let mut send = |key: String| svc.call(key).now_or_never().expect("immediate").map(drop);
    send("pinned-open".into()).unwrap();
    send("pinned-closed".into()).unwrap();
    assert!(handle.force_open("pinned-open"));
    assert!(handle.force_closed("pinned-closed"));
    for n in 0..10_000 {
        send(format!("tenant-{n}")).unwrap();
    }
    assert_eq!(handle.get("pinned-open").unwrap().state, State::ForcedOpen);
    assert_eq!(
        handle.get("pinned-closed").unwrap().state,
        State::ForcedClosed
    );
    assert!(send("pinned-open".into()).unwrap_err().is::<CircuitOpen>());
    assert_eq!(handle.list().len(), 3);

    // The third slot forced too: new keys pass, nothing is kept for them.
    let third = handle
        .list()
        .into_iter()
        .map(|b| b.key)
        .find(|key| key.starts_with("tenant-"))
        .unwrap();
    assert!(handle.force_closed(&third));
    for n in 0..100 {
        send(format!("late-{n}")).unwrap();
    }
    assert_eq!(handle.list().len(), 3);
    assert!(handle.get("late-0").is_none());
}

/// A breaker that closes again by itself (its probe succeeded) while queued
/// among open ones is a closed victim like any other: the eviction order
/// learns of it, and an older open breaker stays.
#[test]
fn a_breaker_that_recovered_is_evicted_before_an_older_open_one() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(std::time::Duration::ZERO)
        .max_breakers(3)
        .build_keyed(ErrorChainClassifier::new(), |req: &Req| req.0)
        .unwrap();
    let handle = layer.handle();
    let mut svc = layer.layer(service_fn(|(_, fails): Req| {
        ready(if fails {
            Err(io::Error::from(io::ErrorKind::ConnectionReset))
        } else {
            Ok(())
        })
    }));
    let mut send = |key, fails| call(&mut svc, (key, fails));
    for key in ["a", "b", "c"] {
        send(key, true).unwrap_err(); // all open
    }
    send("d", false).unwrap(); // every breaker open: `a`, the oldest, goes
    send("d", true).unwrap_err(); // `d` opens too
    send("c", false).unwrap(); // the probe succeeds: `c` closes
    send("e", false).unwrap();
    assert_eq!(
        keys(&handle),
        [
            ("b".to_owned(), State::Open),
            ("d".to_owned(), State::Open),
            ("e".to_owned(), State::Closed)
        ],
        "the recovered breaker went, not the older open one"
    );
}

/// Issue 31, item 1: when every breaker is open, the victim is exactly the
/// least recently used one. `a`, `b` and `c` open in that order, then `b`,
/// `a` and `c` are called (and refused) in that order: `b` is the least
/// recently used, although it opened after `a` and every use came after the
/// last new key.
#[test]
fn item_1_when_every_breaker_is_open_the_least_recently_used_goes() {
    let (mut svc, handle) = keyed(3);
    for key in ["a", "b", "c"] {
        call(&mut svc, (key, true)).unwrap_err();
    }
    for key in ["b", "a", "c"] {
        assert!(call(&mut svc, (key, false))
            .unwrap_err()
            .is::<CircuitOpen>());
    }
    call(&mut svc, ("d", false)).unwrap();
    let names: Vec<_> = keys(&handle).into_iter().map(|(k, _)| k).collect();
    assert_eq!(names, ["a", "c", "d"], "`b` was the least recently used");

    // And again with `d` open too: its opening is its last use.
    call(&mut svc, ("d", true)).unwrap_err();
    for key in ["a", "d"] {
        call(&mut svc, (key, false)).unwrap_err();
    }
    call(&mut svc, ("e", false)).unwrap();
    let names: Vec<_> = keys(&handle).into_iter().map(|(k, _)| k).collect();
    assert_eq!(names, ["a", "d", "e"], "`c` was the least recently used");
}

#[derive(Debug, Clone)]
enum Op {
    Call(usize, bool),
    ForceOpen(usize),
    ForceClosed(usize),
    Reset(usize),
}

const NAMES: [&str; 10] = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    let key = 0..NAMES.len();
    prop_oneof![
        6 => (key.clone(), any::<bool>()).prop_map(|(k, fails)| Op::Call(k, fails)),
        1 => key.clone().prop_map(Op::ForceOpen),
        1 => key.clone().prop_map(Op::ForceClosed),
        1 => key.prop_map(Op::Reset),
    ]
}

proptest::proptest! {
    /// The eviction rule under any sequence of calls and operator actions:
    /// the map stays bounded, a forced breaker is never evicted, an open one
    /// only when no closed one was left, and at most one per new key.
    #[test]
    fn eviction_spares_forced_breakers_and_takes_open_ones_last(
        ops in proptest::collection::vec(op(), 1..80)
    ) {
        let (mut svc, handle) = keyed(4);
        // The index of each key's last call: its last use.
        let mut last_used: HashMap<&str, usize> = HashMap::new();
        for (index, op) in ops.into_iter().enumerate() {
            let before: HashMap<String, State> = keys(&handle).into_iter().collect();
            match op {
                Op::Call(k, fails) => {
                    drop(call(&mut svc, (NAMES[k], fails)));
                    last_used.insert(NAMES[k], index);
                }
                Op::ForceOpen(k) => drop(handle.force_open(NAMES[k])),
                Op::ForceClosed(k) => drop(handle.force_closed(NAMES[k])),
                Op::Reset(k) => drop(handle.reset(NAMES[k])),
            }
            let after: HashMap<String, State> = keys(&handle).into_iter().collect();
            proptest::prop_assert!(after.len() <= 4);
            let gone: Vec<&String> = before.keys().filter(|k| !after.contains_key(*k)).collect();
            proptest::prop_assert!(gone.len() <= 1, "{gone:?}");
            for key in gone {
                let state = before[key];
                proptest::prop_assert!(
                    !matches!(state, State::ForcedOpen | State::ForcedClosed),
                    "evicted {key}, forced"
                );
                if matches!(state, State::Open | State::HalfOpen | State::ForcedOpen) {
                    proptest::prop_assert!(
                        !before.values().any(|s| *s == State::Closed),
                        "evicted open {key} while a closed breaker was left: {before:?}"
                    );
                    // Issue 31, item 1: exactly the least recently used.
                    let oldest = before
                        .iter()
                        .filter(|(_, state)| matches!(state, State::Open | State::HalfOpen))
                        .min_by_key(|(key, _)| last_used[key.as_str()])
                        .map(|(key, _)| key);
                    proptest::prop_assert_eq!(Some(key), oldest, "{:?}", last_used);
                }
            }
        }
    }
}

/// Issue 14: a key flood at a registry whose breakers are all open evicts
/// an open breaker per new key, but warns at most once per 10 s; the next
/// warning says how many were held back, and the eviction counter counts
/// every one.
#[tokio::test(start_paused = true)]
async fn the_open_eviction_warning_is_rate_limited_and_counts_what_it_held_back() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use std::time::Duration;

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let layer = metrics::with_local_recorder(&recorder, || {
        CircuitBreakerLayer::builder()
            .name("hosts")
            .policy(Policy::consecutive_failures(1))
            .max_breakers(1)
            .build_keyed(ErrorChainClassifier::new(), |req: &(String, bool)| {
                req.0.clone()
            })
            .unwrap()
    });
    let mut svc = layer.layer(service_fn(|(_, fails): (String, bool)| {
        ready(if fails {
            Err(io::Error::from(io::ErrorKind::ConnectionReset))
        } else {
            Ok(())
        })
    }));
    let mut send = |key: String| {
        svc.call((key, true))
            .now_or_never()
            .expect("immediate")
            .unwrap_err()
    };
    let eviction_warnings = || -> Vec<String> {
        support::warnings()
            .into_iter()
            .filter(|text| text.contains("evicting"))
            .collect()
    };

    support::capture();
    send("host-0".into()); // opens; the map is full
    for n in 1..=10 {
        send(format!("host-{n}")); // evicts the open breaker of the last key
    }
    let warnings = eviction_warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("breaker=hosts")
            && warnings[0].contains(r#"key="host-0""#)
            && warnings[0].contains("suppressed=0"),
        "{}",
        warnings[0]
    );

    tokio::time::advance(Duration::from_secs(9)).await;
    send("host-11".into());
    assert_eq!(eviction_warnings().len(), 1, "still within 10 s");

    tokio::time::advance(Duration::from_secs(1)).await;
    send("host-12".into());
    let warnings = eviction_warnings();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[1].contains("suppressed=10") && warnings[1].contains(r#"key="host-11""#),
        "the ten evictions since the first warning: {}",
        warnings[1]
    );

    let evicted_open = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find(|(key, ..)| {
            key.key().name() == "tower_breaker_evicted_total"
                && key
                    .key()
                    .labels()
                    .any(|l| l.key() == "state" && l.value() == "open")
        })
        .map(|(.., value)| value);
    assert_eq!(evicted_open, Some(DebugValue::Counter(12)));
}

/// Issue 14: every event of a keyed breaker names the layer and the key
/// (escaped, so a client-chosen key cannot forge a log line); per-call
/// rejections are `debug`; an operator's change says so.
#[test]
fn keyed_events_carry_the_layer_name_and_the_escaped_key() {
    let layer = CircuitBreakerLayer::builder()
        .name("hosts")
        .policy(Policy::consecutive_failures(1))
        .build_keyed(ErrorChainClassifier::new(), |req: &(String, bool)| {
            req.0.clone()
        })
        .unwrap();
    let handle = layer.handle();
    let mut svc = layer.layer(service_fn(|(_, fails): (String, bool)| {
        ready(if fails {
            Err(io::Error::from(io::ErrorKind::ConnectionReset))
        } else {
            Ok(())
        })
    }));
    let hostile = "evil\nlevel=ERROR".to_owned();
    support::capture();
    let mut send = |fails| svc.call((hostile.clone(), fails)).now_or_never().unwrap();
    send(true).unwrap_err(); // opens
    send(false).unwrap_err(); // rejected
    assert!(handle.force_closed(&hostile));

    use tracing::Level;
    let events = support::events();
    assert_eq!(events.len(), 3, "{events:?}");
    for (_, text) in &events {
        assert!(text.contains("breaker=hosts"), "{text}");
        assert!(text.contains(r#"key="evil\nlevel=ERROR""#), "{text}");
        assert!(!text.contains('\n'), "the key was not escaped: {text}");
    }
    assert_eq!(events[0].0, Level::WARN);
    assert!(events[0].1.contains("circuit breaker opened"));
    assert_eq!(events[1].0, Level::DEBUG);
    assert!(events[1].1.contains("rejected a call"));
    assert_eq!(events[2].0, Level::INFO);
    assert!(events[2].1.contains("by an operator") && events[2].1.contains("to=forced_closed"));
}
