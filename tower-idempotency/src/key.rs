//! Keys: what a client sends, where a store keeps it, and what makes two
//! requests "the same".

use http::{HeaderValue, Method, Uri};
use sha2::{Digest, Sha256};

use crate::rejection::Rejection;

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

/// Where a store keeps `key`. Unscoped keys live under `u:`, keys scoped by
/// a client identity under `s:{len}:{identity}:`. The prefixes differ in
/// their first byte, so no unscoped key (whatever it spells) can name a
/// scoped record; the identity's length goes first, so no identity/key pair
/// can spell another's (`a:b` + `c` vs `a` + `b:c`).
pub(crate) fn namespaced(identity: Option<&str>, key: &str) -> String {
    match identity {
        Some(identity) => format!("s:{}:{identity}:{key}", identity.len()),
        None => format!("u:{key}"),
    }
}

/// What makes two requests "the same": method, path and query, and the
/// SHA-256 of the body (of its first bytes when it was longer than the
/// fingerprint limit, marked `+`). Stable across processes and versions, so
/// nodes sharing a store agree.
pub(crate) fn fingerprint(method: &Method, uri: &Uri, body: &[u8], truncated: bool) -> String {
    use std::fmt::Write;
    let digest = Sha256::digest(body);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut text = String::with_capacity(method.as_str().len() + path.len() + 80);
    let _ = write!(text, "{method} {path} sha256:");
    for byte in digest {
        let _ = write!(text, "{byte:02x}");
    }
    if truncated {
        text.push('+');
    }
    text
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

    #[test]
    fn fingerprints_differ_by_method_path_query_and_body() {
        let uri: Uri = "http://x/orders?a=1".parse().unwrap();
        let base = fingerprint(&Method::POST, &uri, b"{}", false);
        assert_eq!(base, fingerprint(&Method::POST, &uri, b"{}", false));
        assert_ne!(base, fingerprint(&Method::PATCH, &uri, b"{}", false));
        assert_ne!(
            base,
            fingerprint(&Method::POST, &"/orders?a=2".parse().unwrap(), b"{}", false)
        );
        assert_ne!(base, fingerprint(&Method::POST, &uri, b"{ }", false));
        assert_ne!(base, fingerprint(&Method::POST, &uri, b"{}", true));
        // The host is not part of it: two nodes behind one name agree.
        let other_host: Uri = "http://y/orders?a=1".parse().unwrap();
        assert_eq!(base, fingerprint(&Method::POST, &other_host, b"{}", false));
        assert_eq!(
            base,
            "POST /orders?a=1 sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }
}
