//! Describing a request for a dead-letter entry, without reading its body
//! ahead of the inner service.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::header::HeaderName;
use http::{Request, Response};
use http_body::Body;
use http_body_replay::{ReplayBody, RequestHead};
use http_body_util::BodyExt;
use tower_classify::SettleBody;

use crate::attempts::{AttemptCounter, Attempts};
use crate::counts::delivery::read_extension;
use crate::counts::DeliveryCount;
use crate::entry::StoredHeader;
use crate::open::OpenCall;

/// What a [`CaptureRequest`] records about one request.
///
/// Headers are stored as given here and redacted by the layer afterwards, so
/// a capture cannot forget to redact.
#[derive(Debug, Clone, Default)]
pub struct RequestRecord {
    /// The message id that poison detection counts failures by.
    pub message_id: Option<String>,
    /// Which delivery of the message this is (1 for the first), when the
    /// queue counts deliveries (SQS's `ApproximateReceiveCount`, Redis
    /// Streams' times-delivered): authoritative for poison detection, which
    /// then asks no count store.
    pub delivery: Option<u32>,
    /// The method or operation name.
    pub method: Option<String>,
    /// The URI or destination.
    pub uri: Option<String>,
    /// The headers (redacted later by the layer).
    pub headers: Vec<StoredHeader>,
    /// The body, at most the body limit.
    pub body: Bytes,
    /// `true` when [`body`](Self::body) is not the whole body.
    pub body_truncated: bool,
    /// The whole body's length when it is not kept whole and the length is
    /// known (the bytes read of a body too large to capture).
    pub body_len: Option<u64>,
    /// Counts the attempts a retry layer below makes (see
    /// [`CountAttemptsLayer`](crate::CountAttemptsLayer)).
    pub attempts: Option<AttemptCounter>,
}

/// Records what a dead-letter entry needs from a request, and hands on the
/// request for the inner service: [`HttpCapture`] for `http::Request<B>`
/// (the default), [`describe_fn`] for any other request type.
///
/// The layer needs the request's data *after* the inner service has
/// consumed the request, so a capture keeps what it needs first, without
/// waiting for anything; one of your own returns [`PendingRecord::ready`]
/// with the record it made up front.
pub trait CaptureRequest<Req> {
    /// The request the inner service receives.
    type Request;

    /// The recording of the request's body the capture keeps while the
    /// call runs: a [`ReplayBody`] for [`HttpCapture`], `()` for a request
    /// described up front.
    type Recording: BodyRecording;

    /// Captures `request`: the request to hand on, and what is kept to
    /// describe it should the call fail.
    fn capture(&self, request: Req) -> (Self::Request, PendingRecord<Self::Recording>);
}

/// Describes a response that was classified as a failure, for the entry's
/// error text (a response is not an error and has no chain), and hands each
/// response back to the caller.
pub trait DescribeResponse<Res> {
    /// The response the layer hands back: for [`HttpCapture`], the same
    /// response with its body in a [`SettleBody`], which settles a call its
    /// head left open ([`OpenCall`]); for [`describe_fn`], `Res` itself.
    type Response;

    /// Hands `response` back to the caller; `open` when the classifier left
    /// the call open at the head, to be settled where the response's body
    /// ends. A capture whose responses have no body to watch drops `open`:
    /// the call is then settled as a body dropped before its end is, with
    /// nothing recorded.
    fn hand_back(&self, response: Res, open: Option<OpenCall>) -> Self::Response;

    /// One line describing `response`.
    fn describe_response(&self, response: &Res) -> String;

    /// The response's HTTP status code, when it has one, for the
    /// [replay history](crate::ReplayRecord::status). `None` by default.
    fn status_code(&self, response: &Res) -> Option<u16> {
        let _ = response;
        None
    }
}

/// What a capture keeps while the call runs; turned into a
/// [`RequestRecord`] only if the call fails.
///
/// For an HTTP request that is a copy of its head (a [`RequestHead`]: one
/// buffer) and the body's recording `R`: nothing is formatted, redacted or
/// turned into text unless the call fails.
pub struct PendingRecord<R = ()> {
    /// The message id poison detection counts by.
    pub(crate) message_id: Option<String>,
    /// Which delivery of the message this is, when the request says.
    pub(crate) delivery: Option<u32>,
    kept: Kept<R>,
}

enum Kept<R> {
    /// Described up front (a queue message); boxed, so that an HTTP
    /// call's pending record, which its future moves, stays small.
    Record(Box<RequestRecord>),
    /// An HTTP request's head and the shared recording of its body.
    Http {
        head: RequestHead,
        body: R,
        /// The request's own counter, when it carried one.
        attempts: Option<AttemptCounter>,
    },
}

/// The recording of a request body that a [`PendingRecord`] keeps: a
/// [`ReplayBody`] (read back only if the call fails), or `()` for a request
/// described up front.
///
/// Sealed: the layer reads recordings through methods of its own.
pub trait BodyRecording: sealed::Finish + Send + Sync + 'static {}

impl<T: sealed::Finish + Send + Sync + 'static> BodyRecording for T {}

pub(crate) mod sealed {
    use std::future::Future;
    use std::time::Duration;

    use super::RequestRecord;

    /// How the layer reads a [`BodyRecording`](super::BodyRecording).
    pub trait Finish {
        /// Sets `record`'s body fields to the recorded bytes once the body
        /// has been read to its end, or as far as it can be within `wait`.
        fn finish<'a>(
            &'a self,
            wait: Duration,
            record: &'a mut RequestRecord,
        ) -> impl Future<Output = ()> + Send + 'a;
    }
}

impl sealed::Finish for () {
    async fn finish(&self, _wait: Duration, _record: &mut RequestRecord) {}
}

impl<B> sealed::Finish for ReplayBody<B>
where
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<tower_classify::BoxError>,
{
    async fn finish(&self, wait: Duration, record: &mut RequestRecord) {
        // The service may have failed before reading the body to its end
        // (a refused connection, a handler that answered early): read the
        // rest through a copy, within `wait`, so the entry can be
        // replayed; the copy stops recording at the limit like any
        // other. Only when no other copy is left: a service still
        // reading the body (an upload going on after an early error
        // status) must not have frames taken from under it, nor wait.
        let recording = self.recording();
        if !recording.is_complete()
            && !recording.is_released()
            && self.can_replay()
            && self.copies() == 1
        {
            let mut copy = self.clone();
            let drain = async { while let Some(Ok(_)) = copy.frame().await {} };
            let _ = tokio::time::timeout(wait, drain).await;
        }
        let recording = self.recording();
        if recording.is_released() {
            record.body_truncated = true;
            record.body_len = Some(recording.bytes_read());
            return;
        }
        record.body = match recording.data() {
            [] => Bytes::new(),
            [one] => one.clone(),
            frames => Bytes::from(frames.concat()),
        };
        record.body_truncated = !recording.is_complete();
        record.body_len = record.body_truncated.then_some(recording.bytes_read());
    }
}

impl PendingRecord {
    /// A record made up front, as a [`describe_fn`] closure's is, for a
    /// capture of one's own.
    pub fn ready(record: RequestRecord) -> Self {
        PendingRecord {
            message_id: record.message_id.clone(),
            delivery: record.delivery,
            kept: Kept::Record(Box::new(record)),
        }
    }
}

impl<R: BodyRecording> PendingRecord<R> {
    /// The record, reading what the body's recording holds; `attempts`
    /// are those [`CountAttempts`](crate::CountAttempts) counted for the
    /// call (unless the request carried a counter of its own).
    pub(crate) async fn finish(self, wait: Duration, attempts: Attempts) -> RequestRecord {
        match self.kept {
            Kept::Record(record) => *record,
            Kept::Http {
                head,
                body,
                attempts: carried,
            } => {
                let attempts = carried.unwrap_or_else(|| AttemptCounter::settled(attempts));
                let mut record = RequestRecord {
                    message_id: self.message_id,
                    delivery: self.delivery,
                    method: Some(head.method().to_owned()),
                    uri: Some(head.uri().to_owned()),
                    headers: stored_headers(&head),
                    attempts: Some(attempts),
                    ..RequestRecord::default()
                };
                sealed::Finish::finish(&body, wait, &mut record).await;
                record
            }
        }
    }
}

impl<R> fmt::Debug for PendingRecord<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingRecord")
            .field("message_id", &self.message_id)
            .finish_non_exhaustive()
    }
}

/// The default body limit of [`HttpCapture`]: 64 KiB.
pub(crate) const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// How long a failed call's entry waits for the rest of a body the service
/// did not read to its end.
pub(crate) const BODY_WAIT: Duration = Duration::from_secs(1);

/// Captures `http::Request<B>`: method, URI, headers and the body up to a
/// byte limit, **without reading anything ahead**.
///
/// The inner service receives the body as a [`ReplayBody`]: each frame
/// reaches it as the client sends it, and is recorded on the way (the same
/// refcounted bytes, no copy) up to the layer's
/// [`body_limit`](crate::DeadLetterLayer::body_limit) (64 KiB by default). The
/// recording is read only if the call fails:
///
/// - a body within the limit is stored whole; if the service stopped
///   reading early (a refused connection), the rest is read then, for at
///   most a second;
/// - a larger body is not stored at all: the entry says it was not
///   captured and how many bytes were read
///   ([`body_len`](RequestRecord::body_len)), and the call is never held up.
///
/// The inner service sees `Request<ReplayBody<B>>` (a retry layer below
/// replays it, and needs no `ReplayBodyLayer` of its own). axum's `Router`
/// and tower-http services accept any body; a client with a fixed body type
/// can box it (`http_body_util::combinators::UnsyncBoxBody`).
///
/// `HttpCapture::default()` reads no message id and no delivery count (the
/// layer's [`message_id_header`](crate::DeadLetterLayer::message_id_header)
/// and [`delivery_count`](crate::DeadLetterLayer::delivery_count) set them);
/// a [`Replayer`](crate::replay::Replayer) takes it to
/// [describe](crate::replay::Replayer::describe) HTTP responses.
#[derive(Debug, Clone)]
pub struct HttpCapture {
    // Set by the layer's builder methods of the same names.
    pub(crate) body_limit: usize,
    pub(crate) message_id_header: Option<HeaderName>,
    pub(crate) delivery_count: Option<DeliveryCount>,
}

impl Default for HttpCapture {
    fn default() -> Self {
        HttpCapture {
            body_limit: DEFAULT_BODY_LIMIT,
            message_id_header: None,
            delivery_count: None,
        }
    }
}

impl<B> CaptureRequest<Request<B>> for HttpCapture
where
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<tower_classify::BoxError>,
{
    type Request = Request<ReplayBody<B>>;
    type Recording = ReplayBody<B>;

    fn capture(&self, request: Request<B>) -> (Self::Request, PendingRecord<ReplayBody<B>>) {
        // Read in place: the head is a few hundred bytes, and taking it
        // apart and putting it back together moves it twice.
        // Nothing is put into the request: `CountAttempts` counts into the
        // call's tally (see `AttemptCounter` for a request that brings its
        // own counter).
        let attempts = request.extensions().get::<AttemptCounter>().cloned();
        let message_id = self
            .message_id_header
            .as_ref()
            .and_then(|name| request.headers().get(name))
            .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
        let delivery = match &self.delivery_count {
            Some(reader) => reader.read_from(request.headers(), request.extensions()),
            None => read_extension(request.extensions()),
        };
        let head = RequestHead::new(&request);
        let request = request.map(|body| ReplayBody::new(body, self.body_limit));
        let pending = PendingRecord {
            message_id,
            delivery,
            kept: Kept::Http {
                head,
                body: request.body().clone(),
                attempts,
            },
        };
        (request, pending)
    }
}

/// The headers of a copied head as an entry stores them: a name once per
/// value, values that are not UTF-8 made so with replacement characters.
fn stored_headers(head: &RequestHead) -> Vec<StoredHeader> {
    head.headers()
        .map(|header| StoredHeader {
            name: header.name.to_owned(),
            value: String::from_utf8_lossy(header.value).into_owned(),
        })
        .collect()
}

impl<B> DescribeResponse<Response<B>> for HttpCapture {
    type Response = Response<SettleBody<B, OpenCall>>;

    fn hand_back(&self, response: Response<B>, open: Option<OpenCall>) -> Self::Response {
        // A call its head settled gets its body back as it was, in place:
        // no allocation, nothing watched.
        response.map(|body| match open {
            Some(open) => SettleBody::new(body, open),
            None => SettleBody::settled(body),
        })
    }

    fn describe_response(&self, response: &Response<B>) -> String {
        format!("HTTP {}", response.status())
    }

    fn status_code(&self, response: &Response<B>) -> Option<u16> {
        Some(response.status().as_u16())
    }
}

/// Describes requests of any type with a closure; see [`describe_fn`].
#[derive(Clone, Copy)]
pub struct DescribeFn<F> {
    f: F,
}

/// Captures requests of any type (queue messages, RPC requests) with a
/// closure that describes one as a [`RequestRecord`]. The request passes to
/// the inner service unchanged (the crate docs'
/// [poison messages](crate#poison-messages) example uses one).
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
    type Recording = ();

    fn capture(&self, request: Req) -> (Req, PendingRecord) {
        let record = (self.f)(&request);
        (request, PendingRecord::ready(record))
    }
}

impl<F, Res> DescribeResponse<Res> for DescribeFn<F> {
    type Response = Res;

    fn hand_back(&self, response: Res, _open: Option<OpenCall>) -> Res {
        response
    }

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

    #[test]
    fn stored_headers_keep_every_value_in_order_and_make_bytes_text() {
        let mut request = Request::new(());
        let headers = request.headers_mut();
        headers.append("accept", "application/json".parse().unwrap());
        headers.append("x-tag", "a".parse().unwrap());
        headers.append("x-tag", "b".parse().unwrap());
        headers.append("x-raw", http::HeaderValue::from_bytes(b"caf\xe9").unwrap());
        let pairs: Vec<_> = stored_headers(&RequestHead::new(&request))
            .into_iter()
            .map(|header| (header.name, header.value))
            .collect();
        assert_eq!(
            pairs,
            [
                ("accept".to_owned(), "application/json".to_owned()),
                ("x-tag".to_owned(), "a".to_owned()),
                ("x-tag".to_owned(), "b".to_owned()),
                ("x-raw".to_owned(), "caf\u{fffd}".to_owned()),
            ]
        );
    }
}
