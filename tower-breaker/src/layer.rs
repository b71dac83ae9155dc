//! [`CircuitBreakerLayer`] and its [`Builder`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_classify::ConfigError;
use tower_layer::Layer;

use crate::admin::BreakerHandle;
use crate::answer::Plain;
use crate::instruments::{describe_metrics, EvictionCounters, MetricsLabel};
use crate::keyed::KeyedCircuitBreakerLayer;
use crate::policy::{ensure, ensure_factor, ensure_share, Policy};
use crate::registry::Registry;
use crate::service::CircuitBreaker;
use crate::settings::{Callbacks, Settings};
use crate::share::{BreakerRef, Share};
use crate::state::{CallEvent, Mode, StateChange};
use crate::word::MAX_PROBES;

/// Wraps services in a [`CircuitBreaker`] that all share one breaker, created
/// with the layer (see the [crate docs](crate)).
///
/// `C`, the [`Classify`](tower_classify::Classify) value deciding what a
/// result means, is cloned into each response future: keep it cheap to clone.
/// `A` is what an open circuit answers ([`answer`](Self::answer)); by default
/// ([`Plain`]) a [`CircuitOpen`](crate::CircuitOpen) error.
pub struct CircuitBreakerLayer<C, A = Plain> {
    pub(crate) breaker: BreakerRef,
    pub(crate) registry: Arc<Registry>,
    pub(crate) classifier: C,
    answer: A,
}

impl<C: Clone, A: Clone> Clone for CircuitBreakerLayer<C, A> {
    /// Written by hand: a clone of the layer (axum's `Router::layer` makes
    /// one per route) keeps handing out a share of the breaker per thread,
    /// as the layer does, rather than holding the cloning thread's share.
    fn clone(&self) -> Self {
        CircuitBreakerLayer {
            breaker: self.breaker.owner(),
            registry: Arc::clone(&self.registry),
            classifier: self.classifier.clone(),
            answer: self.answer.clone(),
        }
    }
}

impl<C: fmt::Debug, A: fmt::Debug> fmt::Debug for CircuitBreakerLayer<C, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let breaker = self.breaker.breaker();
        f.debug_struct("CircuitBreakerLayer")
            .field("breaker", breaker)
            .field("settings", &breaker.settings)
            .field("classifier", &self.classifier)
            .field("answer", &self.answer)
            .finish()
    }
}

impl<C> CircuitBreakerLayer<C> {
    /// A breaker with every default of the [`Builder`].
    pub fn new(classifier: C) -> Self {
        Builder::default()
            .build(classifier)
            .expect("the default configuration is valid")
    }
}

impl<C, A> CircuitBreakerLayer<C, A> {
    /// The same breaker, answering as `answer` (of [`answer`](crate::answer)) says.
    pub fn answer<B>(self, answer: B) -> CircuitBreakerLayer<C, B> {
        CircuitBreakerLayer {
            breaker: self.breaker,
            registry: self.registry,
            classifier: self.classifier,
            answer,
        }
    }

    /// The admin handle of this layer's breaker: list, reset, force.
    pub fn handle(&self) -> BreakerHandle {
        BreakerHandle::new(Arc::clone(&self.registry))
    }
}

impl CircuitBreakerLayer<()> {
    /// A [`Builder`]; the classifier is given to [`Builder::build`].
    pub fn builder() -> Builder {
        Builder::default()
    }
}

impl<S, C: Clone, A: Clone> Layer<S> for CircuitBreakerLayer<C, A> {
    type Service = CircuitBreaker<S, C, A>;

    fn layer(&self, inner: S) -> Self::Service {
        let breaker = self.breaker.owner();
        CircuitBreaker::new(inner, breaker, self.classifier.clone(), self.answer.clone())
    }
}

/// Configures a [`CircuitBreakerLayer`] or a
/// [`KeyedCircuitBreakerLayer`]. Every setting has a documented default;
/// [`build`](Self::build) refuses invalid values with a [`ConfigError`] that
/// names the field.
///
/// # Against Resilience4j and Polly
///
/// The settings a user migrating from those libraries relies on work the
/// same: a failure-rate trip tested on every recorded call (a share exactly
/// at the rate opens), a count or time window with a minimum number of
/// calls, N half-open probes judged together, a maximum wait in half-open, a
/// slow-call rate apart from the failure rate, every listener called,
/// per-call events. Where this breaker differs, it is on purpose:
///
/// | behaviour | Resilience4j / Polly | here | why |
/// |---|---|---|---|
/// | default trip policy | a failure rate (Resilience4j 50 % of 100 calls; Polly 10 % over 30 s, at least 100 calls) | 5 consecutive transient failures; a failure rate is one call away | a dependency that fails every call should open after a handful of calls, not a hundred |
/// | what counts as a failure | every exception, unless ignored | only the transient kinds of `tower-classify` (server error, rate limited, timeout, connection, not sent) | a rejected request (a 4xx, a validation error) says nothing about the dependency's health |
/// | wait in half-open | `maxWaitDurationInHalfOpenState`, 0 (for ever) by default | `probe_timeout`, 60 s by default | a probe hung with no timeout below it must not hold the only slot for good |
/// | several probes | the verdict waits for every permitted call | reopens as soon as the probes' failure share reaches the rate | more answers cannot lower a share already reached; the upstream is spared the rest |
/// | slow calls | on by default (60 s, 100 %) | off; a threshold alone counts slow successes as failures, `slow_call_rate` gives them a rate of their own | no hidden clock reads on the closed path |
/// | counts after opening | kept until the next transition | reset when the breaker opens, and again just before it closes | a failure that lands while the breaker closes again never meets stale counts, nor do the results that calls of the last closed period wrote just after it opened |
/// | a refused call | `CallNotPermittedException` | a `CircuitOpen` error carrying the remaining open time and when to come back (classified `Shed`), or a `503` with `Retry-After` | a retry layer around it can wait it out, the callers spread over a ramp, and an HTTP caller gets an answer |
/// | open period | a fixed `waitDurationInOpenState` (60 s) / `BreakDuration` (5 s), exponential on request | 250 ms, doubling per failed probe up to 500 ms, jittered; fixed on request | a dependency that is back is seen within half a second |
#[derive(Clone, Debug)]
pub struct Builder {
    pub(crate) settings: Settings,
    /// The user set the open period: it is fixed unless a maximum is set too.
    recovery_timeout_set: bool,
    /// The user set the maximum open period.
    max_recovery_timeout_set: bool,
    /// The user set the jitter.
    recovery_jitter_set: bool,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            recovery_timeout_set: false,
            max_recovery_timeout_set: false,
            recovery_jitter_set: false,
            settings: Settings {
                name: Arc::from("default"),
                policy: Policy::default(),
                recovery_timeout: Self::FIRST_OPEN_PERIOD,
                max_recovery_timeout: Some(Self::LONGEST_OPEN_PERIOD),
                recovery_multiplier: 2.0,
                recovery_jitter: Self::OPEN_PERIOD_JITTER,
                probes: 1,
                probe_timeout: Duration::from_secs(60),
                slow_start: Duration::ZERO,
                slow_call_threshold: None,
                slow_call_rate: None,
                mode: Mode::Enforce,
                pending_when_open: false,
                on_state_change: Callbacks(Vec::new()),
                on_call: Callbacks(Vec::new()),
                max_breakers: 1_000,
                metrics_label: MetricsLabel::layer_name(),
            },
        }
    }
}

impl Builder {
    /// The first open period of the default schedule.
    const FIRST_OPEN_PERIOD: Duration = Duration::from_millis(250);
    /// The longest open period of the default schedule.
    const LONGEST_OPEN_PERIOD: Duration = Duration::from_millis(500);
    /// The default schedule's jitter.
    const OPEN_PERIOD_JITTER: f64 = 0.2;

    /// The breaker's name in logs, metrics labels (`breaker="…"`) and the
    /// admin handle (default `"default"`). Keyed breakers use their keys in
    /// logs and the admin handle, and the name as their metrics label unless
    /// [`metrics_label`](Self::metrics_label) says otherwise.
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.settings.name = name.into();
        self
    }

    /// When the breaker opens (default: 5 consecutive failures).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.settings.policy = policy;
        self
    }

    /// A fixed open period: the breaker stays open this long before it
    /// admits a probe, every time it opens (unless
    /// [`max_recovery_timeout`](Self::max_recovery_timeout) lets it grow),
    /// without [jitter](Self::recovery_jitter) unless one is set.
    ///
    /// Without it the open period backs off ([crate docs](crate#recovery)) up
    /// to 500 ms, so a long outage costs one failed probe every 0.4 to 0.5 s;
    /// raise the cap with [`max_recovery_timeout`](Self::max_recovery_timeout)
    /// where many processes and keys would probe one dead dependency.
    pub fn recovery_timeout(mut self, timeout: Duration) -> Self {
        self.settings.recovery_timeout = timeout;
        self.recovery_timeout_set = true;
        if !self.max_recovery_timeout_set {
            self.settings.max_recovery_timeout = None;
        }
        if !self.recovery_jitter_set {
            self.settings.recovery_jitter = 0.0;
        }
        self
    }

    /// Grow the open period on every reopen in a row (a probe failed again):
    /// `first × multiplier^n`, capped at `max`, where `first` is
    /// [`recovery_timeout`](Self::recovery_timeout) (when it is not set,
    /// 250 ms or `max` if shorter). Unset, the cap is 500 ms by default, and
    /// with `recovery_timeout` set every open lasts `recovery_timeout`.
    pub fn max_recovery_timeout(mut self, max: Duration) -> Self {
        self.settings.max_recovery_timeout = Some(max);
        self.max_recovery_timeout_set = true;
        if !self.recovery_timeout_set {
            // The default first period must not exceed a shorter cap.
            self.settings.recovery_timeout = Self::FIRST_OPEN_PERIOD.min(max);
        }
        self
    }

    /// The growth factor of [`max_recovery_timeout`](Self::max_recovery_timeout)
    /// (default 2).
    pub fn recovery_multiplier(mut self, multiplier: f64) -> Self {
        self.settings.recovery_multiplier = multiplier;
        self
    }

    /// Shorten each open period by a random share of up to `jitter` (in
    /// `[0, 1)`), so processes that opened together do not all probe at the
    /// same moment. Default 0.2, or 0 once
    /// [`recovery_timeout`](Self::recovery_timeout) is set.
    pub fn recovery_jitter(mut self, jitter: f64) -> Self {
        self.settings.recovery_jitter = jitter;
        self.recovery_jitter_set = true;
        self
    }

    /// Probe calls admitted when half-open (default 1, at most 4 095), judged
    /// together: under [`Policy::ConsecutiveFailures`] every probe must
    /// succeed and one failure reopens the breaker; under
    /// [`Policy::FailureRate`] the breaker reopens once the probes' own
    /// failure share reaches the rate, and closes when all of them answered
    /// below it.
    pub fn probes(mut self, probes: u32) -> Self {
        self.settings.probes = probes;
        self
    }

    /// How long a half-open breaker waits for its probes once every slot is
    /// taken (default 60 s; [`Builder`] says why) before it reclaims the slots
    /// and reopens, as if the probes had failed. `Duration::MAX` waits for ever.
    pub fn probe_timeout(mut self, timeout: Duration) -> Self {
        self.settings.probe_timeout = timeout;
        self
    }

    /// After a probe closes the breaker, admit a share of calls rising
    /// linearly from a tenth to all of them over `window` (Envoy's
    /// `slow_start_window`; [crate docs](crate#recovery)). A call refused
    /// meanwhile gets a [`CircuitOpen`](crate::CircuitOpen) without a
    /// remaining open time, telling it to come back at a random point of what
    /// is left of the window. Off by default (zero): waiting calls already
    /// come back over a ramp ([`CircuitOpen::failure`](crate::CircuitOpen::failure)).
    pub fn slow_start(mut self, window: Duration) -> Self {
        self.settings.slow_start = window;
        self
    }

    /// Calls slower than `threshold` are slow (off by default). Without a
    /// [`slow_call_rate`](Self::slow_call_rate), a slow success counts as a
    /// failure; with one, slow calls have a rate of their own.
    pub fn slow_call_threshold(mut self, threshold: Duration) -> Self {
        self.settings.slow_call_threshold = Some(threshold);
        self
    }

    /// Open when the share of slow calls (successes or not, slower than the
    /// [`slow_call_threshold`](Self::slow_call_threshold)) over the
    /// failure-rate window reaches `rate`, in `(0, 1]`, apart from the
    /// failure rate: Resilience4j's `slowCallRateThreshold`. A slow success
    /// then no longer counts as a failure, and a slow probe does not close
    /// a half-open breaker. Needs [`Policy::FailureRate`] (its
    /// window and minimum number of calls) and a threshold.
    pub fn slow_call_rate(mut self, rate: f64) -> Self {
        self.settings.slow_call_rate = Some(rate);
        self
    }

    /// Enforce, only measure, or do nothing (default [`Mode::Enforce`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.settings.mode = mode;
        self
    }

    /// While open, make `poll_ready` return `Pending` (until the recovery
    /// timeout ends or the state changes) instead of failing calls, for a
    /// balancer ([crate docs](crate#with-axum)). Off by default. Every waiting
    /// service becomes ready together when the breaker closes: where many
    /// requests wait on clones, add [`slow_start`](Self::slow_start). Ignored
    /// by keyed breakers, whose key is known only in `call`.
    pub fn pending_when_open(mut self, yes: bool) -> Self {
        self.settings.pending_when_open = yes;
        self
    }

    /// Called on every state change, after it happened, on the thread that
    /// made it. Keep it short: it runs inside a service call. Each call adds
    /// a callback; all of them are called, in the order they were added.
    pub fn on_state_change<F>(mut self, callback: F) -> Self
    where
        F: Fn(&StateChange<'_>) + Send + Sync + 'static,
    {
        self.settings.on_state_change.0.push(Arc::new(callback));
        self
    }

    /// Called once per call: its success (or slow success), counted
    /// failure, uncounted end, or refusal ([`CallEvent`]), on the thread that
    /// completed it. Each call adds a callback; all of them are called. With
    /// one registered, every call's duration is measured (a clock read at
    /// its start and end); with none, nothing is.
    pub fn on_call<F>(mut self, callback: F) -> Self
    where
        F: Fn(&CallEvent<'_>) + Send + Sync + 'static,
    {
        self.settings.on_call.0.push(Arc::new(callback));
        self
    }

    /// The most breakers a keyed layer keeps (default 1 000); see
    /// [`KeyedCircuitBreakerLayer`] for the eviction order.
    pub fn max_breakers(mut self, max: usize) -> Self {
        self.settings.max_breakers = max;
        self
    }

    /// What the `breaker` label of each keyed breaker's metrics says (default
    /// [`MetricsLabel::layer_name()`]); see [`MetricsLabel`] for the choices
    /// and the cardinality each one costs an exporter.
    pub fn metrics_label(mut self, label: MetricsLabel) -> Self {
        self.settings.metrics_label = label;
        self
    }

    /// The settings as built, for the crate's unit tests.
    #[cfg(test)]
    pub(crate) fn into_settings(self) -> Settings {
        self.settings
    }

    /// Checks the settings as [`build`](Self::build) does, without building
    /// a layer: no breaker is created and no metric registered (or
    /// described), so a configuration can be validated before the metrics
    /// recorder is installed.
    pub fn check(&self) -> Result<(), ConfigError> {
        let s = &self.settings;
        s.policy.validate()?;
        let probes = format!("must be 1 to {MAX_PROBES}, got {}", s.probes);
        ensure((1..=MAX_PROBES).contains(&s.probes), "probes", probes)?;
        if let Some(rate) = s.slow_call_rate {
            let field = "slow_call_rate";
            ensure_share(rate, field)?;
            ensure(
                s.slow_call_threshold.is_some(),
                field,
                "needs a slow_call_threshold saying which calls are slow",
            )?;
            ensure(
                matches!(s.policy, Policy::FailureRate { .. }),
                field,
                "needs a failure_rate policy, whose window it is measured over",
            )?;
        }
        ensure(
            !s.probe_timeout.is_zero(),
            "probe_timeout",
            "must be longer than zero",
        )?;
        ensure(
            s.max_recovery_timeout
                .is_none_or(|max| max >= s.recovery_timeout),
            "max_recovery_timeout",
            "must not be shorter than recovery_timeout",
        )?;
        let jitter = s.recovery_jitter;
        ensure_factor(s.recovery_multiplier, "recovery_multiplier")?;
        ensure(
            (0.0..1.0).contains(&jitter),
            "recovery_jitter",
            format!("must be in [0, 1), got {jitter}"),
        )?;
        ensure(s.max_breakers > 0, "max_breakers", "must be at least 1")?;
        ensure(!s.name.is_empty(), "name", "must not be empty")
    }

    /// A [`CircuitBreakerLayer`] classifying results with `classifier`.
    pub fn build<C>(self, classifier: C) -> Result<CircuitBreakerLayer<C>, ConfigError> {
        self.check()?;
        describe_metrics();
        let settings = Arc::new(self.settings);
        let (registry, breaker) = Registry::single(settings);
        Ok(CircuitBreakerLayer {
            breaker: BreakerRef(Arc::new(Share::with_thread_shares(breaker))),
            registry: Arc::new(registry),
            classifier,
            answer: Plain,
        })
    }

    /// A [`KeyedCircuitBreakerLayer`]: one breaker per key that `key_fn`
    /// computes from the request.
    pub fn build_keyed<C, F>(
        self,
        classifier: C,
        key_fn: F,
    ) -> Result<KeyedCircuitBreakerLayer<C, F>, ConfigError> {
        self.check()?;
        describe_metrics();
        let evictions = EvictionCounters::register(&self.settings.name);
        Ok(KeyedCircuitBreakerLayer {
            registry: Arc::new(Registry::new(Arc::new(self.settings), evictions)),
            classifier,
            key_fn,
        })
    }
}
