//! The crate's metrics: their descriptions, what a breaker's `breaker` label
//! says, and a keyed registry's eviction counters (a breaker's own handles
//! are its listeners', `listeners.rs`).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use metrics::{Counter, SharedString, Unit};

/// What the `breaker` label of a keyed breaker's metrics says: the layer's
/// [name](crate::Builder::name) (the default), a label computed from the key
/// by a function whose values form a small, fixed set, or the key itself.
/// Set it with [`Builder::metrics_label`](crate::Builder::metrics_label).
///
/// # Cardinality
///
/// Every distinct label value is a set of series in the exporter (the state
/// gauge and three counters), and the `metrics` facade has no way to remove
/// a series once an exporter has seen it. So:
///
/// - [`layer_name`](Self::layer_name) (default): one label value per layer,
///   whatever the keys. The counters add up over every key; the state gauge
///   shows the latest state change of any of them. Per-key state is in the
///   [admin handle](crate::BreakerHandle).
/// - [`mapped`](Self::mapped): one label value per value the function
///   returns. **The caller promises that set is small and fixed** — a tier, a
///   region, a connector kind — never something derived from untrusted input
///   (a host name a client sent, a tenant id).
/// - [`key`](Self::key): one label value per key ever seen. The registry
///   keeps at most `max_breakers` breakers, and an evicted breaker's state
///   gauge is set back to closed (`0`) and its handles dropped, so at most
///   `max_breakers` series per metric are *live*. An exporter still keeps the
///   series of every key it ever saw unless it expires idle series (for
///   example `metrics-exporter-prometheus`' `idle_timeout`); an evicted
///   breaker's series are never updated again, so they expire. Use it for
///   keys that come from configuration, not from requests.
///
/// A plain (unkeyed) breaker's key is the layer's name: every choice labels
/// it with the name.
#[derive(Clone)]
pub struct MetricsLabel(LabelRule);

/// A key's label, as [`MetricsLabel::mapped`] computes it.
type LabelMapper = Arc<dyn Fn(&str) -> Cow<'static, str> + Send + Sync>;

#[derive(Clone)]
enum LabelRule {
    LayerName,
    Key,
    Mapped(LabelMapper),
}

impl MetricsLabel {
    /// Every breaker of the layer is labelled with the layer's name (the default).
    pub fn layer_name() -> Self {
        MetricsLabel(LabelRule::LayerName)
    }

    /// Each breaker is labelled with its key. See the cardinality rule above:
    /// only for keys from a bounded, trusted set, or with an exporter that
    /// expires idle series.
    pub fn key() -> Self {
        MetricsLabel(LabelRule::Key)
    }

    /// Each breaker is labelled with `map(key)`, called once when the breaker
    /// is created. The values must form a small, fixed set: breakers sharing
    /// a label share its series.
    pub fn mapped<F, L>(map: F) -> Self
    where
        F: Fn(&str) -> L + Send + Sync + 'static,
        L: Into<Cow<'static, str>>,
    {
        MetricsLabel(LabelRule::Mapped(Arc::new(move |key| map(key).into())))
    }

    /// The label value for the breaker of `key` in the layer named `name`,
    /// and whether that label is the breaker's own (no other breaker can
    /// share it).
    pub(crate) fn label_for(&self, name: &Arc<str>, key: &Arc<str>) -> (SharedString, bool) {
        match &self.0 {
            LabelRule::LayerName => (SharedString::from(Arc::clone(name)), false),
            LabelRule::Key => (SharedString::from(Arc::clone(key)), true),
            LabelRule::Mapped(map) => (SharedString::from(map(key)), false),
        }
    }
}

impl Default for MetricsLabel {
    fn default() -> Self {
        Self::layer_name()
    }
}

impl fmt::Debug for MetricsLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            LabelRule::LayerName => "MetricsLabel::layer_name()",
            LabelRule::Key => "MetricsLabel::key()",
            LabelRule::Mapped(_) => "MetricsLabel::mapped(..)",
        })
    }
}

/// Registers the descriptions (kind, unit, meaning) of this crate's
/// metrics with the installed `metrics` recorder.
///
/// Building a layer calls it; call it yourself after installing a recorder
/// later ([crate docs](crate#observability)). Repeating it is harmless.
pub fn describe_metrics() {
    // The two gauges hold codes, not quantities: no unit fits them.
    metrics::describe_gauge!(
        "tower_breaker_state",
        "What the circuit breaker refuses: 0 closed (also forced closed), \
         1 half-open, 2 open (also forced open)"
    );
    metrics::describe_gauge!(
        "tower_breaker_forced",
        "1 while an operator has forced the circuit breaker open or closed, else 0"
    );
    metrics::describe_counter!(
        "tower_breaker_opened_total",
        Unit::Count,
        "Transitions of the circuit breaker to open"
    );
    metrics::describe_counter!(
        "tower_breaker_rejected_total",
        Unit::Count,
        "Calls the circuit breaker refused without calling the service"
    );
    metrics::describe_counter!(
        "tower_breaker_would_reject_total",
        Unit::Count,
        "Calls a metrics-only circuit breaker would have refused and let through"
    );
    metrics::describe_counter!(
        "tower_breaker_evicted_total",
        Unit::Count,
        "Keyed circuit breakers evicted to make room for a new key, by the state they were in"
    );
}

/// A keyed registry's eviction counters, labelled with the layer's name
/// (never a key: evictions happen under key floods).
pub(crate) struct EvictionCounters {
    pub(crate) closed: Counter,
    pub(crate) open: Counter,
}

impl EvictionCounters {
    pub(crate) fn register(name: &Arc<str>) -> Self {
        let name = SharedString::from(Arc::clone(name));
        EvictionCounters {
            closed: metrics::counter!(
                "tower_breaker_evicted_total", "breaker" => name.clone(), "state" => "closed"
            ),
            open: metrics::counter!(
                "tower_breaker_evicted_total", "breaker" => name, "state" => "open"
            ),
        }
    }

    /// For a registry that never evicts.
    pub(crate) fn none() -> Self {
        EvictionCounters {
            closed: Counter::noop(),
            open: Counter::noop(),
        }
    }
}
