//! Describing a request for a dead-letter entry, before the inner service
//! consumes it.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::HeaderName;
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tower_classify::BoxError;

use crate::attempts::AttemptCounter;
use crate::entry::StoredHeader;

/// What a [`CaptureRequest`] records about one request.
///
/// Headers are stored as given here and redacted by the layer afterwards, so
/// a capture cannot forget to redact.
#[derive(Debug, Clone, Default)]
pub struct RequestRecord {
    /// The message id that poison detection counts failures by.
    pub message_id: Option<String>,
    /// The method or operation name.
    pub method: Option<String>,
    /// The URI or destination.
    pub uri: Option<String>,
    /// The headers (redacted later by the layer).
    pub headers: Vec<StoredHeader>,
    /// The body, at most the body limit.
    pub body: Bytes,
    /// `true` when the body was longer than what [`body`](Self::body) holds.
    pub body_truncated: bool,
    /// Counts the attempts a retry layer below makes (see
    /// [`CountAttemptsLayer`](crate::CountAttemptsLayer)).
    pub attempts: Option<AttemptCounter>,
}

/// Records what a dead-letter entry needs from a request, and hands on the
/// request for the inner service.
///
/// The layer needs the request's data *after* the inner service has
/// consumed the request, so it captures it first. Implementations:
///
/// - [`HttpCapture`] for `http::Request<B>` (the default): buffers the body up
///   to a limit and hands the inner service the whole body as a
///   [`CapturedBody`].
/// - [`describe_fn`] for any other request type, such as a queue message: a
///   closure describes the message, which passes through unchanged.
pub trait CaptureRequest<Req> {
    /// The request the inner service receives.
    type Request;
    /// Resolves to the request for the inner service and its record.
    type Future: Future<Output = Result<(Self::Request, RequestRecord), BoxError>> + Send + 'static;

    /// Captures `request`.
    fn capture(&self, request: Req) -> Self::Future;
}

/// Describes a response that was classified as a failure, for the entry's
/// error text (a response is not an error and has no chain).
pub trait DescribeResponse<Res> {
    /// One line describing `response`.
    fn describe_response(&self, response: &Res) -> String;
}

/// The default body limit of [`HttpCapture`]: 64 KiB.
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// Captures `http::Request<B>`: method, URI, headers and the body up to a
/// byte limit.
///
/// The body is read *before* the inner service is called, at most
/// [`body_limit`](Self::body_limit) bytes plus the frame that crossed it, and
/// never more: a larger body is recorded as its first `body_limit` bytes with
/// [`body_truncated`](RequestRecord::body_truncated) set. Either way the inner
/// service receives the *whole* body as a [`CapturedBody`]: the frames read
/// so far, then the rest of the original stream. Reading first means an entry
/// has its body even when the call fails before the inner service reads
/// anything (a refused connection).
///
/// The inner service therefore sees `Request<CapturedBody<B>>`. axum's
/// `Router` and tower-http services accept any body; a client with a fixed
/// body type can box it (`http_body_util::combinators::UnsyncBoxBody`).
#[derive(Clone)]
pub struct HttpCapture {
    body_limit: usize,
    message_id_header: Option<HeaderName>,
}

impl Default for HttpCapture {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpCapture {
    /// Captures with a body limit of [`DEFAULT_BODY_LIMIT`].
    pub const fn new() -> Self {
        HttpCapture {
            body_limit: DEFAULT_BODY_LIMIT,
            message_id_header: None,
        }
    }

    /// Keeps at most `limit` bytes of each body.
    pub const fn body_limit(mut self, limit: usize) -> Self {
        self.body_limit = limit;
        self
    }

    /// Reads the message id for poison detection from header `name` (for
    /// example `x-message-id` on a push subscription's requests).
    pub fn message_id_header(mut self, name: HeaderName) -> Self {
        self.message_id_header = Some(name);
        self
    }
}

impl fmt::Debug for HttpCapture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpCapture")
            .field("body_limit", &self.body_limit)
            .field("message_id_header", &self.message_id_header)
            .finish()
    }
}

impl<B> CaptureRequest<Request<B>> for HttpCapture
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Request = Request<CapturedBody<B>>;
    type Future =
        Pin<Box<dyn Future<Output = Result<(Self::Request, RequestRecord), BoxError>> + Send>>;

    fn capture(&self, request: Request<B>) -> Self::Future {
        let (mut parts, body) = request.into_parts();
        let attempts = AttemptCounter::new();
        parts.extensions.insert(attempts.clone());
        let headers = parts
            .headers
            .iter()
            .map(|(name, value)| StoredHeader {
                name: name.as_str().to_owned(),
                value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
            })
            .collect();
        let message_id = self
            .message_id_header
            .as_ref()
            .and_then(|name| parts.headers.get(name))
            .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
        let mut record = RequestRecord {
            message_id,
            method: Some(parts.method.to_string()),
            uri: Some(parts.uri.to_string()),
            headers,
            body: Bytes::new(),
            body_truncated: false,
            attempts: Some(attempts),
        };
        let limit = self.body_limit;
        Box::pin(async move {
            let (body, prefix, truncated) = read_prefix(body, limit).await?;
            record.body = prefix;
            record.body_truncated = truncated;
            Ok((Request::from_parts(parts, body), record))
        })
    }
}

impl<B> DescribeResponse<Response<B>> for HttpCapture {
    fn describe_response(&self, response: &Response<B>) -> String {
        format!("HTTP {}", response.status())
    }
}

/// Reads frames until more than `limit` bytes or the end of the body.
pub(crate) async fn read_prefix<B>(
    body: B,
    limit: usize,
) -> Result<(CapturedBody<B>, Bytes, bool), BoxError>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let mut rest = Box::pin(body);
    let mut frames = VecDeque::new();
    let mut trailers = None;
    let mut total = 0usize;
    let mut ended = false;
    while total <= limit {
        if rest.is_end_stream() {
            ended = true;
            break;
        }
        match rest.frame().await {
            None => {
                ended = true;
                break;
            }
            Some(Err(error)) => return Err(error.into()),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    total += data.len();
                    frames.push_back(data);
                }
                Err(frame) => {
                    if let Ok(map) = frame.into_trailers() {
                        trailers = Some(map);
                    }
                }
            },
        }
    }
    let truncated = total > limit;
    let mut prefix = BytesMut::with_capacity(total.min(limit));
    for data in &frames {
        let room = limit - prefix.len();
        prefix.extend_from_slice(&data[..data.len().min(room)]);
        if prefix.len() == limit {
            break;
        }
    }
    let body = CapturedBody {
        frames,
        trailers,
        rest: (!ended).then_some(rest),
    };
    Ok((body, prefix.freeze(), truncated))
}

/// The body the inner service receives from [`HttpCapture`]: the frames read
/// while capturing, then the rest of the original body.
#[derive(Clone)]
pub struct CapturedBody<B> {
    frames: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
    rest: Option<Pin<Box<B>>>,
}

impl<B> CapturedBody<B> {
    /// A body of `bytes` alone (no stream behind it).
    pub fn full(bytes: Bytes) -> Self {
        CapturedBody {
            frames: VecDeque::from([bytes]),
            trailers: None,
            rest: None,
        }
    }

    /// `body` as it is, nothing read from it yet.
    pub fn streaming(body: B) -> Self {
        CapturedBody {
            frames: VecDeque::new(),
            trailers: None,
            rest: Some(Box::pin(body)),
        }
    }
}

impl<B> fmt::Debug for CapturedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CapturedBody")
            .field("buffered_frames", &self.frames.len())
            .field("streaming", &self.rest.is_some())
            .finish()
    }
}

impl<B> Body for CapturedBody<B>
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
        // `Pin<Box<B>>` is `Unpin`, so the whole body is.
        let this = self.get_mut();
        if let Some(data) = this.frames.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(rest) = this.rest.as_mut() {
            match rest.as_mut().poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(frame)) => return Poll::Ready(Some(frame.map_err(Into::into))),
                Poll::Ready(None) => this.rest = None,
            }
        }
        Poll::Ready(this.trailers.take().map(|map| Ok(Frame::trailers(map))))
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
            && self.trailers.is_none()
            && self.rest.as_ref().is_none_or(|rest| rest.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let buffered: usize = self.frames.iter().map(Bytes::len).sum();
        let rest = match &self.rest {
            Some(rest) => rest.size_hint(),
            None => SizeHint::with_exact(0),
        };
        // Build a fresh hint: raising the lower bound of `rest`'s hint before
        // its upper bound would trip `SizeHint`'s `lower <= upper` assertion
        // whenever `rest` is exact (a `Full` body is).
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(buffered as u64));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(buffered as u64));
        }
        hint
    }
}

/// Describes requests of any type with a closure; see [`describe_fn`].
#[derive(Clone, Copy)]
pub struct DescribeFn<F> {
    f: F,
}

/// Captures requests of any type (queue messages, RPC requests) with a
/// closure that describes one as a [`RequestRecord`]. The request passes to
/// the inner service unchanged.
///
/// ```
/// use bytes::Bytes;
/// use tower_poison::{describe_fn, RequestRecord};
///
/// struct Message { id: String, payload: Bytes }
///
/// let capture = describe_fn(|message: &Message| RequestRecord {
///     message_id: Some(message.id.clone()),
///     body: message.payload.clone(),
///     ..RequestRecord::default()
/// });
/// # let _ = capture;
/// ```
///
/// The closure sees the whole message: keep the body it records small (the
/// layer stores what it is given).
pub const fn describe_fn<F>(f: F) -> DescribeFn<F> {
    DescribeFn { f }
}

impl<F, Req> CaptureRequest<Req> for DescribeFn<F>
where
    F: Fn(&Req) -> RequestRecord,
    Req: Send + 'static,
{
    type Request = Req;
    type Future = std::future::Ready<Result<(Req, RequestRecord), BoxError>>;

    fn capture(&self, request: Req) -> Self::Future {
        let record = (self.f)(&request);
        std::future::ready(Ok((request, record)))
    }
}

impl<F, Res> DescribeResponse<Res> for DescribeFn<F> {
    fn describe_response(&self, _response: &Res) -> String {
        "the response was classified as a failure".to_owned()
    }
}

impl<F> fmt::Debug for DescribeFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DescribeFn")
            .field("f", &std::any::type_name::<F>())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A streamed body that counts how many frames were pulled from it.
    struct Chunks {
        chunks: VecDeque<Bytes>,
        pulled: Arc<AtomicUsize>,
    }

    impl Body for Chunks {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            let this = self.get_mut();
            Poll::Ready(this.chunks.pop_front().map(|c| {
                this.pulled.fetch_add(1, Ordering::SeqCst);
                Ok(Frame::data(c))
            }))
        }
    }

    fn chunked(chunks: &[&'static str]) -> (Chunks, Arc<AtomicUsize>) {
        let pulled = Arc::new(AtomicUsize::new(0));
        let body = Chunks {
            chunks: chunks
                .iter()
                .map(|c| Bytes::from_static(c.as_bytes()))
                .collect(),
            pulled: pulled.clone(),
        };
        (body, pulled)
    }

    #[tokio::test]
    async fn size_hint_of_a_buffered_exact_body_is_exact() {
        // A `Full` body's hint is exact; once its bytes are buffered here, the
        // hint must still hold `lower <= upper` (http-body asserts it).
        let (body, _, _) = read_prefix(Full::new(Bytes::from("hello")), 10)
            .await
            .unwrap();
        let hint = body.size_hint();
        assert_eq!((hint.lower(), hint.upper()), (5, Some(5)));
        let (body, _, truncated) = read_prefix(Full::new(Bytes::from("hello world")), 4)
            .await
            .unwrap();
        assert!(truncated);
        assert_eq!(body.size_hint().exact(), Some(11));
    }

    #[tokio::test]
    async fn small_body_is_kept_whole_and_passed_on() {
        let (body, prefix, truncated) = read_prefix(Full::new(Bytes::from("hello")), 10)
            .await
            .unwrap();
        assert_eq!(prefix, "hello");
        assert!(!truncated);
        assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");
    }

    #[tokio::test]
    async fn body_of_exactly_the_limit_is_not_truncated() {
        let (body, _) = chunked(&["abc", "def"]);
        let (_, prefix, truncated) = read_prefix(body, 6).await.unwrap();
        assert_eq!(prefix, "abcdef");
        assert!(!truncated);
    }

    #[tokio::test]
    async fn large_streamed_body_is_cut_not_buffered_past_the_limit_and_passed_on_whole() {
        let (body, pulled) = chunked(&["abcd", "efgh", "ijkl", "mnop"]);
        let (body, prefix, truncated) = read_prefix(body, 6).await.unwrap();
        assert_eq!(prefix, "abcdef");
        assert!(truncated);
        // Capture stopped at the frame that crossed the limit.
        assert_eq!(pulled.load(Ordering::SeqCst), 2);
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abcdefghijklmnop");
        assert_eq!(pulled.load(Ordering::SeqCst), 4);
    }

    proptest::proptest! {
        /// For any chunking and any limit: the record holds exactly the first
        /// `limit` bytes, the flag says whether there were more, capture pulls
        /// at most one frame past the limit, and the inner service still gets
        /// every byte in order.
        #[test]
        fn capture_keeps_a_prefix_and_passes_everything_on(
            chunks in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..40), 0..12),
            limit in 0usize..200,
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let whole: Vec<u8> = chunks.concat();
            let pulled = Arc::new(AtomicUsize::new(0));
            let body = Chunks {
                chunks: chunks.iter().map(|c| Bytes::from(c.clone())).collect(),
                pulled: pulled.clone(),
            };
            let (body, prefix, truncated) = runtime.block_on(read_prefix(body, limit)).unwrap();
            proptest::prop_assert_eq!(&prefix[..], &whole[..whole.len().min(limit)]);
            proptest::prop_assert_eq!(truncated, whole.len() > limit);
            // Frames pulled while capturing: those that fit in the limit, plus
            // at most the one that crossed it.
            let mut fit = 0;
            let mut seen = 0;
            for chunk in &chunks {
                if seen > limit { break; }
                seen += chunk.len();
                fit += 1;
            }
            proptest::prop_assert!(pulled.load(Ordering::SeqCst) <= fit);
            let passed = runtime.block_on(body.collect()).unwrap().to_bytes();
            proptest::prop_assert_eq!(&passed[..], &whole[..]);
        }
    }
}
