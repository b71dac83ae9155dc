//! Removing secrets from headers before anything is stored.

use std::fmt;
use std::sync::Arc;

use http::header::{HeaderMap, HeaderName, AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION, SET_COOKIE};

use crate::entry::StoredHeader;

/// The text stored in place of a sensitive header's value.
pub const REDACTED: &str = "[redacted]";

/// Replaces the values of sensitive headers with `[redacted]`.
///
/// Always redacted: `Authorization`, `Proxy-Authorization`, `Cookie`,
/// `Set-Cookie` and `X-Api-Key`. Add more with [`with_header`](Self::with_header).
/// The header is kept (with its name) so an operator can see a credential was
/// sent; [replay](mod@crate::replay) drops redacted headers rather than sending the
/// placeholder.
///
/// ```
/// use tower_poison::Redactor;
///
/// let redactor = Redactor::new().with_header("x-session".parse().unwrap());
/// assert!(redactor.is_sensitive("Authorization"));
/// assert!(redactor.is_sensitive("X-Session"));
/// assert!(!redactor.is_sensitive("content-type"));
/// ```
#[derive(Clone)]
pub struct Redactor {
    names: Arc<[HeaderName]>,
}

impl Default for Redactor {
    fn default() -> Self {
        Self::new()
    }
}

impl Redactor {
    /// The redactor with the built-in list.
    pub fn new() -> Self {
        Redactor {
            names: Arc::new([
                AUTHORIZATION,
                PROXY_AUTHORIZATION,
                COOKIE,
                SET_COOKIE,
                HeaderName::from_static("x-api-key"),
            ]),
        }
    }

    /// Also redacts `name`.
    pub fn with_header(mut self, name: HeaderName) -> Self {
        if !self.names.contains(&name) {
            let mut names = self.names.to_vec();
            names.push(name);
            self.names = names.into();
        }
        self
    }

    /// `true` when a header called `name` (any case) is redacted.
    pub fn is_sensitive(&self, name: &str) -> bool {
        self.names
            .iter()
            .any(|sensitive| sensitive.as_str().eq_ignore_ascii_case(name))
    }

    /// Redacts stored headers in place.
    pub fn redact(&self, headers: &mut [StoredHeader]) {
        for header in headers {
            if self.is_sensitive(&header.name) {
                header.value = REDACTED.to_owned();
            }
        }
    }

    /// The headers of a request, redacted, as an entry stores them.
    pub fn redact_map(&self, headers: &HeaderMap) -> Vec<StoredHeader> {
        let mut stored: Vec<StoredHeader> = headers
            .iter()
            .map(|(name, value)| StoredHeader {
                name: name.as_str().to_owned(),
                value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
            })
            .collect();
        self.redact(&mut stored);
        stored
    }
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

        let redactor = Redactor::new().with_header(HeaderName::from_static("x-tenant-token"));
        let stored = redactor.redact_map(&headers);

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
