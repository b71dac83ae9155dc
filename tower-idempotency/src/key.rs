//! Keys: what a client sends, where a store keeps it, and what makes two
//! requests "the same".

use http::{HeaderValue, Method, Uri};
use sha2::{Digest, Sha256};

use crate::rejection::Rejection;
use tower_store_support::bytes_text::{push_hex, unhex};

/// The longest `Idempotency-Key` accepted, in characters.
pub const MAX_KEY_LEN: usize = 255;

/// The key of a header value: visible ASCII, 1 to 255 characters, optionally
/// a quoted structured-field string (`"abc"`, as the IETF draft writes it).
pub(crate) fn parse(value: &HeaderValue) -> Result<&str, Rejection> {
    let text = value.to_str().map_err(|_| Rejection::KeyInvalid)?;
    let text = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text);
    if text.len() > MAX_KEY_LEN {
        return Err(Rejection::KeyTooLong);
    }
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Rejection::KeyInvalid);
    }
    Ok(text)
}

/// Where a store keeps `key` (see the crate docs' *Tenants*). The identity's
/// length goes first, so no identity/key pair can spell another's (`a:b` +
/// `c` vs `a` + `b:c`).
pub(crate) fn namespaced(identity: Option<&str>, key: &str) -> String {
    match identity {
        Some(identity) => format!("s:{}:{identity}:{key}", identity.len()),
        None => format!("u:{key}"),
    }
}

/// The head of a request's fingerprint: its method, path and query
/// (`POST /orders?a=1`). The host is left out, so two nodes behind one name
/// agree.
pub(crate) fn head(method: &Method, uri: &Uri) -> String {
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut head = String::with_capacity(method.as_str().len() + 1 + path.len());
    head.push_str(method.as_str());
    head.push(' ');
    head.push_str(path);
    head
}

/// The longest body part, `body=complete;len={20 digits};sha256={64}`.
const BODY_PART_LEN: usize = 1 + 14 + 4 + 20 + 8 + 64;

/// What the handler read of a request body: the SHA-256 of the bytes, how
/// many there were, and whether they were the whole body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BodyPart {
    pub(crate) sha256: [u8; 32],
    pub(crate) len: u64,
    /// The handler read to the end of the body: a repeat must be exactly
    /// these bytes. Otherwise only its first `len` bytes are compared.
    pub(crate) complete: bool,
}

/// A request's fingerprint, the string a store keeps with its key, in the
/// form the [crate docs](crate#bodies-and-fingerprints) fix (`None`: the
/// body part is not known yet). A path and query never contain a space, so
/// the body part is what follows the last one. Changing the form makes a
/// fleet in the middle of an upgrade answer 422 to some repeats.
pub(crate) fn fingerprint(head: &str, body: Option<&BodyPart>) -> String {
    use std::fmt::Write;
    let mut text = String::with_capacity(head.len() + BODY_PART_LEN);
    text.push_str(head);
    match body {
        None => text.push_str(" body=unknown"),
        Some(part) => {
            let kind = if part.complete { "complete" } else { "partial" };
            let _ = write!(text, " body={kind};len={};sha256=", part.len);
            push_hex(&mut text, &part.sha256);
        }
    }
    text
}

/// The head and the body part of a stored fingerprint. A body part that is
/// unknown, or not in the form above (a record written before it, or by
/// hand), is `None`: only heads are compared then.
pub(crate) fn parse_fingerprint(fingerprint: &str) -> (&str, Option<BodyPart>) {
    let Some((head, body)) = fingerprint.rsplit_once(' ') else {
        return (fingerprint, None);
    };
    (head, parse_body_part(body))
}

fn parse_body_part(text: &str) -> Option<BodyPart> {
    let rest = text.strip_prefix("body=")?;
    let (kind, rest) = rest.split_once(";len=")?;
    let complete = match kind {
        "complete" => true,
        "partial" => false,
        _ => return None,
    };
    let (len, hex) = rest.split_once(";sha256=")?;
    let all_digits = !len.is_empty() && len.bytes().all(|b| b.is_ascii_digit());
    if !all_digits || hex.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    Some(BodyPart {
        sha256: unhex(hex)?.try_into().ok()?,
        len: len.parse().ok()?,
        complete,
    })
}

/// A running SHA-256 of body bytes, and how many there were.
#[derive(Clone, Default)]
pub(crate) struct BodyHasher {
    sha: Sha256,
    len: u64,
}

impl BodyHasher {
    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.sha.update(bytes);
        self.len = self.len.saturating_add(bytes.len() as u64);
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// The body part of the bytes hashed so far; `complete` when they were
    /// the whole body.
    pub(crate) fn part(&self, complete: bool) -> BodyPart {
        BodyPart {
            sha256: self.sha.clone().finalize().into(),
            len: self.len,
            complete,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_visible_ascii_up_to_255_characters() {
        let ok = HeaderValue::from_static("order-42");
        assert_eq!(parse(&ok), Ok("order-42"));
        let quoted = HeaderValue::from_static("\"8e03978e-40d5-43e8-bc93-6894a57f9324\"");
        assert_eq!(parse(&quoted), Ok("8e03978e-40d5-43e8-bc93-6894a57f9324"));
        let max = HeaderValue::from_str(&"k".repeat(255)).unwrap();
        assert!(parse(&max).is_ok());
        let long = HeaderValue::from_str(&"k".repeat(256)).unwrap();
        assert_eq!(parse(&long), Err(Rejection::KeyTooLong));
        for bad in ["", "\"\"", "with space"] {
            let value = HeaderValue::from_str(bad).unwrap();
            assert_eq!(parse(&value), Err(Rejection::KeyInvalid), "{bad:?}");
        }
        let binary = HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap();
        assert_eq!(parse(&binary), Err(Rejection::KeyInvalid));
    }

    proptest::proptest! {
        /// Any visible-ASCII key of 1 to 255 characters is taken as it is;
        /// any longer one is refused as too long.
        #[test]
        fn keys_are_accepted_exactly_up_to_the_limit(key in "[!-~]{1,400}") {
            let value = HeaderValue::from_str(&key).unwrap();
            let quoted = key.len() >= 2 && key.starts_with('"') && key.ends_with('"');
            let inner = if quoted { &key[1..key.len() - 1] } else { &key[..] };
            match parse(&value) {
                Ok(parsed) => {
                    proptest::prop_assert_eq!(parsed, inner);
                    proptest::prop_assert!(parsed.len() <= MAX_KEY_LEN);
                }
                Err(Rejection::KeyTooLong) => proptest::prop_assert!(inner.len() > MAX_KEY_LEN),
                Err(other) => {
                    proptest::prop_assert!(inner.is_empty(), "{other:?} for {key:?}");
                }
            }
        }

        /// No two (identity, key) pairs, scoped or not, share a store key.
        #[test]
        fn namespaces_never_collide(
            a in proptest::option::of("[!-~]{0,12}"), key_a in "[!-~]{1,24}",
            b in proptest::option::of("[!-~]{0,12}"), key_b in "[!-~]{1,24}",
        ) {
            let same = a == b && key_a == key_b;
            proptest::prop_assert_eq!(
                namespaced(a.as_deref(), &key_a) == namespaced(b.as_deref(), &key_b),
                same
            );
        }
    }

    #[test]
    fn an_unscoped_key_cannot_spell_a_scoped_one() {
        let scoped = namespaced(Some("tenant-a"), "order-1");
        assert_eq!(scoped, "s:8:tenant-a:order-1");
        // The attack: an anonymous client sends the scoped record's key.
        assert_ne!(namespaced(None, "8:tenant-a:order-1"), scoped);
        assert_ne!(namespaced(None, "s:8:tenant-a:order-1"), scoped);
        assert_ne!(namespaced(Some("a:b"), "c"), namespaced(Some("a"), "b:c"));
    }

    fn complete(method: &Method, uri: &str, body: &[u8]) -> String {
        let mut hasher = BodyHasher::default();
        hasher.update(body);
        fingerprint(
            &head(method, &uri.parse().unwrap()),
            Some(&hasher.part(true)),
        )
    }

    #[test]
    fn fingerprints_differ_by_method_path_query_and_body() {
        let base = complete(&Method::POST, "http://x/orders?a=1", b"{}");
        assert_eq!(base, complete(&Method::POST, "http://x/orders?a=1", b"{}"));
        assert_ne!(base, complete(&Method::PATCH, "http://x/orders?a=1", b"{}"));
        assert_ne!(base, complete(&Method::POST, "/orders?a=2", b"{}"));
        assert_ne!(base, complete(&Method::POST, "/orders?a=1", b"{ }"));
        // The host is not part of it: two nodes behind one name agree.
        assert_eq!(base, complete(&Method::POST, "http://y/orders?a=1", b"{}"));
    }

    /// The exact strings nodes sharing a store write and compare: this test
    /// failing means a fleet in the middle of an upgrade would disagree.
    #[test]
    fn the_fingerprint_form_is_pinned() {
        let uri: Uri = "http://x/orders?a=1".parse().unwrap();
        let head = head(&Method::POST, &uri);
        assert_eq!(head, "POST /orders?a=1");
        let mut hasher = BodyHasher::default();
        hasher.update(b"{");
        hasher.update(b"}");
        assert_eq!(
            fingerprint(&head, Some(&hasher.part(true))),
            "POST /orders?a=1 body=complete;len=2;sha256=44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        assert_eq!(
            fingerprint(&head, Some(&hasher.part(false))),
            "POST /orders?a=1 body=partial;len=2;sha256=44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        assert_eq!(fingerprint(&head, None), "POST /orders?a=1 body=unknown");
        let empty = head_of("/", &Method::POST);
        assert_eq!(
            fingerprint(&empty, Some(&BodyHasher::default().part(true))),
            "POST / body=complete;len=0;sha256=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    fn head_of(uri: &str, method: &Method) -> String {
        head(method, &uri.parse().unwrap())
    }

    #[test]
    fn stored_fingerprints_parse_back_and_unknown_forms_compare_heads_only() {
        let mut hasher = BodyHasher::default();
        hasher.update(b"abc");
        for complete in [true, false] {
            let part = hasher.part(complete);
            let text = fingerprint("POST /orders", Some(&part));
            assert_eq!(parse_fingerprint(&text), ("POST /orders", Some(part)));
        }
        assert_eq!(
            parse_fingerprint("POST /orders body=unknown"),
            ("POST /orders", None)
        );
        // The form before body parts had a length, and garbage: heads only.
        let legacy =
            "POST /orders sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";
        assert_eq!(parse_fingerprint(legacy), ("POST /orders", None));
        for hostile in [
            "POST /orders body=complete;len=;sha256=00",
            "POST /orders body=complete;len=-1;sha256=44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
            "POST /orders body=partial;len=1;sha256=44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaffZZ",
            "POST /orders body=complete;len=99999999999999999999999;sha256=44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
            "POST /orders body=whole;len=1;sha256=44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
        ] {
            assert_eq!(parse_fingerprint(hostile), ("POST /orders", None), "{hostile}");
        }
        assert_eq!(parse_fingerprint("nospace"), ("nospace", None));
    }
}
