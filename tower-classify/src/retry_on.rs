//! [`RetryOn`]: the set of transient failure classes a policy acts on.

use std::fmt;

use crate::error::ConfigError;
use crate::outcome::FailureKind;

/// A non-empty set of the transient failure classes: `http_5xx`,
/// `rate_limited`, `connection` (which includes [`FailureKind::NotSent`]),
/// `timeout`, and `not_sent`.
///
/// Two sets are equal when they hold the same kinds ([crate
/// docs](crate#classifiers)). An empty set is a configuration error, not
/// "retry nothing": a policy that retries nothing should say `max_retries: 0`.
///
/// ```
/// use tower_classify::{FailureKind, RetryOn};
///
/// let set = RetryOn::from_names(["rate_limited", "timeout"]).unwrap();
/// assert!(set.contains(FailureKind::Timeout));
/// assert!(!set.contains(FailureKind::ServerError));
///
/// let err = RetryOn::from_names(Vec::<&str>::new()).unwrap_err();
/// assert_eq!(err.field(), "retry_on");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RetryOn {
    /// A bit per class; `CONNECTION` always comes with `NOT_SENT` (see
    /// [`from_bits`](Self::from_bits)), so equal sets have equal bits.
    bits: u8,
}

/// The classes with their configuration names, in a fixed order.
const CLASSES: [(FailureKind, &str); 5] = [
    (FailureKind::ServerError, "http_5xx"),
    (FailureKind::RateLimited, "rate_limited"),
    (FailureKind::Connection, "connection"),
    (FailureKind::Timeout, "timeout"),
    (FailureKind::NotSent, "not_sent"),
];

const CONNECTION: u8 = 4;
const NOT_SENT: u8 = 16;

impl RetryOn {
    /// The set of `kinds`.
    ///
    /// Fails when `kinds` is empty or holds a kind that is not transient
    /// (retrying a rejected request cannot help).
    pub fn new(kinds: impl IntoIterator<Item = FailureKind>) -> Result<Self, ConfigError> {
        let mut bits = 0;
        for kind in kinds {
            let refusal = || refused(format_args!("`{kind}` is not a transient class"), "one of");
            bits |= Self::bit(kind).ok_or_else(refusal)?;
        }
        Self::from_bits(bits)
    }

    /// The set named by `names` (`http_5xx`, `rate_limited`, `connection`,
    /// `timeout`, `not_sent`; `server_error` is accepted for `http_5xx`).
    pub fn from_names<I>(names: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let kinds = names.into_iter().map(|name| {
            let name = name.as_ref();
            let refusal = || refused(format_args!("unknown class `{name}`"), "one of");
            let kind = CLASSES.iter().find(|(_, n)| *n == name).map(|(k, _)| *k);
            // `server_error` is accepted for `http_5xx`.
            let alias = (name == "server_error").then_some(FailureKind::ServerError);
            kind.or(alias).ok_or_else(refusal)
        });
        Self::new(kinds.collect::<Result<Vec<_>, _>>()?)
    }

    /// `true` when `kind` is in the set.
    pub const fn contains(&self, kind: FailureKind) -> bool {
        match Self::bit(kind) {
            Some(bit) => self.bits & bit != 0,
            None => false,
        }
    }

    /// The configuration names of the classes in the set (`http_5xx`, …),
    /// in a fixed order, as the set is written.
    pub(crate) fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        CLASSES
            .iter()
            .filter(move |(kind, _)| self.contains(*kind))
            .map(|(_, name)| *name)
    }

    fn from_bits(mut bits: u8) -> Result<Self, ConfigError> {
        if bits & CONNECTION != 0 {
            // A request never sent is one kind of connection failure.
            bits |= NOT_SENT;
        }
        if bits == 0 {
            return Err(refused("must name at least one class", "some of"));
        }
        Ok(RetryOn { bits })
    }

    const fn bit(kind: FailureKind) -> Option<u8> {
        match kind {
            FailureKind::ServerError => Some(1),
            FailureKind::RateLimited => Some(2),
            FailureKind::Connection => Some(CONNECTION),
            FailureKind::Timeout => Some(8),
            FailureKind::NotSent => Some(NOT_SENT),
            _ => None,
        }
    }
}

/// The configuration error `reason`, naming the classes expected.
fn refused(reason: impl fmt::Display, expected: &str) -> ConfigError {
    let names = CLASSES.map(|(_, name)| format!("`{name}`")).join(", ");
    ConfigError::new("retry_on", format!("{reason}; expected {expected} {names}"))
}

/// Every transient class.
impl Default for RetryOn {
    fn default() -> Self {
        RetryOn { bits: 0b1_1111 }
    }
}

impl fmt::Debug for RetryOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.names()).finish()
    }
}
