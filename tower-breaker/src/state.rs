//! What a breaker is in and what it reports: its [`State`], its [`Mode`],
//! and the events its callbacks receive ([`StateChange`], [`CallEvent`]).

use std::fmt;
use std::time::Duration;

/// A breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum State {
    /// Calls pass; counted failures are measured against the [`Policy`](crate::Policy).
    Closed,
    /// Calls fail at once with [`CircuitOpen`](crate::CircuitOpen) until the open period ends.
    Open,
    /// The open period ended: the configured number of probe calls pass,
    /// everything else still fails fast. Probe successes close the breaker; a
    /// probe failure reopens it.
    HalfOpen,
    /// Opened by an operator: every call fails fast until a reset.
    ForcedOpen,
    /// Closed by an operator: every call passes and nothing trips it until a reset.
    ForcedClosed,
}

impl State {
    /// A short, stable name for logs, JSON and metric labels (`half_open`, …).
    pub const fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
            State::ForcedOpen => "forced_open",
            State::ForcedClosed => "forced_closed",
        }
    }

    /// The value of the `tower_breaker_state` gauge: 0 closed, 1 half-open,
    /// 2 open, a forced state reading as what it does (forced open 2, forced
    /// closed 0; see the [crate docs](crate#observability)).
    pub(crate) const fn gauge_value(self) -> f64 {
        match self {
            State::Closed | State::ForcedClosed => 0.0,
            State::HalfOpen => 1.0,
            State::Open | State::ForcedOpen => 2.0,
        }
    }

    /// `true` for the states an operator set: forced open and forced closed.
    pub const fn is_forced(self) -> bool {
        matches!(self, State::ForcedOpen | State::ForcedClosed)
    }

    /// `true` when this state refuses calls it has no probe slot for: open,
    /// half-open and forced open. Keyed eviction spares these.
    pub(crate) const fn is_open(self) -> bool {
        matches!(self, State::Open | State::HalfOpen | State::ForcedOpen)
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether the breaker rejects calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Mode {
    /// Open means calls fail fast (the default).
    #[default]
    Enforce,
    /// Everything is measured, every state change is logged and reported, the
    /// `tower_breaker_would_reject_total` counter counts what *would* have been
    /// rejected, but every call passes. Roll a breaker out in this mode first.
    MetricsOnly,
    /// The layer is a pass-through: nothing is recorded, nothing rejected.
    Disabled,
}

/// One state change, as given to the
/// [state-change callback](crate::Builder::on_state_change).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StateChange<'a> {
    /// The breaker's key (its [name](crate::Builder::name) when not keyed).
    pub key: &'a str,
    /// The state left.
    pub from: State,
    /// The state entered.
    pub to: State,
    /// For [`State::Open`]: how long it stays open.
    pub open_for: Option<Duration>,
}

pub(crate) type Callback = dyn Fn(&StateChange<'_>) + Send + Sync;

/// One call's result as the breaker saw it, as given to the
/// [per-call callbacks](crate::Builder::on_call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallEvent<'a> {
    /// The breaker's key (its [name](crate::Builder::name) when not keyed).
    pub key: &'a str,
    /// What happened.
    pub kind: CallKind,
    /// How long the call took, for a call that was made.
    pub elapsed: Option<Duration>,
}

/// What a [`CallEvent`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallKind {
    /// Succeeded in time.
    Success,
    /// Succeeded, slower than the
    /// [slow-call threshold](crate::Builder::slow_call_threshold).
    SlowCall,
    /// Failed with a kind the breaker counts (a transient one).
    Failure(tower_classify::FailureKind),
    /// Ended in a way that says nothing about the dependency (a rejected
    /// request, a cancelled call): not counted.
    Ignored,
    /// Refused by the open (or busy half-open) breaker without reaching the
    /// service; the remaining open time when it is known.
    Rejected(Option<Duration>),
}

pub(crate) type CallCallback = dyn Fn(&CallEvent<'_>) + Send + Sync;
