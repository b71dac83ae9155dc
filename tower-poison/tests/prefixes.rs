//! Short ids: every store finds the ids a prefix matches (a contiguous range
//! of its id order), counts them, and returns the first few.

#[cfg(feature = "redis")]
mod support;

use std::time::{Duration, SystemTime};

use tower_classify::FailureKind;
use tower_poison::store::{
    DeadLetterStore, ListQuery, MemoryStore, Page, PrefixMatches, PurgeFilter, StoreError,
};
use tower_poison::{Claim, ClaimToken, DeadLetterEntry, EntryId, EntryIdPrefix};

const IDS: [&str; 6] = [
    "00000000000000000000000000000000",
    "aaaa1000000000000000000000000001",
    "aaaa1000000000000000000000000002",
    "aaaa2000000000000000000000000000",
    "aaab0000000000000000000000000000",
    "ffffffffffffffffffffffffffffffff",
];

fn id(text: &str) -> EntryId {
    text.parse().unwrap()
}

fn prefix(text: &str) -> EntryIdPrefix {
    text.parse().unwrap()
}

async fn prefixes_match_a_range_of_ids(store: impl DeadLetterStore) {
    let now = SystemTime::now();
    for text in IDS {
        let mut entry = DeadLetterEntry::new("orders", FailureKind::ServerError, vec![], now);
        entry.id = id(text);
        store.put(entry).await.unwrap();
    }
    let found = |matches: PrefixMatches| {
        (
            matches.count,
            matches
                .ids
                .iter()
                .map(|id| id.to_string())
                .collect::<Vec<_>>(),
        )
    };
    let ambiguous = store.match_prefix(prefix("aaaa"), 2).await.unwrap();
    assert_eq!(ambiguous.unique(), None);
    assert_eq!(found(ambiguous), (3, vec![IDS[1].into(), IDS[2].into()]));
    assert_eq!(
        store.match_prefix(prefix("AAA"), 10).await.unwrap().count,
        4
    );
    assert_eq!(
        store
            .match_prefix(prefix("aaaa2"), 5)
            .await
            .unwrap()
            .unique(),
        Some(id(IDS[3]))
    );
    // The ends of the id space: the first id and the last.
    assert_eq!(
        store.match_prefix(prefix("0"), 5).await.unwrap().unique(),
        Some(id(IDS[0]))
    );
    assert_eq!(
        store.match_prefix(prefix("f"), 5).await.unwrap().unique(),
        Some(id(IDS[5]))
    );
    assert_eq!(
        store
            .match_prefix(prefix(IDS[2]), 5)
            .await
            .unwrap()
            .unique(),
        Some(id(IDS[2]))
    );
    assert_eq!(
        found(store.match_prefix(prefix("c"), 5).await.unwrap()),
        (0, vec![])
    );
    // A limit of zero still counts.
    let counted = store.match_prefix(prefix("a"), 0).await.unwrap();
    assert_eq!((counted.count, counted.ids.len()), (4, 0));
    // Removed entries no longer match.
    assert!(store.remove(id(IDS[1])).await.unwrap());
    assert!(store.remove(id(IDS[2])).await.unwrap());
    assert_eq!(
        store
            .match_prefix(prefix("aaaa"), 5)
            .await
            .unwrap()
            .unique(),
        Some(id(IDS[3]))
    );
}

#[tokio::test]
async fn memory_store_matches_prefixes() {
    prefixes_match_a_range_of_ids(MemoryStore::new(100)).await;
}

#[cfg(feature = "redb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_store_matches_prefixes() {
    let dir = tempfile::tempdir().unwrap();
    let store = tower_poison::store::RedbStore::builder()
        .open(dir.path().join("dlq.redb"))
        .unwrap();
    prefixes_match_a_range_of_ids(store).await;
}

#[cfg(feature = "redis")]
async fn redis_store_matches_prefixes(url: String) {
    let name = support::unique("prefixes");
    let _cleanup = support::Cleanup::queue(&url, &name);
    let store = tower_poison::store::RedisDeadLetterStore::builder()
        .connect(&url, name)
        .await
        .unwrap();
    prefixes_match_a_range_of_ids(store).await;
}

/// A store that implements only what the trait requires, so the provided
/// `match_prefix` (paging through `list`) is the one tested.
#[derive(Clone)]
struct ListOnly(MemoryStore);

impl DeadLetterStore for ListOnly {
    async fn put(&self, entry: DeadLetterEntry) -> Result<(), StoreError> {
        self.0.put(entry).await
    }
    async fn get(&self, id: EntryId) -> Result<Option<DeadLetterEntry>, StoreError> {
        self.0.get(id).await
    }
    async fn list(&self, query: ListQuery) -> Result<Page, StoreError> {
        self.0.list(query).await
    }
    async fn remove(&self, id: EntryId) -> Result<bool, StoreError> {
        self.0.remove(id).await
    }
    async fn purge(&self, filter: PurgeFilter) -> Result<u64, StoreError> {
        self.0.purge(filter).await
    }
    async fn claim(
        &self,
        id: EntryId,
        now: SystemTime,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.0.claim(id, now, lease).await
    }
    async fn release(&self, id: EntryId, token: ClaimToken) -> Result<(), StoreError> {
        self.0.release(id, token).await
    }
    async fn depth(&self) -> Result<u64, StoreError> {
        self.0.depth().await
    }
    async fn oldest_age(&self, now: SystemTime) -> Result<Option<Duration>, StoreError> {
        self.0.oldest_age(now).await
    }
}

#[tokio::test]
async fn the_provided_prefix_match_pages_through_list() {
    prefixes_match_a_range_of_ids(ListOnly(MemoryStore::new(100))).await;
}

#[cfg(feature = "redis")]
support::redis_suites! {
    redis_store_matches_prefixes,
}
