//! Error types

use std::error::Error;
use std::fmt;

/// A store could not do what was asked.
///
/// The [`kind`](Self::kind) tells a full store (back-pressure) from a broken
/// one and from a stored value that no longer decodes; the source, when
/// there is one, is the backend's own error. The [`Display`](fmt::Display)
/// is the message alone: a caller that logs the error walks its
/// [`source`](Error::source) chain for the rest.
///
/// What a call that met one comes to is its layer's to say: the dead-letter
/// layer fails the call (`StoreFull`, `StoreFailed`), the idempotency guard
/// answers `503` rather than run a request unguarded.
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
    /// The store is at its bound (entries or bytes) and kept nothing: it
    /// evicts nothing it promised to keep (a dead-letter entry, an
    /// idempotency claim whose request is still running) to make room.
    Full,
    /// The backend failed (I/O, a lock, a timeout, a closed connection or
    /// store).
    Backend,
    /// A stored value could not be decoded.
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
        StoreError::new(StoreErrorKind::Backend, message).with_source(source.into())
    }

    /// A stored value that could not be decoded, because of `source`.
    pub fn corrupt(
        message: impl Into<String>,
        source: impl Into<Box<dyn Error + Send + Sync>>,
    ) -> Self {
        StoreError::new(StoreErrorKind::Corrupt, message).with_source(source.into())
    }

    fn with_source(self, source: Box<dyn Error + Send + Sync>) -> Self {
        StoreError {
            source: Some(source),
            ..self
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
