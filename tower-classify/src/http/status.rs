//! The HTTP response classifier.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use http::{header, Response, StatusCode};

use super::rules::ResponseRule;
use crate::classify::Classify;
use crate::error::ConfigError;
use crate::error_chain::{AsDynError, ErrorChainClassifier};
use crate::hint::parse_retry_after;
use crate::outcome::{Failure, FailureKind, Outcome, RetryHint};

/// Classifies HTTP responses by status, and errors by their chain.
///
/// | response | outcome |
/// |---|---|
/// | 1xx, 2xx, 3xx | success |
/// | 408 Request Timeout | [`Timeout`](FailureKind::Timeout) |
/// | 429 Too Many Requests | [`RateLimited`](FailureKind::RateLimited) |
/// | any other 4xx | [`Rejected`](FailureKind::Rejected): never retried, never trips a breaker |
/// | 5xx (and any status ≥ 500) | [`ServerError`](FailureKind::ServerError) |
/// | an error (no response) | the [`ErrorChainClassifier`]: timeouts, connection failures, … |
///
/// A failing response's `Retry-After` is its [hint](RetryHint::After).
/// [Response rules](ResponseRule) are checked first;
/// [`retryable_statuses`](Self::retryable_statuses) narrows which failing
/// statuses are transient. A response carrying a [`Failure`] in its
/// extensions is that failure, whatever its status. Clones share rules
/// through one `Arc`.
///
/// ```
/// use http::{Response, StatusCode};
/// use tower_classify::{BoxError, Classify, FailureKind, HttpClassifier, Outcome};
///
/// let classifier = HttpClassifier::new();
/// let not_found = Response::builder().status(StatusCode::NOT_FOUND).body(()).unwrap();
/// let outcome = Classify::<_, BoxError>::classify(&classifier, Ok(&not_found));
/// assert_eq!(outcome, Outcome::failure(FailureKind::Rejected));
/// ```
#[derive(Debug, Clone, Default)]
pub struct HttpClassifier {
    /// `None` without rules or a retryable set: no reference to count.
    custom: Option<Arc<Custom>>,
    errors: ErrorChainClassifier,
}

/// What a classifier adds to the default status table.
#[derive(Debug, Clone, Default)]
struct Custom {
    /// Checked in order, before the status table.
    rules: Vec<ResponseRule>,
    retryable: Option<StatusSet>,
}

impl HttpClassifier {
    /// The classifier with the defaults in the table above.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes only `statuses` transient: any other status ≥ 400 is
    /// [`Rejected`](FailureKind::Rejected). Statuses in the set keep their kind
    /// (429 rate limited, 408 timeout, others server error), and a status below
    /// 400 in the set is a server error.
    pub fn retryable_statuses(self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        self.retryable_set(statuses.into_iter().collect())
    }

    pub(crate) fn retryable_set(mut self, statuses: StatusSet) -> Self {
        self.custom_mut().retryable = Some(statuses);
        self
    }

    /// Adds response rules, checked in order before the status table.
    pub fn with_rules(mut self, rules: impl IntoIterator<Item = ResponseRule>) -> Self {
        let mut rules = rules.into_iter().peekable();
        // No rules (a configuration without any) keep the default's
        // classifier free of an `Arc`.
        if rules.peek().is_some() {
            self.custom_mut().rules.extend(rules);
        }
        self
    }

    fn custom_mut(&mut self) -> &mut Custom {
        Arc::make_mut(self.custom.get_or_insert_with(Default::default))
    }

    fn rules(&self) -> &[ResponseRule] {
        self.custom.as_ref().map_or(&[], |custom| &custom.rules)
    }

    /// Uses `errors` for calls that produced no response.
    pub fn with_error_classifier(mut self, errors: ErrorChainClassifier) -> Self {
        self.errors = errors;
        self
    }

    /// Classifies a response's parts, measuring HTTP-date hints against `now`
    /// when the response has no `Date` header. `body` is the buffered body, if
    /// there is one, for body rules.
    pub(crate) fn classify_parts(
        &self,
        status: StatusCode,
        headers: &http::HeaderMap,
        body: Option<&[u8]>,
        now: SystemTime,
    ) -> Outcome {
        for rule in self.rules() {
            if let Some(failure) = rule.check(status, headers, body, now) {
                // A rule's own wait (`backoff_from`) comes before `Retry-After`.
                let hint = failure.hint.or_else(|| retry_after(headers, now));
                return Outcome::Failure(Failure { hint, ..failure });
            }
        }
        let Some(kind) = self.status_kind(status) else {
            return Outcome::Success;
        };
        let hint = retry_after(headers, now).filter(|_| kind != FailureKind::Rejected);
        Outcome::Failure(Failure::new(kind).with_hint_opt(hint))
    }

    fn status_kind(&self, status: StatusCode) -> Option<FailureKind> {
        let kind = match status.as_u16() {
            408 => Some(FailureKind::Timeout),
            429 => Some(FailureKind::RateLimited),
            500.. => Some(FailureKind::ServerError),
            400..=499 => Some(FailureKind::Rejected),
            _ => None,
        };
        match self.custom.as_ref().and_then(|c| c.retryable.as_ref()) {
            None => kind,
            // In the set, 408 and 429 keep their kind and any other status
            // is a server error; out of it, every failing one is rejected.
            Some(set) if set.contains(status) => match kind {
                Some(FailureKind::Timeout | FailureKind::RateLimited) => kind,
                _ => Some(FailureKind::ServerError),
            },
            Some(_) => kind.and(Some(FailureKind::Rejected)),
        }
    }
}

fn retry_after(headers: &http::HeaderMap, now: SystemTime) -> Option<RetryHint> {
    let value = headers.get(header::RETRY_AFTER)?;
    let date = headers.get(header::DATE).map(|d| d.as_bytes());
    parse_retry_after(value.as_bytes(), date, now).map(RetryHint::After)
}

impl<B, E> Classify<Response<B>, E> for HttpClassifier
where
    B: 'static,
    E: AsDynError,
{
    fn classify(&self, result: Result<&Response<B>, &E>) -> Outcome {
        match result {
            // A layer that answered on its own says what its answer stands
            // for (see the type's docs).
            Ok(response) => match response.extensions().get::<Failure>() {
                Some(failure) => Outcome::Failure(*failure),
                // The success path reads no clock: only a rule or a failure's
                // `Retry-After` date needs one.
                None if self.rules().is_empty()
                    && self.status_kind(response.status()).is_none() =>
                {
                    Outcome::Success
                }
                None => self.classify_parts(
                    response.status(),
                    response.headers(),
                    super::buffered_body(response.body()),
                    SystemTime::now(),
                ),
            },
            Err(err) => self.errors.classify_error(err.as_dyn_error()),
        }
    }
}

/// A set of HTTP status codes (100–999), stored as a bitmap.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct StatusSet {
    bits: [u64; 16],
}

impl StatusSet {
    /// The empty set.
    const EMPTY: StatusSet = StatusSet { bits: [0; 16] };

    /// The set of `codes`. A code outside 100–999 is refused naming `field`.
    pub(crate) fn from_codes(
        field: &'static str,
        codes: impl IntoIterator<Item = u16>,
    ) -> Result<Self, ConfigError> {
        let mut set = StatusSet::EMPTY;
        for code in codes {
            let status = StatusCode::from_u16(code).map_err(|_| {
                ConfigError::new(field, format!("{code} is not an HTTP status (100–999)"))
            })?;
            set = set.with(status);
        }
        Ok(set)
    }

    /// The set with `status` added.
    const fn with(mut self, status: StatusCode) -> Self {
        let code = status.as_u16() as usize;
        self.bits[code / 64] |= 1 << (code % 64);
        self
    }

    /// `true` when `status` is in the set.
    pub(crate) const fn contains(&self, status: StatusCode) -> bool {
        let code = status.as_u16();
        self.bits[code as usize / 64] & (1 << (code % 64)) != 0
    }

    /// `true` when the set is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.bits.iter().all(|word| *word == 0)
    }

    /// The codes in the set, ascending.
    fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        let has = |code| StatusCode::from_u16(code).is_ok_and(|status| self.contains(status));
        (100u16..1000).filter(move |&code| has(code))
    }
}

impl fmt::Debug for StatusSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl FromIterator<StatusCode> for StatusSet {
    fn from_iter<I: IntoIterator<Item = StatusCode>>(iter: I) -> Self {
        iter.into_iter().fold(StatusSet::EMPTY, StatusSet::with)
    }
}

impl crate::classify::ClassifyExt for HttpClassifier {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BoxError;

    fn classify(classifier: &HttpClassifier, status: u16) -> Outcome {
        let response = Response::builder().status(status).body(()).unwrap();
        Classify::<_, BoxError>::classify(classifier, Ok(&response))
    }

    /// Layers keep a classifier in every response future, and the
    /// breaker's service carries one per clone: a set of 128 bytes inline
    /// would be copied with each (it once made the breaker's future 352
    /// bytes over a 144-byte one).
    #[test]
    fn the_classifier_stays_a_few_words() {
        let size = std::mem::size_of::<HttpClassifier>();
        assert!(size <= 40, "{size} bytes");
        // Nor does an empty list of rules, what a configuration without
        // rules gives, make it share anything.
        assert!(HttpClassifier::new().with_rules([]).custom.is_none());
    }

    /// The settings are shared copy-on-write: a clone made before a later
    /// setting keeps what it had (`default` is the baseline a leak into it
    /// would break), and settings made in either order add up.
    #[test]
    fn clones_keep_their_own_settings() {
        let narrow = StatusSet::from_codes("retryable_statuses", [302, 503]).unwrap();
        let rule = ResponseRule::builder().statuses([400]).build().unwrap();
        let default = HttpClassifier::new();
        let narrowed = default.clone().retryable_set(narrow);
        let both = narrowed.clone().with_rules([rule.clone()]);
        let other_order = HttpClassifier::new()
            .with_rules([rule])
            .retryable_set(narrow);

        assert_eq!(
            classify(&default, 500),
            Outcome::failure(FailureKind::ServerError)
        );
        assert_eq!(
            classify(&default, 400),
            Outcome::failure(FailureKind::Rejected)
        );
        assert_eq!(
            classify(&narrowed, 500),
            Outcome::failure(FailureKind::Rejected)
        );
        assert_eq!(
            classify(&narrowed, 400),
            Outcome::failure(FailureKind::Rejected)
        );
        // A status below 400 in the set is a server error; not in it, a
        // success.
        assert_eq!(
            classify(&narrowed, 302),
            Outcome::failure(FailureKind::ServerError)
        );
        assert_eq!(classify(&narrowed, 301), Outcome::Success);
        assert_eq!(classify(&default, 302), Outcome::Success);
        for classifier in [&both, &other_order] {
            assert_eq!(
                classify(classifier, 500),
                Outcome::failure(FailureKind::Rejected)
            );
            assert_eq!(
                classify(classifier, 503),
                Outcome::failure(FailureKind::ServerError)
            );
            assert_eq!(
                classify(classifier, 400),
                Outcome::failure(FailureKind::RateLimited)
            );
        }
    }
}
