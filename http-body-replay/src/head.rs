//! [`RequestHead`], a request's head copied for later.

use std::fmt;

use http::header::{HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Request, Uri, Version};

/// A request's method, URI, version and headers, copied into one buffer of
/// their exact size: what a retry, a hedge or a dead-letter record needs of
/// a request after the service below has consumed it (see the
/// [crate docs](crate#the-requests-head) for why, and an example).
///
/// [`to_request`](Self::to_request) rebuilds a request equal to the
/// original in everything but its extensions (which are not copied: keep
/// `request.extensions().clone()` beside it when they are needed).
#[derive(Clone)]
pub struct RequestHead {
    /// The method, the URI as `Uri`'s `Display` writes it, then each header
    /// as a [`HEADER_PREFIX`]-byte prefix (the name's length and the
    /// value's, `u32` native order, and the value's sensitivity) followed by
    /// the name's and the value's bytes.
    bytes: Box<[u8]>,
    method_end: u32,
    /// The end of the scheme (before its `://`), or `method_end` without one.
    scheme_end: u32,
    /// The end of the authority, or where it would start without one.
    authority_end: u32,
    uri_end: u32,
    version: Version,
    /// `false` when the head did not fit in `u32::MAX` bytes and its headers
    /// were left out: it describes the request, but does not rebuild it.
    complete: bool,
}

const HEADER_PREFIX: usize = 9;

impl RequestHead {
    /// Copies `request`'s head (the body is not touched).
    #[inline]
    pub fn new<B>(request: &Request<B>) -> Self {
        Self::from_parts(
            request.method(),
            request.uri(),
            request.version(),
            request.headers(),
        )
    }

    /// Copies a head given in parts: not generic, so one copy of it serves
    /// every body type.
    fn from_parts(method: &Method, uri: &Uri, version: Version, headers: &http::HeaderMap) -> Self {
        let method = method.as_str();
        // The URI as `Display` writes it, in as few copies as possible:
        // "http://" and "https://" as constants, the path and query as one
        // string ("/" for an absolute URI without a path, nothing for an
        // authority-form one).
        let scheme = uri.scheme();
        let authority = uri.authority().map(Authority::as_str);
        let path_and_query = uri.path_and_query().map_or("", PathAndQuery::as_str);
        let uri_len = scheme.map_or(0, |scheme| scheme.as_str().len() + 3)
            + authority.map_or(0, str::len)
            + path_and_query.len();
        let headers_len: usize = headers
            .iter()
            .map(|(name, value)| HEADER_PREFIX + name.as_str().len() + value.len())
            .sum();
        // A `Uri` keeps under 64 KiB and a method is a short token; only the
        // headers can make a head too large for `u32` offsets.
        let complete = (method.len() + uri_len)
            .checked_add(headers_len)
            .is_some_and(|len| len <= u32::MAX as usize);
        let capacity = method.len() + uri_len + if complete { headers_len } else { 0 };
        let mut bytes = Vec::with_capacity(capacity);
        bytes.extend_from_slice(method.as_bytes());
        let method_end = bytes.len() as u32;
        match scheme {
            None => {}
            Some(scheme) if *scheme == Scheme::HTTP => bytes.extend_from_slice(b"http://"),
            Some(scheme) if *scheme == Scheme::HTTPS => bytes.extend_from_slice(b"https://"),
            Some(scheme) => {
                bytes.extend_from_slice(scheme.as_str().as_bytes());
                bytes.extend_from_slice(b"://");
            }
        }
        // Before the "://".
        let scheme_end = match scheme {
            None => method_end,
            Some(_) => bytes.len() as u32 - 3,
        };
        if let Some(authority) = authority {
            bytes.extend_from_slice(authority.as_bytes());
        }
        let authority_end = bytes.len() as u32;
        bytes.extend_from_slice(path_and_query.as_bytes());
        let uri_end = bytes.len() as u32;
        if complete {
            for (name, value) in headers {
                let name = name.as_str().as_bytes();
                let value_bytes = value.as_bytes();
                let mut prefix = [0; HEADER_PREFIX];
                prefix[..4].copy_from_slice(&(name.len() as u32).to_ne_bytes());
                prefix[4..8].copy_from_slice(&(value_bytes.len() as u32).to_ne_bytes());
                prefix[8] = u8::from(value.is_sensitive());
                bytes.extend_from_slice(&prefix);
                bytes.extend_from_slice(name);
                bytes.extend_from_slice(value_bytes);
            }
        }
        RequestHead {
            // Exact capacity: no reallocation.
            bytes: bytes.into_boxed_slice(),
            method_end,
            scheme_end,
            authority_end,
            uri_end,
            version,
            complete,
        }
    }

    /// The method.
    pub fn method(&self) -> &str {
        self.str(0, self.method_end)
    }

    /// The URI, as `Uri`'s `Display` writes it.
    pub fn uri(&self) -> &str {
        self.str(self.method_end, self.uri_end)
    }

    /// The HTTP version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The headers in the request's order, a name once per value.
    pub fn headers(&self) -> Headers<'_> {
        let rest = if self.complete {
            &self.bytes[self.uri_end as usize..]
        } else {
            &[]
        };
        Headers { rest }
    }

    /// `false` for a head whose headers did not fit in 4 GiB and were left
    /// out: [`headers`](Self::headers) is then empty and
    /// [`to_request`](Self::to_request) refuses.
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// A request with this head and `body`, or `None` for a head that
    /// [is not complete](Self::is_complete). Each part is parsed again from
    /// its copy, and so, coming from a valid request, parses.
    pub fn to_request<B>(&self, body: B) -> Option<Request<B>> {
        if !self.complete {
            return None;
        }
        let mut request = Request::new(body);
        *request.method_mut() = Method::from_bytes(self.method().as_bytes()).ok()?;
        *request.uri_mut() = self.rebuild_uri()?;
        *request.version_mut() = self.version;
        let headers = request.headers_mut();
        for header in self.headers() {
            let name = HeaderName::from_bytes(header.name.as_bytes()).ok()?;
            let mut value = HeaderValue::from_bytes(header.value).ok()?;
            value.set_sensitive(header.sensitive);
            headers.append(name, value);
        }
        Some(request)
    }

    fn rebuild_uri(&self) -> Option<Uri> {
        let mut parts = http::uri::Parts::default();
        let scheme = &self.bytes[self.method_end as usize..self.scheme_end as usize];
        let authority_start = if scheme.is_empty() {
            self.scheme_end as usize
        } else {
            parts.scheme = Some(Scheme::try_from(scheme).ok()?);
            self.scheme_end as usize + 3
        };
        let authority = &self.bytes[authority_start..self.authority_end as usize];
        if !authority.is_empty() {
            parts.authority = Some(Authority::try_from(authority).ok()?);
        }
        let path_and_query = &self.bytes[self.authority_end as usize..self.uri_end as usize];
        if !path_and_query.is_empty() {
            parts.path_and_query = Some(PathAndQuery::try_from(path_and_query).ok()?);
        }
        Uri::from_parts(parts).ok()
    }

    fn str(&self, start: u32, end: u32) -> &str {
        // Copied from `&str`s, and cut at their ends only.
        std::str::from_utf8(&self.bytes[start as usize..end as usize])
            .expect("the method and URI are copied from `&str`s")
    }
}

impl fmt::Debug for RequestHead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Header values are left out: they may be credentials.
        f.debug_struct("RequestHead")
            .field("method", &self.method())
            .field("uri", &self.uri())
            .field("version", &self.version)
            .field("headers", &self.headers().count())
            .finish()
    }
}

/// One header of a [`RequestHead`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopiedHeader<'a> {
    /// The name, in lower case.
    pub name: &'a str,
    /// The value's bytes.
    pub value: &'a [u8],
    /// Whether the value was marked [sensitive](HeaderValue::is_sensitive).
    pub sensitive: bool,
}

/// The headers of a [`RequestHead`], in order; see [`RequestHead::headers`].
#[derive(Clone, Debug)]
pub struct Headers<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Headers<'a> {
    type Item = CopiedHeader<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        let (prefix, after) = self.rest.split_first_chunk::<HEADER_PREFIX>()?;
        let name_len = u32::from_ne_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        let value_len = u32::from_ne_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]) as usize;
        let (name, after) = after.split_at(name_len);
        let (value, after) = after.split_at(value_len);
        self.rest = after;
        Some(CopiedHeader {
            // A `HeaderName` is lower-case ASCII.
            name: std::str::from_utf8(name).expect("a header name is ASCII"),
            value,
            sensitive: prefix[8] != 0,
        })
    }
}
