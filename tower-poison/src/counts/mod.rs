//! Where poison detection counts a message's deliveries: by the queue when
//! the request carries its count ([`DeliveryCount`], [`DeliveryAttempt`]:
//! authoritative, no store asked), else in a [`FailureCountStore`]:
//! [`MemoryFailureCounts`] (the default), [`RedbFailureCounts`] (feature
//! `redb`, survives a restart) or [`RedisFailureCounts`] (feature `redis`,
//! shared by a fleet).
//!
//! [`RedbFailureCounts`]: https://docs.rs/tower-poison/latest/tower_poison/counts/struct.RedbFailureCounts.html
//! [`RedisFailureCounts`]: https://docs.rs/tower-poison/latest/tower_poison/counts/struct.RedisFailureCounts.html
//!
//! # Why a delivery is counted before it runs
//!
//! A store counts a delivery *when it begins*, before the inner service
//! sees the message, and forgets the message when a delivery succeeds. A
//! message that crashes its worker (an abort, an OOM kill, a cancelled
//! future) therefore still counts: the next delivery, on this consumer or
//! another sharing the store, sees the earlier count. Were a delivery
//! counted only when it *returned* a failure, a message that kills every
//! worker it reaches would be redelivered forever. Stores never see a
//! publisher's id, only its bounded [`MessageKey`].

use std::future::Future;
use std::pin::Pin;
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use crate::store::StoreError;

pub(crate) mod delivery;
mod memory;
#[cfg(feature = "redb")]
mod redb;
#[cfg(feature = "redis")]
mod redis;

pub use self::delivery::{DeliveryAttempt, DeliveryCount};
pub use self::memory::MemoryFailureCounts;
#[cfg(feature = "redb")]
pub use self::redb::{RedbFailureCounts, RedbFailureCountsBuilder};
#[cfg(feature = "redis")]
pub use self::redis::{RedisFailureCounts, RedisFailureCountsBuilder};

/// Counts deliveries per message, for poison detection.
///
/// Implementations are cheap to clone, share their counts between clones,
/// and bound what they keep. A store that fails ([`StoreError`]) makes the
/// layer fail the delivery with
/// [`CountStoreFailed`](crate::error::CountStoreFailed) *without* calling
/// the inner service, so a message is never processed uncounted; one that
/// cannot [`forget`](Self::forget) after a success only logs a warning.
pub trait FailureCountStore: Clone + Send + Sync + 'static {
    /// Counts one delivery of `key` that is about to be processed; the tally
    /// includes it. `now` is the delivery's time, kept as the first
    /// delivery's time when the key is new.
    fn count_delivery(
        &self,
        key: &MessageKey,
        now: SystemTime,
    ) -> impl Future<Output = Result<DeliveryTally, StoreError>> + Send;

    /// Forgets `key`: a delivery of it succeeded, or it was dead-lettered.
    fn forget(&self, key: &MessageKey) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// What a [`FailureCountStore`] knows of a message after counting a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeliveryTally {
    /// Deliveries counted since the message was last forgotten, this one
    /// included (so at least 1).
    pub deliveries: u32,
    /// When the first of them was counted.
    pub first_delivered_at: SystemTime,
}

impl DeliveryTally {
    /// `deliveries` counted (at least 1), the first at `first_delivered_at`.
    pub const fn new(deliveries: u32, first_delivered_at: SystemTime) -> Self {
        DeliveryTally {
            deliveries,
            first_delivered_at,
        }
    }
}

/// A message id in a bounded form that is safe to use as a store key.
///
/// An id of at most 128 bytes of printable
/// ASCII (`!` to `~`, no spaces or control bytes) is kept readable as
/// `id:<id>`; any other id becomes `sha256:<64 hex digits>` of its bytes. The
/// two prefixes keep the forms apart, so no verbatim id can collide with a
/// digest, and SHA-256 keeps a publisher from crafting two long ids that
/// share a count. A key is at most 131 bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageKey(String);

impl MessageKey {
    /// The longest id kept verbatim, in bytes.
    const MAX_VERBATIM: usize = 128;

    /// The longest key, in bytes (`id:` and 128 bytes).
    #[cfg(test)]
    const MAX_LEN: usize = 3 + Self::MAX_VERBATIM;

    /// The key of message id `id`.
    pub fn new(id: &str) -> Self {
        let verbatim = id.len() <= Self::MAX_VERBATIM
            && !id.is_empty()
            && id.bytes().all(|b| b.is_ascii_graphic());
        if verbatim {
            return MessageKey(format!("id:{id}"));
        }
        MessageKey(format!("sha256:{}", sha256_hex(id.as_bytes())))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The SHA-256 of `bytes` in lowercase hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A [`FailureCountStore`] behind a pointer, so the layer's type does not
/// name the store.
pub(crate) trait DynFailureCountStore: Send + Sync {
    fn count_delivery(
        &self,
        key: MessageKey,
        now: SystemTime,
    ) -> BoxFuture<Result<DeliveryTally, StoreError>>;

    fn forget(&self, key: MessageKey) -> BoxFuture<Result<(), StoreError>>;

    /// The store's type, for `Debug`.
    fn name(&self) -> &'static str;
}

impl<T: FailureCountStore> DynFailureCountStore for T {
    fn count_delivery(
        &self,
        key: MessageKey,
        now: SystemTime,
    ) -> BoxFuture<Result<DeliveryTally, StoreError>> {
        let store = self.clone();
        Box::pin(async move { FailureCountStore::count_delivery(&store, &key, now).await })
    }

    fn forget(&self, key: MessageKey) -> BoxFuture<Result<(), StoreError>> {
        let store = self.clone();
        Box::pin(async move { FailureCountStore::forget(&store, &key).await })
    }

    fn name(&self) -> &'static str {
        std::any::type_name::<T>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_printable_ids_stay_readable_and_others_are_hashed() {
        assert_eq!(MessageKey::new("msg-42").as_str(), "id:msg-42");
        let long = "x".repeat(MessageKey::MAX_VERBATIM + 1);
        let hashed = MessageKey::new(&long);
        assert!(hashed.as_str().starts_with("sha256:"), "{hashed:?}");
        assert_eq!(hashed.as_str().len(), 7 + 64);
        // Spaces, control bytes, non-ASCII and the empty id are hashed too.
        for id in ["a b", "a\r\nb", "é", ""] {
            assert!(
                MessageKey::new(id).as_str().starts_with("sha256:"),
                "{id:?}"
            );
        }
        // The verbatim form has its own prefix.
        assert_ne!(MessageKey::new(hashed.as_str()).as_str(), hashed.as_str());
    }

    #[test]
    fn the_digest_is_sha256() {
        // The well-known SHA-256 of the empty input.
        assert_eq!(
            MessageKey::new("").as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    proptest::proptest! {
        /// Every key is bounded and distinct ids give distinct keys (a
        /// verbatim id cannot look like a digest).
        #[test]
        fn keys_are_bounded_and_injective(
            a in ".{0,300}",
            other in ".{0,300}",
            same in proptest::bool::ANY,
        ) {
            let b = if same { a.clone() } else { other };
            let (ka, kb) = (MessageKey::new(&a), MessageKey::new(&b));
            proptest::prop_assert!(ka.as_str().len() <= MessageKey::MAX_LEN);
            proptest::prop_assert_eq!(a == b, ka == kb);
        }
    }

    #[test]
    fn epoch_millis_saturate() {
        use crate::store::{millis_since_epoch, time_from_millis};
        assert_eq!(millis_since_epoch(SystemTime::UNIX_EPOCH), 0);
        let early = SystemTime::UNIX_EPOCH - std::time::Duration::from_secs(1);
        assert_eq!(millis_since_epoch(early), 0);
        assert_eq!(
            millis_since_epoch(time_from_millis(1_700_000_000_123)),
            1_700_000_000_123
        );
        // Far-future millis never panic.
        let _ = time_from_millis(u64::MAX);
    }
}
