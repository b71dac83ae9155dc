//! Logging: a `warn` event per dead-lettered call, and `drop` logs once per
//! key. In its own test binary because tracing caches per-callsite interest
//! process-wide: another test hitting the same callsites on another thread at
//! the same moment can race with this test's thread-local subscriber.

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_classify::{BoxError, ErrorChainClassifier};
use tower_poison::store::MemoryStore;
use tower_poison::{describe_fn, Action, DeadLetterLayer, ReplayBody, RequestRecord};

mod events;
use events::Events;

#[derive(Debug, Clone)]
struct Message {
    id: String,
}

fn describe(message: &Message) -> RequestRecord {
    RequestRecord {
        message_id: Some(message.id.clone()),
        ..RequestRecord::default()
    }
}

fn run<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

#[test]
fn dlq_logs_every_entry_and_drop_logs_once_per_key() {
    let events = Events::default();
    tracing::subscriber::with_default(events.clone(), || {
        run(async {
            let store = MemoryStore::new(100);
            let mut dlq = DeadLetterLayer::new(store.clone()).layer(service_fn(
                |_req: Request<ReplayBody<Full<Bytes>>>| async {
                    Ok::<_, BoxError>(Response::builder().status(500).body(Bytes::new()).unwrap())
                },
            ));
            for _ in 0..2 {
                let req = Request::post("http://x/")
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                dlq.ready().await.unwrap().call(req).await.unwrap();
            }

            let consumer =
                service_fn(|_message: Message| async { Err::<(), _>(std::io::Error::other("no")) });
            let mut dropping = DeadLetterLayer::new(store.clone())
                .action(Action::Drop)
                .classifier(ErrorChainClassifier::new())
                .capture(describe_fn(describe))
                .layer(consumer);
            for id in ["a", "a", "a", "b"] {
                let message = Message { id: id.into() };
                dropping.call(message).await.unwrap_err();
            }
        });
    });
    let events = events.0.lock().unwrap();
    let warned = |text: &str| {
        events
            .iter()
            .filter(|(level, message, ..)| *level == tracing::Level::WARN && message.contains(text))
            .map(|(_, _, key, _)| key.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(warned("dead-lettered a failed call").len(), 2);
    assert_eq!(warned("dropped a failed call"), ["a", "b"]);
    let quiet = events
        .iter()
        .filter(|(level, message, ..)| {
            *level == tracing::Level::DEBUG && message.contains("dropped")
        })
        .count();
    assert_eq!(quiet, 2, "repeats of key a are logged at debug");
}

/// Issue 13: a secret in the query, the userinfo, a token header or a JSON
/// body field reaches neither the stored entry nor the logs.
#[test]
fn secrets_reach_neither_the_store_nor_the_logs() {
    let events = Events::default();
    let store = MemoryStore::new(100);
    tracing::subscriber::with_default(events.clone(), || {
        run(async {
            let mut dlq = DeadLetterLayer::new(store.clone()).layer(service_fn(
                |_req: Request<ReplayBody<Full<Bytes>>>| async {
                    Ok::<_, BoxError>(Response::builder().status(503).body(Bytes::new()).unwrap())
                },
            ));
            let req = Request::post(
                "https://operator:SECRET-1@upstream.example/v1/orders?access_token=SECRET-2&page=3",
            )
            .header("x-auth-token", "SECRET-3")
            .header("x-amz-security-token", "SECRET-4")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(
                br#"{"order":7,"card":{"password":"SECRET-5"}}"#,
            )))
            .unwrap();
            dlq.ready().await.unwrap().call(req).await.unwrap();
        });
    });
    let entries = run(async {
        use tower_poison::store::{DeadLetterStore, ListQuery};
        store.list(ListQuery::default()).await.unwrap().entries
    });
    assert_eq!(entries.len(), 1);
    let stored = serde_json::to_string(&entries[0]).unwrap();
    assert!(!stored.contains("SECRET"), "stored: {stored}");
    assert!(
        stored.contains("page=3") && stored.contains(r#"\"order\":7"#),
        "{stored}"
    );
    let logs: Vec<String> = events
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.3.clone())
        .collect();
    let logs = logs.join("\n");
    assert!(logs.contains("/v1/orders"), "{logs}");
    assert!(!logs.contains("SECRET"), "logs: {logs}");
}
