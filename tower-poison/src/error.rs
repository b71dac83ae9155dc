//! Error types

use std::error::Error;
use std::fmt;

use tower_classify::{BoxError, Classified, Failure, FailureKind};

use crate::action::Action;
use crate::entry::EntryId;
use crate::store::{StoreError, StoreErrorKind};

/// The error a call fails with when its entry could not be kept: [`StoreFull`]
/// when the store is at its limits, [`StoreFailed`] otherwise. It keeps the
/// call's classification `failure` when that was a refusal that never
/// reached the dependency ([`Shed`](FailureKind::Shed)): what the entry
/// still stands for.
pub(crate) fn not_kept(
    entry_id: EntryId,
    store: StoreError,
    original: Option<BoxError>,
    failure: Option<Failure>,
) -> BoxError {
    let refusal = failure.filter(|failure| failure.kind == FailureKind::Shed);
    let refusal = refusal.map(|failure| Classified::new(failure, "refused call not kept"));
    match store.kind() {
        StoreErrorKind::Full => StoreFull::new(entry_id, store, original, refusal).into(),
        _ => StoreFailed::new(entry_id, store, original, refusal).into(),
    }
}

/// The two errors of an entry the store did not keep: the same fields and
/// accessors, told apart by type so a caller can `downcast_ref` the one it
/// handles.
macro_rules! not_kept_error {
    ($(#[$doc:meta])* $name:ident, $store_doc:literal, $display:literal) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name {
            entry_id: EntryId,
            store: StoreError,
            original: Option<BoxError>,
            refusal: Option<Classified>,
        }

        impl $name {
            pub(crate) fn new(
                entry_id: EntryId,
                store: StoreError,
                original: Option<BoxError>,
                refusal: Option<Classified>,
            ) -> Self {
                $name {
                    entry_id,
                    store,
                    original,
                    refusal,
                }
            }

            /// The id of the entry that was not stored.
            pub fn entry_id(&self) -> EntryId {
                self.entry_id
            }

            #[doc = $store_doc]
            pub fn store_error(&self) -> &StoreError {
                &self.store
            }

            /// The call's own error, if the call failed with one (a response
            /// classified as a failure has none).
            pub fn original(&self) -> Option<&(dyn Error + Send + Sync + 'static)> {
                self.original.as_deref()
            }

            /// Consumes `self`, returning the call's own error.
            pub fn into_original(self) -> Option<BoxError> {
                self.original
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, $display, self.entry_id)?;
                if let Some(original) = &self.original {
                    write!(f, " for a call that failed with: {original}")?;
                }
                Ok(())
            }
        }

        impl Error for $name {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                match &self.refusal {
                    Some(refusal) => Some(refusal),
                    None => Some(&self.store),
                }
            }
        }
    };
}

not_kept_error! {
    /// The dead-letter store could not keep an entry, so the call fails with this
    /// error instead of losing the entry silently.
    ///
    /// [`source`](Error::source) is the [`StoreError`] (for a refusal, see
    /// [`StoreFull`]); the call's own error, when
    /// there was one, is kept in [`original`](Self::original). A queue consumer
    /// should *not* acknowledge a message whose call ended in this error: the
    /// message was neither processed nor dead-lettered.
    StoreFailed,
    "The store's error.",
    "dead-letter store failed to keep entry {}"
}

not_kept_error! {
    /// The dead-letter store is at its limits (entries or bytes), so it refused
    /// a call's entry and the call fails with this error.
    ///
    /// Nothing was evicted to make room, and the call is *not*
    /// dead-lettered: as for [`StoreFailed`], a queue consumer should not
    /// acknowledge its message (let the queue redeliver it once an operator
    /// has replayed or purged the store), and the call's own error is kept
    /// in [`original`](Self::original).
    ///
    /// [`source`](Error::source) is the [`StoreError`] (of kind
    /// [`Full`](StoreErrorKind::Full)), except for a refusal that never
    /// reached the dependency (an open circuit's, stored under
    /// [`store_refusals`](crate::DeadLetterLayer::store_refusals)): then a
    /// [`Classified`] with the refusal's classification (kind
    /// [`Shed`](FailureKind::Shed) and its wait), so outer layers answer it
    /// as the refusal it was (`503` with `Retry-After`), not as a rejected
    /// request; the [`StoreError`] is then still
    /// [`store_error`](Self::store_error).
    StoreFull,
    "The store's error (what limit was reached).",
    "dead-letter store is full, entry {} not kept"
}

/// A message that had already failed the poison limit was diverted: the inner
/// service's response future was never polled (see
/// [`PoisonPolicy`](crate::PoisonPolicy) for services that act inside `call`).
///
/// What happened to it is [`action`](Self::action): with
/// [`Action::Dlq`] it is in the store ([`entry_id`](Self::entry_id)), with
/// [`Action::Drop`] it was discarded; either way a queue consumer should
/// acknowledge it so the queue stops redelivering it. With [`Action::Fail`]
/// nothing was kept, and the consumer decides.
///
/// Its [`source`](Error::source) is a [`Classified`] of kind
/// [`Poison`](FailureKind::Poison), so classifiers in outer layers see a
/// poison outcome and do not retry it.
#[derive(Debug)]
pub struct PoisonMessage {
    message_id: String,
    attempts: u32,
    action: Action,
    entry_id: Option<EntryId>,
    classified: Classified,
}

impl PoisonMessage {
    pub(crate) fn new(
        message_id: String,
        attempts: u32,
        action: Action,
        entry_id: Option<EntryId>,
    ) -> Self {
        PoisonMessage {
            message_id,
            attempts,
            action,
            entry_id,
            classified: Classified::new(FailureKind::Poison, "poison message"),
        }
    }

    /// The message's id.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// How many deliveries of it failed.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// What was done with it.
    pub fn action(&self) -> Action {
        self.action
    }

    /// The dead-letter entry, when it was stored.
    pub fn entry_id(&self) -> Option<EntryId> {
        self.entry_id
    }
}

impl fmt::Display for PoisonMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "poison message {:?} diverted after {} failed deliveries",
            self.message_id, self.attempts
        )?;
        match self.entry_id {
            Some(id) => write!(f, " (dead-letter entry {id})"),
            None => write!(f, " ({})", self.action),
        }
    }
}

impl Error for PoisonMessage {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.classified)
    }
}

/// Poison detection could not count a delivery (its
/// [`FailureCountStore`](crate::counts::FailureCountStore) failed), so the
/// inner service's response future was never polled (see
/// [`PoisonPolicy`](crate::PoisonPolicy) for services that act inside `call`).
///
/// A queue consumer should *not* acknowledge the message: it was neither
/// processed nor dead-lettered, and the queue's redelivery tries again once
/// the store is back. Its [`source`](Error::source) is the [`StoreError`].
#[derive(Debug)]
pub struct CountStoreFailed {
    store: StoreError,
}

impl CountStoreFailed {
    pub(crate) fn new(store: StoreError) -> Self {
        CountStoreFailed { store }
    }

    /// The store's error.
    pub fn store_error(&self) -> &StoreError {
        &self.store
    }
}

impl fmt::Display for CountStoreFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("poison count store failed; the delivery was not processed")
    }
}

impl Error for CountStoreFailed {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.store)
    }
}
