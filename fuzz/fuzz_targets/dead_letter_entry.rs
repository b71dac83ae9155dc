//! Stored dead-letter entries (`DeadLetterEntry`'s JSON form, which the redb
//! and Redis stores decode every stored value from with `serde_json`).
//!
//! Input: the stored bytes. An entry built from the same bytes (with a body
//! that need not be UTF-8) is also encoded and decoded.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use tower_classify::FailureKind;
use tower_poison::{DeadLetterEntry, EntryId, ReplayRecord, StoredHeader};

fuzz_target!(|data: &[u8]| {
    if let Ok(entry) = serde_json::from_slice::<DeadLetterEntry>(data) {
        // Whatever a store held, once decoded it encodes to bytes that
        // decode to the same entry, and encoding is stable.
        let encoded = serde_json::to_vec(&entry).unwrap();
        let decoded: DeadLetterEntry =
            serde_json::from_slice(&encoded).expect("an encoded entry decodes");
        assert_eq!(decoded, entry);
        assert_eq!(serde_json::to_vec(&decoded).unwrap(), encoded);
    }

    // Any entry the layer writes reads back as itself.
    if data.len() >= 16 {
        let (head, body) = data.split_at(16);
        let number = u128::from_le_bytes(head.try_into().unwrap());
        let millis = (number as u64) >> 20;
        let at = UNIX_EPOCH + Duration::from_millis(millis);
        // The body whole; its first bytes as every text field (kept short:
        // this half runs for every input).
        let text = String::from_utf8_lossy(&body[..body.len().min(48)]).into_owned();
        let kinds = FailureKind::ALL;
        let mut entry = DeadLetterEntry::new(
            text.clone(),
            kinds[(number >> 5) as usize % kinds.len()],
            vec![text.clone(), text.clone()],
            at,
        );
        entry.id = format!("{number:032x}").parse::<EntryId>().unwrap();
        entry.headers.push(StoredHeader {
            name: text.clone(),
            value: text.clone(),
        });
        entry.body = Bytes::copy_from_slice(body);
        entry.attempts = (number >> 64) as u32;
        entry.last_failed_at = at + Duration::from_millis(u64::from(head[15]));
        entry.message_id = (number & 1 == 1).then(|| text.clone());
        entry.method = (number & 2 == 2).then(|| text.clone());
        entry.uri = (number & 4 == 4).then(|| text.clone());
        entry.body_truncated = number & 8 == 8;
        entry.body_len = (number & 16 == 16).then_some(body.len() as u64);
        if number & 32 == 32 {
            // A failed replay, as a replayer records it (its stored form:
            // records are made by the replayer and the layer alone).
            let record: ReplayRecord = serde_json::from_value(serde_json::json!({
                "at": millis,
                "attempt": entry.attempts.saturating_add(1),
                "kind": entry.kind.as_str(),
                "status": head[14],
                "error": [text],
            }))
            .expect("a replay record decodes");
            entry.attempts = record.attempt;
            entry.failed_replays = 1;
            entry.replays.push(record);
        }
        let encoded = serde_json::to_vec(&entry).unwrap();
        let decoded: DeadLetterEntry = serde_json::from_slice(&encoded).expect("an entry decodes");
        assert_eq!(decoded, entry);
    }
});
