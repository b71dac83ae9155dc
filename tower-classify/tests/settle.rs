//! A call settled where its response body ends: `Classify::classify_head`,
//! `classify_end` and `SettleBody`.

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{HeaderMap, Response};
use http_body::{Body, Frame};
use http_body_util::channel::Channel;
use http_body_util::{BodyExt, Full};
use tower_classify::{
    classify_fn, BoxError, Classify, ClassifyExt, FailureKind, GrpcClassifier, HttpClassifier,
    OnEnd, Outcome, SettleBody, StreamEnd,
};

type Res = Response<()>;

fn trailers(status: &str) -> HeaderMap {
    let mut map = HeaderMap::new();
    map.insert("grpc-status", status.parse().unwrap());
    map
}

fn grpc_head() -> Res {
    Response::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap()
}

/// Settles with `C` and keeps what it was told, as a breaker would.
struct Record<C> {
    classifier: C,
    seen: Arc<Mutex<Vec<(Outcome, String)>>>,
}

impl<C: Classify<Res, BoxError>> OnEnd for Record<C> {
    type Future = Ready<Result<(), BoxError>>;

    fn classify_end(&self, end: StreamEnd<'_>) -> Outcome {
        self.classifier.classify_end(end)
    }

    fn settle(self, outcome: Outcome, end: StreamEnd<'_>) -> Self::Future {
        let end = match end {
            StreamEnd::Trailers(Some(_)) => "trailers",
            StreamEnd::Trailers(None) => "end",
            StreamEnd::Error(_) => "error",
            StreamEnd::Dropped => "dropped",
        };
        self.seen.lock().unwrap().push((outcome, end.to_owned()));
        ready(Ok(()))
    }
}

type Seen = Arc<Mutex<Vec<(Outcome, String)>>>;

fn record<C>(classifier: C) -> (Record<C>, Seen) {
    let seen = Seen::default();
    let record = Record {
        classifier,
        seen: Arc::clone(&seen),
    };
    (record, seen)
}

fn answer(end: Option<HeaderMap>) -> impl Body<Data = Bytes, Error = Infallible> {
    Full::new(Bytes::from_static(b"\0\0\0\0\x02hi")).with_trailers(ready(end.map(Ok)))
}

#[tokio::test]
async fn ok_trailers_settle_a_success_and_reach_the_caller() {
    let (record, seen) = record(GrpcClassifier::new());
    let body = SettleBody::new(answer(Some(trailers("0"))), record);
    assert!(body.awaits_end());
    assert!(!body.is_end_stream());
    let collected = body.collect().await.unwrap();
    assert_eq!(collected.trailers(), Some(&trailers("0")));
    assert_eq!(
        *seen.lock().unwrap(),
        [(Outcome::Success, "trailers".to_owned())]
    );
}

#[tokio::test]
async fn failing_trailers_settle_their_failure_once() {
    let (record, seen) = record(GrpcClassifier::new());
    let mut body = SettleBody::new(answer(Some(trailers("14"))), record);
    body.frame().await.unwrap().unwrap();
    assert!(body.frame().await.unwrap().unwrap().is_trailers());
    assert!(!body.awaits_end());
    assert!(body.frame().await.is_none());
    drop(body);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "settled once: {seen:?}");
    assert_eq!(seen[0].0, Outcome::failure(FailureKind::ServerError));
}

#[tokio::test]
async fn a_body_that_ends_without_grpc_status_is_unknown() {
    let (record, seen) = record(GrpcClassifier::new());
    SettleBody::new(answer(None), record)
        .collect()
        .await
        .unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [(Outcome::failure(FailureKind::ServerError), "end".to_owned())]
    );
}

#[tokio::test]
async fn a_body_error_is_a_connection_failure_and_is_handed_on() {
    let (record, seen) = record(GrpcClassifier::new());
    let (sender, inner) = Channel::<Bytes, BoxError>::new(1);
    sender.abort("stream reset".into());
    let error = SettleBody::new(inner, record).collect().await.unwrap_err();
    assert_eq!(error.to_string(), "stream reset");
    assert_eq!(
        *seen.lock().unwrap(),
        [(
            Outcome::failure(FailureKind::Connection),
            "error".to_owned()
        )]
    );
}

#[tokio::test]
async fn a_body_dropped_before_its_end_is_settled_ignored() {
    let (record, seen) = record(GrpcClassifier::new());
    let (mut sender, inner) = Channel::<Bytes, BoxError>::new(1);
    let mut body = SettleBody::new(inner, record);
    sender.send_data(Bytes::from_static(b"x")).await.unwrap();
    body.frame().await.unwrap().unwrap();
    assert!(seen.lock().unwrap().is_empty(), "not over yet");
    drop(body);
    assert_eq!(
        *seen.lock().unwrap(),
        [(Outcome::Ignored, "dropped".to_owned())]
    );
}

#[tokio::test]
async fn a_settled_body_passes_frames_and_settles_nothing() {
    let body = SettleBody::<_, Record<GrpcClassifier>>::settled(answer(Some(trailers("14"))));
    assert!(!body.awaits_end());
    let collected = body.collect().await.unwrap();
    assert_eq!(collected.trailers(), Some(&trailers("14")));
}

/// Settles by waiting for a channel, as a layer writing to a store does.
struct Waits(tokio::sync::oneshot::Receiver<Result<(), BoxError>>);

impl OnEnd for Waits {
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), BoxError>>>>;

    fn classify_end(&self, end: StreamEnd<'_>) -> Outcome {
        Classify::<Res, BoxError>::classify_end(&GrpcClassifier::new(), end)
    }

    fn settle(self, _: Outcome, _: StreamEnd<'_>) -> Self::Future {
        Box::pin(async move { self.0.await.unwrap() })
    }
}

#[tokio::test]
async fn the_last_frame_waits_for_the_settling_and_an_error_replaces_it() {
    let (done, wait) = tokio::sync::oneshot::channel();
    let mut body = SettleBody::new(answer(Some(trailers("14"))), Waits(wait));
    body.frame().await.unwrap().unwrap();
    assert!(
        poll_once(&mut body).is_pending(),
        "held while the settling runs"
    );
    done.send(Err("store full".into())).unwrap();
    let Poll::Ready(Some(Err(error))) = poll_once(&mut body) else {
        panic!("the store's error replaces the last frame");
    };
    assert_eq!(error.to_string(), "store full");
}

/// What one poll of a body gives.
type Polled<B> = Poll<Option<Result<Frame<<B as Body>::Data>, <B as Body>::Error>>>;

/// Polls `body` once.
fn poll_once<B: Body + Unpin>(body: &mut B) -> Polled<B> {
    let mut cx = Context::from_waker(Waker::noop());
    Pin::new(body).poll_frame(&mut cx)
}

#[test]
fn the_head_leaves_only_a_streaming_grpc_response_open() {
    let grpc = GrpcClassifier::new();
    let head = |response: &Res| Classify::<Res, BoxError>::classify_head(&grpc, Ok(response));
    assert_eq!(head(&grpc_head()), None);
    let mut trailers_only = grpc_head();
    trailers_only
        .headers_mut()
        .insert("grpc-status", "5".parse().unwrap());
    assert_eq!(
        head(&trailers_only),
        Some(Outcome::failure(FailureKind::Rejected))
    );
    assert_eq!(head(&Response::new(())), Some(Outcome::Success));
    // A classifier that reads heads only settles every call there.
    let http = HttpClassifier::new();
    assert_eq!(
        Classify::<Res, BoxError>::classify_head(&http, Ok(&grpc_head())),
        Some(Outcome::Success)
    );
}

#[test]
fn combinators_pass_the_head_and_the_end_on() {
    let failing = trailers("14");
    let end = StreamEnd::Trailers(Some(&failing));
    let grpc = GrpcClassifier::new();
    let head = grpc_head();

    // `Map` rewrites the end's verdict too.
    let lenient = grpc.clone().map(|outcome: Outcome| match outcome {
        Outcome::Failure(_) => Outcome::Ignored,
        other => other,
    });
    assert_eq!(
        Classify::<Res, BoxError>::classify_head(&lenient, Ok(&head)),
        None
    );
    assert_eq!(
        Classify::<Res, BoxError>::classify_end(&lenient, end),
        Outcome::Ignored
    );

    // `&C` and `Arc<C>` are the classifier they point to.
    assert_eq!(
        Classify::<Res, BoxError>::classify_end(&&grpc, end),
        Outcome::failure(FailureKind::ServerError)
    );
    let shared = Arc::new(lenient);
    assert_eq!(
        Classify::<Res, BoxError>::classify_end(&shared, end),
        Outcome::Ignored
    );
    assert_eq!(
        Classify::<Res, BoxError>::classify_head(&shared, Ok(&head)),
        None
    );

    // `Or`: open while the gRPC side is open, judged by it at the end; a
    // narrow classifier in front still settles what it recognises.
    let teapot = classify_fn(|result: Result<&Res, &BoxError>| match result {
        Ok(response) if response.headers().contains_key("x-teapot") => {
            Outcome::failure(FailureKind::Rejected)
        }
        _ => Outcome::Success,
    });
    let both = teapot.or(grpc.clone());
    assert_eq!(
        Classify::<Res, BoxError>::classify_head(&both, Ok(&head)),
        None
    );
    assert_eq!(
        Classify::<Res, BoxError>::classify_end(&both, end),
        Outcome::failure(FailureKind::ServerError)
    );
    let mut teapot_head = grpc_head();
    teapot_head
        .headers_mut()
        .insert("x-teapot", "1".parse().unwrap());
    assert_eq!(
        Classify::<Res, BoxError>::classify_head(&both, Ok(&teapot_head)),
        Some(Outcome::failure(FailureKind::Rejected))
    );
    let reversed = grpc.or(teapot);
    assert_eq!(
        Classify::<Res, BoxError>::classify_head(&reversed, Ok(&teapot_head)),
        Some(Outcome::failure(FailureKind::Rejected)),
        "a failure the second finds at the head settles the call"
    );
    assert_eq!(
        Classify::<Res, BoxError>::classify_head(&reversed, Ok(&head)),
        None
    );
}
