//! Error types

use std::error::Error as StdError;
use std::fmt;

type BoxError = Box<dyn StdError + Send + Sync>;

/// The error a [`ReplayBody`](crate::ReplayBody) yields.
///
/// [`kind`](Self::kind) says which of three things happened; for
/// [`ReplayErrorKind::Body`] the original body's own error is the
/// [`source`](StdError::source), unchanged, so error-chain inspection (a
/// downcast to `hyper::Error`, an I/O error's kind) sees it.
#[derive(Debug)]
pub struct ReplayError {
    kind: ReplayErrorKind,
    source: Option<BoxError>,
}

/// What a [`ReplayError`] means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplayErrorKind {
    /// The original body failed while this copy was reading it; its error is
    /// the source.
    Body,
    /// The original body failed while another copy was reading it.
    BodyFailedEarlier,
    /// This copy needed bytes that were no longer kept: the body grew past
    /// the recording limit after this copy was made.
    NotReplayable,
}

impl ReplayError {
    pub(crate) fn body(source: BoxError) -> Self {
        ReplayError {
            kind: ReplayErrorKind::Body,
            source: Some(source),
        }
    }

    /// What happened.
    pub fn kind(&self) -> ReplayErrorKind {
        self.kind
    }

    /// The original body's error, when this copy received it.
    pub fn into_source(self) -> Option<BoxError> {
        self.source
    }
}

/// An error of `kind` with no source: what a layer that makes copies of a
/// [`ReplayBody`](crate::ReplayBody) reports when it cannot make one.
impl From<ReplayErrorKind> for ReplayError {
    fn from(kind: ReplayErrorKind) -> Self {
        ReplayError { kind, source: None }
    }
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.kind {
            ReplayErrorKind::Body => "request body failed",
            ReplayErrorKind::BodyFailedEarlier => "request body failed in an earlier attempt",
            ReplayErrorKind::NotReplayable => {
                "request body cannot be replayed: it outgrew the recording limit"
            }
        })
    }
}

impl StdError for ReplayError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn StdError + 'static))
    }
}
