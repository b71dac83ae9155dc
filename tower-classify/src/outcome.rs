//! The result of classifying one call.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::ConfigError;
use crate::refusal::RefusalToken;

/// What one call's result means to a resilience layer: a retry layer
/// retries [transient](FailureKind::is_transient) failures, a breaker counts
/// them, a dead-letter layer stores what is still a failure at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The call did what was asked.
    Success,
    /// The call failed; the [`Failure`] says how.
    Failure(Failure),
    /// The result says nothing about the dependency's health, for example
    /// a call the client itself cancelled. It counts neither way.
    Ignored,
}

impl Outcome {
    /// A failure of `kind` with no delay hint.
    pub const fn failure(kind: FailureKind) -> Self {
        Outcome::Failure(Failure::new(kind))
    }

    /// The failure, if this outcome is one.
    pub const fn as_failure(&self) -> Option<&Failure> {
        match self {
            Outcome::Failure(failure) => Some(failure),
            _ => None,
        }
    }

    /// `true` when this is a failure that a retry may fix: a
    /// [transient](FailureKind::is_transient) kind whose hint does not forbid it.
    pub fn is_retryable(&self) -> bool {
        self.as_failure()
            .is_some_and(|failure| failure.kind.is_transient() && !failure.forbids_retry())
    }
}

/// A failed call: what kind of failure, what the server said about waiting,
/// and, for a refusal, whose request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Failure {
    /// What failed.
    pub kind: FailureKind,
    /// What the other side (or a load-shedding layer) said about trying again.
    pub hint: Option<RetryHint>,
    /// The [`RefusalToken`] of the request a layer refused without passing
    /// it on; `None` for every other failure.
    pub refusal: Option<RefusalToken>,
}

impl Failure {
    /// A failure of `kind` with no hint.
    pub const fn new(kind: FailureKind) -> Self {
        Failure {
            kind,
            hint: None,
            refusal: None,
        }
    }

    /// The same failure, made by refusing the request that carried `token`
    /// (from its extensions) without passing it on; see [`RefusalToken`].
    pub const fn with_refusal(mut self, token: Option<RefusalToken>) -> Self {
        self.refusal = token;
        self
    }

    /// The same failure carrying `hint`.
    pub const fn with_hint(mut self, hint: RetryHint) -> Self {
        self.hint = Some(hint);
        self
    }

    /// The same failure carrying `hint` when there is one, unchanged otherwise.
    pub(crate) const fn with_hint_opt(mut self, hint: Option<RetryHint>) -> Self {
        if hint.is_some() {
            self.hint = hint;
        }
        self
    }

    /// The wait the hint asks for, if it asks for one.
    pub const fn retry_after(&self) -> Option<Duration> {
        match self.hint {
            Some(RetryHint::After(wait)) => Some(wait),
            _ => None,
        }
    }

    /// `true` when the hint says not to retry: [`RetryHint::DoNotRetry`]
    /// or [`RetryHint::Final`].
    pub const fn forbids_retry(&self) -> bool {
        matches!(self.hint, Some(RetryHint::DoNotRetry | RetryHint::Final))
    }
}

impl From<FailureKind> for Failure {
    fn from(kind: FailureKind) -> Self {
        Failure::new(kind)
    }
}

/// The kinds of failure the whole family agrees on; the [crate
/// docs](crate#what-it-decides) say where each comes from. The first five
/// are [transient](Self::is_transient).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum FailureKind {
    /// The server failed (HTTP 5xx).
    ServerError,
    /// The server asked the client to slow down (HTTP 429).
    RateLimited,
    /// The call took too long.
    Timeout,
    /// No usable response, and the request may have reached the server: not
    /// safe to resend a non-idempotent request.
    Connection,
    /// The request was provably never sent: safe to resend even when not
    /// idempotent. The `connection` class of [`RetryOn`](crate::RetryOn)
    /// includes it.
    NotSent,
    /// The request itself is wrong: never retried, never trips a breaker.
    Rejected,
    /// The input can never be processed; a dead-letter layer stores it at once.
    Poison,
    /// A local layer refused the call before it reached the dependency (an
    /// open circuit, an exhausted budget): evidence about this process, so
    /// breakers do not count it and a retry only waits out its hint once.
    Shed,
}

impl FailureKind {
    /// Every kind, in declaration order.
    pub const ALL: [FailureKind; 8] = [
        FailureKind::ServerError,
        FailureKind::RateLimited,
        FailureKind::Timeout,
        FailureKind::Connection,
        FailureKind::NotSent,
        FailureKind::Rejected,
        FailureKind::Poison,
        FailureKind::Shed,
    ];

    /// `true` for the kinds a retry may fix and a breaker counts:
    /// server error, rate limited, timeout, connection and not sent.
    pub const fn is_transient(self) -> bool {
        matches!(
            self,
            FailureKind::ServerError
                | FailureKind::RateLimited
                | FailureKind::Timeout
                | FailureKind::Connection
                | FailureKind::NotSent
        )
    }

    /// A short, stable name for logs and metric labels (`server_error`, …).
    pub const fn as_str(self) -> &'static str {
        match self {
            FailureKind::ServerError => "server_error",
            FailureKind::RateLimited => "rate_limited",
            FailureKind::Timeout => "timeout",
            FailureKind::Connection => "connection",
            FailureKind::NotSent => "not_sent",
            FailureKind::Rejected => "rejected",
            FailureKind::Poison => "poison",
            FailureKind::Shed => "shed",
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind whose [`as_str`](FailureKind::as_str) name is the text.
///
/// ```
/// use tower_classify::FailureKind;
///
/// assert_eq!("rate_limited".parse(), Ok(FailureKind::RateLimited));
/// let err = "throttled".parse::<FailureKind>().unwrap_err();
/// assert_eq!(err.field(), "kind");
/// ```
impl FromStr for FailureKind {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let found = FailureKind::ALL.into_iter().find(|kind| kind.as_str() == s);
        found.ok_or_else(|| {
            let names = FailureKind::ALL.map(FailureKind::as_str).join(", ");
            ConfigError::new(
                "kind",
                format!("unknown failure kind {s:?}; expected one of {names}"),
            )
        })
    }
}

/// What the other side said about trying again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryHint {
    /// Wait this long before the next attempt (`Retry-After`,
    /// `grpc-retry-pushback-ms`, a `backoff_from` reader). It replaces the
    /// computed backoff for that attempt.
    After(Duration),
    /// Do not retry at all (a negative or unreadable gRPC pushback).
    DoNotRetry,
    /// Do not retry, and this answer is the call's: a status a gRPC hedging
    /// policy calls fatal (gRFC A6). A hedging layer returns it and cancels
    /// its other attempts (after [`DoNotRetry`](Self::DoNotRetry) it only
    /// sends no more).
    Final,
}
