//! Every status and error rule of the classification table, one row each.

use std::error::Error;
use std::fmt;
use std::io;
use std::time::Duration;

use http::{HeaderMap, Response};
use tower_classify::{
    classify_fn, BoxError, Classified, Classify, ClassifyExt, ErrorChainClassifier, Failure,
    FailureKind, GrpcClassifier, HttpClassifier, Outcome, RetryHint, RetryOn,
};

fn response(status: u16) -> Response<()> {
    Response::builder().status(status).body(()).unwrap()
}

fn classify_status(classifier: &HttpClassifier, status: u16) -> Outcome {
    Classify::<_, BoxError>::classify(classifier, Ok(&response(status)))
}

fn classify_error(error: BoxError) -> Outcome {
    Classify::<Response<()>, _>::classify(&HttpClassifier::new(), Err(&error))
}

const fn fail(kind: FailureKind) -> Outcome {
    Outcome::failure(kind)
}

#[test]
fn http_status_table() {
    use FailureKind::*;
    let rows: &[(u16, Outcome, &str)] = &[
        (200, Outcome::Success, "2xx succeeds"),
        (204, Outcome::Success, "2xx succeeds"),
        (304, Outcome::Success, "3xx is not a failure"),
        (101, Outcome::Success, "1xx is not a failure"),
        (500, fail(ServerError), ">= 500 is a server error"),
        (502, fail(ServerError), ">= 500 is a server error"),
        (503, fail(ServerError), ">= 500 is a server error"),
        (504, fail(ServerError), ">= 500 is a server error"),
        (599, fail(ServerError), ">= 500 is a server error"),
        (429, fail(RateLimited), "429 is rate limited"),
        (408, fail(Timeout), "408 is a timeout"),
        (400, fail(Rejected), "other 4xx are rejected"),
        (401, fail(Rejected), "auth is rejected"),
        (403, fail(Rejected), "auth is rejected"),
        (404, fail(Rejected), "other 4xx are rejected"),
        (409, fail(Rejected), "other 4xx are rejected"),
        (422, fail(Rejected), "validation is rejected"),
    ];
    let classifier = HttpClassifier::new();
    for (status, expected, rule) in rows {
        assert_eq!(
            classify_status(&classifier, *status),
            *expected,
            "status {status}: {rule}"
        );
    }
}

#[test]
fn transient_kinds_are_exactly_the_five() {
    use FailureKind::*;
    for kind in FailureKind::ALL {
        let expected = matches!(
            kind,
            ServerError | RateLimited | Timeout | Connection | NotSent
        );
        assert_eq!(kind.is_transient(), expected, "{kind}");
        assert_eq!(fail(kind).is_retryable(), expected, "{kind}");
    }
}

#[derive(Debug)]
struct Wrapper(BoxError);

impl fmt::Display for Wrapper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("client error")
    }
}

impl Error for Wrapper {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.0)
    }
}

#[derive(Debug)]
struct Opaque;

impl fmt::Display for Opaque {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("something odd")
    }
}

impl Error for Opaque {}

#[tokio::test]
async fn error_chain_table() {
    use FailureKind::*;
    let tokio_elapsed = tokio::time::timeout(Duration::ZERO, std::future::pending::<()>())
        .await
        .unwrap_err();
    let rows: Vec<(BoxError, Outcome, &str)> = vec![
        (
            tower::timeout::error::Elapsed::new().into(),
            fail(Timeout),
            "tower's Elapsed is a timeout",
        ),
        (
            tokio_elapsed.into(),
            fail(Timeout),
            "tokio's Elapsed is a timeout",
        ),
        (
            io::Error::from(io::ErrorKind::TimedOut).into(),
            fail(Timeout),
            "io TimedOut is a timeout",
        ),
        (
            io::Error::from(io::ErrorKind::ConnectionRefused).into(),
            fail(NotSent),
            "refused: the request never left",
        ),
        (
            io::Error::from(io::ErrorKind::HostUnreachable).into(),
            fail(Connection),
            "unreachable: an established connection reports it too",
        ),
        (
            io::Error::from(io::ErrorKind::NetworkUnreachable).into(),
            fail(Connection),
            "unreachable: an established connection reports it too",
        ),
        (
            io::Error::from(io::ErrorKind::NotConnected).into(),
            fail(Connection),
            "not connected: the connection may have carried the request",
        ),
        (
            io::Error::from(io::ErrorKind::AddrNotAvailable).into(),
            fail(NotSent),
            "no local address: the connect failed",
        ),
        (
            io::Error::from(io::ErrorKind::ConnectionReset).into(),
            fail(Connection),
            "reset is a connection failure",
        ),
        (
            io::Error::from(io::ErrorKind::BrokenPipe).into(),
            fail(Connection),
            "other I/O errors are connection failures",
        ),
        (
            io::Error::from(io::ErrorKind::UnexpectedEof).into(),
            fail(Connection),
            "a response cut short is a connection failure",
        ),
        (
            io::Error::from(io::ErrorKind::InvalidData).into(),
            fail(Rejected),
            "malformed data is rejected",
        ),
        (
            Box::new(Wrapper(
                io::Error::from(io::ErrorKind::ConnectionReset).into(),
            )),
            fail(Connection),
            "the chain is walked through source()",
        ),
        (
            io::Error::other(tower::timeout::error::Elapsed::new()).into(),
            fail(Timeout),
            "the deepest recognised error wins, also inside io::Error",
        ),
        (Box::new(Opaque), fail(Rejected), "unknown errors fail fast"),
        (
            tower::load_shed::error::Overloaded::new().into(),
            fail(Shed),
            "tower's load-shed refusal is shed",
        ),
        (
            Box::new(Wrapper(Box::new(Classified::shed(
                "circuit open",
                Some(Duration::from_secs(3)),
            )))),
            Outcome::Failure(
                Failure::new(Shed).with_hint(RetryHint::After(Duration::from_secs(3))),
            ),
            "a Classified error anywhere in the chain decides",
        ),
    ];
    for (error, expected, rule) in rows {
        assert_eq!(classify_error(error), expected, "{rule}");
    }
}

#[test]
fn unknown_errors_can_be_made_transient() {
    let classifier = ErrorChainClassifier::new().unknown_as(fail(FailureKind::Connection));
    assert_eq!(
        classifier.classify_error(&Opaque),
        fail(FailureKind::Connection)
    );
}

/// An HTTP classifier judges a call that produced no response with the
/// error classifier it was given.
#[test]
fn the_http_classifier_uses_the_error_classifier_it_is_given() {
    let opaque: BoxError = Box::new(Opaque);
    assert_eq!(classify_error(opaque), fail(FailureKind::Rejected));
    let classifier = HttpClassifier::new().with_error_classifier(
        ErrorChainClassifier::new().unknown_as(fail(FailureKind::Connection)),
    );
    let opaque: BoxError = Box::new(Opaque);
    assert_eq!(
        Classify::<Response<()>, _>::classify(&classifier, Err(&opaque)),
        fail(FailureKind::Connection)
    );
}

#[test]
fn retry_after_is_carried_on_failures_only() {
    let classifier = HttpClassifier::new();
    let with_header = |status: u16| {
        let response = Response::builder()
            .status(status)
            .header("retry-after", "7")
            .body(())
            .unwrap();
        Classify::<_, BoxError>::classify(&classifier, Ok(&response))
    };
    let hinted = |kind| {
        Outcome::Failure(Failure::new(kind).with_hint(RetryHint::After(Duration::from_secs(7))))
    };
    assert_eq!(with_header(503), hinted(FailureKind::ServerError));
    assert_eq!(with_header(429), hinted(FailureKind::RateLimited));
    assert_eq!(with_header(200), Outcome::Success);
    assert_eq!(with_header(400), fail(FailureKind::Rejected));
}

#[test]
fn a_failure_in_the_response_extensions_decides() {
    // A layer that answered on its own (a breaker's 503) says what it means.
    let mut response = response(503);
    let shed = Failure::new(FailureKind::Shed).with_hint(RetryHint::After(Duration::from_secs(4)));
    response.extensions_mut().insert(shed);
    assert_eq!(
        Classify::<_, BoxError>::classify(&HttpClassifier::new(), Ok(&response)),
        Outcome::Failure(shed)
    );
    assert_eq!(
        Classify::<_, BoxError>::classify(&GrpcClassifier::new(), Ok(&response)),
        Outcome::Failure(shed)
    );
    let mut success = self::response(200);
    success
        .extensions_mut()
        .insert(Failure::new(FailureKind::Poison));
    assert_eq!(
        Classify::<_, BoxError>::classify(&HttpClassifier::new(), Ok(&success)),
        fail(FailureKind::Poison)
    );
}

#[test]
fn retryable_statuses_narrow_the_table() {
    // Google Cloud Workflows' default_retry: 429, 502, 503, 504.
    let set = [429, 502, 503, 504].map(|code| http::StatusCode::from_u16(code).unwrap());
    let classifier = HttpClassifier::new().retryable_statuses(set);
    assert_eq!(
        classify_status(&classifier, 500),
        fail(FailureKind::Rejected)
    );
    assert_eq!(
        classify_status(&classifier, 502),
        fail(FailureKind::ServerError)
    );
    assert_eq!(
        classify_status(&classifier, 429),
        fail(FailureKind::RateLimited)
    );
    assert_eq!(
        classify_status(&classifier, 408),
        fail(FailureKind::Rejected)
    );
    assert_eq!(classify_status(&classifier, 200), Outcome::Success);
    // A code that is no status (1000) is refused naming the field: see
    // tests/config.rs, where a configuration names codes.
}

fn grpc_response(code: &str, pushback: Option<&str>) -> Response<()> {
    let mut builder = Response::builder().status(200).header("grpc-status", code);
    if let Some(pushback) = pushback {
        builder = builder.header("grpc-retry-pushback-ms", pushback);
    }
    builder.body(()).unwrap()
}

#[test]
fn grpc_status_table() {
    use FailureKind::*;
    let rows: &[(&str, Outcome, &str)] = &[
        ("0", Outcome::Success, "OK"),
        ("1", Outcome::Ignored, "CANCELLED counts neither way"),
        ("2", fail(ServerError), "UNKNOWN"),
        ("3", fail(Rejected), "INVALID_ARGUMENT"),
        ("4", fail(Timeout), "DEADLINE_EXCEEDED"),
        ("5", fail(Rejected), "NOT_FOUND"),
        ("7", fail(Rejected), "PERMISSION_DENIED"),
        ("8", fail(RateLimited), "RESOURCE_EXHAUSTED"),
        ("12", fail(Rejected), "UNIMPLEMENTED"),
        ("13", fail(ServerError), "INTERNAL"),
        ("14", fail(ServerError), "UNAVAILABLE"),
        ("15", fail(ServerError), "DATA_LOSS"),
        ("16", fail(Rejected), "UNAUTHENTICATED"),
        ("99", fail(ServerError), "unknown codes are UNKNOWN"),
    ];
    let classifier = GrpcClassifier::new();
    for (code, expected, rule) in rows {
        let outcome =
            Classify::<_, BoxError>::classify(&classifier, Ok(&grpc_response(code, None)));
        assert_eq!(outcome, *expected, "grpc-status {code}: {rule}");
    }
}

#[test]
fn grpc_pushback_and_http_fallback() {
    let classifier = GrpcClassifier::new();
    let classify =
        |response: &Response<()>| Classify::<_, BoxError>::classify(&classifier, Ok(response));
    let unavailable = |pushback| classify(&grpc_response("14", Some(pushback)));
    assert_eq!(
        unavailable("250").as_failure().unwrap().hint,
        Some(RetryHint::After(Duration::from_millis(250)))
    );
    for refused in ["-1", "soon", ""] {
        let outcome = unavailable(refused);
        assert_eq!(
            outcome.as_failure().unwrap().hint,
            Some(RetryHint::DoNotRetry),
            "{refused:?}"
        );
        assert!(
            !outcome.is_retryable(),
            "{refused:?}: pushback forbids the retry"
        );
    }
    // No grpc-status header: a 200 waits for trailers, anything else is HTTP.
    assert_eq!(classify(&response(200)), Outcome::Success);
    assert_eq!(classify(&response(503)), fail(FailureKind::ServerError));
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", "8".parse().unwrap());
    assert_eq!(grpc_end(Some(&trailers)), fail(FailureKind::RateLimited));
    trailers.insert("grpc-status", "x".parse().unwrap());
    assert_eq!(
        grpc_end(Some(&trailers)),
        fail(FailureKind::ServerError),
        "an unreadable status is UNKNOWN"
    );
}

#[test]
fn grpc_end_of_stream_reads_trailers_and_fails_a_missing_status() {
    let end = grpc_end;
    let trailers = |pairs: &[(&'static str, &str)]| {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    };
    assert_eq!(
        end(Some(&trailers(&[("grpc-status", "0")]))),
        Outcome::Success
    );
    assert_eq!(
        end(Some(&trailers(&[("grpc-status", "1")]))),
        Outcome::Ignored
    );
    assert_eq!(
        end(Some(&trailers(&[("grpc-status", "3")]))),
        fail(FailureKind::Rejected)
    );
    // The same pushback rule as for a trailers-only head.
    let unavailable = end(Some(&trailers(&[
        ("grpc-status", "14"),
        ("grpc-retry-pushback-ms", "750"),
    ])));
    assert_eq!(
        unavailable.as_failure().unwrap().kind,
        FailureKind::ServerError
    );
    assert_eq!(
        unavailable.as_failure().unwrap().retry_after(),
        Some(Duration::from_millis(750))
    );
    // No status where the body ended: UNKNOWN, a server error.
    let missing = GrpcClassifier::code_outcome(2); // UNKNOWN, as tonic reports it
    assert_eq!(missing, fail(FailureKind::ServerError));
    assert_eq!(end(None), missing);
    assert_eq!(end(Some(&HeaderMap::new())), missing);
    assert_eq!(end(Some(&trailers(&[("grpc-status", "ok")]))), missing);

    assert_eq!(
        GrpcClassifier::status_code(&trailers(&[("grpc-status", " 14 ")])),
        Some(14)
    );
    assert_eq!(GrpcClassifier::status_code(&HeaderMap::new()), None);
    // Present but not written as gRPC writes a code: UNKNOWN, as tonic reads
    // it. Read as absent, a trailers-only response with it was a success.
    for unreadable in ["ok", "fourteen", "+0", "00", "-1", "014", "100", ""] {
        let headers = trailers(&[("grpc-status", unreadable)]);
        assert_eq!(
            GrpcClassifier::status_code(&headers),
            Some(2),
            "{unreadable:?}"
        );
    }
    let head_only = Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", "fourteen")
        .body(())
        .unwrap();
    let outcome = Classify::<_, BoxError>::classify(&GrpcClassifier::new(), Ok(&head_only));
    assert_eq!(outcome, fail(FailureKind::ServerError));
}

#[test]
fn combinators() {
    let classifier = HttpClassifier::new();
    // retry_on keeps only the named transient classes transient.
    let only_rate_limits = classifier
        .clone()
        .retry_on(RetryOn::from_names(["rate_limited"]).unwrap());
    let classify = |c: &dyn Fn(&Response<()>) -> Outcome, status| c(&response(status));
    let narrowed = |r: &Response<()>| Classify::<_, BoxError>::classify(&only_rate_limits, Ok(r));
    assert_eq!(classify(&narrowed, 503), fail(FailureKind::Rejected));
    assert_eq!(classify(&narrowed, 429), fail(FailureKind::RateLimited));
    assert_eq!(classify(&narrowed, 200), Outcome::Success);

    // `or`: the first failure found wins.
    let teapot = classify_fn(|result: Result<&Response<()>, &BoxError>| match result {
        Ok(r) if r.status() == 200 && r.headers().contains_key("x-poison") => {
            fail(FailureKind::Poison)
        }
        _ => Outcome::Success,
    });
    let combined = teapot.or(classifier.clone());
    let poisoned = Response::builder()
        .header("x-poison", "1")
        .body(())
        .unwrap();
    assert_eq!(
        Classify::<_, BoxError>::classify(&combined, Ok(&poisoned)),
        fail(FailureKind::Poison)
    );
    assert_eq!(
        Classify::<_, BoxError>::classify(&combined, Ok(&response(503))),
        fail(FailureKind::ServerError)
    );

    // `map` rewrites every outcome.
    let ignore_rejections = classifier.map(|outcome: Outcome| match outcome {
        Outcome::Failure(f) if f.kind == FailureKind::Rejected => Outcome::Ignored,
        other => other,
    });
    assert_eq!(
        Classify::<_, BoxError>::classify(&ignore_rejections, Ok(&response(404))),
        Outcome::Ignored
    );
}

#[test]
fn retry_on_set_rules() {
    let every = [
        "http_5xx",
        "rate_limited",
        "connection",
        "timeout",
        "not_sent",
    ];
    assert_eq!(RetryOn::default(), RetryOn::from_names(every).unwrap());
    let err = RetryOn::from_names(Vec::<String>::new()).unwrap_err();
    assert_eq!(err.field(), "retry_on");
    let err = RetryOn::from_names(["http_4xx"]).unwrap_err();
    assert!(err.to_string().contains("http_4xx"), "{err}");
    let err = RetryOn::new([FailureKind::Rejected]).unwrap_err();
    assert!(err.to_string().contains("rejected"), "{err}");
    let set = RetryOn::from_names(["server_error", "timeout"]).unwrap();
    assert_eq!(
        set,
        RetryOn::new([FailureKind::ServerError, FailureKind::Timeout]).unwrap()
    );
    let held = FailureKind::ALL
        .into_iter()
        .filter(|kind| set.contains(*kind));
    assert_eq!(
        held.collect::<Vec<_>>(),
        [FailureKind::ServerError, FailureKind::Timeout]
    );
}

#[test]
fn a_grpc_status_is_awaited_in_trailers_only_for_a_200_grpc_head_without_one() {
    let grpc = || http::Response::builder().header("content-type", "application/grpc+proto");
    let left_open = |response: &Response<()>| {
        Classify::<_, BoxError>::classify_head(&GrpcClassifier::new(), Ok(response)).is_none()
    };
    assert!(left_open(&grpc().body(()).unwrap()));
    let trailers_only = grpc().header("grpc-status", "14").body(()).unwrap();
    assert!(!left_open(&trailers_only));
    let not_ok = grpc().status(503).body(()).unwrap();
    assert!(!left_open(&not_ok));
    let json = http::Response::builder()
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    assert!(!left_open(&json));
}

#[test]
fn grpc_messages_are_percent_decoded() {
    let mut trailers = http::HeaderMap::new();
    assert_eq!(GrpcClassifier::status_message(&trailers), None);
    trailers.insert(
        "grpc-message",
        "no%20backend%3A %E2%9C%93 100%".parse().unwrap(),
    );
    assert_eq!(
        GrpcClassifier::status_message(&trailers).as_deref(),
        Some("no backend: ✓ 100%")
    );
}

proptest::proptest! {
    /// Any bytes a server sends as `grpc-message` decode without a panic.
    #[test]
    fn any_grpc_message_decodes(raw in proptest::collection::vec(0x20u8..0x7f, 0..64)) {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-message", http::HeaderValue::from_bytes(&raw).unwrap());
        let decoded = GrpcClassifier::status_message(&trailers).unwrap();
        proptest::prop_assert!(decoded.len() <= raw.len() * 3);
    }
}

#[test]
fn item_13_the_connection_class_includes_not_sent_and_not_sent_alone_is_narrower() {
    use tower_classify::RetryOn;
    let connection = RetryOn::from_names(["connection"]).unwrap();
    assert!(connection.contains(FailureKind::Connection));
    assert!(connection.contains(FailureKind::NotSent));
    let not_sent = RetryOn::from_names(["not_sent"]).unwrap();
    assert!(not_sent.contains(FailureKind::NotSent));
    assert!(
        !not_sent.contains(FailureKind::Connection),
        "a connection lost after sending is not in `not_sent`"
    );
    assert!(RetryOn::default().contains(FailureKind::NotSent));
}

#[test]
fn item_14_towers_load_shed_refusal_is_shed() {
    let overloaded: BoxError = tower::load_shed::error::Overloaded::new().into();
    assert_eq!(classify_error(overloaded), fail(FailureKind::Shed));
}

#[test]
fn item_14_grpc_unavailable_is_one_kind_a_server_error() {
    let unavailable = http::Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", "14")
        .body(())
        .unwrap();
    assert_eq!(
        Classify::<_, BoxError>::classify(&GrpcClassifier::new(), Ok(&unavailable)),
        fail(FailureKind::ServerError)
    );
}

/// Issue 31, item 2: two sets that hold the same kinds are equal (and hash
/// alike), however they were written: the default, and the four classes
/// named or built (`connection` holds `not_sent`).
#[test]
fn item_2_sets_holding_the_same_kinds_are_equal() {
    use std::collections::HashSet;
    let named = RetryOn::from_names(["http_5xx", "rate_limited", "connection", "timeout"]).unwrap();
    let built = RetryOn::new([
        FailureKind::ServerError,
        FailureKind::RateLimited,
        FailureKind::Connection,
        FailureKind::Timeout,
    ])
    .unwrap();
    for set in [named, built, RetryOn::default()] {
        assert_eq!(format!("{set:?}"), format!("{:?}", RetryOn::default()));
        assert_eq!(set, RetryOn::default());
    }
    let distinct: HashSet<RetryOn> = [named, built, RetryOn::default()].into();
    assert_eq!(distinct.len(), 1);
    // Naming `not_sent` beside `connection` adds nothing.
    assert_eq!(
        RetryOn::from_names(["connection", "not_sent"]).unwrap(),
        RetryOn::from_names(["connection"]).unwrap()
    );
    // `not_sent` alone is a narrower set, and not equal to `connection`.
    assert_ne!(
        RetryOn::from_names(["not_sent"]).unwrap(),
        RetryOn::from_names(["connection"]).unwrap()
    );
    // The default is every transient kind (its names: tests/config.rs).
    for kind in FailureKind::ALL {
        assert_eq!(RetryOn::default().contains(kind), kind.is_transient());
    }
}

/// Issue 31, item 5: a refusal's token reaches whoever classifies the
/// refusal, as an error (anywhere in the chain) or as a response's `Failure`
/// extension, through the combinators too; a setting never carries one.
#[test]
fn item_5_a_refusal_token_survives_classification() {
    use tower_classify::RefusalToken;

    let token = RefusalToken::issue();
    assert_ne!(token, RefusalToken::issue(), "each call gets its own");
    let refused = Failure::new(FailureKind::Shed).with_refusal(Some(token));
    assert_eq!(refused.kind, FailureKind::Shed);

    let error: BoxError = Box::new(Wrapper(Box::new(Classified::new(refused, "circuit open"))));
    let outcome = classify_error(error);
    assert_eq!(outcome.as_failure().unwrap().refusal, Some(token));

    let mut answer = response(503);
    answer.extensions_mut().insert(refused);
    let outcome = Classify::<_, BoxError>::classify(&HttpClassifier::new(), Ok(&answer));
    assert_eq!(outcome.as_failure().unwrap().refusal, Some(token));
    let grpc = Classify::<_, BoxError>::classify(&GrpcClassifier::new(), Ok(&answer));
    assert_eq!(grpc.as_failure().unwrap().refusal, Some(token));

    // Narrowing what is transient rewrites the kind, not whose request it was.
    let mut overloaded = response(503);
    overloaded
        .extensions_mut()
        .insert(Failure::new(FailureKind::ServerError).with_refusal(Some(token)));
    let narrowed = HttpClassifier::new().retry_on(RetryOn::from_names(["timeout"]).unwrap());
    let outcome = Classify::<_, BoxError>::classify(&narrowed, Ok(&overloaded));
    let failure = outcome.as_failure().unwrap();
    assert_eq!(
        (failure.kind, failure.refusal),
        (FailureKind::Rejected, Some(token))
    );

    // A plain shed refusal proves nothing, and neither does a setting.
    let unproven = Classified::shed("circuit open", None);
    assert_eq!(unproven.failure().refusal, None);
    let setting = ErrorChainClassifier::new().unknown_as(Outcome::Failure(refused));
    let outcome = setting.classify_error(&fmt::Error);
    assert_eq!(outcome, fail(FailureKind::Shed));
}

/// Every kind's name (`as_str`, the `Display`) parses back to the kind, and
/// nothing else parses: the names dead-letter entries and configurations
/// store are read back by `FromStr`.
#[test]
fn every_kind_name_parses_back() {
    for kind in FailureKind::ALL {
        assert_eq!(kind.as_str().parse::<FailureKind>(), Ok(kind));
        assert_eq!(kind.to_string().parse::<FailureKind>(), Ok(kind));
    }
    let err = "nope".parse::<FailureKind>().unwrap_err();
    assert_eq!(err.field(), "kind");
    assert!(err.to_string().contains("server_error"), "{err}");
}

/// How a `GrpcClassifier` judges the end of a body: its trailers, or none.
fn grpc_end(trailers: Option<&HeaderMap>) -> Outcome {
    Classify::<Response<()>, BoxError>::classify_end(
        &GrpcClassifier::new(),
        tower_classify::StreamEnd::Trailers(trailers),
    )
}
