//! When a closed breaker opens: the trip policies and the windows they are
//! measured over, as configured. The windows' live counters are in
//! `window.rs`.

use std::time::Duration;

use tower_classify::ConfigError;

/// When a closed breaker opens. Only *counted* failures feed a policy: the
/// [transient](tower_classify::FailureKind::is_transient) ones (see the
/// [crate docs](crate)), plus successes slower than a configured
/// [slow-call threshold](crate::Builder::slow_call_threshold).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Policy {
    /// Open after `threshold` counted failures in a row; any success resets the
    /// count. The default (5 in a row).
    #[non_exhaustive]
    ConsecutiveFailures {
        /// Failures in a row that open the breaker.
        threshold: u32,
    },
    /// Open when, over a sliding window, at least `minimum_calls` calls were
    /// recorded and the share of counted failures among them reaches `rate`.
    #[non_exhaustive]
    FailureRate {
        /// The failure share that opens the breaker, in `(0, 1]`.
        rate: f64,
        /// No decision is taken on fewer calls than this: two failures out of
        /// three calls at startup are not an outage.
        minimum_calls: u32,
        /// Which calls the rate is measured over.
        window: Window,
    },
    /// Never open; instead, while closed, refuse each call at random with
    /// the probability of client-side adaptive throttling (Google SRE book,
    /// "Handling Overload"): `max(0, (requests − k × accepts) / (requests + 1))`
    /// over the sliding `window`. A call the backend answered is an accept,
    /// even when it answered with an error of the request's own
    /// ([`Rejected`](tower_classify::FailureKind::Rejected),
    /// [`Poison`](tower_classify::FailureKind::Poison)); transient failures
    /// and shed calls are not. Every call counts as a request, those this
    /// breaker refused included. A refusal is the same [`CircuitOpen`](crate::CircuitOpen)
    /// an open circuit gives (without a remaining time), with the same
    /// metrics, events and HTTP or gRPC answer; when to choose it is in the
    /// [crate docs](crate#partial-outages-adaptive-throttling).
    #[non_exhaustive]
    AdaptiveThrottle {
        /// How many requests per accept are allowed before any is refused:
        /// 2 in the SRE book. At least 1.
        k: f64,
        /// Which calls requests and accepts are counted over.
        window: Window,
    },
}

impl Default for Policy {
    fn default() -> Self {
        Policy::consecutive_failures(5)
    }
}

impl Policy {
    /// Open after `threshold` counted failures in a row.
    pub const fn consecutive_failures(threshold: u32) -> Self {
        Policy::ConsecutiveFailures { threshold }
    }

    /// Open when the failure share over `window` reaches `rate`, once at least
    /// `minimum_calls` calls were recorded in it.
    pub const fn failure_rate(rate: f64, minimum_calls: u32, window: Window) -> Self {
        Policy::FailureRate {
            rate,
            minimum_calls,
            window,
        }
    }

    /// Throttle instead of opening; see [`Policy::AdaptiveThrottle`].
    pub const fn adaptive_throttle(k: f64, window: Window) -> Self {
        Policy::AdaptiveThrottle { k, window }
    }

    /// The sliding window this policy keeps, if any.
    pub(crate) fn window(&self) -> Option<Window> {
        match *self {
            Policy::ConsecutiveFailures { .. } => None,
            Policy::FailureRate { window, .. } | Policy::AdaptiveThrottle { window, .. } => {
                Some(window)
            }
        }
    }

    /// Refuses values that could never trip, or always would.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        match *self {
            Policy::ConsecutiveFailures { threshold } => {
                ensure(threshold > 0, "failure_threshold", "must be at least 1")
            }
            Policy::FailureRate {
                rate,
                minimum_calls,
                window,
            } => {
                let field = "failure_rate.minimum_calls";
                ensure_share(rate, "failure_rate.rate")?;
                ensure(minimum_calls > 0, field, "must be at least 1")?;
                window.validate().map_err(|e| e.within("failure_rate"))?;
                match window {
                    Window::Count(size) => ensure(
                        minimum_calls <= size,
                        field,
                        format!("{minimum_calls} can never be reached in a window of {size} calls"),
                    ),
                    _ => Ok(()),
                }
            }
            Policy::AdaptiveThrottle { k, window } => {
                ensure_factor(k, "adaptive_throttle.k")?;
                window.validate().map_err(|e| e.within("adaptive_throttle"))
            }
        }
    }
}

/// `Ok` when `ok`, else a [`ConfigError`] refusing `field` for `reason`.
pub(crate) fn ensure(
    ok: bool,
    field: &'static str,
    reason: impl Into<String>,
) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(field, reason))
    }
}

/// [`ensure`] that `share` is in `(0, 1]`.
pub(crate) fn ensure_share(share: f64, field: &'static str) -> Result<(), ConfigError> {
    let reason = format!("must be in (0, 1], got {share}");
    ensure(share > 0.0 && share <= 1.0, field, reason)
}

/// [`ensure`] that `factor` is a finite number of at least 1.
pub(crate) fn ensure_factor(factor: f64, field: &'static str) -> Result<(), ConfigError> {
    let reason = format!("must be a finite number of at least 1, got {factor}");
    ensure(factor >= 1.0 && factor.is_finite(), field, reason)
}

/// The calls a [`Policy::FailureRate`] or [`Policy::AdaptiveThrottle`] is
/// measured over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Window {
    /// The last `n` calls (at most 65 536).
    Count(u32),
    /// The calls of the last `length`, kept in `buckets` equal buckets (at most
    /// 1 024); a whole bucket ages out at once, so the window is exact to one
    /// bucket's length.
    ///
    /// A success is filed by a coarse clock, not a clock read per call: a
    /// process-wide reading that one thread refreshes every millisecond, so
    /// near a bucket boundary a success may land in the bucket before, late
    /// by at most a millisecond plus the thread's scheduling delay. Failures
    /// are filed at the exact time, and a success whose coarse tally would
    /// open the breaker is judged again at the exact time, so an expired
    /// failure never opens it. Under paused tokio time (tests) every call
    /// reads tokio's clock.
    ///
    /// Every call writes its bucket (the failure rate needs every call), so
    /// that threads recording at once do not write one cache line, a window
    /// of at most 64 buckets keeps a copy of its buckets per CPU (up to 8,
    /// each on cache lines of its own) and adds them up when it needs a
    /// tally: 10 buckets take 1 KiB on 8 CPUs, against 80 bytes on one. A
    /// longer window keeps one copy.
    ///
    /// A bucket's copy counts at most 1 048 575 calls; past that, calls of
    /// the bucket's period on that copy are not counted (the bucket keeps
    /// the failure share of the calls it took) until the next bucket. Cut
    /// the window so that a bucket sees fewer calls per CPU: a 10-minute
    /// window in 10 buckets fills one at about 17 000 calls a second on
    /// one copy, and in 600 buckets never below a million a second.
    #[non_exhaustive]
    Time {
        /// How far back the window reaches.
        length: Duration,
        /// How many buckets `length` is cut into.
        buckets: u32,
    },
}

const MAX_COUNT_WINDOW: u32 = 65_536;
pub(crate) const MAX_BUCKETS: u32 = 1_024;

impl Window {
    /// The last `n` calls.
    pub const fn count(n: u32) -> Self {
        Window::Count(n)
    }

    /// The calls of the last `length`, in ten buckets.
    pub const fn time(length: Duration) -> Self {
        Window::Time {
            length,
            buckets: 10,
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        match *self {
            Window::Count(n) => ensure(
                (1..=MAX_COUNT_WINDOW).contains(&n),
                "window",
                format!("a count window holds 1 to {MAX_COUNT_WINDOW} calls, got {n}"),
            ),
            Window::Time { length, buckets } => {
                let reason = format!("must be 1 to {MAX_BUCKETS}, got {buckets}");
                ensure(
                    (1..=MAX_BUCKETS).contains(&buckets),
                    "window.buckets",
                    reason,
                )?;
                ensure(
                    length >= Duration::from_millis(u64::from(buckets)),
                    "window.length",
                    "must be at least one millisecond per bucket",
                )
            }
        }
    }
}

#[cfg(test)]
#[cfg(not(breaker_loom))]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_field() {
        let err = Policy::consecutive_failures(0).validate().unwrap_err();
        assert_eq!(err.field(), "failure_threshold");
        let err = Policy::failure_rate(1.5, 10, Window::count(10))
            .validate()
            .unwrap_err();
        assert_eq!(err.field(), "failure_rate.rate");
        let err = Policy::failure_rate(0.5, 20, Window::count(10))
            .validate()
            .unwrap_err();
        assert_eq!(err.field(), "failure_rate.minimum_calls");
        let err = Policy::failure_rate(0.5, 5, Window::count(0))
            .validate()
            .unwrap_err();
        assert_eq!(err.field(), "failure_rate.window");
    }
}
