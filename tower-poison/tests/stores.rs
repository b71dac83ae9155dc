//! The stores: durability across reopen, paging, filters, purge by age, and
//! a crash (SIGKILL) in the middle of writing.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tower_classify::FailureKind;
use tower_poison::store::{
    DeadLetterStore, ListQuery, MemoryStore, PurgeFilter, RedbStore, StoreErrorKind,
};
use tower_poison::{DeadLetterEntry, EntryId, StoredHeader};

fn entry(label: &str, kind: FailureKind, first_failed_at: SystemTime) -> DeadLetterEntry {
    DeadLetterEntry {
        id: EntryId::generate(SystemTime::now()),
        label: label.into(),
        message_id: Some("m-1".into()),
        method: Some("POST".into()),
        uri: Some("http://example.internal/orders".into()),
        headers: vec![StoredHeader {
            name: "content-type".into(),
            value: "application/json".into(),
        }],
        body: Bytes::from_static(b"{\"sku\":42}"),
        body_truncated: false,
        body_len: None,
        error: vec!["upstream failed".into(), "connection reset".into()],
        kind,
        attempts: 3,
        // Stored times have millisecond precision; start from whole
        // milliseconds so entries compare equal after a round trip.
        first_failed_at: whole_millis(first_failed_at),
        last_failed_at: whole_millis(SystemTime::now()),
    }
}

fn whole_millis(time: SystemTime) -> SystemTime {
    let since = time.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    SystemTime::UNIX_EPOCH + Duration::from_millis(since.as_millis() as u64)
}

const DAY: Duration = Duration::from_secs(86_400);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_store_keeps_entries_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dlq.redb");
    let now = SystemTime::now();
    let written: Vec<DeadLetterEntry> = (0..5)
        .map(|i| entry("orders", FailureKind::ServerError, now - DAY * i))
        .collect();
    {
        let store = RedbStore::open(&path).unwrap();
        for e in &written {
            store.put(e.clone()).await.unwrap();
        }
        assert_eq!(store.depth().await.unwrap(), 5);
        // The store is closed when its last clone is dropped.
    }
    let store = RedbStore::open(&path).unwrap();
    assert_eq!(store.depth().await.unwrap(), 5);
    for e in &written {
        assert_eq!(store.get(e.id).await.unwrap().as_ref(), Some(e));
    }
    let listed = store.list(ListQuery::new()).await.unwrap();
    let mut ids: Vec<EntryId> = written.iter().map(|e| e.id).collect();
    ids.sort();
    assert_eq!(
        listed.entries.iter().map(|e| e.id).collect::<Vec<_>>(),
        ids,
        "listed in id order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_open_of_a_live_store_is_refused_not_corrupting() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dlq.redb");
    let _store = RedbStore::open(&path).unwrap();
    let error = RedbStore::open(&path).unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Backend);
    assert!(error.to_string().contains("cannot open dead-letter store"));
}

/// Runs the same checks against both stores.
async fn paging_filters_purge_and_stats(store: impl DeadLetterStore) {
    let now = SystemTime::now();
    let mut old_ids = HashSet::new();
    for i in 0..10u32 {
        let kind = if i % 2 == 0 {
            FailureKind::ServerError
        } else {
            FailureKind::Poison
        };
        // Entries 0..4 first failed 10 days ago; the rest in the last hours.
        let first = if i < 4 {
            now - DAY * 10
        } else {
            now - Duration::from_secs(3_600 * u64::from(i))
        };
        let label = if i < 7 { "orders" } else { "billing" };
        let e = entry(label, kind, first);
        if i < 4 {
            old_ids.insert(e.id);
        }
        store.put(e).await.unwrap();
    }

    // Paging: 3 at a time, no entry twice, none lost.
    let mut seen = Vec::new();
    let mut query = ListQuery::new().limit(3);
    loop {
        let page = store.list(query.clone()).await.unwrap();
        assert!(page.entries.len() <= 3);
        seen.extend(page.entries.iter().map(|e| e.id));
        match page.next {
            Some(next) => query = query.after(next),
            None => break,
        }
    }
    assert_eq!(seen.len(), 10);
    assert!(seen.windows(2).all(|w| w[0] < w[1]));

    // Filters.
    let poison = store
        .list(ListQuery::new().kind(FailureKind::Poison))
        .await
        .unwrap();
    assert_eq!(poison.entries.len(), 5);
    assert!(poison.entries.iter().all(|e| e.kind == FailureKind::Poison));
    let billing = store.list(ListQuery::new().label("billing")).await.unwrap();
    assert_eq!(billing.entries.len(), 3);

    // Stats.
    let stats = store.stats(now).await.unwrap();
    assert_eq!(stats.depth, 10);
    assert_eq!(stats.by_kind["server_error"], 5);
    assert_eq!(stats.by_kind["poison"], 5);
    let oldest = store.oldest_age(now).await.unwrap().unwrap();
    assert!(
        oldest >= DAY * 10 - Duration::from_secs(1) && oldest <= DAY * 10 + Duration::from_secs(1)
    );
    assert_eq!(
        stats.oldest_age.map(|a| a.as_secs()),
        Some(oldest.as_secs())
    );

    // Purge by age: only the four entries older than 7 days go.
    let purged = store
        .purge(PurgeFilter::older_than(DAY * 7, now))
        .await
        .unwrap();
    assert_eq!(purged, 4);
    assert_eq!(store.depth().await.unwrap(), 6);
    for id in &old_ids {
        assert_eq!(store.get(*id).await.unwrap(), None);
    }
    let oldest = store.oldest_age(now).await.unwrap().unwrap();
    assert!(oldest < DAY);

    // Remove one, then purge the rest.
    let first = store.list(ListQuery::new().limit(1)).await.unwrap().entries[0].id;
    assert!(store.remove(first).await.unwrap());
    assert!(!store.remove(first).await.unwrap());
    assert_eq!(store.purge(PurgeFilter::all()).await.unwrap(), 5);
    assert_eq!(store.depth().await.unwrap(), 0);
    assert_eq!(store.oldest_age(now).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_store_pages_filters_and_purges_by_age() {
    let dir = tempfile::tempdir().unwrap();
    paging_filters_purge_and_stats(RedbStore::open(dir.path().join("dlq.redb")).unwrap()).await;
}

#[tokio::test]
async fn memory_store_pages_filters_and_purges_by_age() {
    paging_filters_purge_and_stats(MemoryStore::new(100)).await;
}

#[tokio::test]
async fn memory_store_refuses_past_capacity_but_replaces_in_place() {
    let store = MemoryStore::new(2);
    let now = SystemTime::now();
    let a = entry("x", FailureKind::Timeout, now);
    store.put(a.clone()).await.unwrap();
    store
        .put(entry("x", FailureKind::Timeout, now))
        .await
        .unwrap();
    let error = store
        .put(entry("x", FailureKind::Timeout, now))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Full);
    let mut updated = a.clone();
    updated.attempts = 9;
    store.put(updated).await.unwrap();
    assert_eq!(store.get(a.id).await.unwrap().unwrap().attempts, 9);
    assert_eq!(store.depth().await.unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_puts_are_all_acknowledged_and_kept_with_or_without_group_commit() {
    for max_batch in [1, 256] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dlq.redb");
        let ids: Vec<EntryId> = {
            let store = RedbStore::builder()
                .max_batch(max_batch)
                .open(&path)
                .unwrap();
            let tasks: Vec<_> = (0..64)
                .map(|_| {
                    let store = store.clone();
                    tokio::spawn(async move {
                        let e = entry("orders", FailureKind::Connection, SystemTime::now());
                        let id = e.id;
                        store.put(e).await.map(|()| id)
                    })
                })
                .collect();
            let mut ids = Vec::new();
            for task in tasks {
                ids.push(task.await.unwrap().unwrap());
            }
            ids
        };
        let store = RedbStore::open(&path).unwrap();
        assert_eq!(store.depth().await.unwrap(), 64);
        for id in ids {
            assert!(store.get(id).await.unwrap().is_some());
        }
    }
}

/// The crash test's child: writes entries as fast as it can, printing each id
/// once `put` has acknowledged it. It never returns; the parent kills it.
/// Ignored so that it runs only when the parent asks for it.
#[test]
#[ignore = "the child role of acknowledged_entries_survive_sigkill"]
fn crash_child() {
    let Ok(path) = std::env::var("TOWER_POISON_CRASH_CHILD") else {
        return; // Only runs as the child of `acknowledged_entries_survive_sigkill`.
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let store = RedbStore::open(&path).unwrap();
        let (acks, mut acked) = tokio::sync::mpsc::unbounded_channel();
        // Several writers at once, so group commits are in flight when the
        // kill lands.
        for _ in 0..4 {
            let store = store.clone();
            let acks = acks.clone();
            tokio::spawn(async move {
                loop {
                    let e = entry("crash", FailureKind::ServerError, SystemTime::now());
                    let id = e.id;
                    store.put(e).await.unwrap();
                    if acks.send(id).is_err() {
                        return;
                    }
                }
            });
        }
        let mut stdout = std::io::stdout();
        while let Some(id) = acked.recv().await {
            writeln!(stdout, "ACK {id}").unwrap();
            stdout.flush().unwrap();
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_entries_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dlq.redb");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_child",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("TOWER_POISON_CRASH_CHILD", &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let reading = acked.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(id) = line.strip_prefix("ACK ") {
                reading.lock().unwrap().push(id.parse::<EntryId>().unwrap());
            }
        }
    });
    // Let it acknowledge a good number of entries, then kill it mid-stream
    // (its writers never pause, so a commit is always in flight).
    let started = std::time::Instant::now();
    while acked.lock().unwrap().len() < 200 && started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    // `Child::kill` sends SIGKILL on Unix: no destructor, no flush runs.
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    assert!(
        acked.len() >= 10,
        "only {} entries acknowledged",
        acked.len()
    );
    eprintln!("{} entries acknowledged before SIGKILL", acked.len());

    let store = RedbStore::open(&path).expect("the store opens cleanly after SIGKILL");
    let depth = store.depth().await.unwrap();
    assert!(depth >= acked.len() as u64);
    for id in &acked {
        let e = store.get(*id).await.unwrap();
        assert!(e.is_some(), "acknowledged entry {id} lost");
    }
    // The store is fully usable: every entry decodes, and it takes writes.
    let listed = store
        .list(ListQuery::new().limit(usize::MAX))
        .await
        .unwrap();
    assert_eq!(listed.entries.len() as u64, depth);
    store
        .put(entry("after", FailureKind::Timeout, SystemTime::now()))
        .await
        .unwrap();
}
