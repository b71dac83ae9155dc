use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_classify::{ConfigError, ErrorChainClassifier, Failure, RetryOn};
use tower_layer::Layer;

use crate::backoff::Backoff;
use crate::budget::{Budget, TpsBudget};
use crate::events::{Listeners, RetryEvent, RetryStopped, SuccessAfterRetries};
use crate::policy::{Policy, RetryIf};
use crate::replay::CloneRequest;
use crate::service::Retry;
use crate::telemetry::Telemetry;

/// The most retries a policy may ask for; larger values are refused when the
/// layer is built (more retries than this multiply load rather than ride out
/// a blip).
pub const MAX_RETRIES_LIMIT: u32 = 16;

/// Retries failed calls of the service it wraps; see the [crate docs](crate).
///
/// Built by [`RetryLayer::builder`], [`RetryLayer::http_builder`] (or one of
/// Google's [presets](crate::presets) built on it) or from a configuration.
/// All settings, the classifier and the retry budget
/// live in one place, behind an `Arc`: every clone of the layer, every
/// service it makes and every call's response future share them, so the
/// budget counts the traffic of all of them together.
#[derive(Debug)]
pub struct RetryLayer<C = ErrorChainClassifier, R = CloneRequest> {
    pub(crate) policy: Arc<Policy<C, R>>,
}

impl<C, R> Clone for RetryLayer<C, R> {
    fn clone(&self) -> Self {
        RetryLayer {
            policy: Arc::clone(&self.policy),
        }
    }
}

impl RetryLayer {
    /// A builder for any `Clone` request, classifying errors by their chain
    /// ([`ErrorChainClassifier`]: timeouts and I/O errors are transient; any
    /// response is a success).
    pub fn builder() -> RetryBuilder<ErrorChainClassifier, CloneRequest> {
        RetryBuilder::new(ErrorChainClassifier::new(), CloneRequest)
    }
}

#[cfg(feature = "http")]
impl RetryLayer<tower_classify::HttpClassifier, crate::replay::HttpReplay> {
    /// A builder for `http::Request`s with every HTTP default: the
    /// [`HttpClassifier`](tower_classify::HttpClassifier) (5xx, 429, 408,
    /// `Retry-After`, connection errors and timeouts),
    /// [`HttpReplay`](crate::replay::HttpReplay) (idempotent methods only),
    /// 3 retries with exponential backoff and full jitter, and a retry
    /// budget. Change any of them before [`build`](RetryBuilder::build).
    ///
    /// ```
    /// use tower_retry_budget::RetryLayer;
    ///
    /// let layer = RetryLayer::http_builder().max_retries(2).build().unwrap();
    /// ```
    pub fn http_builder() -> RetryBuilder<tower_classify::HttpClassifier, crate::replay::HttpReplay>
    {
        RetryBuilder::new(
            tower_classify::HttpClassifier::new(),
            crate::replay::HttpReplay::new(),
        )
    }
}

impl<C, R> RetryLayer<C, R> {
    /// The settings, as the layer's services and their calls share them.
    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Arc<Policy<C, R>> {
        &self.policy
    }

    /// The layer's name in metrics labels, events and spans.
    pub fn name(&self) -> &str {
        self.policy.telemetry.name()
    }
}

impl<S, C, R> Layer<S> for RetryLayer<C, R> {
    type Service = Retry<S, C, R>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry::from_policy(inner, Arc::clone(&self.policy))
    }
}

#[derive(Clone)]
enum Deadline {
    None,
    Fixed(Duration),
    /// `timeout × (max_retries + 1)`, resolved in `build`.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    FromAttemptTimeout(Duration),
}

#[derive(Clone)]
enum BudgetChoice {
    Default,
    None,
    Shared(Arc<dyn Budget + Send + Sync>),
}

/// Builds a [`RetryLayer`]. Every setting has a documented default;
/// [`build`](Self::build) checks them and names the field it refuses.
///
/// | setting | default |
/// |---|---|
/// | [`max_retries`](Self::max_retries) | 3 |
/// | [`backoff`](Self::backoff) | exponential, 1 s, ×2, at most 60 s, full jitter |
/// | [`deadline`](Self::deadline) | none |
/// | [`attempt_timeout`](Self::attempt_timeout) | none |
/// | [`max_wait`](Self::max_wait) | 1 h |
/// | [`min_attempt_time`](Self::min_attempt_time) | 0 |
/// | [`retry_on`](Self::retry_on) | all transient classes |
/// | [`budget`](Self::budget) | a [`TpsBudget::default`] (10 s, 10/s, 20 %) per `build` |
/// | [`name`](Self::name) | `"default"` |
pub struct RetryBuilder<C, R> {
    classifier: C,
    replay: R,
    settings: Settings,
}

/// A builder's settings but its classifier and replay, which keep them
/// when either is changed.
struct Settings {
    max_retries: u32,
    backoff: Backoff,
    deadline: Deadline,
    attempt_timeout: Option<Duration>,
    max_wait: Duration,
    min_attempt_time: Duration,
    restart_backoff_after_hint: bool,
    retry_if: RetryIf,
    budget: BudgetChoice,
    listeners: Listeners,
    name: Arc<str>,
}

impl<C: fmt::Debug, R: fmt::Debug> fmt::Debug for RetryBuilder<C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        f.debug_struct("RetryBuilder")
            .field("classifier", &self.classifier)
            .field("replay", &self.replay)
            .field("backoff", &s.backoff)
            .field("attempt_timeout", &s.attempt_timeout)
            .field("max_wait", &s.max_wait)
            .field("retry_if", &s.retry_if)
            .field("name", &s.name)
            .finish_non_exhaustive()
    }
}

impl<C, R> RetryBuilder<C, R> {
    /// A builder with `classifier` and `replay` and the defaults above.
    pub(crate) fn new(classifier: C, replay: R) -> Self {
        RetryBuilder {
            classifier,
            replay,
            settings: Settings {
                max_retries: 3,
                backoff: Backoff::default(),
                deadline: Deadline::None,
                attempt_timeout: None,
                max_wait: Duration::from_secs(3600),
                min_attempt_time: Duration::ZERO,
                restart_backoff_after_hint: false,
                retry_if: RetryIf::Classes(RetryOn::default()),
                budget: BudgetChoice::Default,
                listeners: Listeners::default(),
                name: Arc::from("default"),
            },
        }
    }

    /// The builder with one setting changed.
    fn set(mut self, change: impl FnOnce(&mut Settings)) -> Self {
        change(&mut self.settings);
        self
    }

    /// Uses `classifier` to decide what a result means.
    pub fn classifier<C2>(self, classifier: C2) -> RetryBuilder<C2, R> {
        self.map_parts(|_| classifier, |replay| replay)
    }

    /// How requests are copied for retries: `change` gets the replay
    /// already chosen and returns the one to use. Change it, keeping what a
    /// preset or a configuration set on it (a gRPC method's config makes
    /// POSTs retryable, for one): `.map_replay(|replay| replay.grpc_timeout(true))`;
    /// or replace it: `.map_replay(|_| CloneRequest)`.
    pub fn map_replay<R2>(self, change: impl FnOnce(R) -> R2) -> RetryBuilder<C, R2> {
        self.map_parts(|classifier| classifier, change)
    }

    /// The builder with its classifier and replay changed, every setting kept.
    fn map_parts<C2, R2>(
        self,
        classifier: impl FnOnce(C) -> C2,
        replay: impl FnOnce(R) -> R2,
    ) -> RetryBuilder<C2, R2> {
        RetryBuilder {
            classifier: classifier(self.classifier),
            replay: replay(self.replay),
            settings: self.settings,
        }
    }

    /// The layer's name in metrics labels (`retry="…"`), events and spans
    /// (default `"default"`); see [Observability](crate#observability).
    pub fn name(self, name: impl Into<Arc<str>>) -> Self {
        self.set(|s| s.name = name.into())
    }

    /// Retries after the first attempt (0–16; default 3): `n` attempts in
    /// all is `max_retries(n - 1)`.
    pub fn max_retries(self, retries: u32) -> Self {
        self.set(|s| s.max_retries = retries)
    }

    /// The backoff between attempts.
    pub fn backoff(self, backoff: Backoff) -> Self {
        self.set(|s| s.backoff = backoff)
    }

    /// One deadline for the whole loop, measured from the first attempt
    /// (see [when retrying stops](crate#when-retrying-stops)).
    ///
    /// A call with a deadline or an [attempt timeout](Self::attempt_timeout)
    /// arms its timer when it is made, as `tower::timeout` does: it must be
    /// called inside a tokio runtime with its time driver enabled.
    pub fn deadline(self, deadline: Duration) -> Self {
        self.set(|s| s.deadline = Deadline::Fixed(deadline))
    }

    /// A timeout for each attempt; an attempt that takes longer fails as a
    /// [`Timeout`](tower_classify::FailureKind::Timeout) (a
    /// `tower::timeout::error::Elapsed` error) and may be retried.
    pub fn attempt_timeout(self, timeout: Duration) -> Self {
        self.set(|s| s.attempt_timeout = Some(timeout))
    }

    /// One timeout for both: each attempt gets `timeout`, and the whole
    /// loop gets `timeout × (max_retries + 1)`, backoff included (a
    /// configuration's `deadline_from_attempt_timeout`).
    #[cfg(feature = "serde")]
    pub(crate) fn deadline_from_timeout(self, timeout: Duration) -> Self {
        self.set(|s| {
            s.attempt_timeout = Some(timeout);
            s.deadline = Deadline::FromAttemptTimeout(timeout);
        })
    }

    /// The longest server-requested wait the layer honours (default 1 h). A
    /// longer `Retry-After` ends the loop at once with
    /// [`WaitTooLong`](crate::error::WaitTooLong).
    pub fn max_wait(self, max_wait: Duration) -> Self {
        self.set(|s| s.max_wait = max_wait)
    }

    /// The least time an attempt must have before the loop's deadline for
    /// it to be started (default 0; must be below [`deadline`](Self::deadline));
    /// see [Deadlines](crate#deadlines). A retry whose service is not ready
    /// again this long before the deadline is not sent either: the call
    /// ends then with [`DeadlineExceeded`](crate::error::DeadlineExceeded).
    pub fn min_attempt_time(self, min: Duration) -> Self {
        self.set(|s| s.min_attempt_time = min)
    }

    /// After a retry that waited what the server asked (`Retry-After`, a
    /// gRPC pushback), the computed backoff starts again at its initial
    /// delay, as gRFC A6 says (default `false`: it goes on where it was).
    pub fn restart_backoff_after_hint(self, yes: bool) -> Self {
        self.set(|s| s.restart_backoff_after_hint = yes)
    }

    /// Retries only retryable failures of these classes (default: all four).
    pub fn retry_on(self, classes: RetryOn) -> Self {
        self.set(|s| s.retry_if = RetryIf::Classes(classes))
    }

    /// Retries the failures `predicate` accepts, instead of the class set.
    /// A hint that forbids a retry ([`Failure::forbids_retry`]) still wins.
    pub fn retry_if<F>(self, predicate: F) -> Self
    where
        F: Fn(&Failure) -> bool + Send + Sync + 'static,
    {
        self.set(|s| s.retry_if = RetryIf::Predicate(Arc::new(predicate)))
    }

    /// Limits retries with `budget`, shared by every clone of the layer;
    /// pass a clone of the same `Arc` to other layers to share it with them
    /// too.
    pub fn budget(self, budget: Arc<dyn Budget + Send + Sync>) -> Self {
        self.set(|s| s.budget = BudgetChoice::Shared(budget))
    }

    /// No budget: only `max_retries` limits retries. Prefer a budget; see
    /// [`budget`](crate::budget) for why.
    pub fn no_budget(self) -> Self {
        self.set(|s| s.budget = BudgetChoice::None)
    }

    /// Calls `callback` before every retry's sleep. Each call adds a
    /// callback; all of them are called, in the order they were added.
    pub fn on_retry<F>(self, callback: F) -> Self
    where
        F: Fn(&RetryEvent) + Send + Sync + 'static,
    {
        self.set(|s| s.listeners.retry.push(Arc::new(callback)))
    }

    /// Calls `callback` when a call ends in failure: the failure is handed
    /// back (or replaced by an error of this layer's), with why retrying
    /// stopped ([`RetryStopped`]). Each call adds a callback. A call whose
    /// service fails `poll_ready` before a retry ends with that error and
    /// no give-up: the service stopped, not the retrying.
    pub fn on_give_up<F>(self, callback: F) -> Self
    where
        F: Fn(&RetryStopped) + Send + Sync + 'static,
    {
        self.set(|s| s.listeners.give_up.push(Arc::new(callback)))
    }

    /// Calls `callback` when a call succeeds after at least one retry, with
    /// the attempts it took. Each call adds a callback.
    pub fn on_success_after_retries<F>(self, callback: F) -> Self
    where
        F: Fn(&SuccessAfterRetries) + Send + Sync + 'static,
    {
        self.set(|s| s.listeners.recovered.push(Arc::new(callback)))
    }

    /// The loop's deadline, once every setting is checked.
    fn resolve_deadline(&self) -> Result<Option<Duration>, ConfigError> {
        let s = &self.settings;
        let retries = s.max_retries;
        ensure(retries <= MAX_RETRIES_LIMIT, "max_retries", || {
            format!("{retries} is above the limit of {MAX_RETRIES_LIMIT}")
        })?;
        s.backoff.validate().map_err(|e| e.within("backoff"))?;
        ensure(
            s.attempt_timeout != Some(Duration::ZERO),
            "attempt_timeout",
            || "must be more than zero".into(),
        )?;
        let deadline = match s.deadline {
            Deadline::None => None,
            Deadline::Fixed(d) => Some(d),
            Deadline::FromAttemptTimeout(t) => Some(t.saturating_mul(s.max_retries + 1)),
        };
        ensure(deadline != Some(Duration::ZERO), "deadline", || {
            "must be more than zero".into()
        })?;
        if let Some(deadline) = deadline.filter(|deadline| *deadline <= s.min_attempt_time) {
            // No attempt, the first included, would ever be sent.
            return Err(ConfigError::new(
                "min_attempt_time",
                format!(
                    "{:?} must be below the deadline ({deadline:?}): no attempt could start",
                    s.min_attempt_time
                ),
            ));
        }
        Ok(deadline)
    }

    /// Checks the settings as [`build`](Self::build) does, without building.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.resolve_deadline().map(drop)
    }

    /// Checks the settings and builds the layer. Errors name the field.
    pub fn build(self) -> Result<RetryLayer<C, R>, ConfigError> {
        crate::telemetry::describe_retry_metrics();
        let deadline = self.resolve_deadline()?;
        let s = self.settings;
        let budget = match s.budget {
            BudgetChoice::Default => Some(Arc::new(TpsBudget::default()) as Arc<_>),
            BudgetChoice::None => None,
            BudgetChoice::Shared(budget) => Some(budget),
        };
        Ok(RetryLayer {
            policy: Arc::new(Policy {
                classifier: self.classifier,
                replay: self.replay,
                retry_if: s.retry_if,
                max_retries: s.max_retries,
                backoff: s.backoff,
                deadline,
                attempt_timeout: s.attempt_timeout,
                max_wait: s.max_wait,
                min_attempt_time: s.min_attempt_time,
                restart_backoff_after_hint: s.restart_backoff_after_hint,
                budget,
                listeners: s.listeners,
                telemetry: Telemetry::new(s.name),
            }),
        })
    }
}

/// `Ok` when `ok`, else the error refusing `field` for `reason()`.
pub(crate) fn ensure(
    ok: bool,
    field: &'static str,
    reason: impl FnOnce() -> String,
) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(field, reason()))
    }
}
