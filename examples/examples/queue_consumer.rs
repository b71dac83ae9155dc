//! A queue consumer with poison-message detection and the durable redb
//! dead-letter store.
//!
//! ```sh
//! cargo run -p examples --example queue_consumer
//! ```
//!
//! A simulated queue redelivers every message its consumer does not
//! acknowledge, as SQS, Pub/Sub or RabbitMQ do. Among six order messages:
//!
//! - `order-2` meets a busy database once: redelivered, then processed;
//! - `order-3` asks for a negative quantity, which the handler refuses every
//!   time. Without poison detection the queue would hand it back forever.
//!   `PoisonPolicy::new(3)` counts its failures by message id; after three
//!   failed deliveries the fourth goes to the dead-letter store instead of the
//!   handler, and the consumer acknowledges it;
//! - `order-5` cannot even be parsed. The handler says so with a `Poison`
//!   failure (a `tower_classify::Classified` error), and the layer stores it on
//!   its first delivery: redelivering it cannot help.
//!
//! At the end the example lists the store, "fixes" the handler (negative
//! quantities are returns after all) and replays the entries: `order-3` is
//! processed and removed; `order-5` fails again and stays, for a human.
//!
//! Why the dead-letter layer sits directly on the handler, with no retry
//! layer: for a redelivering queue, **the redelivery is the retry**. A retry
//! layer inside the consumer would multiply the deliveries (and hold the
//! message's lease while it sleeps); poison detection instead counts
//! failures *across* deliveries, which no per-call layer can see.

use std::collections::{BTreeMap, VecDeque};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
use tower_classify::{Classified, ErrorChainClassifier, FailureKind, Outcome};
use tower_poison::replay::{ReplayOutcome, Replayer};
use tower_poison::store::{DeadLetterStore, ListQuery, RedbStore};
use tower_poison::{
    describe_fn, DeadLetterLayer, PoisonMessage, PoisonPolicy, RequestRecord, StoreFailed,
};

/// A message as the queue delivers it.
#[derive(Debug, Clone)]
struct Message {
    id: String,
    payload: Bytes,
    /// 1 on the first delivery.
    delivery: u32,
}

/// An in-memory queue that redelivers what is not acknowledged, at the back
/// of the line (like a visibility timeout running out).
#[derive(Debug, Default)]
struct RedeliveringQueue {
    ready: VecDeque<Message>,
}

impl RedeliveringQueue {
    fn publish(&mut self, id: &str, payload: &'static str) {
        self.ready.push_back(Message {
            id: id.to_owned(),
            payload: Bytes::from_static(payload.as_bytes()),
            delivery: 0,
        });
    }

    fn receive(&mut self) -> Option<Message> {
        let mut message = self.ready.pop_front()?;
        message.delivery += 1;
        Some(message)
    }

    /// Not acknowledged: delivered again later.
    fn nack(&mut self, message: Message) {
        self.ready.push_back(message);
    }
}

/// The handler refuses negative quantities.
#[derive(Debug)]
struct NegativeQuantity(i64);

impl std::fmt::Display for NegativeQuantity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "quantity {} is negative", self.0)
    }
}

impl std::error::Error for NegativeQuantity {}

/// Parses `sku=apple qty=3`.
fn parse(payload: &[u8]) -> Result<(String, i64), BoxError> {
    let text = std::str::from_utf8(payload)?;
    let mut sku = None;
    let mut qty = None;
    for field in text.split_whitespace() {
        match field.split_once('=') {
            Some(("sku", value)) => sku = Some(value.to_owned()),
            Some(("qty", value)) => qty = Some(value.parse::<i64>()?),
            _ => return Err(format!("unexpected field {field:?}").into()),
        }
    }
    match (sku, qty) {
        (Some(sku), Some(qty)) => Ok((sku, qty)),
        _ => Err("missing sku or qty".into()),
    }
}

/// Processes one order. `accept_returns` is the fix applied before replay.
async fn handle(
    message: Message,
    accept_returns: bool,
    calls: Arc<Mutex<BTreeMap<String, u32>>>,
) -> Result<(), BoxError> {
    *calls
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(message.id.clone())
        .or_default() += 1;
    let (_sku, qty) = parse(&message.payload).map_err(|error| {
        // A payload that cannot be parsed will never succeed: say so with a
        // `Poison` failure, and the dead-letter layer stores it at once.
        Classified::new(FailureKind::Poison, "malformed payload").with_source(error)
    })?;
    if message.id == "order-2" && message.delivery == 1 {
        // A transient failure: the next delivery will do.
        return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "database busy").into());
    }
    if qty < 0 && !accept_returns {
        return Err(NegativeQuantity(qty).into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("orders-dead-letters.redb");
    // Durable: `put` returns once the entry is committed to disk, so an
    // acknowledged message is never lost, even if the process dies next.
    let store = RedbStore::builder().open(&path)?;

    let calls = Arc::new(Mutex::new(BTreeMap::new()));
    let handler_calls = calls.clone();
    let mut consumer = ServiceBuilder::new()
        .layer(
            DeadLetterLayer::new(store.clone())
                .label("orders")
                // Messages are not HTTP requests: the error chain decides
                // (`Classified` errors, I/O kinds; anything else is rejected).
                .classifier(ErrorChainClassifier::new())
                // What to keep of a message, and the id failures are counted by.
                .capture(describe_fn(|message: &Message| RequestRecord {
                    message_id: Some(message.id.clone()),
                    method: Some("orders.created".to_owned()),
                    uri: Some("queue://orders".to_owned()),
                    body: message.payload.clone(),
                    ..RequestRecord::default()
                }))
                // Three failed deliveries, then the dead-letter store.
                .poison(PoisonPolicy::new(3)?),
        )
        .service_fn(move |message: Message| handle(message, false, handler_calls.clone()));

    let mut queue = RedeliveringQueue::default();
    queue.publish("order-1", "sku=apple qty=3");
    queue.publish("order-2", "sku=pear qty=1");
    queue.publish("order-3", "sku=plum qty=-2");
    queue.publish("order-4", "sku=fig qty=5");
    queue.publish("order-5", "sku=kiwi qty=many");
    queue.publish("order-6", "sku=lime qty=2");

    let errors = ErrorChainClassifier::new();
    let mut processed = Vec::new();
    println!("consuming (dead letters in {}):", path.display());
    while let Some(message) = queue.receive() {
        let label = format!("  {} delivery {}", message.id, message.delivery);
        match consumer.ready().await?.call(message.clone()).await {
            Ok(()) => {
                println!("{label:<24} ✓ processed, acknowledged");
                processed.push(message.id);
            }
            Err(error) => {
                if let Some(poison) = error.downcast_ref::<PoisonMessage>() {
                    // Diverted: it is in the store now. Acknowledge it, or the
                    // queue keeps handing it back.
                    println!(
                        "{label:<24} ☠ poison after {} failed deliveries: dead-lettered, acknowledged",
                        poison.attempts()
                    );
                } else if error.is::<StoreFailed>() {
                    // Neither processed nor stored: must not be acknowledged.
                    println!("{label:<24} ! store failed ({error}), redelivered");
                    queue.nack(message);
                } else if matches!(errors.classify_error(&*error), Outcome::Failure(f) if f.kind == FailureKind::Poison)
                {
                    // A poison failure is stored on the spot.
                    println!("{label:<24} ☠ {error}: dead-lettered at once, acknowledged");
                } else {
                    println!("{label:<24} ✗ {error}: not acknowledged, redelivered");
                    queue.nack(message);
                }
            }
        }
    }

    let entries = store.list(ListQuery::default()).await?.entries;
    println!("\ndead-letter store: {} entries", entries.len());
    for entry in &entries {
        println!(
            "  {}  {}  kind={}  attempts={}  body={:?}  error={:?}",
            entry.id,
            entry.message_id.as_deref().unwrap_or("-"),
            entry.kind.as_str(),
            entry.attempts,
            String::from_utf8_lossy(&entry.body),
            entry.error.join(": ")
        );
    }
    println!("  (an operator would run `tower-poison --store <file> list` for this)");

    // The fix: negative quantities are returns. Replay every entry through
    // the fixed handler; a delivered entry is removed, a failing one is kept
    // with its attempt count raised.
    println!("\nreplaying through the fixed handler:");
    let fixed_calls = calls.clone();
    let mut fixed = service_fn(move |message: Message| handle(message, true, fixed_calls.clone()));
    let mut outcomes = BTreeMap::new();
    for entry in &entries {
        let outcome = Replayer::new(&store)
            .replay(entry.id, &mut fixed, &errors, |entry| {
                Ok(Message {
                    id: entry.message_id.clone().unwrap_or_default(),
                    payload: entry.body.clone(),
                    delivery: entry.attempts + 1,
                })
            })
            .await?;
        let id = entry.message_id.clone().unwrap_or_default();
        match &outcome {
            ReplayOutcome::Delivered => println!("  {id}: delivered, removed from the store"),
            ReplayOutcome::Failed {
                attempts, error, ..
            } => {
                println!("  {id}: failed again ({error}), kept with attempts={attempts}")
            }
            ReplayOutcome::NotFound => println!("  {id}: gone"),
            ReplayOutcome::InProgress { .. } => {
                println!("  {id}: another replay is sending it, skipped")
            }
            other => println!("  {id}: {other:?}"),
        }
        outcomes.insert(id, outcome);
    }
    let left = store.list(ListQuery::default()).await?.entries;
    println!(
        "store now holds {}: {:?}",
        left.len(),
        left.iter()
            .map(|e| e.message_id.as_deref().unwrap_or("-"))
            .collect::<Vec<_>>()
    );

    // Did what this example claims happen?
    let calls = calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut ok = true;
    let mut expect = |what: &str, good: bool| {
        if !good {
            eprintln!("UNEXPECTED: {what}");
            ok = false;
        }
    };
    expect(
        "orders 1, 2, 4 and 6 are processed",
        processed == ["order-1", "order-4", "order-6", "order-2"],
    );
    expect(
        "order-2 is processed on its second delivery",
        calls.get("order-2") == Some(&2),
    );
    expect(
        "order-3 reaches the handler 3 times, then is diverted (+1 call on replay)",
        calls.get("order-3") == Some(&4),
    );
    expect(
        "order-5 is stored on its first delivery (+1 call on replay)",
        calls.get("order-5") == Some(&2),
    );
    let mut stored: Vec<_> = entries
        .iter()
        .map(|e| (e.message_id.clone().unwrap_or_default(), e.kind, e.attempts))
        .collect();
    stored.sort();
    expect(
        "the store holds order-3 (3 attempts) and order-5 (1 attempt), both poison",
        stored
            == [
                ("order-3".to_owned(), FailureKind::Poison, 3),
                ("order-5".to_owned(), FailureKind::Poison, 1),
            ],
    );
    expect(
        "after the fix, order-3 replays and order-5 stays",
        outcomes.get("order-3") == Some(&ReplayOutcome::Delivered)
            && left.len() == 1
            && left[0].message_id.as_deref() == Some("order-5")
            && left[0].attempts == 2,
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
