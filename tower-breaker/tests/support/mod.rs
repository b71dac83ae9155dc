//! Captures `tracing` events per test thread.
//!
//! `tracing` caches each callsite's interest globally. With scoped
//! subscribers (`with_default`) in some tests and none in others running in
//! parallel, a callsite first hit on a thread without a subscriber can be
//! cached as uninteresting and a capturing test misses its events. So one
//! global subscriber is installed for the whole test binary, and it files
//! every event under the thread that emitted it.

use std::cell::RefCell;
use std::fmt::Write;
use std::sync::Once;

use tracing::field::{Field, Visit};
use tracing::Level;
use tracing_subscriber::layer::{Context, SubscriberExt};

thread_local! {
    static EVENTS: RefCell<Vec<(Level, String)>> = const { RefCell::new(Vec::new()) };
}

struct PerThread;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PerThread {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Fields<'a>(&'a mut String);
        impl Visit for Fields<'_> {
            fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                let _ = write!(self.0, "{}={value:?} ", field.name());
            }
            fn record_str(&mut self, field: &Field, value: &str) {
                let _ = write!(self.0, "{}={value} ", field.name());
            }
        }
        let mut text = String::new();
        event.record(&mut Fields(&mut text));
        let level = *event.metadata().level();
        EVENTS.with(|events| events.borrow_mut().push((level, text)));
    }
}

/// Starts capturing this thread's events, dropping any captured before.
pub fn capture() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(PerThread))
            .expect("no other global subscriber in this test binary");
    });
    EVENTS.with(|events| events.borrow_mut().clear());
}

/// The events this thread emitted since [`capture`].
pub fn events() -> Vec<(Level, String)> {
    EVENTS.with(|events| events.borrow().clone())
}

/// Only the warnings.
#[allow(dead_code)]
pub fn warnings() -> Vec<String> {
    events()
        .into_iter()
        .filter(|(level, _)| *level == Level::WARN)
        .map(|(_, text)| text)
        .collect()
}
