//! Classifying errors by walking their `source()` chain.

use std::error::Error;
use std::fmt;
use std::io;

use crate::classified::Classified;
use crate::classify::Classify;
use crate::outcome::{Failure, FailureKind, Outcome, RetryHint};

/// Views an error value as `&dyn Error`, so classifiers can walk its chain.
///
/// `BoxError` does not implement [`Error`], and coherence forbids one blanket
/// impl over both it and every `E: Error`; so this is implemented for boxed
/// errors and common concrete ones. For your own error type:
///
/// ```
/// use std::error::Error;
/// use tower_classify::AsDynError;
///
/// #[derive(Debug)]
/// struct MyError;
/// # impl std::fmt::Display for MyError {
/// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("mine") }
/// # }
/// impl Error for MyError {}
///
/// impl AsDynError for MyError {
///     fn as_dyn_error(&self) -> &(dyn Error + 'static) {
///         self
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be classified: it is not viewed as `&dyn Error`",
    note = "implement `tower_classify::AsDynError` for it (one line, see its docs), or box it (`.map_err(BoxError::from)`)"
)]
pub trait AsDynError {
    /// This error as a trait object.
    fn as_dyn_error(&self) -> &(dyn Error + 'static);
}

macro_rules! as_dyn_error {
    ($($(#[$attr:meta])* $ty:ty => |$e:ident| $body:expr;)*) => {$(
        $(#[$attr])*
        impl AsDynError for $ty {
            fn as_dyn_error(&self) -> &(dyn Error + 'static) {
                let $e = self;
                $body
            }
        }
    )*};
}

as_dyn_error! {
    Box<dyn Error + Send + Sync + 'static> => |e| &**e;
    Box<dyn Error + Send + 'static> => |e| &**e;
    Box<dyn Error + 'static> => |e| &**e;
    dyn Error + Send + Sync + 'static => |e| e;
    dyn Error + Send + 'static => |e| e;
    dyn Error + 'static => |e| e;
    io::Error => |e| e;
    tower::timeout::error::Elapsed => |e| e;
    tower::load_shed::error::Overloaded => |e| e;
    tokio::time::error::Elapsed => |e| e;
    Classified => |e| e;
    crate::error::ConfigError => |e| e;
    std::convert::Infallible => |e| match *e {};
    #[cfg(feature = "hyper")]
    hyper::Error => |e| e;
    #[cfg(feature = "hyper")]
    hyper_util::client::legacy::Error => |e| e;
}

/// Classifies errors by what they are, not by what they print.
///
/// It walks the error and its [`source`](Error::source) chain:
///
/// 1. The first [`Classified`] found decides (the family's own errors, such as
///    an open circuit, carry one).
/// 2. Otherwise the *deepest* recognised error decides, because a root cause is
///    the most precise answer (a client error wrapping a connection reset is a
///    connection failure):
///    - `tower::timeout::error::Elapsed`, `tokio::time::error::Elapsed` and
///      `io::ErrorKind::TimedOut` are [`Timeout`](FailureKind::Timeout);
///    - tower's `load_shed::error::Overloaded` is [`Shed`](FailureKind::Shed);
///    - `io::ErrorKind::InvalidData` and `InvalidInput` are
///      [`Rejected`](FailureKind::Rejected) (a malformed message will not
///      improve by being sent again);
///    - `ConnectionRefused` and `AddrNotAvailable`, which only a connect
///      gives, are [`NotSent`](FailureKind::NotSent): the request never
///      left;
///    - every other `io::Error` is [`Connection`](FailureKind::Connection),
///      `HostUnreachable`, `NetworkUnreachable` and `NotConnected` included:
///      an established connection reports them too (Linux gives
///      `EHOSTUNREACH` when retransmissions end after an ICMP unreachable),
///      by when the server may have the request. Under a connect error
///      (below) they are `NotSent`;
///    - with the `hyper` feature (on by default): `hyper::Error` timeouts are
///      `Timeout`, parse and user errors `Rejected`, a request hyper cancelled
///      before dispatching it `NotSent`, the rest (a connection closed before
///      the response, as a stale keep-alive connection is) `Connection`; a
///      `hyper_util` client's connect error (refused, DNS, connect timeout) is
///      `NotSent`, whatever the I/O error beneath it says about the
///      connection.
/// 3. An error nothing recognises is [`Rejected`](FailureKind::Rejected) by
///    default: unknown errors fail fast rather than being retried blindly.
///    Change that with [`unknown_as`](Self::unknown_as).
#[derive(Clone, Copy, Default)]
pub struct ErrorChainClassifier {
    // `None` until `unknown_as`: `GrpcStatusLayer` tells the default apart
    // from the same outcome chosen.
    unknown: Option<Unknown>,
}

/// An [`Outcome`] without a refusal (no setting can prove one), in three
/// words rather than four: layers keep a classifier in every response future.
#[derive(Clone, Copy)]
enum Unknown {
    Success,
    Ignored,
    Failure(FailureKind, Option<RetryHint>),
}

impl Unknown {
    const fn from_outcome(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Success => Unknown::Success,
            Outcome::Ignored => Unknown::Ignored,
            Outcome::Failure(failure) => Unknown::Failure(failure.kind, failure.hint),
        }
    }

    const fn outcome(self) -> Outcome {
        match self {
            Unknown::Success => Outcome::Success,
            Unknown::Ignored => Outcome::Ignored,
            Unknown::Failure(kind, hint) => {
                Outcome::Failure(Failure::new(kind).with_hint_opt(hint))
            }
        }
    }
}

impl fmt::Debug for ErrorChainClassifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ErrorChainClassifier")
            .field(
                "unknown",
                &self.unknown.map_or(DEFAULT_UNKNOWN, Unknown::outcome),
            )
            .finish()
    }
}

/// What an error nothing recognises means unless
/// [`unknown_as`](ErrorChainClassifier::unknown_as) says otherwise.
pub(crate) const DEFAULT_UNKNOWN: Outcome = Outcome::failure(FailureKind::Rejected);

impl ErrorChainClassifier {
    /// The classifier with the defaults above.
    pub const fn new() -> Self {
        ErrorChainClassifier { unknown: None }
    }

    /// What an error that nothing recognises means (default: rejected); a
    /// [`refusal`](Failure::refusal) in it is dropped. Even the default,
    /// chosen, is a choice to `GrpcStatusLayer`, which then answers its
    /// status rather than `UNKNOWN`.
    pub const fn unknown_as(mut self, outcome: Outcome) -> Self {
        self.unknown = Some(Unknown::from_outcome(outcome));
        self
    }

    /// Classifies one error and its chain.
    pub fn classify_error(&self, error: &(dyn Error + 'static)) -> Outcome {
        self.decided(error).unwrap_or(DEFAULT_UNKNOWN)
    }

    /// What the chain, else [`unknown_as`](Self::unknown_as), says `error`
    /// means; `None` for an error nothing recognises under the default.
    pub(crate) fn decided(&self, error: &(dyn Error + 'static)) -> Option<Outcome> {
        let mut deepest = None;
        // A wrapper that knows the request was never sent (a connect error)
        // knows more than the I/O error beneath it about *that*.
        let mut not_sent = false;
        let mut current = Some(error);
        while let Some(err) = current {
            if let Some(classified) = err.downcast_ref::<Classified>() {
                return Some(Outcome::Failure(classified.failure()));
            }
            if let Some(kind) = recognise(err) {
                not_sent |= kind == FailureKind::NotSent;
                deepest = Some(kind);
            }
            current = next_in_chain(err);
        }
        let deepest = match deepest {
            Some(FailureKind::Connection | FailureKind::Timeout) if not_sent => {
                Some(FailureKind::NotSent)
            }
            other => other,
        };
        let chosen = || self.unknown.map(Unknown::outcome);
        deepest.map(Outcome::failure).or_else(chosen)
    }
}

/// The error after `err` in its chain: `io::Error::source` skips the error
/// it wraps, so that one is taken explicitly.
pub(crate) fn next_in_chain<'a>(
    err: &'a (dyn Error + 'static),
) -> Option<&'a (dyn Error + 'static)> {
    match err.downcast_ref::<io::Error>().and_then(io::Error::get_ref) {
        Some(inner) => Some(inner as &(dyn Error + 'static)),
        None => err.source(),
    }
}

fn recognise(err: &(dyn Error + 'static)) -> Option<FailureKind> {
    if err.is::<tower::timeout::error::Elapsed>() || err.is::<tokio::time::error::Elapsed>() {
        return Some(FailureKind::Timeout);
    }
    if err.is::<tower::load_shed::error::Overloaded>() {
        return Some(FailureKind::Shed);
    }
    if let Some(io) = err.downcast_ref::<io::Error>() {
        return Some(io_kind(io.kind()));
    }
    #[cfg(feature = "hyper")]
    if let Some(hyper) = err.downcast_ref::<hyper::Error>() {
        return Some(hyper_kind(hyper));
    }
    #[cfg(feature = "hyper")]
    if let Some(client) = err.downcast_ref::<hyper_util::client::legacy::Error>() {
        // Anything else it wraps (a hyper error) is classified below it.
        return client.is_connect().then_some(FailureKind::NotSent);
    }
    None
}

fn io_kind(kind: io::ErrorKind) -> FailureKind {
    match kind {
        io::ErrorKind::TimedOut => FailureKind::Timeout,
        io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput => FailureKind::Rejected,
        // Only a connect gives these; unreachable errors end established
        // connections too, so they are `NotSent` only under a connect error.
        io::ErrorKind::ConnectionRefused | io::ErrorKind::AddrNotAvailable => FailureKind::NotSent,
        _ => FailureKind::Connection,
    }
}

#[cfg(feature = "hyper")]
fn hyper_kind(err: &hyper::Error) -> FailureKind {
    if err.is_timeout() {
        FailureKind::Timeout
    } else if err.is_canceled() {
        // Dropped before it was dispatched to a connection.
        FailureKind::NotSent
    } else if err.is_parse() || err.is_user() || err.is_parse_status() {
        FailureKind::Rejected
    } else {
        FailureKind::Connection
    }
}

impl<Res, E> Classify<Res, E> for ErrorChainClassifier
where
    E: AsDynError,
{
    /// Any response is a success; errors are classified by their chain.
    fn classify(&self, result: Result<&Res, &E>) -> Outcome {
        match result {
            Ok(_) => Outcome::Success,
            Err(err) => self.classify_error(err.as_dyn_error()),
        }
    }
}

impl From<Classified> for Failure {
    fn from(classified: Classified) -> Self {
        classified.failure()
    }
}

impl crate::classify::ClassifyExt for ErrorChainClassifier {}
