//! The same-origin check on writes. The token check is tower-breaker's
//! [`require_token`](tower_breaker::require_token), shared with its admin
//! router.

use axum::extract::Request;
use axum::http::uri::Authority;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::routes::error;

/// Refuses a write (any method but `GET` and `HEAD`) a browser says comes
/// from another site, as [`AdminPage`](super::AdminPage) states.
///
/// The bearer token alone already stops a forged form post (a browser never
/// adds it by itself); this check is the second lock, so that a page on
/// another origin holding a leaked token still cannot drive the admin page
/// from an operator's browser.
pub(crate) async fn same_origin(request: Request, next: Next) -> Response {
    let reads = matches!(*request.method(), Method::GET | Method::HEAD);
    let authority = request.uri().authority().map(Authority::as_str);
    if reads || is_same_origin(request.headers(), authority) {
        next.run(request).await
    } else {
        let refusal = "writes must come from the admin page's own origin";
        error(StatusCode::FORBIDDEN, "CROSS_ORIGIN", refusal).into_response()
    }
}

fn is_same_origin(headers: &HeaderMap, authority: Option<&str>) -> bool {
    if headers
        .get("sec-fetch-site")
        .is_some_and(|site| site.as_bytes().eq_ignore_ascii_case(b"cross-site"))
    {
        return false;
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        // Not a browser's cross-origin request: browsers send `Origin` on
        // every cross-origin POST.
        return true;
    };
    let host = headers
        .get(header::HOST)
        .map(|host| host.as_bytes())
        .or(authority.map(str::as_bytes));
    // `Origin` is `scheme://host[:port]`, or `null` for an opaque origin
    // (a sandboxed frame, a `data:` page), which is never this page.
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|origin| origin.split_once("://"))
        .map(|(_, authority)| authority.as_bytes());
    matches!((origin_host, host), (Some(a), Some(b)) if a.eq_ignore_ascii_case(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers_of(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, value.parse().unwrap());
        }
        headers
    }

    #[test]
    fn an_origin_must_name_the_host_it_was_sent_to() {
        assert!(is_same_origin(
            &headers_of(&[("host", "127.0.0.1:8080")]),
            None
        ));
        assert!(is_same_origin(
            &headers_of(&[
                ("host", "127.0.0.1:8080"),
                ("origin", "http://127.0.0.1:8080"),
            ]),
            None
        ));
        assert!(!is_same_origin(
            &headers_of(&[
                ("host", "127.0.0.1:8080"),
                ("origin", "http://127.0.0.1:8081"),
            ]),
            None
        ));
        assert!(!is_same_origin(
            &headers_of(&[
                ("host", "admin.internal"),
                ("origin", "https://evil.example"),
            ]),
            None
        ));
        assert!(!is_same_origin(
            &headers_of(&[("host", "admin.internal"), ("origin", "null"),]),
            None
        ));
        // An origin with no Host to compare with is not trusted.
        assert!(!is_same_origin(
            &headers_of(&[("origin", "http://a")]),
            None
        ));
    }

    #[test]
    fn over_http2_the_uri_authority_stands_for_host() {
        // HTTP/2 carries `:authority`, which hyper puts in the URI, not `Host`.
        let origin = headers_of(&[("origin", "https://admin.internal:8443")]);
        assert!(is_same_origin(&origin, Some("admin.internal:8443")));
        assert!(!is_same_origin(&origin, Some("admin.internal:9443")));
        // A `Host` header, when present, is what the request was sent to.
        let both = headers_of(&[
            ("host", "other.internal"),
            ("origin", "https://admin.internal:8443"),
        ]);
        assert!(!is_same_origin(&both, Some("admin.internal:8443")));
    }

    #[test]
    fn a_cross_site_fetch_is_refused_even_without_an_origin() {
        assert!(!is_same_origin(
            &headers_of(&[("host", "admin.internal"), ("sec-fetch-site", "cross-site"),]),
            None
        ));
        assert!(is_same_origin(
            &headers_of(&[
                ("host", "admin.internal"),
                ("sec-fetch-site", "same-origin"),
            ]),
            None
        ));
    }
}
