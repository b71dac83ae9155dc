//! The spans and events the layer emits, captured by a subscriber that keeps
//! everything.
//!
//! One test in its own binary: it installs a global subscriber, and tracing
//! caches per-callsite interest process-wide.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower::{Layer, Service, ServiceExt};
use tower_classify::BoxError;
use tower_retry_budget::backoff::{Backoff, Jitter};
use tower_retry_budget::RetryLayer;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

#[derive(Debug, Clone)]
struct SpanData {
    name: &'static str,
    parent: Option<u64>,
    fields: BTreeMap<String, String>,
    closed: bool,
}

#[derive(Debug, Clone)]
struct EventData {
    level: Level,
    message: String,
    fields: BTreeMap<String, String>,
    // The innermost span entered when the event was emitted.
    span: Option<u64>,
}

#[derive(Default)]
struct Captured {
    spans: BTreeMap<u64, SpanData>,
    events: Vec<EventData>,
    // Spans entered, innermost last (the tests run on one thread).
    stack: Vec<u64>,
    // Span ids in the order they were closed.
    closed: Vec<u64>,
    refs: BTreeMap<u64, usize>,
}

#[derive(Clone, Default)]
struct Capture {
    inner: Arc<Mutex<Captured>>,
    next_id: Arc<AtomicU64>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").replace('"', ""),
        );
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attributes: &Attributes<'_>) -> Id {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let mut inner = self.inner.lock().unwrap();
        let parent = if attributes.is_root() {
            None
        } else if let Some(parent) = attributes.parent() {
            Some(parent.into_u64())
        } else {
            inner.stack.last().copied()
        };
        let mut fields = BTreeMap::new();
        attributes.record(&mut Fields(&mut fields));
        inner.spans.insert(
            id,
            SpanData {
                name: attributes.metadata().name(),
                parent,
                fields,
                closed: false,
            },
        );
        inner.refs.insert(id, 1);
        Id::from_u64(id)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut inner = self.inner.lock().unwrap();
        if let Some(data) = inner.spans.get_mut(&span.into_u64()) {
            values.record(&mut Fields(&mut data.fields));
        }
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let mut inner = self.inner.lock().unwrap();
        let span = inner.stack.last().copied();
        inner.events.push(EventData {
            level: *event.metadata().level(),
            message: fields.remove("message").unwrap_or_default(),
            fields,
            span,
        });
    }
    fn enter(&self, span: &Id) {
        self.inner.lock().unwrap().stack.push(span.into_u64());
    }
    fn exit(&self, span: &Id) {
        let mut inner = self.inner.lock().unwrap();
        if let Some(at) = inner.stack.iter().rposition(|id| *id == span.into_u64()) {
            inner.stack.remove(at);
        }
    }
    fn clone_span(&self, span: &Id) -> Id {
        *self
            .inner
            .lock()
            .unwrap()
            .refs
            .entry(span.into_u64())
            .or_default() += 1;
        span.clone()
    }
    fn try_close(&self, span: Id) -> bool {
        let mut inner = self.inner.lock().unwrap();
        let id = span.into_u64();
        let refs = inner.refs.entry(id).or_default();
        *refs = refs.saturating_sub(1);
        if *refs > 0 {
            return false;
        }
        inner.closed.push(id);
        if let Some(data) = inner.spans.get_mut(&id) {
            data.closed = true;
        }
        true
    }
}

fn connection_reset() -> BoxError {
    io::Error::from(io::ErrorKind::ConnectionReset).into()
}

#[tokio::test(start_paused = true)]
async fn spans_per_call_and_attempt_and_give_ups_warned_at_most_every_10_s() {
    let capture = Capture::default();
    tracing::subscriber::set_global_default(capture.clone()).unwrap();

    // Part 1: a call that fails twice and then succeeds.
    let calls = Arc::new(AtomicU64::new(0));
    let counter = calls.clone();
    let flaky = tower::service_fn(move |_: ()| {
        let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
        // Logged inside the attempt: it belongs to that attempt's span.
        tracing::info!(n, "inner called");
        async move {
            tracing::info!(n, "inner polled");
            if n <= 2 {
                Err(connection_reset())
            } else {
                Ok(())
            }
        }
    });
    let layer = RetryLayer::builder()
        .name("search")
        .backoff(Backoff::fixed(Duration::from_millis(100)).with_jitter(Jitter::None))
        .no_budget()
        .build()
        .unwrap();
    layer.layer(flaky).oneshot(()).await.unwrap();

    {
        let captured = capture.inner.lock().unwrap();
        let calls: Vec<(&u64, &SpanData)> = captured
            .spans
            .iter()
            .filter(|(_, span)| span.name == "retry")
            .collect();
        assert_eq!(calls.len(), 1, "{:?}", captured.spans);
        let (&call_id, call) = calls[0];
        assert_eq!(call.fields["retry"], "search");
        assert_eq!(call.fields["attempts"], "3");
        assert_eq!(call.fields["outcome"], "success");
        assert!(call.closed, "the call's span ends with the call");

        let attempts: Vec<(u64, &SpanData)> = captured
            .spans
            .iter()
            .filter(|(_, span)| span.name == "retry_attempt")
            .map(|(id, span)| (*id, span))
            .collect();
        assert_eq!(attempts.len(), 3);
        for (n, (_, span)) in attempts.iter().enumerate() {
            let attempt = n + 1;
            assert_eq!(span.parent, Some(call_id), "attempt {attempt}'s parent");
            assert_eq!(span.fields["attempt"], attempt.to_string());
            assert!(span.closed);
            if attempt == 1 {
                assert!(!span.fields.contains_key("http.request.resend_count"));
            } else {
                assert_eq!(
                    span.fields["http.request.resend_count"],
                    (attempt - 1).to_string()
                );
            }
            if attempt <= 2 {
                assert_eq!(span.fields["outcome"], "failure");
                assert_eq!(span.fields["error.type"], "connection");
                assert_eq!(span.fields["wait"], "100ms");
            } else {
                assert_eq!(span.fields["outcome"], "success");
                assert!(!span.fields.contains_key("wait"));
            }
        }
        // A failed attempt's span ends when it fails, before the next one
        // starts (not after the backoff).
        let order: Vec<u64> = captured.closed.clone();
        let position = |id: u64| order.iter().position(|closed| *closed == id).unwrap();
        assert!(position(attempts[0].0) < position(attempts[1].0));
        assert!(position(attempts[1].0) < position(attempts[2].0));
        assert!(position(attempts[2].0) < position(call_id));

        // What the service logs is inside its attempt's span, at call and
        // at poll.
        for event in captured
            .events
            .iter()
            .filter(|e| e.message.starts_with("inner"))
        {
            let n: usize = event.fields["n"].parse().unwrap();
            assert_eq!(
                event.span,
                Some(attempts[n - 1].0),
                "{} of attempt {n}",
                event.message
            );
        }
        let retries: Vec<&EventData> = captured
            .events
            .iter()
            .filter(|e| e.message == "retrying")
            .collect();
        assert_eq!(retries.len(), 2);
        assert!(retries
            .iter()
            .all(|e| e.level == Level::DEBUG && e.fields["retry"] == "search"));
    }

    // Part 2: an outage. Every call gives up; one `warn` per 10 s per layer.
    let outage = tower::service_fn(|_: ()| async { Err::<(), BoxError>(connection_reset()) });
    let layer = RetryLayer::builder()
        .name("payments")
        .max_retries(0)
        .no_budget()
        .build()
        .unwrap();
    let mut service = layer.layer(outage);
    let give_ups = |capture: &Capture, level: Level| {
        capture
            .inner
            .lock()
            .unwrap()
            .events
            .iter()
            .filter(|e| e.message.starts_with("giving up") && e.fields["retry"] == "payments")
            .filter(|e| e.level == level)
            .cloned()
            .collect::<Vec<_>>()
    };
    for _ in 0..50 {
        service.ready().await.unwrap().call(()).await.unwrap_err();
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    // 5 s in: the first give-up warned, the other 49 at debug.
    let warnings = give_ups(&capture, Level::WARN);
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].fields["since_last_warning"], "0");
    assert_eq!(warnings[0].fields["reason"], "attempts");
    assert_eq!(give_ups(&capture, Level::DEBUG).len(), 49);
    assert!(give_ups(&capture, Level::INFO).is_empty());

    tokio::time::advance(Duration::from_secs(10)).await;
    service.ready().await.unwrap().call(()).await.unwrap_err();
    let warnings = give_ups(&capture, Level::WARN);
    assert_eq!(warnings.len(), 2);
    assert_eq!(
        warnings[1].fields["since_last_warning"], "49",
        "the warning says how many give-ups it stood for"
    );

    // Part 3: hedges. Attempt n of each call answers after `waits[n]` ms;
    // the service logs an event, which must land in the hedge's span.
    let attempt = Arc::new(AtomicU64::new(0));
    let counter = attempt.clone();
    let waits = [1000, 1000, 10];
    let service = tower::service_fn(move |_: ()| {
        let n = counter.fetch_add(1, Ordering::SeqCst) as usize;
        tracing::info!(n, "downstream called");
        async move {
            tokio::time::sleep(Duration::from_millis(waits[n % 3])).await;
            Ok::<_, BoxError>(())
        }
    });
    let hedge = tower_retry_budget::hedge::HedgeLayer::builder()
        .name("search")
        .delay(Duration::from_millis(50))
        .max_attempts(3)
        .build()
        .unwrap();
    let before = capture.inner.lock().unwrap().spans.len();
    hedge.layer(service).oneshot(()).await.unwrap();
    let inner = capture.inner.lock().unwrap();
    let hedges: Vec<(u64, SpanData)> = inner
        .spans
        .iter()
        .filter(|(_, span)| span.name == "hedge_attempt")
        .map(|(id, span)| (*id, span.clone()))
        .collect();
    assert_eq!(
        inner.spans.len() - before,
        2,
        "one span per hedge, none for the first attempt"
    );
    let outcomes: Vec<(&str, &str, &str)> = hedges
        .iter()
        .map(|(_, span)| {
            (
                span.fields["attempt"].as_str(),
                span.fields["http.request.resend_count"].as_str(),
                span.fields["outcome"].as_str(),
            )
        })
        .collect();
    assert_eq!(outcomes, [("2", "1", "cancelled"), ("3", "2", "won")]);
    assert!(hedges
        .iter()
        .all(|(_, span)| span.closed && span.fields["hedge"] == "search"));
    for (id, span) in &hedges {
        let called: Vec<&EventData> = inner
            .events
            .iter()
            .filter(|event| event.message == "downstream called" && event.span == Some(*id))
            .collect();
        assert_eq!(
            called.len(),
            1,
            "the hedge's call ran in its span: {span:?}"
        );
    }
    let sent = inner
        .events
        .iter()
        .filter(|event| event.message == "hedge sent" && event.level == Level::DEBUG)
        .count();
    assert_eq!(sent, 2);
}
