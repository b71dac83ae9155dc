//! Error types

use std::error::Error;
use std::fmt;

/// An idempotency store could not do what was asked.
///
/// The guard never turns it into an error of its own: a store that cannot
/// claim a key makes the guard answer `503` with `Retry-After` (the request
/// is not run unguarded), and one that cannot keep an outcome is logged. The
/// [`kind`](Self::kind) tells a full store (back-pressure) from a broken one;
/// the source, when there is one, is the backend's own error.
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    message: String,
    source: Option<Box<dyn Error + Send + Sync>>,
}

/// What kind of store failure a [`StoreError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store is at its bound and holds nothing it may evict: every
    /// record left is a claim whose request is still running.
    Full,
    /// The backend failed (I/O, a timeout, a closed connection).
    Backend,
    /// A stored record could not be decoded.
    Corrupt,
}

impl StoreError {
    /// An error of `kind` described by `message`.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// A backend failure caused by `source`.
    pub fn backend(
        message: impl Into<String>,
        source: impl Into<Box<dyn Error + Send + Sync>>,
    ) -> Self {
        StoreError {
            kind: StoreErrorKind::Backend,
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A stored record that could not be decoded, because of `source`.
    pub fn corrupt(
        message: impl Into<String>,
        source: impl Into<Box<dyn Error + Send + Sync>>,
    ) -> Self {
        StoreError {
            kind: StoreErrorKind::Corrupt,
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

/// `error` and its sources, joined with `": "`, for one log line.
pub(crate) fn chain(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
