use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_classify::{ConfigError, ErrorChainClassifier};
use tower_layer::Layer;

use super::policy::{DelaySource, HedgePolicy};
use super::service::Hedge;
use crate::budget::{Budget, TpsBudget};
use crate::hedge::latency::LatencyWindow;
use crate::layer::ensure;
use crate::replay::CloneRequest;
use crate::telemetry::Telemetry;

/// The most attempts a hedged call may have in flight, as gRFC A6 caps
/// `maxAttempts`.
const MAX_HEDGE_ATTEMPTS: u32 = 5;

/// The longest fixed delay and least delay a builder takes.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(3600);

/// Sends a hedge (a second copy of a request) when the first attempt is
/// slow; see the [module docs](crate::hedge).
///
/// Built by [`HedgeLayer::builder`] or [`HedgeLayer::http_builder`]. The
/// settings, the latency window and the budget live behind one `Arc`: every
/// clone of the layer and every service it makes share them.
#[derive(Debug)]
pub struct HedgeLayer<C = ErrorChainClassifier, R = CloneRequest> {
    pub(crate) policy: Arc<HedgePolicy<C, R>>,
}

impl<C, R> Clone for HedgeLayer<C, R> {
    fn clone(&self) -> Self {
        HedgeLayer {
            policy: Arc::clone(&self.policy),
        }
    }
}

impl HedgeLayer {
    /// A builder for any `Clone` request, classifying errors by their
    /// chain ([`ErrorChainClassifier`]).
    pub fn builder() -> HedgeBuilder<ErrorChainClassifier, CloneRequest> {
        HedgeBuilder::new(ErrorChainClassifier::new(), CloneRequest)
    }
}

#[cfg(feature = "http")]
impl HedgeLayer<tower_classify::HttpClassifier, crate::replay::HttpReplay> {
    /// A builder for `http::Request`s: the
    /// [`HttpClassifier`](tower_classify::HttpClassifier) and
    /// [`HttpReplay`](crate::replay::HttpReplay), so only idempotent
    /// requests with a body that can be copied are hedged.
    pub fn http_builder() -> HedgeBuilder<tower_classify::HttpClassifier, crate::replay::HttpReplay>
    {
        HedgeBuilder::new(
            tower_classify::HttpClassifier::new(),
            crate::replay::HttpReplay::new(),
        )
    }
}

impl<C, R> HedgeLayer<C, R> {
    /// The settings, as the layer's services and their calls share them.
    #[cfg(all(test, feature = "grpc-service-config"))]
    pub(crate) fn shared(&self) -> &Arc<HedgePolicy<C, R>> {
        &self.policy
    }

    /// The delay a call made now would wait before its first hedge: the
    /// fixed delay, or the percentile of the latency window; `None` while
    /// the window holds fewer samples than it needs (no hedge is sent).
    pub fn current_delay(&self) -> Option<Duration> {
        self.policy.delay.current()
    }
}

impl<S, C, R> Layer<S> for HedgeLayer<C, R> {
    type Service = Hedge<S, C, R>;

    fn layer(&self, inner: S) -> Self::Service {
        Hedge::from_policy(inner, Arc::clone(&self.policy))
    }
}

#[derive(Clone, Copy, Debug)]
enum DelayChoice {
    /// The percentile `1 − max_extra_load`, as Finagle's backup requests.
    FromExtraLoad,
    Percentile(f64),
    Fixed(Duration),
}

/// Builds a [`HedgeLayer`]. Every setting has a documented default;
/// [`build`](Self::build) checks them and names the field it refuses.
///
/// | setting | default |
/// |---|---|
/// | [`max_attempts`](Self::max_attempts) | 2 (the first and one hedge) |
/// | delay | the percentile `1 − max_extra_load` (p95) of recent latencies |
/// | [`max_extra_load`](Self::max_extra_load) | 0.05: hedges add at most 5 % to the requests sent |
/// | [`min_hedges_per_sec`](Self::min_hedges_per_sec) | 1 |
/// | [`window`](Self::window) | 30 s |
/// | [`min_samples`](Self::min_samples) | 100 |
/// | [`min_delay`](Self::min_delay) | 1 ms |
/// | [`min_attempt_time`](Self::min_attempt_time) | 0 |
/// | [`name`](Self::name) | `"default"` |
pub struct HedgeBuilder<C, R> {
    classifier: C,
    replay: R,
    settings: Settings,
}

/// A builder's settings but its classifier and replay, which keep them
/// when either is changed.
struct Settings {
    max_attempts: u32,
    delay: DelayChoice,
    window: Duration,
    min_samples: u32,
    min_delay: Duration,
    max_extra_load: f64,
    min_hedges_per_sec: u32,
    /// Whether the layer has a budget of its own (`max_extra_load`).
    own_budget: bool,
    shared: Vec<Arc<dyn Budget + Send + Sync>>,
    min_attempt_time: Duration,
    name: Arc<str>,
}

impl<C: fmt::Debug, R: fmt::Debug> fmt::Debug for HedgeBuilder<C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        f.debug_struct("HedgeBuilder")
            .field("classifier", &self.classifier)
            .field("replay", &self.replay)
            .field("max_attempts", &s.max_attempts)
            .field("delay", &s.delay)
            .field("max_extra_load", &s.max_extra_load)
            .field("name", &s.name)
            .finish_non_exhaustive()
    }
}

impl<C, R> HedgeBuilder<C, R> {
    /// A builder with `classifier` and `replay` and the defaults above.
    pub(crate) fn new(classifier: C, replay: R) -> Self {
        HedgeBuilder {
            classifier,
            replay,
            settings: Settings {
                max_attempts: 2,
                delay: DelayChoice::FromExtraLoad,
                window: Duration::from_secs(30),
                min_samples: 100,
                min_delay: Duration::from_millis(1),
                max_extra_load: 0.05,
                min_hedges_per_sec: 1,
                own_budget: true,
                shared: Vec::new(),
                min_attempt_time: Duration::ZERO,
                name: Arc::from("default"),
            },
        }
    }

    /// The builder with one setting changed.
    fn set(mut self, change: impl FnOnce(&mut Settings)) -> Self {
        change(&mut self.settings);
        self
    }

    /// Uses `classifier` to decide which answer wins, by the rules of the
    /// [module docs](crate::hedge).
    pub fn classifier<C2>(self, classifier: C2) -> HedgeBuilder<C2, R> {
        self.map_parts(|_| classifier, |replay| replay)
    }

    /// How requests are copied for hedges, as
    /// [`RetryBuilder::map_replay`](crate::RetryBuilder::map_replay) sets it
    /// for retries; a request the replay refuses is never hedged.
    pub fn map_replay<R2>(self, change: impl FnOnce(R) -> R2) -> HedgeBuilder<C, R2> {
        self.map_parts(|classifier| classifier, change)
    }

    /// The builder with its classifier and replay changed, every setting kept.
    fn map_parts<C2, R2>(
        self,
        classifier: impl FnOnce(C) -> C2,
        replay: impl FnOnce(R) -> R2,
    ) -> HedgeBuilder<C2, R2> {
        HedgeBuilder {
            classifier: classifier(self.classifier),
            replay: replay(self.replay),
            settings: self.settings,
        }
    }

    /// The layer's name in metrics labels (`hedge="…"`), events and spans
    /// (default `"default"`); see [Observability](crate#observability).
    pub fn name(self, name: impl Into<Arc<str>>) -> Self {
        self.set(|s| s.name = name.into())
    }

    /// The most attempts in flight for one call, the first included (2–5;
    /// default 2). Each hedge is sent one delay after the attempt before it
    /// went out, if no answer has won by then and no failure came back.
    pub fn max_attempts(self, attempts: u32) -> Self {
        self.set(|s| s.max_attempts = attempts)
    }

    /// Hedges after a fixed `delay` (0 sends every attempt at once, as
    /// gRFC A6's `hedgingDelay` of 0 does).
    pub fn delay(self, delay: Duration) -> Self {
        self.set(|s| s.delay = DelayChoice::Fixed(delay))
    }

    /// Hedges after the `percentile` (between 0 and 1: 0.95 is p95) of the
    /// first attempts' recent latencies (default `1 − max_extra_load`).
    pub fn percentile(self, percentile: f64) -> Self {
        self.set(|s| s.delay = DelayChoice::Percentile(percentile))
    }

    /// How much history the percentile reads (1 s – 10 min; default 30 s).
    /// The window is three slices; the oldest is dropped as a new one starts.
    pub fn window(self, window: Duration) -> Self {
        self.set(|s| s.window = window)
    }

    /// The latencies the window must hold before any hedge is sent
    /// (1–1,000,000; default 100).
    pub fn min_samples(self, samples: u32) -> Self {
        self.set(|s| s.min_samples = samples)
    }

    /// The shortest percentile delay (default 1 ms): a dependency that
    /// answers in microseconds is not sent every request twice.
    pub fn min_delay(self, delay: Duration) -> Self {
        self.set(|s| s.min_delay = delay)
    }

    /// The most extra load hedges may add, as a fraction of the calls
    /// through the layer (more than 0 and at most 1; default 0.05), as
    /// [the budget](crate::hedge#the-budget) enforces it. Undoes
    /// [`no_budget`](Self::no_budget).
    pub fn max_extra_load(self, fraction: f64) -> Self {
        self.set(|s| {
            s.max_extra_load = fraction;
            s.own_budget = true;
        })
    }

    /// Hedges per second the layer's budget allows whatever the traffic
    /// (0–1000; default 1), so a quiet client can hedge at all.
    pub fn min_hedges_per_sec(self, hedges: u32) -> Self {
        self.set(|s| s.min_hedges_per_sec = hedges)
    }

    /// No budget of the layer's own: only [`max_attempts`](Self::max_attempts)
    /// and the shared budgets limit hedges (gRFC A6's hedging, which only
    /// retry throttling limits). [`max_extra_load`](Self::max_extra_load)
    /// undoes it.
    pub fn no_budget(self) -> Self {
        self.set(|s| s.own_budget = false)
    }

    /// Also asks `budget` before each hedge (each call adds one). A hedge
    /// is sent only when the layer's own budget and every shared budget
    /// allow it; it is then withdrawn from each. When a shared budget
    /// refuses, the own budget gets its withdrawal back; the shared budgets
    /// asked before it do not (tower's [`Budget`] has no refund), so with
    /// two or more shared budgets a refused hedge still spends what the
    /// earlier ones allowed. Share one budget unless that is wanted.
    ///
    /// Pass a retry layer's budget so that retries and hedges together stay
    /// within it (Finagle's rule). The layer never deposits into a shared budget: its owner does.
    pub fn shared_budget(self, budget: Arc<dyn Budget + Send + Sync>) -> Self {
        self.set(|s| s.shared.push(budget))
    }

    /// The least time before the caller's [`Deadline`](tower_classify::deadline::Deadline)
    /// an attempt must have to be sent (default 0). A hedge due later is not
    /// sent; a call with less left sends nothing ([`DeadlineExceeded`](crate::error::DeadlineExceeded)).
    pub fn min_attempt_time(self, min: Duration) -> Self {
        self.set(|s| s.min_attempt_time = min)
    }

    /// Checks the settings and builds the layer. Errors name the field.
    pub fn build(self) -> Result<HedgeLayer<C, R>, ConfigError> {
        self.settings.check()?;
        super::telemetry::describe_metrics();
        let s = self.settings;
        let delay = match (s.delay, s.percentile_value()) {
            (DelayChoice::Fixed(delay), _) => DelaySource::Fixed(delay),
            (_, Some(percentile)) => DelaySource::Window(LatencyWindow::new(
                percentile,
                s.window,
                s.min_samples,
                s.min_delay,
            )),
            (_, None) => unreachable!("only a fixed delay has no percentile"),
        };
        let own = s
            .own_budget
            .then(|| {
                TpsBudget::new(
                    Duration::from_secs(10),
                    s.min_hedges_per_sec,
                    s.max_extra_load,
                )
            })
            .transpose()
            .map_err(|error| error.within("max_extra_load"))?;
        Ok(HedgeLayer {
            policy: Arc::new(HedgePolicy {
                classifier: self.classifier,
                replay: self.replay,
                max_attempts: s.max_attempts,
                delay,
                own_budget: own,
                shared: s.shared,
                min_attempt_time: s.min_attempt_time,
                telemetry: Telemetry::new(s.name),
            }),
        })
    }
}

impl Settings {
    fn percentile_value(&self) -> Option<f64> {
        match self.delay {
            DelayChoice::FromExtraLoad => Some(1.0 - self.max_extra_load),
            DelayChoice::Percentile(p) => Some(p),
            DelayChoice::Fixed(_) => None,
        }
    }

    /// Checks the settings as [`HedgeBuilder::build`] does.
    fn check(&self) -> Result<(), ConfigError> {
        let attempts = self.max_attempts;
        ensure(
            (2..=MAX_HEDGE_ATTEMPTS).contains(&attempts),
            "max_attempts",
            || format!("{attempts} must be between 2 and {MAX_HEDGE_ATTEMPTS}"),
        )?;
        let load = self.max_extra_load;
        ensure(
            load.is_finite() && load > 0.0 && load <= 1.0,
            "max_extra_load",
            || format!("{load} must be more than 0 and at most 1"),
        )?;
        let hedges = self.min_hedges_per_sec;
        ensure(hedges <= 1000, "min_hedges_per_sec", || {
            format!("{hedges} is above 1000")
        })?;
        if let Some(p) = self.percentile_value() {
            ensure(p.is_finite() && p > 0.0 && p < 1.0, "percentile", || {
                format!("{p} must be between 0 and 1 (0.95 is p95)")
            })?;
        }
        if let DelayChoice::Fixed(delay) = self.delay {
            ensure(delay <= MAX_DELAY, "delay", || "must be at most 1 h".into())?;
        }
        let window = self.window;
        let window_range = Duration::from_secs(1)..=Duration::from_secs(600);
        ensure(window_range.contains(&window), "window", || {
            format!("{window:?} must be between 1s and 10min")
        })?;
        let samples = self.min_samples;
        ensure((1..=1_000_000).contains(&samples), "min_samples", || {
            format!("{samples} must be between 1 and 1000000")
        })?;
        ensure(self.min_delay <= MAX_DELAY, "min_delay", || {
            "must be at most 1 h".into()
        })
    }
}
