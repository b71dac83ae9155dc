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
    pub(crate) fn generate(now: SystemTime) -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
        let millis = since.as_millis() & ((1 << 48) - 1);
        let count = COUNTER.fetch_add(1, Ordering::Relaxed) as u128 & 0xffff;
        let random = fastrand::u64(..) as u128;
        EntryId((millis << 80) | (count << 64) | random)
    }

    /// The identifier as a number (its storage key).
    pub(crate) const fn as_u128(self) -> u128 {
        self.0
    }

    /// The identifier with number `value`.
    pub(crate) const fn from_u128(value: u128) -> Self {
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
    /// A prefix (1 to 32 digits) was expected, not a whole id.
    prefix: bool,
}

impl fmt::Display for ParseEntryIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let expected = if self.prefix {
            "1 to 32 hex digits"
        } else {
            "32 hex digits"
        };
        write!(f, "invalid entry id {:?}: expected {expected}", self.input)
    }
}

impl Error for ParseEntryIdError {}

impl FromStr for EntryId {
    type Err = ParseEntryIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.parse::<EntryIdPrefix>() {
            Ok(prefix) if prefix.digits == 32 => Ok(EntryId(prefix.low)),
            _ => Err(ParseEntryIdError {
                input: s.to_owned(),
                prefix: false,
            }),
        }
    }
}

/// The first hex digits of an [`EntryId`], as an operator types them
/// (`0190c3`): 1 to 32 hex digits, either case.
///
/// Ids sort by their digits, so the ids a prefix matches are one contiguous
/// [`range`](Self::range): a store that keeps ids in order finds them
/// without reading any entry
/// ([`DeadLetterStore::match_prefix`](crate::store::DeadLetterStore::match_prefix)).
///
/// ```
/// use tower_poison::{EntryId, EntryIdPrefix};
///
/// let prefix: EntryIdPrefix = "0190C3".parse().unwrap();
/// let id: EntryId = "0190c3a1000000000000000000000000".parse().unwrap();
/// let (first, last) = prefix.range();
/// assert!((first..=last).contains(&id));
/// assert_eq!(prefix.to_string(), "0190c3");
/// assert!("".parse::<EntryIdPrefix>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EntryIdPrefix {
    /// The digits as a number, shifted to the top of the id.
    low: u128,
    /// How many digits there are (1 to 32).
    digits: u32,
}

impl EntryIdPrefix {
    /// The first and the last id the prefix matches.
    pub const fn range(self) -> (EntryId, EntryId) {
        // At most 124 free bits: the shift never overflows.
        let high = self.low | ((1u128 << (4 * (32 - self.digits))) - 1);
        (EntryId(self.low), EntryId(high))
    }

    /// How many digits the prefix has.
    const fn len(self) -> usize {
        self.digits as usize
    }
}

impl fmt::Display for EntryIdPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let full = format!("{:032x}", self.low);
        f.write_str(&full[..self.len()])
    }
}

impl FromStr for EntryIdPrefix {
    type Err = ParseEntryIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let error = || ParseEntryIdError {
            input: s.to_owned(),
            prefix: true,
        };
        if s.is_empty() || s.len() > 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(error());
        }
        let digits = s.len() as u32;
        // At most 32 hex digits: always fits.
        let value = u128::from_str_radix(s, 16).map_err(|_| error())?;
        let low = value << (4 * (32 - digits));
        Ok(EntryIdPrefix { low, digits })
    }
}

/// The prefix that is all of `id`: it matches `id` alone.
impl From<EntryId> for EntryIdPrefix {
    fn from(id: EntryId) -> Self {
        EntryIdPrefix {
            low: id.0,
            digits: 32,
        }
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

/// A failed call as a dead-letter store keeps it, redacted by the
/// [`Redactor`](crate::Redactor).
///
/// The stores keep an entry as its JSON encoding (`serde_json` of this
/// type, whose `Serialize` and `Deserialize` are the stored form), and
/// their byte limits count that encoding's size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
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
    #[serde(with = "tower_store_support::bytes_text")]
    pub body: Bytes,
    /// `true` when [`body`](Self::body) is not the whole request body: the
    /// body was larger than the layer's limit (nothing of it is kept), or
    /// it ended early.
    pub body_truncated: bool,
    /// The request body's length when it is not kept whole, as far as it
    /// was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_len: Option<u64>,
    /// The error and its `source()` chain, outermost first, cut to 8 levels
    /// of at most 512 bytes (`…` appended), so an error quoting a whole body
    /// cannot fill the store; a response classified as a failure, in one line.
    pub error: Vec<String>,
    /// How the failure was classified.
    #[serde(with = "kind_serde")]
    pub kind: FailureKind,
    /// How many attempts failed: retries counted by
    /// [`CountAttemptsLayer`](crate::CountAttemptsLayer), deliveries counted by
    /// poison detection, plus the attempts of failed replays.
    pub attempts: u32,
    /// When the first attempt failed.
    #[serde(with = "time_serde")]
    pub first_failed_at: SystemTime,
    /// When the last attempt failed, a failed replay's included.
    #[serde(with = "time_serde")]
    pub last_failed_at: SystemTime,
    /// The latest 16 failed replays, oldest first, so that an entry replayed
    /// again and again stays bounded; [`failed_replays`](Self::failed_replays)
    /// counts them all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replays: Vec<ReplayRecord>,
    /// How many replays of this entry failed, including those no longer in
    /// [`replays`](Self::replays).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed_replays: u64,
    /// How many replays a server answered with a 5xx of its own (not 502 or
    /// 504) while the key was free to move: the `n` of the `Idempotency-Key`
    /// [`http_request`](crate::replay::http_request) makes, since a guard may
    /// keep a 5xx under the key it answered.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub replay_server_errors: u64,
    /// The key no longer moves: a replay under it may have been applied (the
    /// [replay module](crate::replay#delivered-once) says when), and a server
    /// that honours it cannot run the request twice. (A guard that kept a
    /// failure under it answers that failure until its record expires.)
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replay_key_pinned: bool,
}

fn is_zero(count: &u64) -> bool {
    *count == 0
}

/// How many failed replays an entry keeps: enough to see a cause change (a
/// 503 that became a 422), few enough that a replay loop left running keeps
/// an entry to a few kilobytes.
pub(crate) const REPLAY_HISTORY_LIMIT: usize = 16;

/// The bounds of an entry's [`error`](DeadLetterEntry::error) (and a
/// [`ReplayRecord`]'s): levels of the chain, bytes of each message.
pub(crate) const ERROR_LEVELS: usize = 8;
pub(crate) const ERROR_BYTES: usize = 512;

/// What a failed replay's answer says about the next replay's idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum ReplayAnswer {
    /// A server error of the server's own: the key moves on.
    ServerError,
    /// No answer from the server itself: the key is pinned.
    Unknown,
    /// Any other answer: a client error, an `in use` conflict, a call
    /// refused before it was sent.
    Other,
}

impl ReplayAnswer {
    /// The answer of a replay that failed with `kind`, having got a response
    /// (`responded`, its `status` if read) or an error. Only a read 5xx is a
    /// [`ServerError`](Self::ServerError): a replayer that reads no status
    /// never moves the key.
    pub(crate) fn new(responded: bool, status: Option<u16>, kind: FailureKind) -> Self {
        match kind {
            // Refused before it was sent: nothing ran.
            FailureKind::NotSent | FailureKind::Shed => ReplayAnswer::Other,
            // A timeout, whoever reports it: the request may have run.
            FailureKind::Timeout => ReplayAnswer::Unknown,
            // No response: the server may have acted.
            _ if !responded => ReplayAnswer::Unknown,
            _ => match status {
                Some(502 | 504) => ReplayAnswer::Unknown,
                Some(500..=599) => ReplayAnswer::ServerError,
                // A client error, or a status not read: the key stays (a
                // gateway's 504 read as a server error would move it).
                _ => ReplayAnswer::Other,
            },
        }
    }
}

/// One failed replay of a dead-letter entry, as the entry keeps it in
/// [`DeadLetterEntry::replays`].
///
/// The entry's own [`error`](DeadLetterEntry::error),
/// [`kind`](DeadLetterEntry::kind) and
/// [`first_failed_at`](DeadLetterEntry::first_failed_at) stay those of the
/// original failure; what each replay met is here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ReplayRecord {
    /// When the replay failed.
    #[serde(with = "time_serde")]
    pub at: SystemTime,
    /// The entry's attempt count once this replay was counted.
    pub attempt: u32,
    /// How the replay's failure was classified.
    #[serde(with = "kind_serde")]
    pub kind: FailureKind,
    /// The response's HTTP status, when the replay got a response (and the
    /// replayer or layer could read its status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The error and its `source()` chain when the replay got no response,
    /// or the response described in one line.
    pub error: Vec<String>,
}

impl ReplayRecord {
    /// A replay that failed at `at` with a failure of `kind`, described by
    /// `error` (cut, as an entry's [`error`](DeadLetterEntry::error) is),
    /// with the response's HTTP `status` when there was one.
    pub(crate) fn new(
        at: SystemTime,
        kind: FailureKind,
        error: Vec<String>,
        status: Option<u16>,
    ) -> Self {
        let error = clip_chain(error);
        ReplayRecord {
            at,
            attempt: 0,
            kind,
            status,
            error,
        }
    }

    /// The error chain in one line, levels joined with `": "`.
    pub(crate) fn error_text(&self) -> String {
        self.error.join(": ")
    }
}

/// `chain` cut to [`ERROR_LEVELS`] levels of at most [`ERROR_BYTES`] bytes.
pub(crate) fn clip_chain(chain: Vec<String>) -> Vec<String> {
    let clip = |message| clip_message(message, ERROR_BYTES);
    chain.into_iter().take(ERROR_LEVELS).map(clip).collect()
}

/// `message` cut to at most `max` bytes at a character boundary, with `…`
/// in place of what was cut.
fn clip_message(mut message: String, max: usize) -> String {
    if message.len() <= max {
        return message;
    }
    let ellipsis = '…';
    let mut end = max - ellipsis.len_utf8();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message.truncate(end);
    message.push(ellipsis);
    message
}

impl DeadLetterEntry {
    /// An entry for a call labelled `label` that failed once, at
    /// `failed_at`, with a failure of `kind` described by `error` (cut as the
    /// [`error`](Self::error) field says), for stores, tests and tools: the
    /// request fields are public, and empty until set.
    pub fn new(
        label: impl Into<String>,
        kind: FailureKind,
        error: Vec<String>,
        failed_at: SystemTime,
    ) -> Self {
        DeadLetterEntry {
            id: EntryId::generate(failed_at),
            label: label.into(),
            message_id: None,
            method: None,
            uri: None,
            headers: Vec::new(),
            body: Bytes::new(),
            body_truncated: false,
            body_len: None,
            error: clip_chain(error),
            kind,
            attempts: 1,
            first_failed_at: failed_at,
            last_failed_at: failed_at,
            replays: Vec::new(),
            failed_replays: 0,
            replay_server_errors: 0,
            replay_key_pinned: false,
        }
    }

    /// How long ago the first attempt failed, measured against `now`.
    pub(crate) fn age(&self, now: SystemTime) -> Duration {
        now.duration_since(self.first_failed_at).unwrap_or_default()
    }

    /// Adds a failed replay of `attempts` attempts (a retrying service's
    /// layer may count more than one) to the history; the original failure's
    /// fields stay.
    pub(crate) fn record_replay(&mut self, mut record: ReplayRecord, attempts: u32) {
        self.attempts = self.attempts.saturating_add(attempts.max(1));
        self.last_failed_at = self.last_failed_at.max(record.at);
        self.failed_replays = self.failed_replays.saturating_add(1);
        record.attempt = self.attempts;
        self.replays.push(record);
        if self.replays.len() > REPLAY_HISTORY_LIMIT {
            let excess = self.replays.len() - REPLAY_HISTORY_LIMIT;
            self.replays.drain(..excess);
        }
    }

    /// Takes in what a failed replay's answer says about the idempotency key
    /// the next replay sends.
    pub(crate) fn note_replay_answer(&mut self, answer: ReplayAnswer) {
        match answer {
            ReplayAnswer::Unknown => self.replay_key_pinned = true,
            ReplayAnswer::ServerError if !self.replay_key_pinned => {
                self.replay_server_errors = self.replay_server_errors.saturating_add(1);
            }
            _ => {}
        }
    }

    /// The entry encoded for storage (JSON).
    #[cfg_attr(not(any(feature = "redb", feature = "redis")), allow(dead_code))]
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_vec(self).expect("a dead-letter entry serializes")
    }

    /// An entry decoded from [`to_bytes`](Self::to_bytes).
    #[cfg_attr(not(any(feature = "redb", feature = "redis")), allow(dead_code))]
    pub(crate) fn from_bytes(bytes: &[u8]) -> Result<Self, serde_json::Error> {
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

    pub(super) fn serialize<S: Serializer>(kind: &FailureKind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(kind.as_str())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<FailureKind, D::Error> {
        let name = String::deserialize(d)?;
        name.parse()
            .map_err(|_| serde::de::Error::custom(format!("unknown failure kind {name:?}")))
    }
}

/// Times are stored as milliseconds since the Unix epoch.
mod time_serde {
    use super::*;

    pub(super) fn serialize<S: Serializer>(time: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
        s.serialize_u64(since.as_millis() as u64)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        Ok(UNIX_EPOCH + Duration::from_millis(u64::deserialize(d)?))
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
            replays: Vec::new(),
            failed_replays: 0,
            replay_server_errors: 0,
            replay_key_pinned: false,
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

    /// An entry stored before entries had a replay history decodes with an
    /// empty one, and an entry without replays is stored as before.
    #[test]
    fn entries_without_a_history_decode_and_encode_as_before() {
        let stored = r#"{"id":"0000018bcfe568000000000000000001","label":"orders",
            "headers":[],"body":{"utf8":"{}"},"body_truncated":false,
            "error":["HTTP 503 Service Unavailable"],"kind":"server_error","attempts":2,
            "first_failed_at":1700000000000,"last_failed_at":1700000005000}"#;
        let entry = DeadLetterEntry::from_bytes(stored.as_bytes()).unwrap();
        assert!(entry.replays.is_empty());
        assert_eq!(entry.failed_replays, 0);
        let encoded = String::from_utf8(entry.to_bytes()).unwrap();
        assert!(!encoded.contains("replays"), "{encoded}");
    }

    #[test]
    fn a_replay_adds_to_the_history_and_leaves_the_original_failure() {
        let mut stored = entry(b"{}");
        let original = stored.clone();
        let at = stored.last_failed_at + Duration::from_secs(60);
        let record = ReplayRecord::new(
            at,
            FailureKind::RateLimited,
            vec!["HTTP 429".into()],
            Some(429),
        );
        stored.record_replay(record, 1);
        assert_eq!(
            (&stored.error, stored.kind, stored.first_failed_at),
            (&original.error, original.kind, original.first_failed_at)
        );
        assert_eq!(stored.attempts, original.attempts + 1);
        assert_eq!(stored.last_failed_at, at);
        assert_eq!(stored.failed_replays, 1);
        assert_eq!(stored.replays[0].attempt, stored.attempts);
        assert_eq!(stored.replays[0].status, Some(429));
        // A record from a clock behind never moves the last failure back.
        let early = ReplayRecord::new(UNIX_EPOCH, FailureKind::Timeout, vec![], None);
        stored.record_replay(early, 2);
        assert_eq!(stored.last_failed_at, at);
        assert_eq!(stored.attempts, original.attempts + 3);
        let decoded = DeadLetterEntry::from_bytes(&stored.to_bytes()).unwrap();
        assert_eq!(decoded, stored);
    }

    #[test]
    fn the_history_keeps_the_latest_records_and_counts_them_all() {
        let mut stored = entry(b"{}");
        let total = REPLAY_HISTORY_LIMIT as u32 * 2 + 3;
        for n in 0..total {
            let at = stored.first_failed_at + Duration::from_secs(u64::from(n));
            stored.record_replay(
                ReplayRecord::new(at, FailureKind::ServerError, vec![format!("try {n}")], None),
                1,
            );
        }
        assert_eq!(stored.replays.len(), REPLAY_HISTORY_LIMIT);
        assert_eq!(stored.failed_replays, u64::from(total));
        let first_kept = total - REPLAY_HISTORY_LIMIT as u32;
        assert_eq!(stored.replays[0].error, [format!("try {first_kept}")]);
        assert_eq!(
            stored.replays.last().unwrap().error,
            [format!("try {}", total - 1)]
        );
    }

    /// What each kind of answer does to the next replay's key.
    #[test]
    fn a_replay_answer_is_read_from_the_response_or_the_error() {
        use FailureKind::*;
        let cases = [
            ((true, Some(503), ServerError), ReplayAnswer::ServerError),
            ((true, Some(500), ServerError), ReplayAnswer::ServerError),
            ((true, Some(502), ServerError), ReplayAnswer::Unknown),
            ((true, Some(504), ServerError), ReplayAnswer::Unknown),
            ((true, Some(409), Rejected), ReplayAnswer::Other),
            ((true, Some(429), RateLimited), ReplayAnswer::Other),
            ((true, Some(408), Timeout), ReplayAnswer::Unknown),
            // A breaker's own 503: the request never ran.
            ((true, Some(503), Shed), ReplayAnswer::Other),
            // No status read (a gateway's 504 would look the same).
            ((true, None, ServerError), ReplayAnswer::Other),
            // gRPC: a trailers-only answer's HTTP status is 200.
            ((true, Some(200), ServerError), ReplayAnswer::Other),
            ((true, Some(200), Timeout), ReplayAnswer::Unknown),
            ((false, None, Timeout), ReplayAnswer::Unknown),
            ((false, None, Connection), ReplayAnswer::Unknown),
            ((false, None, ServerError), ReplayAnswer::Unknown),
            ((false, None, NotSent), ReplayAnswer::Other),
            ((false, None, Shed), ReplayAnswer::Other),
        ];
        for ((responded, status, kind), expected) in cases {
            let answer = ReplayAnswer::new(responded, status, kind);
            assert_eq!(answer, expected, "{responded} {status:?} {kind:?}");
        }
    }

    #[test]
    fn a_record_bounds_its_error_chain() {
        let long = "é".repeat(ERROR_BYTES);
        let chain: Vec<String> = (0..ERROR_LEVELS + 5).map(|_| long.clone()).collect();
        let record = ReplayRecord::new(UNIX_EPOCH, FailureKind::NotSent, chain, None);
        assert_eq!(record.error.len(), ERROR_LEVELS);
        for message in &record.error {
            assert!(message.len() <= ERROR_BYTES, "{}", message.len());
            assert!(message.ends_with('…'));
        }
        let short = ReplayRecord::new(UNIX_EPOCH, FailureKind::NotSent, vec!["reset".into()], None);
        assert_eq!(short.error, ["reset"]);
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
    fn a_prefix_matches_the_contiguous_range_of_ids_it_starts() {
        let id: EntryId = "0190c3a1b2c3d4e5f60718293a4b5c6d".parse().unwrap();
        for digits in 1..=32 {
            let text = &id.to_string()[..digits];
            let prefix: EntryIdPrefix = text.parse().unwrap();
            assert_eq!(prefix.to_string(), text);
            assert_eq!(prefix.len(), digits);
            let (low, high) = prefix.range();
            assert!((low..=high).contains(&id), "{text}");
            assert!(low.to_string().starts_with(text) && high.to_string().starts_with(text));
            assert!(low.to_string()[digits..].bytes().all(|b| b == b'0'));
            assert!(high.to_string()[digits..].bytes().all(|b| b == b'f'));
        }
        let matches = |prefix: EntryIdPrefix| {
            let (low, high) = prefix.range();
            (low..=high).contains(&id)
        };
        let upper: EntryIdPrefix = "0190C3".parse().unwrap();
        assert!(matches(upper));
        let other: EntryIdPrefix = "0190c4".parse().unwrap();
        assert!(!matches(other));
        assert_eq!(EntryIdPrefix::from(id).range(), (id, id));
        for bad in ["", "xyz", "+1", &"0".repeat(33)] {
            let error = bad.parse::<EntryIdPrefix>().unwrap_err();
            assert!(error.to_string().contains("1 to 32 hex digits"), "{error}");
        }
        let all: EntryIdPrefix = "f".parse().unwrap();
        assert_eq!(all.range().1, EntryId::from_u128(u128::MAX));
    }

    /// A failed replay as [`ReplayRecord::new`] makes it,
    /// from generated parts.
    fn replay() -> impl proptest::strategy::Strategy<Value = (ReplayRecord, u32)> {
        use proptest::prelude::*;
        (
            0u64..1 << 50,
            0..FailureKind::ALL.len(),
            proptest::option::of(any::<u16>()),
            proptest::collection::vec("\\PC{0,8}|é{200,300}", 0..ERROR_LEVELS + 3),
            prop_oneof![0u32..4, Just(u32::MAX)],
        )
            .prop_map(|(millis, kind, status, error, attempts)| {
                let at = UNIX_EPOCH + Duration::from_millis(millis);
                let record = ReplayRecord::new(at, FailureKind::ALL[kind], error.clone(), status);
                (record, attempts)
            })
    }

    proptest::proptest! {
        /// The checks the `dead_letter_entry` fuzz target made before
        /// `ReplayRecord::new`, `record_replay` and `age` became the crate's
        /// own: an entry the layer writes, failed replays recorded, reads
        /// back as itself and encodes stably; `age` and a record's
        /// `error_text` never panic. With them, what `record_replay` and
        /// `ReplayRecord::new` promise.
        #[test]
        fn an_entry_with_recorded_replays_reads_back_as_itself(
            number in proptest::prelude::any::<u128>(),
            millis in 0u64..1 << 50,
            text in "\\PC{0,48}",
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            replays in proptest::collection::vec(replay(), 0..REPLAY_HISTORY_LIMIT + 4),
            now_millis in 0u64..1 << 51,
        ) {
            use proptest::{prop_assert, prop_assert_eq};

            let at = UNIX_EPOCH + Duration::from_millis(millis);
            let kinds = FailureKind::ALL;
            let mut entry = DeadLetterEntry::new(
                text.clone(),
                kinds[(number >> 5) as usize % kinds.len()],
                vec![text.clone(), text.clone()],
                at,
            );
            entry.id = EntryId::from_u128(number);
            entry.headers.push(StoredHeader { name: text.clone(), value: text.clone() });
            entry.body = Bytes::from(body.clone());
            entry.attempts = (number >> 64) as u32;
            entry.last_failed_at = at + Duration::from_millis(number as u8 as u64);
            entry.message_id = (number & 1 == 1).then(|| text.clone());
            entry.method = (number & 2 == 2).then(|| text.clone());
            entry.uri = (number & 4 == 4).then(|| text.clone());
            entry.body_truncated = number & 8 == 8;
            entry.body_len = (number & 16 == 16).then_some(body.len() as u64);

            let recorded = replays.len();
            for (record, attempts) in replays {
                let before = entry.clone();
                prop_assert!(record.error.len() <= ERROR_LEVELS);
                prop_assert!(record.error.iter().all(|level| level.len() <= ERROR_BYTES));
                let line = record.error_text();
                prop_assert!(record.error.iter().all(|level| line.contains(level.as_str())));
                entry.record_replay(record.clone(), attempts);

                prop_assert_eq!(
                    entry.attempts,
                    before.attempts.saturating_add(attempts.max(1))
                );
                prop_assert_eq!(entry.last_failed_at, before.last_failed_at.max(record.at));
                prop_assert_eq!(entry.failed_replays, before.failed_replays + 1);
                prop_assert!(entry.replays.len() <= REPLAY_HISTORY_LIMIT);
                let kept = entry.replays.last().unwrap();
                prop_assert_eq!(kept.attempt, entry.attempts);
                prop_assert_eq!((kept.at, kept.kind, kept.status), (record.at, record.kind, record.status));
                prop_assert_eq!(&kept.error, &record.error);
                // The original failure stays as it was.
                prop_assert_eq!(
                    (&entry.error, entry.kind, entry.first_failed_at),
                    (&before.error, before.kind, before.first_failed_at)
                );
            }
            prop_assert_eq!(entry.failed_replays, recorded as u64);
            prop_assert_eq!(entry.replays.len(), recorded.min(REPLAY_HISTORY_LIMIT));

            let encoded = entry.to_bytes();
            let decoded = DeadLetterEntry::from_bytes(&encoded).expect("an entry decodes");
            prop_assert_eq!(&decoded, &entry);
            prop_assert_eq!(decoded.to_bytes(), encoded);

            let now = UNIX_EPOCH + Duration::from_millis(now_millis);
            let expected = now.duration_since(entry.first_failed_at).unwrap_or_default();
            prop_assert_eq!(decoded.age(now), expected);
        }
    }
}
