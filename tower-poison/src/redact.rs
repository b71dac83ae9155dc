//! Removing secrets from headers, URIs and bodies before anything is stored.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderName, AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION, SET_COOKIE};

use crate::entry::StoredHeader;

/// The text stored in place of a sensitive header's value.
pub const REDACTED: &str = "[redacted]";

/// Header names whose values are always redacted.
const SENSITIVE_HEADERS: [&str; 11] = [
    "x-api-key",
    "x-auth-token",
    "x-access-token",
    "x-refresh-token",
    "x-amz-security-token",
    "x-goog-api-key",
    "x-csrf-token",
    "x-xsrf-token",
    "x-vault-token",
    "x-session-token",
    "x-upload-token",
];

/// Query parameter and JSON field names whose values are redacted by
/// default (any case); a name ending in `*` is a prefix.
const SENSITIVE_NAMES: [&str; 14] = [
    "access_token",
    "refresh_token",
    "id_token",
    "token",
    "api_key",
    "apikey",
    "key",
    "sig",
    "signature",
    "x-amz-*",
    "code",
    "password",
    "secret",
    "client_secret",
];

/// Replaces secrets with `[redacted]` before a request is stored or logged.
///
/// - **Headers**: `Authorization`, `Proxy-Authorization`, `Cookie`,
///   `Set-Cookie`, and the common token headers (`X-Api-Key`, `X-Auth-Token`,
///   `X-Amz-Security-Token`, …). Add more with
///   [`with_header`](Self::with_header). The header is kept (with its name)
///   so an operator can see a credential was sent;
///   [replay](mod@crate::replay) drops redacted headers rather than sending
///   the placeholder.
/// - **URIs**: the userinfo (`user:password@`) always, and the values of
///   query parameters named `access_token`, `token`, `api_key`, `key`, `sig`,
///   `signature`, `X-Amz-*` (a presigned URL's signature), `code`,
///   `password` and a few more (any case). Add more with
///   [`with_name`](Self::with_name).
/// - **JSON bodies**: the values of object fields with those same names, at
///   any depth. [`with_body_hook`](Self::with_body_hook) and
///   [`with_error_hook`](Self::with_error_hook) add your own rules for
///   bodies and for error texts. Text that is not JSON loses only its
///   `"name": value` pairs: a form's `password=…` is stored as it is
///   unless a body hook takes it out.
///
/// An entry with a secret redacted from its URI or body cannot be replayed
/// ([`http_request`](crate::replay::http_request) refuses it).
///
/// ```
/// # tokio_test::block_on(async {
/// use http::Request;
/// use http_body_util::Full;
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_poison::store::{DeadLetterStore, ListQuery, MemoryStore};
/// use tower_poison::{DeadLetterLayer, Redactor, REDACTED};
///
/// let store = MemoryStore::new(100);
/// let redactor = Redactor::default().with_header("x-session".parse().unwrap());
/// let layer = DeadLetterLayer::new(store.clone()).redactor(redactor);
/// let failing = service_fn(|_: Request<_>| async {
///     Err::<http::Response<()>, _>(std::io::Error::other("connection reset"))
/// });
/// let request = Request::post("https://bob:hunter2@api.example/v1?access_token=abc&page=2")
///     .header("authorization", "Bearer abc")
///     .header("x-session", "s3cr3t")
///     .header("content-type", "application/json")
///     .body(Full::new(bytes::Bytes::from_static(br#"{"password":"hunter2","sku":42}"#)))
///     .unwrap();
/// let _ = layer.layer(failing).oneshot(request).await;
///
/// let entry = store.list(ListQuery::default()).await.unwrap().entries.remove(0);
/// let header = |name: &str| entry.headers.iter().find(|h| h.name == name).unwrap().value.clone();
/// assert_eq!(header("authorization"), REDACTED);
/// assert_eq!(header("x-session"), REDACTED);
/// assert_eq!(header("content-type"), "application/json");
/// assert_eq!(
///     entry.uri.as_deref(),
///     Some("https://[redacted]@api.example/v1?access_token=[redacted]&page=2")
/// );
/// assert_eq!(entry.body, r#"{"password":"[redacted]","sku":42}"#);
/// # });
/// ```
#[derive(Clone)]
pub struct Redactor {
    names: Arc<[HeaderName]>,
    fields: Arc<[String]>,
    body_hook: Option<Hook>,
    error_hook: Option<Hook>,
}

type Hook = Arc<dyn Fn(&mut String) + Send + Sync>;

/// The redactor with the built-in lists.
impl Default for Redactor {
    fn default() -> Self {
        let headers = [AUTHORIZATION, PROXY_AUTHORIZATION, COOKIE, SET_COOKIE]
            .into_iter()
            .chain(SENSITIVE_HEADERS.map(HeaderName::from_static));
        Redactor {
            names: headers.collect(),
            fields: SENSITIVE_NAMES.map(str::to_owned).into(),
            body_hook: None,
            error_hook: None,
        }
    }
}

impl Redactor {
    /// Also redacts query parameters and JSON fields called `name` (any
    /// case; a trailing `*` makes it a prefix).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.fields = self.fields.iter().cloned().chain([name.into()]).collect();
        self
    }

    /// Runs `hook` on every stored body that is UTF-8 text, after the JSON
    /// fields are redacted.
    pub fn with_body_hook(mut self, hook: impl Fn(&mut String) + Send + Sync + 'static) -> Self {
        self.body_hook = Some(Arc::new(hook));
        self
    }

    /// Runs `hook` on every line of a stored error chain.
    pub fn with_error_hook(mut self, hook: impl Fn(&mut String) + Send + Sync + 'static) -> Self {
        self.error_hook = Some(Arc::new(hook));
        self
    }

    fn is_sensitive_name(&self, name: &str) -> bool {
        self.fields
            .iter()
            .any(|field| match field.strip_suffix('*') {
                Some(prefix) => name
                    .get(..prefix.len())
                    .is_some_and(|start| start.eq_ignore_ascii_case(prefix)),
                None => field.eq_ignore_ascii_case(name),
            })
    }

    /// `uri` without its userinfo and with the values of sensitive query
    /// parameters replaced.
    pub(crate) fn redact_uri(&self, uri: &str) -> String {
        let [scheme, authority, path, query, fragment] = split_uri(uri);
        let mut out = String::with_capacity(uri.len());
        out.push_str(scheme);
        // The userinfo ends at the authority's last `@`.
        match authority.rfind('@') {
            Some(at) => out.extend([REDACTED, &authority[at..]]),
            None => out.push_str(authority),
        }
        out.push_str(path);
        if let Some(query) = query.strip_prefix('?') {
            out.push('?');
            for (i, pair) in query.split('&').enumerate() {
                if i > 0 {
                    out.push('&');
                }
                match pair.split_once('=') {
                    Some((name, _)) if self.is_sensitive_name(name) => {
                        out.extend([name, "=", REDACTED]);
                    }
                    _ => out.push_str(pair),
                }
            }
        }
        out.push_str(fragment);
        out
    }

    /// A stored body: JSON fields with sensitive names redacted (at any
    /// depth), then the body hook. Text that does not parse as JSON (a body
    /// cut short, say) has the same fields redacted where `"name": value`
    /// appears in it; a body that is not text is kept as it is.
    pub(crate) fn redact_body(&self, body: Bytes) -> Bytes {
        // `None`: nothing redacted, the body stays as it is.
        let redacted = match serde_json::from_slice::<serde_json::Value>(&body) {
            Ok(mut json) if json.is_object() || json.is_array() => {
                self.redact_json(&mut json).then(|| json.to_string())
            }
            Ok(_) => None,
            Err(_) => std::str::from_utf8(&body)
                .ok()
                .and_then(|text| self.redact_json_text(text)),
        };
        let Some(hook) = &self.body_hook else {
            return redacted.map_or(body, Bytes::from);
        };
        let mut text = match redacted {
            Some(text) => text,
            None => match std::str::from_utf8(&body) {
                Ok(text) => text.to_owned(),
                Err(_) => return body,
            },
        };
        hook(&mut text);
        Bytes::from(text)
    }

    fn redact_json(&self, value: &mut serde_json::Value) -> bool {
        let mut changed = false;
        match value {
            serde_json::Value::Object(fields) => {
                for (name, field) in fields.iter_mut() {
                    if self.is_sensitive_name(name) && !field.is_object() && !field.is_array() {
                        *field = serde_json::Value::String(REDACTED.to_owned());
                        changed = true;
                    } else {
                        changed |= self.redact_json(field);
                    }
                }
            }
            serde_json::Value::Array(items) => {
                for item in items {
                    changed |= self.redact_json(item);
                }
            }
            _ => {}
        }
        changed
    }

    /// Redacts `"name": value` in text that is not whole JSON; `None` when
    /// nothing was redacted.
    fn redact_json_text(&self, text: &str) -> Option<String> {
        let bytes = text.as_bytes();
        let mut out = String::with_capacity(text.len());
        let mut copied = 0;
        let mut changed = false;
        let mut at = 0;
        while let Some(offset) = text[at..].find('"') {
            let open = at + offset;
            let Some(len) = text[open + 1..].find('"') else {
                break;
            };
            let close = open + 1 + len;
            let name = &text[open + 1..close];
            at = close + 1;
            if !self.is_sensitive_name(name) {
                continue;
            }
            let skip_space = |from: usize| {
                from + bytes[from..]
                    .iter()
                    .take_while(|b| b.is_ascii_whitespace())
                    .count()
            };
            let value = skip_space(at);
            if bytes.get(value) != Some(&b':') {
                continue;
            }
            let value = skip_space(value + 1);
            let end = if bytes.get(value) == Some(&b'"') {
                // A string, to its closing quote (or the end of a cut body).
                let mut end = value + 1;
                while end < bytes.len() && bytes[end] != b'"' {
                    end += if bytes[end] == b'\\' { 2 } else { 1 };
                }
                (end + 1).min(bytes.len())
            } else if matches!(bytes.get(value), Some(b'{' | b'[')) || value >= bytes.len() {
                continue;
            } else {
                let mut end = value;
                while end < bytes.len() && !matches!(bytes[end], b',' | b'}' | b']') {
                    end += 1;
                }
                end
            };
            out.extend([&text[copied..value], "\"", REDACTED, "\""]);
            copied = end;
            at = end;
            changed = true;
        }
        changed.then(|| {
            out.push_str(&text[copied..]);
            out
        })
    }

    /// Runs the error hook on every line of an error chain.
    pub(crate) fn redact_errors(&self, errors: &mut [String]) {
        if let Some(hook) = &self.error_hook {
            for line in errors {
                hook(line);
            }
        }
    }

    /// Also redacts `name`.
    pub fn with_header(mut self, name: HeaderName) -> Self {
        if !self.names.contains(&name) {
            self.names = self.names.iter().cloned().chain([name]).collect();
        }
        self
    }

    /// `true` when a header called `name` (any case) is redacted.
    pub(crate) fn is_sensitive(&self, name: &str) -> bool {
        self.names
            .iter()
            .any(|sensitive| sensitive.as_str().eq_ignore_ascii_case(name))
    }

    /// Redacts stored headers in place.
    pub(crate) fn redact(&self, headers: &mut [StoredHeader]) {
        for header in headers {
            if self.is_sensitive(&header.name) {
                header.value = REDACTED.to_owned();
            }
        }
    }
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("headers", &self.names)
            .field("names", &self.fields)
            .field("body_hook", &self.body_hook.is_some())
            .field("error_hook", &self.error_hook.is_some())
            .finish()
    }
}

/// Where the authority of `uri` (without its query) starts: after
/// `scheme://`, or after a leading `//`. `None` for a path, even one that
/// holds `//` or `://` further on.
fn authority_start(uri: &str) -> Option<usize> {
    if uri.starts_with("//") {
        return Some(2);
    }
    let scheme_end = uri.find("://")?;
    let scheme = &uri[..scheme_end];
    let mut bytes = scheme.bytes();
    // A letter, then letters, digits, `+`, `-` or `.`.
    let is_scheme = bytes
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    is_scheme.then_some(scheme_end + 3)
}

/// The path of a stored URI, without its scheme, userinfo, authority,
/// query or fragment.
pub(crate) fn uri_path(uri: &str) -> &str {
    let [scheme, _, path, ..] = split_uri(uri);
    if path.is_empty() && !scheme.is_empty() {
        "/"
    } else {
        path
    }
}

/// A stored URI's parts: `scheme://` (or a leading `//`), the authority
/// (both empty for a path), the path, the query from its `?` and the
/// fragment from its `#`.
fn split_uri(uri: &str) -> [&str; 5] {
    let (uri, fragment) = uri.split_at(uri.find('#').unwrap_or(uri.len()));
    let (uri, query) = uri.split_at(uri.find('?').unwrap_or(uri.len()));
    let (scheme, rest) = uri.split_at(authority_start(uri).unwrap_or(0));
    let authority_len = match scheme {
        "" => 0,
        _ => rest.find('/').unwrap_or(rest.len()),
    };
    let (authority, path) = rest.split_at(authority_len);
    [scheme, authority, path, query, fragment]
}

#[cfg(test)]
mod tests {
    use http::header::HeaderMap;

    use super::*;

    /// The headers of a request, redacted, as an entry stores them.
    fn redact_map(redactor: &Redactor, headers: &HeaderMap) -> Vec<StoredHeader> {
        let mut stored: Vec<StoredHeader> = headers
            .iter()
            .map(|(name, value)| StoredHeader {
                name: name.as_str().to_owned(),
                value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
            })
            .collect();
        redactor.redact(&mut stored);
        stored
    }

    #[test]
    fn uris_lose_userinfo_and_sensitive_query_values() {
        let redactor = Redactor::default().with_name("session");
        let cases = [
            ("/v1/items?page=2", "/v1/items?page=2"),
            (
                "https://u:SECRET@host:8443/p?Access_Token=SECRET&x=1#frag",
                "https://[redacted]@host:8443/p?Access_Token=[redacted]&x=1#frag",
            ),
            (
                "https://bucket.s3/k?X-Amz-Signature=SECRET&X-Amz-Credential=SECRET&v=1",
                "https://bucket.s3/k?X-Amz-Signature=[redacted]&X-Amz-Credential=[redacted]&v=1",
            ),
            ("/cb?code=SECRET&state=s", "/cb?code=[redacted]&state=s"),
            ("/s?session=SECRET", "/s?session=[redacted]"),
            ("/flag?token", "/flag?token"),
            // A path holding `//` or `://` has no authority to redact.
            ("/v1//a@b/c?x=1", "/v1//a@b/c?x=1"),
            (
                "/go/https://u:p@elsewhere?sig=SECRET",
                "/go/https://u:p@elsewhere?sig=[redacted]",
            ),
            ("//u:SECRET@host/p", "//[redacted]@host/p"),
            ("", ""),
            ("a?", "a?"),
            (
                "http://u@h?token=SECRET#f?token=x",
                "http://[redacted]@h?token=[redacted]#f?token=x",
            ),
            ("//h?token=SECRET&&", "//h?token=[redacted]&&"),
        ];
        for (uri, expected) in cases {
            assert_eq!(redactor.redact_uri(uri), expected, "{uri}");
        }
        assert_eq!(uri_path("https://u:SECRET@host/p/q?token=SECRET"), "/p/q");
        assert_eq!(uri_path("/p?token=SECRET"), "/p");
        assert_eq!(uri_path("/v1//a?b"), "/v1//a");
        assert_eq!(uri_path("http://u@h?x#f"), "/");
        assert_eq!(uri_path("//h/p#f/g"), "/p");
        assert_eq!(uri_path("?q"), "");
    }

    #[test]
    fn json_bodies_lose_sensitive_fields_at_any_depth_even_cut_short() {
        let redactor = Redactor::default();
        let body = Bytes::from_static(
            br#"{"user":"bob","password":"SECRET","nested":[{"api_key":123}],"n":1}"#,
        );
        let redacted = redactor.redact_body(body);
        let json: serde_json::Value = serde_json::from_slice(&redacted).unwrap();
        assert_eq!(json["password"], REDACTED);
        assert_eq!(json["nested"][0]["api_key"], REDACTED);
        assert_eq!(
            (json["user"].as_str(), json["n"].as_i64()),
            (Some("bob"), Some(1))
        );

        let cut = Bytes::from_static(br#"{"user":"bob", "Password" : "SEC\"RET", "token": 42, "x"#);
        let redacted = redactor.redact_body(cut);
        let text = std::str::from_utf8(&redacted).unwrap();
        assert!(!text.contains("SEC") && !text.contains("42"), "{text}");
        assert!(text.starts_with(r#"{"user":"bob""#), "{text}");

        let plain = Bytes::from_static(b"not json, no secrets");
        assert_eq!(redactor.redact_body(plain.clone()), plain);
        let binary = Bytes::from_static(&[0xff, 0x00, 0x01]);
        assert_eq!(redactor.redact_body(binary.clone()), binary);
    }

    proptest::proptest! {
        /// Hostile URIs and bodies never panic, and a sensitive query value
        /// or JSON field never survives.
        #[test]
        fn redaction_is_total_and_drops_the_secret(
            prefix in "\\PC{0,40}",
            secret in "[A-Za-z0-9]{8,16}",
            junk in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
        ) {
            let redactor = Redactor::default();
            let _ = redactor.redact_uri(&prefix);
            let _ = uri_path(&prefix);
            let _ = redactor.redact_body(Bytes::from(junk));
            let uri = format!("https://h/{}?a=1&token={secret}", prefix.replace(['?', '#', '&'], ""));
            proptest::prop_assert!(!redactor.redact_uri(&uri).contains(&secret));
            let body = format!(r#"{{"x":"{}","password":"{secret}"}}"#, prefix.replace(['"', '\\'], ""));
            let redacted = redactor.redact_body(Bytes::from(body));
            proptest::prop_assert!(!String::from_utf8_lossy(&redacted).contains(&secret));
        }
    }

    #[test]
    fn hooks_run_on_bodies_and_error_texts() {
        let redactor = Redactor::default()
            .with_body_hook(|body| *body = body.replace("4111-1111", "[card]"))
            .with_error_hook(|line| *line = line.replace("tenant-7", "[tenant]"));
        let body = redactor.redact_body(Bytes::from_static(b"card 4111-1111"));
        assert_eq!(body, "card [card]");
        let mut errors = vec!["denied for tenant-7".to_owned()];
        redactor.redact_errors(&mut errors);
        assert_eq!(errors, ["denied for [tenant]"]);
    }

    #[test]
    fn built_in_and_configured_headers_are_redacted_and_others_kept() {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, "Bearer secret".parse().unwrap());
        headers.insert(PROXY_AUTHORIZATION, "Basic c2VjcmV0".parse().unwrap());
        headers.insert(COOKIE, "session=secret".parse().unwrap());
        headers.append(SET_COOKIE, "a=secret".parse().unwrap());
        headers.append(SET_COOKIE, "b=secret".parse().unwrap());
        headers.insert("x-api-key", "secret".parse().unwrap());
        headers.insert("x-tenant-token", "secret".parse().unwrap());
        headers.insert("content-type", "application/json".parse().unwrap());

        let redactor = Redactor::default().with_header(HeaderName::from_static("x-tenant-token"));
        let stored = redact_map(&redactor, &headers);

        assert_eq!(stored.len(), 8);
        for header in &stored {
            if header.name == "content-type" {
                assert_eq!(header.value, "application/json");
            } else {
                assert_eq!(header.value, REDACTED, "{} leaked", header.name);
            }
        }
        assert!(!stored.iter().any(|h| h.value.contains("secret")));
    }
}
