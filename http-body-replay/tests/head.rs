//! `RequestHead`: what it copies reads back, and rebuilds the request.

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Uri, Version};
use http_body_replay::{CopiedHeader, RequestHead};
use proptest::prelude::*;

fn method() -> impl Strategy<Value = Method> {
    prop_oneof![
        Just(Method::GET),
        Just(Method::POST),
        Just(Method::PUT),
        Just(Method::DELETE),
        Just(Method::OPTIONS),
        "[A-Z]{1,24}".prop_map(|name| Method::from_bytes(name.as_bytes()).unwrap()),
    ]
}

fn uri() -> impl Strategy<Value = Uri> {
    let segment = "[a-zA-Z0-9._~-]{0,12}";
    let path = proptest::collection::vec(segment, 0..4).prop_map(|segments| {
        let mut path = String::new();
        for segment in segments {
            path.push('/');
            path.push_str(&segment);
        }
        path
    });
    let query = proptest::option::of("[a-z0-9=&%]{0,16}");
    let host = "[a-z]{1,10}(\\.[a-z]{1,6})?(:[1-9][0-9]{0,3})?";
    (0..3usize, path, query, host, prop::bool::ANY).prop_map(|(form, path, query, host, https)| {
        let path_and_query = match (path.is_empty(), query) {
            (true, None) => "/".to_owned(),
            (true, Some(query)) => format!("/?{query}"),
            (false, None) => path,
            (false, Some(query)) => format!("{path}?{query}"),
        };
        let text = match form {
            0 => path_and_query,
            1 => {
                let scheme = if https { "https" } else { "http" };
                format!("{scheme}://{host}{path_and_query}")
            }
            // Authority form, as a CONNECT carries it.
            _ if host.contains(':') => host,
            _ => format!("{host}:443"),
        };
        text.parse().unwrap()
    })
}

fn headers() -> impl Strategy<Value = HeaderMap> {
    let name = prop_oneof![
        Just("accept".to_owned()),
        Just("content-type".to_owned()),
        Just("authorization".to_owned()),
        "x-[a-z0-9-]{1,12}",
    ];
    // Every byte a `HeaderValue` takes: tab, visible ASCII, obs-text.
    let value =
        proptest::collection::vec(prop_oneof![Just(b'\t'), 0x20u8..0x7f, 0x80u8..=0xff], 0..40);
    proptest::collection::vec((name, value, prop::bool::ANY), 0..12).prop_map(|entries| {
        let mut headers = HeaderMap::new();
        for (name, value, sensitive) in entries {
            let mut value = HeaderValue::from_bytes(&value).unwrap();
            value.set_sensitive(sensitive);
            headers.append(HeaderName::from_bytes(name.as_bytes()).unwrap(), value);
        }
        headers
    })
}

fn version() -> impl Strategy<Value = Version> {
    prop_oneof![
        Just(Version::HTTP_09),
        Just(Version::HTTP_10),
        Just(Version::HTTP_11),
        Just(Version::HTTP_2),
        Just(Version::HTTP_3),
    ]
}

/// Each name's values in order, with their sensitivity: what `HeaderMap`'s
/// equality leaves out.
fn values(headers: &HeaderMap) -> Vec<(String, Vec<u8>, bool)> {
    headers
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                value.as_bytes().to_vec(),
                value.is_sensitive(),
            )
        })
        .collect()
}

proptest! {
    #[test]
    fn a_copied_head_reads_back_and_rebuilds_the_request(
        method in method(),
        uri in uri(),
        version in version(),
        headers in headers(),
    ) {
        let mut request = Request::new(());
        *request.method_mut() = method.clone();
        *request.uri_mut() = uri.clone();
        *request.version_mut() = version;
        *request.headers_mut() = headers.clone();
        let head = RequestHead::new(&request);

        prop_assert!(head.is_complete());
        prop_assert_eq!(head.method(), method.as_str());
        prop_assert_eq!(head.uri(), uri.to_string());
        prop_assert_eq!(head.version(), version);
        let copied: Vec<_> = head
            .headers()
            .map(|CopiedHeader { name, value, sensitive }| (name.to_owned(), value.to_vec(), sensitive))
            .collect();
        prop_assert_eq!(&copied, &values(&headers));

        let rebuilt = head.to_request("body").expect("a copy of a valid head rebuilds");
        prop_assert_eq!(rebuilt.method(), &method);
        prop_assert_eq!(rebuilt.uri(), &uri);
        prop_assert_eq!(rebuilt.uri().to_string(), uri.to_string());
        prop_assert_eq!(rebuilt.version(), version);
        prop_assert_eq!(rebuilt.headers(), &headers);
        prop_assert_eq!(values(rebuilt.headers()), values(&headers));
        prop_assert_eq!(*rebuilt.body(), "body");

        // A clone is the same copy.
        let clone = head.clone();
        prop_assert_eq!(clone.uri(), head.uri());
    }
}

#[test]
fn the_debug_output_leaves_header_values_out() {
    let request = Request::get("/")
        .header("authorization", "Bearer secret")
        .body(())
        .unwrap();
    let debug = format!("{:?}", RequestHead::new(&request));
    assert!(!debug.contains("secret"), "{debug}");
    assert!(debug.contains("headers: 1"), "{debug}");
}

#[test]
fn a_uri_made_from_parts_comes_back_equal() {
    // A path-and-query that starts with `?` is a `Uri` the builder makes but
    // its own text does not parse back to: the head rebuilds it from parts.
    for uri in [
        Uri::builder().path_and_query("?a=1").build().unwrap(),
        Uri::builder()
            .path_and_query("/orders?a=1")
            .build()
            .unwrap(),
        Uri::from_static("http://[::1]:8080/a%20b?x=1"),
        Uri::from_static("*"),
        Uri::from_static("orders.internal:443"),
    ] {
        let request = Request::get(uri.clone()).body(()).unwrap();
        let again = RequestHead::new(&request).to_request(()).expect("rebuilt");
        assert_eq!(again.uri(), &uri);
    }
}
