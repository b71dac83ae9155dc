//! The body the guard hands on, in both directions.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_classify::BoxError;

pin_project! {
    /// A body whose first frames the guard has already read, followed by the
    /// rest of the original body; or a whole body of the guard's own (a
    /// replayed response, a refusal).
    ///
    /// The guard reads a guarded request's body up to the fingerprint limit
    /// before it calls the service, and a guarded response's body up to the
    /// response limit before it returns, to store it. Nothing is lost: the
    /// frames read are handed on first, then the rest streams as it arrives.
    /// Requests and responses the guard does not guard stream untouched.
    pub struct GuardBody<B> {
        read: VecDeque<Bytes>,
        read_len: u64,
        trailers: Option<HeaderMap>,
        error: Option<BoxError>,
        #[pin]
        rest: Rest<B>,
    }
}

pin_project! {
    /// The part of the original body not read yet: inline when nothing was
    /// read (no allocation on the pass-through path), boxed once the guard
    /// has polled it in place.
    #[project = RestProj]
    enum Rest<B> {
        Inline { #[pin] body: B },
        Boxed { body: Pin<Box<B>> },
        Done,
    }
}

impl<B> GuardBody<B> {
    /// The original body, untouched.
    pub fn new(body: B) -> Self {
        GuardBody {
            read: VecDeque::new(),
            read_len: 0,
            trailers: None,
            error: None,
            rest: Rest::Inline { body },
        }
    }

    /// A whole body of `bytes`, ended by `trailers`.
    pub(crate) fn replay(bytes: Bytes, trailers: Option<HeaderMap>) -> Self {
        GuardBody {
            trailers,
            ..Self::full(bytes)
        }
    }

    /// The trailers read ahead with the whole body, if it had any.
    pub(crate) fn trailers(&self) -> Option<&HeaderMap> {
        self.trailers.as_ref()
    }

    /// A whole body of `bytes`.
    pub fn full(bytes: Bytes) -> Self {
        let read_len = bytes.len() as u64;
        let read = if bytes.is_empty() {
            VecDeque::new()
        } else {
            VecDeque::from([bytes])
        };
        GuardBody {
            read,
            read_len,
            trailers: None,
            error: None,
            rest: Rest::Done,
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
        let mut this = self.project();
        if let Some(data) = this.read.pop_front() {
            *this.read_len -= data.len() as u64;
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        let polled = match this.rest.as_mut().project() {
            RestProj::Inline { body } => ready!(body.poll_frame(cx)),
            RestProj::Boxed { body } => ready!(body.as_mut().poll_frame(cx)),
            RestProj::Done => None,
        };
        if let Some(frame) = polled {
            return Poll::Ready(Some(frame.map_err(Into::into)));
        }
        this.rest.set(Rest::Done);
        if let Some(trailers) = this.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Poll::Ready(this.error.take().map(Err))
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty()
            && self.trailers.is_none()
            && self.error.is_none()
            && match &self.rest {
                Rest::Inline { body } => body.is_end_stream(),
                Rest::Boxed { body } => body.is_end_stream(),
                Rest::Done => true,
            }
    }

    fn size_hint(&self) -> SizeHint {
        let rest = match &self.rest {
            Rest::Inline { body } => body.size_hint(),
            Rest::Boxed { body } => body.size_hint(),
            Rest::Done => SizeHint::with_exact(0),
        };
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(self.read_len));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(self.read_len));
        }
        hint
    }
}

impl<B> fmt::Debug for GuardBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardBody")
            .field("read_len", &self.read_len)
            .field("streaming", &!matches!(self.rest, Rest::Done))
            .finish_non_exhaustive()
    }
}

/// How reading a body ahead ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The whole body was read, within the limit.
    Whole,
    /// The body is longer than the limit; the rest was left to stream.
    OverLimit,
    /// The body failed; its error is handed on after the frames read.
    Failed,
}

/// Reads `body` until it ends, fails, or more than `limit` bytes were read.
/// Returns the body to hand on (nothing lost), a copy of its first `limit`
/// bytes at most, and how the reading ended.
pub(crate) async fn read_ahead<B>(body: B, limit: usize) -> (GuardBody<B>, Bytes, Ending)
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = Box::pin(body);
    let mut read = VecDeque::new();
    let mut trailers = None;
    let mut error = None;
    let mut total = 0usize;
    let ending = loop {
        if total > limit {
            break Ending::OverLimit;
        }
        if body.is_end_stream() {
            break Ending::Whole;
        }
        match std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            None => break Ending::Whole,
            Some(Err(e)) => {
                error = Some(e.into());
                break Ending::Failed;
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    total = total.saturating_add(data.len());
                    read.push_back(data);
                }
                Err(frame) => {
                    if let Ok(map) = frame.into_trailers() {
                        trailers = Some(map);
                    }
                }
            },
        }
    };
    let mut prefix = BytesMut::with_capacity(total.min(limit));
    for data in &read {
        let room = limit - prefix.len();
        prefix.extend_from_slice(&data[..data.len().min(room)]);
        if prefix.len() == limit {
            break;
        }
    }
    let rest = match ending {
        Ending::OverLimit => Rest::Boxed { body },
        Ending::Whole | Ending::Failed => Rest::Done,
    };
    let body = GuardBody {
        read_len: total as u64,
        read,
        trailers,
        error,
        rest,
    };
    (body, prefix.freeze(), ending)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A body of the given chunks, then optional trailers or an error,
    /// counting how many frames were pulled.
    struct Chunks {
        frames: VecDeque<Result<Frame<Bytes>, BoxError>>,
    }

    impl Chunks {
        fn new(chunks: &[&'static str]) -> Self {
            Chunks {
                frames: chunks
                    .iter()
                    .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes()))))
                    .collect(),
            }
        }

        fn then(mut self, frame: Result<Frame<Bytes>, BoxError>) -> Self {
            self.frames.push_back(frame);
            self
        }
    }

    impl Body for Chunks {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Ready(self.frames.pop_front())
        }
    }

    #[tokio::test]
    async fn a_body_within_the_limit_is_read_whole_and_handed_on_whole() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let body = Chunks::new(&["abc", "def"]).then(Ok(Frame::trailers(trailers.clone())));
        let (body, prefix, ending) = read_ahead(body, 6).await;
        assert_eq!((prefix.as_ref(), ending), (&b"abcdef"[..], Ending::Whole));
        assert_eq!(body.size_hint().exact(), Some(6));
        let collected = body.collect().await.unwrap();
        assert_eq!(collected.trailers(), Some(&trailers));
        assert_eq!(collected.to_bytes(), "abcdef");
    }

    #[tokio::test]
    async fn a_longer_body_is_read_only_past_the_limit_and_handed_on_whole() {
        let body = Chunks::new(&["abcd", "efgh", "ijkl", "mnop"]);
        let (body, prefix, ending) = read_ahead(body, 6).await;
        assert_eq!(
            (prefix.as_ref(), ending),
            (&b"abcdef"[..], Ending::OverLimit)
        );
        // Two frames were read (8 bytes, past the limit), two are left.
        assert_eq!(body.read.len(), 2);
        assert!(matches!(&body.rest, Rest::Boxed { body } if body.frames.len() == 2));
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abcdefghijklmnop");
    }

    #[tokio::test]
    async fn a_failing_body_hands_on_what_was_read_then_its_error() {
        let body = Chunks::new(&["abc"]).then(Err("upload reset".into()));
        let (mut body, prefix, ending) = read_ahead(body, 100).await;
        assert_eq!((prefix.as_ref(), ending), (&b"abc"[..], Ending::Failed));
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "abc");
        let error = body.frame().await.unwrap().unwrap_err();
        assert_eq!(error.to_string(), "upload reset");
        assert!(body.frame().await.is_none());
        assert!(body.is_end_stream());
    }

    proptest::proptest! {
        /// Any chunking and any limit: the prefix is the body's first
        /// `limit` bytes, the ending says whether it was all of it, and the
        /// body handed on is the original, byte for byte.
        #[test]
        fn read_ahead_loses_nothing(
            chunks in proptest::collection::vec(proptest::collection::vec(0u8..=255, 0..40), 0..8),
            limit in 0usize..200,
        ) {
            let whole: Vec<u8> = chunks.concat();
            let body = Chunks {
                frames: chunks.into_iter().map(|c| Ok(Frame::data(Bytes::from(c)))).collect(),
            };
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let (prefix, ending, handed_on) = runtime.block_on(async {
                let (body, prefix, ending) = read_ahead(body, limit).await;
                (prefix, ending, body.collect().await.unwrap().to_bytes())
            });
            proptest::prop_assert_eq!(&prefix[..], &whole[..whole.len().min(limit)]);
            proptest::prop_assert_eq!(ending == Ending::Whole, whole.len() <= limit);
            proptest::prop_assert_eq!(&handed_on[..], &whole[..]);
        }
    }
}
