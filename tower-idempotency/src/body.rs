//! The body the guard hands on, in both directions, reading nothing ahead.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http::response::Parts;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_classify::BoxError;

use crate::key::{BodyHasher, BodyPart};
use crate::run_to_end::Write;
use crate::store::{Completion, NotKept, StoredResponse};

pin_project! {
    /// The body the guard hands on: the inner service's request body and
    /// the response body it returns, each passed through frame by frame as
    /// it arrives, or a whole body of the guard's own (a replayed response,
    /// a refusal).
    ///
    /// For a guarded request it hashes the request body and records the
    /// response body as they are read, reading neither ahead (see the
    /// [crate docs](crate#bodies-and-fingerprints)). Requests and responses
    /// the guard does not guard stream untouched, with nothing allocated.
    ///
    /// [`size_hint`](Body::size_hint) and
    /// [`is_end_stream`](Body::is_end_stream) are the original body's.
    pub struct GuardBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Plain { #[pin] body: B },
        Hashed { #[pin] body: B, hash: Arc<RequestHash> },
        Recorded { #[pin] body: B, recorder: Box<Recorder> },
        Whole { data: Option<Bytes>, trailers: Option<HeaderMap> },
    }
}

impl<B> GuardBody<B> {
    /// The original body, untouched.
    pub(crate) fn new(body: B) -> Self {
        GuardBody {
            kind: Kind::Plain { body },
        }
    }

    /// A whole body of `bytes`, ended by `trailers`.
    pub(crate) fn replay(bytes: Bytes, trailers: Option<HeaderMap>) -> Self {
        GuardBody {
            kind: Kind::Whole {
                data: (!bytes.is_empty()).then_some(bytes),
                trailers,
            },
        }
    }

    /// A guarded request's body, its data hashed into `hash` as it is read.
    pub(crate) fn hashed(body: B, hash: Arc<RequestHash>) -> Self {
        GuardBody {
            kind: Kind::Hashed { body, hash },
        }
    }

    /// A guarded response's body, recorded by `recorder` as it is read.
    pub(crate) fn recorded(body: B, recorder: Recorder) -> Self {
        GuardBody {
            kind: Kind::Recorded {
                body,
                recorder: Box::new(recorder),
            },
        }
    }
}

impl<B> Body for GuardBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Plain { body } => body.poll_frame(cx).map_err(Into::into),
            KindProj::Hashed { mut body, hash } => {
                let polled = ready!(body.as_mut().poll_frame(cx));
                hash.saw(&polled, body.is_end_stream());
                Poll::Ready(polled.map(|frame| frame.map_err(Into::into)))
            }
            KindProj::Recorded { body, recorder } => recorder.poll_frame(body, cx),
            KindProj::Whole { data, trailers } => {
                if let Some(data) = data.take() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Plain { body } | Kind::Hashed { body, .. } => body.is_end_stream(),
            Kind::Recorded { body, recorder } => recorder.writing.is_none() && body.is_end_stream(),
            Kind::Whole { data, trailers } => data.is_none() && trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Plain { body } | Kind::Hashed { body, .. } => body.size_hint(),
            Kind::Recorded { body, recorder } => {
                let held = recorder.held_len();
                let inner = body.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower().saturating_add(held));
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper.saturating_add(held));
                }
                hint
            }
            Kind::Whole { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

impl<B> fmt::Debug for GuardBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Plain { .. } => "passed through",
            Kind::Hashed { .. } => "hashed request",
            Kind::Recorded { .. } => "recorded response",
            Kind::Whole { .. } => "whole",
        };
        f.debug_struct("GuardBody")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

/// What the handler has read of a guarded request's body: shared by the body
/// it reads and the guard, which records it with the outcome.
pub(crate) struct RequestHash(Mutex<Hashing>);

struct Hashing {
    hasher: BodyHasher,
    /// The handler saw the end of the body's data.
    ended: bool,
    /// The body failed: what was read is not the whole body, whatever
    /// comes after.
    failed: bool,
}

impl RequestHash {
    /// Nothing read yet of a body that is `ended` already (an empty one).
    pub(crate) fn new(ended: bool) -> Self {
        RequestHash(Mutex::new(Hashing {
            hasher: BodyHasher::default(),
            ended,
            failed: false,
        }))
    }

    /// The body part of the fingerprint: what the handler has read so far,
    /// and whether that was all of it.
    pub(crate) fn part(&self) -> BodyPart {
        let hashing = self.lock();
        hashing.hasher.part(hashing.ended && !hashing.failed)
    }

    fn saw<D: AsRef<[u8]>, E>(&self, polled: &Option<Result<Frame<D>, E>>, end: bool) {
        let mut hashing = self.lock();
        match polled {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    hashing.hasher.update(data.as_ref());
                }
                // Trailers come after the last data.
                hashing.ended |= end || frame.is_trailers();
            }
            Some(Err(_)) => hashing.failed = true,
            None => hashing.ended = true,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Hashing> {
        // Nothing panics while holding the lock.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Writes what a guarded call came to, once its response body ends; the
/// write runs to its end even if the returned future is dropped. Dropped
/// unused (the body was dropped before its end), it records
/// [`NotKept::Cancelled`].
pub(crate) type Settle = Box<dyn FnOnce(Completion) -> Write + Send + Sync>;

/// A body's length as its head or the body itself declares it up front:
/// its `Content-Length`, else an exact size hint (which hyper sends as the
/// `Content-Length`). `None` when neither says.
pub(crate) fn declared_len<B: Body>(headers: &http::HeaderMap, body: &B) -> Option<u64> {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .or_else(|| body.size_hint().exact())
}

/// What polling a body for a frame gave.
type Polled = Option<Result<Frame<Bytes>, BoxError>>;

/// Records a guarded response's body as the client reads it and writes the
/// outcome when it ends. The last frame (or the end, or the error) is handed
/// on only once the outcome is written, so a client that saw the whole
/// response and repeats the request gets it replayed, not a 409.
pub(crate) struct Recorder {
    /// The claim, until the outcome is written.
    claim: Option<Settle>,
    /// The response as it will be stored, its body still empty.
    response: Option<StoredResponse>,
    chunks: Vec<Bytes>,
    len: usize,
    limit: usize,
    /// The body's length as declared up front (its `Content-Length`, or an
    /// exact size hint), when it is.
    declared: Option<u64>,
    /// The outcome being written, and what to hand on once it is.
    writing: Option<(Write, Polled)>,
}

impl Recorder {
    /// Records a response with head `parts` for `claim`, storing at most
    /// `limit` bytes of body. `declared` is the body's length when it is
    /// known up front (see [`declared_len`]).
    pub(crate) fn new(claim: Settle, parts: &Parts, declared: Option<u64>, limit: usize) -> Self {
        Recorder {
            claim: Some(claim),
            response: Some(StoredResponse::new(
                parts.status,
                &parts.headers,
                Bytes::new(),
            )),
            chunks: Vec::new(),
            len: 0,
            limit,
            declared,
            writing: None,
        }
    }

    fn poll_frame<B>(&mut self, mut body: Pin<&mut B>, cx: &mut Context<'_>) -> Poll<Polled>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        loop {
            if let Some((write, _)) = &mut self.writing {
                ready!(Pin::new(write).poll(cx));
                let (_, held) = self.writing.take().expect("a write under way");
                return Poll::Ready(held);
            }
            let polled = ready!(body.as_mut().poll_frame(cx)).map(|f| f.map_err(Into::into));
            if self.claim.is_none() {
                return Poll::Ready(polled);
            }
            let Some(completion) = self.saw(&polled, body.is_end_stream()) else {
                return Poll::Ready(polled);
            };
            let claim = self.claim.take().expect("checked above");
            self.writing = Some((claim(completion), polled));
        }
    }

    /// Takes in a frame; what the call came to once that is known.
    fn saw(&mut self, polled: &Polled, end: bool) -> Option<Completion> {
        let frame = match polled {
            None => return Some(self.finish()),
            Some(Err(_)) => return Some(Completion::NotKept(NotKept::BodyFailed)),
            Some(Ok(frame)) => frame,
        };
        if let Some(data) = frame.data_ref() {
            self.len = self.len.saturating_add(data.len());
            if self.len > self.limit {
                self.chunks = Vec::new();
                return Some(Completion::NotKept(NotKept::TooLarge));
            }
            if !data.is_empty() {
                self.chunks.push(data.clone());
            }
            // A body that has given all it declared is whole, whether or not
            // it says it has ended: hyper stops polling an HTTP/1 body once
            // its `Content-Length` is written, so waiting for the end would
            // leave a response the client read in full recorded as
            // cancelled. (Trailers after it, which only HTTP/2 could send
            // with a length, are handed on but not stored.)
            if self.declared == Some(self.len as u64) {
                return Some(self.finish());
            }
        } else if let Some(trailers) = frame.trailers_ref() {
            // Trailers end the body.
            self.response = self.response.take().map(|r| r.with_trailers(trailers));
            return Some(self.finish());
        }
        end.then(|| self.finish())
    }

    fn finish(&mut self) -> Completion {
        let mut response = self.response.take().expect("finished once");
        let chunks = std::mem::take(&mut self.chunks);
        response.body = match <[Bytes; 1]>::try_from(chunks) {
            Ok([whole]) => whole,
            Err(chunks) => {
                let mut body = BytesMut::with_capacity(self.len);
                for chunk in chunks {
                    body.extend_from_slice(&chunk);
                }
                body.freeze()
            }
        };
        Completion::Response(response)
    }

    /// The data of the frame held back while the outcome is written.
    fn held_len(&self) -> u64 {
        match &self.writing {
            Some((_, Some(Ok(frame)))) => frame.data_ref().map_or(0, |d| d.len() as u64),
            _ => 0,
        }
    }
}

/// Whether a repeat's body is the body `part` describes: exactly those
/// bytes when the first request's handler read its whole body, else
/// starting with them. Hashes the data as it arrives, keeping none of it,
/// and reads no more than the part's length and one frame: a longer body
/// differs as soon as it passes the length, and one whose declared length
/// already says it differs is not read at all. An error is the body's.
pub(crate) async fn compare<B>(body: B, part: BodyPart) -> Result<bool, BoxError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut hasher = BodyHasher::default();
    loop {
        let room = part.len - hasher.len();
        let hint = body.size_hint();
        if hint.upper().is_some_and(|upper| upper < room) || (part.complete && hint.lower() > room)
        {
            return Ok(false);
        }
        if (!part.complete && room == 0) || body.is_end_stream() {
            break;
        }
        let frame = match std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            None => break,
            Some(Err(error)) => return Err(error.into()),
            Some(Ok(frame)) => frame,
        };
        let Ok(data) = frame.into_data() else {
            // Trailers: the data has ended.
            break;
        };
        if data.len() as u64 > room {
            if part.complete {
                return Ok(false);
            }
            hasher.update(&data[..room as usize]);
        } else {
            hasher.update(&data);
        }
    }
    Ok(hasher.part(part.complete) == part)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use http_body_util::BodyExt;
    use sha2::{Digest, Sha256};

    /// A body of the given frames, handed out one per poll, counting how
    /// many were pulled; ends when they run out (`is_end_stream` says so
    /// only then, as a channel's would).
    struct Frames {
        frames: VecDeque<Result<Frame<Bytes>, BoxError>>,
        pulled: Arc<Mutex<usize>>,
    }

    impl Frames {
        fn new(chunks: &[&[u8]]) -> Self {
            Frames {
                frames: chunks
                    .iter()
                    .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
                    .collect(),
                pulled: Arc::default(),
            }
        }

        fn then(mut self, frame: Result<Frame<Bytes>, BoxError>) -> Self {
            self.frames.push_back(frame);
            self
        }
    }

    impl Body for Frames {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            *self.pulled.lock().unwrap() += 1;
            Poll::Ready(self.frames.pop_front())
        }
    }

    fn sha(bytes: &[u8]) -> [u8; 32] {
        Sha256::digest(bytes).into()
    }

    #[tokio::test]
    async fn a_hashed_body_hands_every_frame_on_and_hashes_what_was_read() {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", "1".parse().unwrap());
        let frames = Frames::new(&[b"abc", b"def"]).then(Ok(Frame::trailers(trailers.clone())));
        let hash = Arc::new(RequestHash::new(false));
        let mut body = GuardBody::hashed(frames, Arc::clone(&hash));
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "abc");
        let part = hash.part();
        assert_eq!(
            (part.sha256, part.len, part.complete),
            (sha(b"abc"), 3, false)
        );
        let rest = body.collect().await.unwrap();
        assert_eq!(rest.trailers(), Some(&trailers));
        assert_eq!(rest.to_bytes(), "def");
        let part = hash.part();
        assert_eq!(
            (part.sha256, part.len, part.complete),
            (sha(b"abcdef"), 6, true)
        );
    }

    /// A body that says it has ended after its last data frame is complete
    /// without a further poll; one that was empty from the start is
    /// complete with nothing read; one that failed never is.
    #[tokio::test]
    async fn the_end_is_seen_from_is_end_stream_and_a_failure_is_never_complete() {
        let hash = Arc::new(RequestHash::new(false));
        let mut body = GuardBody::hashed(
            http_body_util::Full::new(Bytes::from("{}")),
            Arc::clone(&hash),
        );
        assert_eq!(body.size_hint().exact(), Some(2));
        body.frame().await.unwrap().unwrap();
        assert!(body.is_end_stream());
        assert_eq!(hash.part().sha256, sha(b"{}"));
        assert!(hash.part().complete);

        let empty = RequestHash::new(true).part();
        assert_eq!(
            (empty.sha256, empty.len, empty.complete),
            (sha(b""), 0, true)
        );

        let hash = Arc::new(RequestHash::new(false));
        let failing = Frames::new(&[b"abc"]).then(Err("upload reset".into()));
        let mut body = GuardBody::hashed(failing, Arc::clone(&hash));
        body.frame().await.unwrap().unwrap();
        let error = body.frame().await.unwrap().unwrap_err();
        assert_eq!(error.to_string(), "upload reset");
        assert!(body.frame().await.is_none());
        let part = hash.part();
        assert_eq!((part.len, part.complete), (3, false));
    }

    /// What a recorded body's claim was told.
    #[derive(Clone, Default)]
    struct Told(Arc<Mutex<Vec<Result<Completion, &'static str>>>>);

    impl Told {
        fn take(&self) -> Vec<Result<Completion, &'static str>> {
            std::mem::take(&mut self.0.lock().unwrap())
        }
    }

    /// A claim that tells `told` what it recorded, or that it was dropped;
    /// its write waits for `release` when there is one.
    struct FakeClaim {
        told: Told,
        release: Option<tokio::sync::oneshot::Receiver<()>>,
        recorded: bool,
    }

    impl FakeClaim {
        fn settle(self) -> Settle {
            Box::new(move |completion| self.record(completion))
        }

        fn record(mut self, completion: Completion) -> Write {
            self.recorded = true;
            self.told.0.lock().unwrap().push(Ok(completion));
            match self.release.take() {
                Some(release) => Write::new(async move {
                    let _ = release.await;
                }),
                None => Write::new(async {}),
            }
        }
    }

    impl Drop for FakeClaim {
        fn drop(&mut self) {
            if !self.recorded {
                self.told.0.lock().unwrap().push(Err("dropped"));
            }
        }
    }

    fn recorded<B: Body>(body: B, limit: usize, told: &Told) -> GuardBody<B> {
        recorded_declaring(body, None, limit, told)
    }

    /// A recorded 201 `text/plain` response, its `Content-Length` the one
    /// given.
    fn recorded_declaring<B: Body>(
        body: B,
        content_length: Option<u64>,
        limit: usize,
        told: &Told,
    ) -> GuardBody<B> {
        let claim = FakeClaim {
            told: told.clone(),
            release: None,
            recorded: false,
        };
        let mut head = http::Response::builder()
            .status(201)
            .header("content-type", "text/plain");
        if let Some(length) = content_length {
            head = head.header("content-length", length);
        }
        let (parts, ()) = head.body(()).unwrap().into_parts();
        let declared = declared_len(&parts.headers, &body);
        GuardBody::recorded(body, Recorder::new(claim.settle(), &parts, declared, limit))
    }

    fn stored(body: &'static str, trailers: Option<&HeaderMap>) -> Completion {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", "text/plain".parse().unwrap());
        let response = StoredResponse::new(http::StatusCode::CREATED, &headers, body.into());
        Completion::Response(match trailers {
            Some(trailers) => response.with_trailers(trailers),
            None => response,
        })
    }

    #[tokio::test]
    async fn a_recorded_body_streams_and_records_the_whole_response_at_its_end() {
        let told = Told::default();
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let frames = Frames::new(&[b"ab", b"", b"cd"]).then(Ok(Frame::trailers(trailers.clone())));
        let mut body = recorded(frames, 4, &told);
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "ab");
        assert!(told.take().is_empty(), "nothing recorded before the end");
        let rest = body.collect().await.unwrap();
        assert_eq!(rest.trailers(), Some(&trailers));
        assert_eq!(rest.to_bytes(), "cd");
        assert_eq!(told.take(), [Ok(stored("abcd", Some(&trailers)))]);
    }

    /// A body past the limit is recorded as too large the moment it passes
    /// it and streams on untouched; a failing one as failed; one dropped
    /// before its end is left to the claim's drop (cancelled).
    #[tokio::test]
    async fn over_the_limit_failed_and_dropped_bodies_are_not_kept() {
        let told = Told::default();
        let mut body = recorded(Frames::new(&[b"abc", b"de", b"fgh"]), 4, &told);
        body.frame().await.unwrap().unwrap();
        assert!(told.take().is_empty());
        let second = body.frame().await.unwrap().unwrap();
        assert_eq!(second.into_data().unwrap(), "de");
        assert_eq!(told.take(), [Ok(Completion::NotKept(NotKept::TooLarge))]);
        let Kind::Recorded { recorder, .. } = &body.kind else {
            panic!("a recorded body");
        };
        assert!(recorder.chunks.is_empty(), "the chunks are let go");
        assert_eq!(body.collect().await.unwrap().to_bytes(), "fgh");
        assert!(told.take().is_empty());

        let failing = Frames::new(&[b"abc"]).then(Err("reset".into()));
        let body = recorded(failing, 100, &told);
        assert!(body.collect().await.is_err());
        assert_eq!(told.take(), [Ok(Completion::NotKept(NotKept::BodyFailed))]);

        let mut body = recorded(Frames::new(&[b"abc", b"def"]), 100, &told);
        body.frame().await.unwrap().unwrap();
        drop(body);
        assert_eq!(told.take(), [Err("dropped")]);
    }

    /// A body that has given all its `Content-Length` is recorded whole at
    /// that frame, though it has not said it ended: hyper stops polling an
    /// HTTP/1 body there, so waiting for the end recorded a response the
    /// client read in full as cancelled.
    #[tokio::test]
    async fn a_body_is_whole_once_it_has_given_its_declared_length() {
        let told = Told::default();
        let frames = Frames::new(&[b"ab", b"cde"]);
        let mut body = recorded_declaring(frames, Some(5), 100, &told);
        body.frame().await.unwrap().unwrap();
        assert!(told.take().is_empty(), "not whole at 2 of 5 bytes");
        let last = body.frame().await.unwrap().unwrap();
        assert_eq!(last.into_data().unwrap(), "cde");
        // Dropped here, as hyper drops it, without being polled to its end.
        drop(body);
        let mut headers = HeaderMap::new();
        headers.insert("content-type", "text/plain".parse().unwrap());
        headers.insert("content-length", "5".parse().unwrap());
        let whole = StoredResponse::new(http::StatusCode::CREATED, &headers, "abcde".into());
        assert_eq!(told.take(), [Ok(Completion::Response(whole))]);
    }

    /// The last frame waits for the outcome to be written, and while it
    /// waits the body still counts it: `size_hint` and `is_end_stream` stay
    /// exact.
    #[tokio::test]
    async fn the_last_frame_waits_for_the_write_and_is_still_counted() {
        let told = Told::default();
        let (release, wait) = tokio::sync::oneshot::channel();
        let claim = FakeClaim {
            told: told.clone(),
            release: Some(wait),
            recorded: false,
        };
        let (parts, ()) = http::Response::new(()).into_parts();
        let inner = http_body_util::Full::new(Bytes::from("whole"));
        let mut body =
            GuardBody::recorded(inner, Recorder::new(claim.settle(), &parts, Some(5), 100));
        assert_eq!(body.size_hint().exact(), Some(5));
        assert!(!body.is_end_stream());
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());
        assert_eq!(told.take().len(), 1, "the write has started");
        assert_eq!(body.size_hint().exact(), Some(5), "the held frame counts");
        assert!(!body.is_end_stream());
        release.send(()).unwrap();
        let last = body.frame().await.unwrap().unwrap();
        assert_eq!(last.into_data().unwrap(), "whole");
        assert_eq!(body.size_hint().exact(), Some(0));
        assert!(body.is_end_stream());
    }

    #[test]
    fn guard_bodies_are_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<GuardBody<http_body_util::Full<Bytes>>>();
        send_sync::<Write>();
    }

    fn run<F: Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(future)
    }

    proptest::proptest! {
        /// Any chunking: a hashed body hands on the original byte for byte,
        /// and its body part is the SHA-256 of the whole body, complete.
        #[test]
        fn hashing_loses_nothing(
            chunks in proptest::collection::vec(proptest::collection::vec(0u8..=255, 0..40), 0..8),
        ) {
            let whole: Vec<u8> = chunks.concat();
            let slices: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
            let hash = Arc::new(RequestHash::new(false));
            let body = GuardBody::hashed(Frames::new(&slices), Arc::clone(&hash));
            let handed_on = run(body.collect()).unwrap().to_bytes();
            proptest::prop_assert_eq!(&handed_on[..], &whole[..]);
            let part = hash.part();
            proptest::prop_assert_eq!(
                (part.sha256, part.len, part.complete),
                (sha(&whole), whole.len() as u64, true)
            );
        }

        /// Any first body and what its handler read of it (all, or its first
        /// `read` bytes), any repeat in any chunking: the repeat is the same
        /// exactly when it is the same bytes (read whole) or starts with the
        /// same bytes (read in part); and the guard never pulls a frame past
        /// the one that takes it over the length read.
        #[test]
        fn a_repeat_compares_as_far_as_the_first_was_read(
            first in proptest::collection::vec(0u8..4, 0..12),
            read in proptest::option::of(0usize..14),
            repeat in proptest::collection::vec(0u8..4, 0..14),
            cuts in proptest::collection::vec(1usize..5, 0..6),
        ) {
            let read = read.map(|n| n.min(first.len()));
            let mut hasher = BodyHasher::default();
            hasher.update(&first[..read.unwrap_or(first.len())]);
            let part = hasher.part(read.is_none());
            let expected = match read {
                None => repeat == first,
                Some(n) => repeat.len() >= n && repeat[..n] == first[..n],
            };
            let mut chunks = Vec::new();
            let mut rest = &repeat[..];
            for cut in cuts {
                let cut = cut.min(rest.len());
                chunks.push(&rest[..cut]);
                rest = &rest[cut..];
            }
            chunks.push(rest);
            let frames = Frames::new(&chunks);
            let pulled = Arc::clone(&frames.pulled);
            let compared = run(compare(frames, part));
            proptest::prop_assert_eq!(matches!(compared, Ok(true)), expected, "{:?}", compared);
            // Frames needed to pass the length, plus the end.
            let mut needed = 0;
            let mut seen = 0usize;
            for chunk in &chunks {
                if seen as u64 > part.len || (!part.complete && seen as u64 == part.len) {
                    break;
                }
                needed += 1;
                seen += chunk.len();
            }
            proptest::prop_assert!(*pulled.lock().unwrap() <= needed + 1);
        }
    }

    #[tokio::test]
    async fn a_repeat_whose_body_fails_or_declares_another_length_is_not_compared() {
        let mut hasher = BodyHasher::default();
        hasher.update(b"abc");
        let part = hasher.part(true);
        let failing = Frames::new(&[b"ab"]).then(Err("reset".into()));
        assert!(compare(failing, part).await.is_err());
        let longer = Frames::new(&[b"abcd"]);
        let pulled = Arc::clone(&longer.pulled);
        assert!(matches!(compare(longer, part).await, Ok(false)));
        assert_eq!(*pulled.lock().unwrap(), 1);
        // A declared length says it before anything is read.
        let declared = http_body_util::Full::new(Bytes::from("abcd"));
        assert!(matches!(compare(declared, part).await, Ok(false)));
        let same = http_body_util::Full::new(Bytes::from("abc"));
        assert!(matches!(compare(same, part).await, Ok(true)));
    }
}
