//! What a dead-letter store keeps about one failed call.

use std::error::Error;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tower_classify::FailureKind;

/// The identifier of a dead-letter entry.
///
/// Identifiers sort by the time the entry was created (the high 48 bits are
/// milliseconds since the Unix epoch), so a store that keeps entries in key
/// order lists them oldest first and pages through them with a cursor. They
/// print as 32 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryId(u128);

impl EntryId {
    /// A new identifier for an entry created at `now`.
    ///
    /// The low 80 bits are a process-wide counter mixed with randomness, so
    /// identifiers made in the same millisecond, in one process or in several
    /// writing to the same store, still differ.
    pub fn generate(now: SystemTime) -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let millis = now
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis()
            & ((1 << 48) - 1);
        let count = COUNTER.fetch_add(1, Ordering::Relaxed) as u128 & 0xffff;
        let random = fastrand::u64(..) as u128;
        EntryId((millis << 80) | (count << 64) | random)
    }

    /// The identifier as a number (its storage key).
    pub const fn as_u128(self) -> u128 {
        self.0
    }

    /// The identifier with number `value`.
    pub const fn from_u128(value: u128) -> Self {
        EntryId(value)
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// An entry identifier was not 32 hex digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseEntryIdError {
    input: String,
}

impl fmt::Display for ParseEntryIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid entry id {:?}: expected 32 hex digits",
            self.input
        )
    }
}

impl Error for ParseEntryIdError {}

impl FromStr for EntryId {
    type Err = ParseEntryIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let error = || ParseEntryIdError {
            input: s.to_owned(),
        };
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(error());
        }
        u128::from_str_radix(s, 16)
            .map(EntryId)
            .map_err(|_| error())
    }
}

impl Serialize for EntryId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for EntryId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// One header as stored: its name and its value, or `[redacted]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredHeader {
    /// The header name, lowercase.
    pub name: String,
    /// The value; bytes that are not UTF-8 are replaced (`U+FFFD`).
    pub value: String,
}

/// A failed call as a dead-letter store keeps it.
///
/// Headers are redacted before an entry is built (see
/// [`Redactor`](crate::Redactor)); the body is kept whole when it is within
/// the layer's body limit, and not at all when it is larger
/// ([`body_truncated`](Self::body_truncated) set, its length in
/// [`body_len`](Self::body_len)). A truncated entry cannot be replayed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetterEntry {
    /// The entry's identifier.
    pub id: EntryId,
    /// The service or route the call was for (the layer's label).
    pub label: String,
    /// The message id, for queue messages counted by poison detection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// The request method (HTTP) or operation name, if there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The request URI or destination, if there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// The request headers, sensitive ones redacted.
    #[serde(default)]
    pub headers: Vec<StoredHeader>,
    /// The request body, up to the layer's limit.
    #[serde(with = "body_serde")]
    pub body: Bytes,
    /// `true` when [`body`](Self::body) is not the whole request body: the
    /// body was larger than the layer's limit (nothing of it is kept), or
    /// it ended early.
    pub body_truncated: bool,
    /// The request body's length when it is not kept whole, as far as it
    /// was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_len: Option<u64>,
    /// The error and its `source()` chain, outermost first, one message per
    /// level. A response classified as a failure is described in one line.
    pub error: Vec<String>,
    /// How the failure was classified.
    #[serde(with = "kind_serde")]
    pub kind: FailureKind,
    /// How many attempts failed: retries counted by
    /// [`CountAttemptsLayer`](crate::CountAttemptsLayer), deliveries counted by
    /// poison detection, plus failed replays.
    pub attempts: u32,
    /// When the first attempt failed.
    #[serde(with = "time_serde")]
    pub first_failed_at: SystemTime,
    /// When the last attempt failed.
    #[serde(with = "time_serde")]
    pub last_failed_at: SystemTime,
}

impl DeadLetterEntry {
    /// How long ago the first attempt failed, measured against `now`.
    pub fn age(&self, now: SystemTime) -> Duration {
        now.duration_since(self.first_failed_at).unwrap_or_default()
    }

    /// The error chain in one line, levels joined with `": "`.
    pub fn error_text(&self) -> String {
        self.error.join(": ")
    }

    /// The entry encoded for storage (JSON).
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_vec(self).expect("a dead-letter entry serializes")
    }

    /// An entry decoded from [`to_bytes`](Self::to_bytes).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// The messages of `error` and of every error in its `source()` chain.
pub fn error_chain(error: &(dyn Error + 'static)) -> Vec<String> {
    let mut chain = Vec::new();
    let mut current = Some(error);
    while let Some(err) = current {
        let message = err.to_string();
        // Some errors repeat their source's message in their own; keep the
        // chain readable by not printing the same text twice in a row.
        if chain.last() != Some(&message) {
            chain.push(message);
        }
        current = err.source();
    }
    chain
}

/// A failure kind is stored by its stable name, so the stored form does not
/// depend on the enum's layout.
mod kind_serde {
    use super::*;

    pub(super) fn serialize<S: Serializer>(
        kind: &FailureKind,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(kind.as_str())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<FailureKind, D::Error> {
        let name = String::deserialize(deserializer)?;
        kind_from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown failure kind {name:?}")))
    }
}

/// The failure kind whose [`as_str`](FailureKind::as_str) name is `name`.
pub fn kind_from_name(name: &str) -> Option<FailureKind> {
    FailureKind::ALL
        .into_iter()
        .find(|kind| kind.as_str() == name)
}

/// Times are stored as milliseconds since the Unix epoch.
mod time_serde {
    use super::*;

    pub(super) fn serialize<S: Serializer>(
        time: &SystemTime,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let millis = time
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        serializer.serialize_u64(millis)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<SystemTime, D::Error> {
        let millis = u64::deserialize(deserializer)?;
        Ok(UNIX_EPOCH + Duration::from_millis(millis))
    }
}

/// A body is stored as text when it is UTF-8 (the common JSON case, readable
/// in `show --json`), and as hex otherwise.
pub(crate) mod body_serde {
    use super::*;

    #[derive(Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum Stored {
        Utf8(String),
        Hex(String),
    }

    pub(crate) fn serialize<S: Serializer>(body: &Bytes, serializer: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(body) {
            Ok(text) => Stored::Utf8(text.to_owned()),
            Err(_) => Stored::Hex(body.iter().map(|b| format!("{b:02x}")).collect()),
        }
        .serialize(serializer)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Bytes, D::Error> {
        match Stored::deserialize(deserializer)? {
            Stored::Utf8(text) => Ok(Bytes::from(text)),
            Stored::Hex(hex) => {
                if hex.len() % 2 != 0 {
                    return Err(serde::de::Error::custom("odd number of hex digits"));
                }
                // Checked first so that every pair below is two ASCII bytes:
                // slicing a stored string that holds multi-byte UTF-8 at a
                // byte offset would panic, and `from_str_radix` alone takes
                // a sign (`+f`).
                if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(serde::de::Error::custom("a hex body holds a non-hex digit"));
                }
                (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
                    .collect::<Result<Vec<u8>, _>>()
                    .map(Bytes::from)
                    .map_err(serde::de::Error::custom)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(body: &'static [u8]) -> DeadLetterEntry {
        let now = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        DeadLetterEntry {
            id: EntryId::generate(now),
            label: "orders".into(),
            message_id: Some("m-1".into()),
            method: Some("POST".into()),
            uri: Some("http://example.com/orders?x=1".into()),
            headers: vec![StoredHeader {
                name: "content-type".into(),
                value: "application/json".into(),
            }],
            body: Bytes::from_static(body),
            body_truncated: false,
            body_len: None,
            error: vec!["outer".into(), "inner".into()],
            kind: FailureKind::ServerError,
            attempts: 3,
            first_failed_at: now,
            last_failed_at: now + Duration::from_secs(2),
        }
    }

    #[test]
    fn entries_round_trip_through_storage_encoding() {
        for body in [&b"{\"a\":1}"[..], &[0xff, 0x00, 0x10][..], &b""[..]] {
            let original = entry(body);
            let decoded = DeadLetterEntry::from_bytes(&original.to_bytes()).unwrap();
            assert_eq!(decoded, original);
        }
    }

    /// A stored hex body that is not hex digits (multi-byte UTF-8, which
    /// cannot be sliced into byte pairs, or a sign) is a decoding error,
    /// never a panic. Found by the `dead_letter_entry` fuzz target.
    #[test]
    fn a_hex_body_that_is_not_hex_is_refused() {
        let stored = String::from_utf8(entry(&[0xff]).to_bytes()).unwrap();
        assert!(stored.contains(r#""hex":"ff""#), "{stored}");
        for bad in ["ff001é0", "é", "aéb", "+f", "-1", "  "] {
            let hostile = stored.replace(r#""hex":"ff""#, &format!(r#""hex":"{bad}""#));
            assert!(
                DeadLetterEntry::from_bytes(hostile.as_bytes()).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn ids_sort_by_time_and_parse_back() {
        let early = EntryId::generate(UNIX_EPOCH + Duration::from_secs(10));
        let late = EntryId::generate(UNIX_EPOCH + Duration::from_secs(11));
        assert!(early < late);
        assert_eq!(late.to_string().parse::<EntryId>().unwrap(), late);
        assert!("xyz".parse::<EntryId>().is_err());
        let same_ms = UNIX_EPOCH + Duration::from_secs(12);
        assert_ne!(EntryId::generate(same_ms), EntryId::generate(same_ms));
    }

    #[test]
    fn every_kind_name_parses_back() {
        for kind in FailureKind::ALL {
            assert_eq!(kind_from_name(kind.as_str()), Some(kind));
        }
        assert_eq!(kind_from_name("nope"), None);
    }
}
