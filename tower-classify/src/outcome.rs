//! The result of classifying one call.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::ConfigError;
use crate::refusal::RefusalToken;

/// What one call's result means to a resilience layer.
///
/// Every layer of the family asks the same [`Classify`](crate::Classify) value
/// and reads the answer the same way: a retry layer retries
/// [transient](FailureKind::is_transient) failures, a circuit breaker counts them,
/// a dead-letter layer stores whatever is still a failure when the call ends.
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
    /// it on; `None` for every other failure. It proves, to whoever gave the
    /// request that token, that nothing behind the refusing layer saw it.
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

    /// The same failure, made by refusing a request that carried `token`
    /// (read from its extensions: `None` when it carried none) without
    /// passing it on. Only a layer that refuses before calling what it
    /// wraps may say so; see [`RefusalToken`].
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

/// The kinds of failure the whole family agrees on.
///
/// The first five are *transient*: a retry may fix them and a circuit breaker
/// counts them. The others are not: retrying a [`Rejected`](FailureKind::Rejected)
/// request cannot help and says nothing about the dependency's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum FailureKind {
    /// The server failed: HTTP 5xx, gRPC `UNKNOWN`/`INTERNAL`/`UNAVAILABLE`/
    /// `DATA_LOSS`.
    ServerError,
    /// The server asked the client to slow down: HTTP 429, gRPC
    /// `RESOURCE_EXHAUSTED`, or a response rule (`http::ResponseRule`, with the
    /// `http` feature).
    RateLimited,
    /// The call took too long: HTTP 408, `tower::timeout::error::Elapsed`,
    /// `io::ErrorKind::TimedOut`, gRPC `DEADLINE_EXCEEDED`.
    Timeout,
    /// No usable response, and the request may have reached the server: a
    /// connection reset or aborted, closed before the response (a stale
    /// keep-alive connection), other I/O errors. Not safe to resend a
    /// non-idempotent request after it: the server may have acted on it.
    Connection,
    /// The connection failed before the request was sent, so the server
    /// provably never saw it: refused, a failed connect or DNS lookup (an
    /// unreachable host when a connect error says so), a request the HTTP
    /// client cancelled before writing it. Safe to resend even when the
    /// request is not idempotent. The `connection` class of
    /// [`RetryOn`](crate::RetryOn) includes it.
    NotSent,
    /// The request itself is wrong: other 4xx, authentication, validation, parse
    /// errors. Never retried and never trips a breaker.
    Rejected,
    /// The input can never be processed; a dead-letter layer stores it at once.
    Poison,
    /// A local load-shedding layer refused the call before it reached the
    /// dependency (an open circuit, an exhausted retry budget). It is evidence
    /// about *this* process, not about the dependency: breakers do not count it,
    /// and a retry layer does not retry it except by waiting out its hint once.
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
    /// Do not retry, and this answer is the call's whatever its other
    /// attempts in flight would say: a status a gRPC hedging policy calls
    /// fatal (one not in its `nonFatalStatusCodes`, gRFC A6). A hedging
    /// layer returns it and cancels the other attempts, where after
    /// [`DoNotRetry`](Self::DoNotRetry) (the server's pushback) it only
    /// sends no more.
    Final,
}
