//! A tracing subscriber that keeps every event, for the tests that check
//! what the layer logs. Each such test is its own binary: tracing caches
//! per-callsite interest process-wide, so a thread-local subscriber can race
//! with another test on another thread.

#![allow(dead_code)]

use std::fmt;
use std::sync::Arc;

/// One event: its level, message, key field, and every field as text.
pub type Event = (tracing::Level, String, String, String);

/// Collects every tracing event.
#[derive(Clone, Default)]
pub struct Events(pub Arc<std::sync::Mutex<Vec<Event>>>);

impl tracing::Subscriber for Events {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Fields(String, String, String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
                self.2 += &format!("{}={value:?} ", field.name());
                match field.name() {
                    "message" => self.0 = format!("{value:?}"),
                    "key" | "entry_id" => self.1 = format!("{value:?}"),
                    _ => {}
                }
            }
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                self.2 += &format!("{}={value} ", field.name());
                if field.name() == "key" {
                    self.1 = value.to_owned();
                }
            }
        }
        let mut fields = Fields(String::new(), String::new(), String::new());
        event.record(&mut fields);
        self.0
            .lock()
            .unwrap()
            .push((*event.metadata().level(), fields.0, fields.1, fields.2));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
