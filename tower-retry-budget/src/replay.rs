//! Which requests may be sent again, and how to copy them.
//!
//! A retry needs the request again after the first attempt consumed it. A
//! [`Replay`] keeps what it needs of the request before that attempt, or
//! refuses: a request it refuses gets exactly one attempt. Each retry is
//! then made from what was kept.
//!
//! - [`CloneRequest`] (the default): any `Req: Clone`, always replayable.
//! - [`HttpReplay`] (feature `http`): an `http::Request<B>` that
//!   [`Idempotency`](tower_classify::http::Idempotency) allows and whose body
//!   can be copied ([`TryCloneBody`](crate::body::TryCloneBody)); retries
//!   carry its extensions except its [`RefusalToken`](tower_classify::RefusalToken).

use tower_classify::BoxError;

use crate::error::ResponseHead;
use crate::events::RetryStopped;

/// Keeps what a retry needs of a request, and makes each retry from it.
pub trait Replay<Req> {
    /// What is kept of a request while its attempts run: the request itself
    /// for [`CloneRequest`], a copy of the head and a handle on the body
    /// for [`HttpReplay`]. A call that succeeds at once only makes and
    /// drops it, so it should be cheap to make and small to carry.
    type Kept;

    /// What to keep of `request` before its first attempt consumes it, or
    /// `None` when it must not be sent again.
    fn keep(&self, request: &Req) -> Option<Self::Kept>;

    /// The request to send as attempt `previous_attempts + 1`, made from
    /// `kept`, or why it can no longer be made (a streamed body that
    /// outgrew its recording since [`can_replay`](Self::can_replay) was
    /// asked): the call then ends with the failed answer kept while the
    /// body streamed (see [`still_streaming`](Self::still_streaming)), or
    /// with that error if none was.
    fn replay(&self, kept: &Self::Kept, previous_attempts: u32) -> Result<Req, BoxError>;

    /// Whether a request can still be made from `kept`. Asked after each
    /// failed attempt, before the retry is decided: a streamed body that
    /// outgrew its recording during the attempt cannot. Asked again when
    /// the backoff ends if the body was [still
    /// streaming](Self::still_streaming).
    fn can_replay(&self, kept: &Self::Kept) -> bool {
        let _ = kept;
        true
    }

    /// Whether an attempt may still be reading the request from its source
    /// (an upload it goes on sending after an early answer), so that
    /// [`can_replay`](Self::can_replay) may yet turn `false`: the loop then
    /// keeps the failed answer whole, to hand back rather than an error
    /// that says nothing of the request. `false` by default;
    /// [`HttpReplay`] asks the body.
    fn still_streaming(&self, kept: &Self::Kept) -> bool {
        let _ = kept;
        false
    }

    /// The caller's [`Deadline`](tower_classify::deadline::Deadline) carried
    /// by `request`, if any: the loop ends by the earlier of it and the
    /// layer's own deadline. `None` by default; [`HttpReplay`] reads the
    /// request's extensions.
    fn deadline(&self, request: &Req) -> Option<tower_classify::deadline::Deadline> {
        let _ = request;
        None
    }

    /// Called just before each attempt is sent, with the loop's deadline
    /// (if any): [`HttpReplay`] writes what is left of it as
    /// `grpc-timeout` when told to. Nothing by default.
    fn before_send(&self, request: &mut Req, deadline: Option<tokio::time::Instant>) {
        let _ = (request, deadline);
    }
}

/// What a [`Replay`] strategy tells the caller about a failed response that
/// the loop hands back, or replaces with an error of its own.
///
/// Every method has a default that does nothing, which is right for
/// responses that carry no metadata; [`HttpReplay`] implements it for
/// `http::Response`.
pub trait StopReport<Res> {
    /// What the caller gets for a failed `response` after retrying stopped:
    /// the response itself by default.
    fn hand_back(&self, response: Res, stopped: RetryStopped) -> Result<Res, BoxError> {
        let _ = stopped;
        Ok(response)
    }

    /// `true` when `response` was handed back by a retry layer below that
    /// stopped because its budget was spent: it is not retried again here.
    fn spent_below(&self, response: &Res) -> bool {
        let _ = response;
        false
    }

    /// What an error that replaces `response` keeps of it (for
    /// [`WaitTooLong`](crate::error::WaitTooLong) and
    /// [`DeadlineExceeded`](crate::error::DeadlineExceeded)).
    fn keep_head(&self, response: Res) -> Option<ResponseHead> {
        let _ = response;
        None
    }
}

/// Whether an attempt failed because its copy of the request body could
/// not be sent whole (another attempt read it past the recording, or it
/// failed under another attempt), which says nothing about the request.
#[cfg(feature = "http")]
pub(crate) fn lost_its_body(error: &BoxError) -> bool {
    use http_body_replay::{ReplayError, ReplayErrorKind};

    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&**error);
    while let Some(error) = cause {
        if let Some(replay) = error.downcast_ref::<ReplayError>() {
            return matches!(
                replay.kind(),
                ReplayErrorKind::NotReplayable | ReplayErrorKind::BodyFailedEarlier
            );
        }
        cause = error.source();
    }
    false
}

/// Without the `http` feature there is no replayable body to lose.
#[cfg(not(feature = "http"))]
pub(crate) fn lost_its_body(_: &BoxError) -> bool {
    false
}

/// Replays any `Clone` request by cloning it.
#[derive(Debug, Clone, Copy, Default)]
pub struct CloneRequest;

impl<Req: Clone> Replay<Req> for CloneRequest {
    type Kept = Req;

    #[inline]
    fn keep(&self, request: &Req) -> Option<Req> {
        Some(request.clone())
    }

    #[inline]
    fn replay(&self, kept: &Req, _previous_attempts: u32) -> Result<Req, BoxError> {
        Ok(kept.clone())
    }
}

impl<Res> StopReport<Res> for CloneRequest {}

#[cfg(feature = "http")]
pub use self::http_replay::{HttpReplay, KeptRequest};

#[cfg(feature = "http")]
mod http_replay {
    use std::fmt;

    use http::{Extensions, HeaderName, HeaderValue, Request, Response};
    use http_body_replay::{ReplayError, ReplayErrorKind, RequestHead};
    use tower_classify::http::Idempotency;
    use tower_classify::{BoxError, GrpcClassifier, RefusalToken};

    use super::{Replay, StopReport};
    use crate::body::TryCloneBody;
    use crate::error::{FailedSuccess, ResponseHead};
    use crate::events::{RetryStopped, StopReason};

    /// Replays `http::Request`s that are idempotent and whose body can be copied.
    ///
    /// ```
    /// use http::Request;
    /// use tower_retry_budget::replay::{HttpReplay, Replay};
    ///
    /// let replay = HttpReplay::new().attempt_header(http::HeaderName::from_static("grpc-previous-rpc-attempts"));
    /// let get = Request::get("/").body(String::new()).unwrap();
    /// let kept = replay.keep(&get).unwrap();
    /// let again = replay.replay(&kept, 1).unwrap();
    /// assert_eq!(again.headers()["grpc-previous-rpc-attempts"], "1");
    ///
    /// let post = Request::post("/").body(String::from("pay")).unwrap();
    /// assert!(replay.keep(&post).is_none(), "POST gets one attempt");
    /// ```
    #[derive(Debug, Clone, Default)]
    pub struct HttpReplay {
        idempotency: Idempotency,
        attempt_header: Option<HeaderName>,
        grpc_timeout: bool,
    }

    impl HttpReplay {
        /// RFC 9110 idempotency, no attempt header.
        pub fn new() -> Self {
            Self::default()
        }

        /// Replays POST and PATCH too (default `false`). Only for endpoints
        /// that deduplicate.
        pub fn retry_non_idempotent(mut self, yes: bool) -> Self {
            self.idempotency = self.idempotency.retry_non_idempotent(yes);
            self
        }

        /// Uses `idempotency` to decide which requests may be replayed.
        pub fn idempotency(mut self, idempotency: Idempotency) -> Self {
            self.idempotency = idempotency;
            self
        }

        /// Marks every retry with `name: N`, N being the number of attempts
        /// sent before it (gRPC's `grpc-previous-rpc-attempts`), so servers
        /// can tell retries from fresh load.
        pub fn attempt_header(mut self, name: HeaderName) -> Self {
            self.attempt_header = Some(name);
            self
        }

        /// Writes what is left of the loop's deadline as `grpc-timeout` on
        /// every attempt, rounded down (default `false`); see the crate
        /// docs' *Deadlines*. A request with no deadline keeps its header.
        pub fn grpc_timeout(mut self, yes: bool) -> Self {
            self.grpc_timeout = yes;
            self
        }
    }

    /// What [`HttpReplay`] keeps of a request while its attempts run: a
    /// copy of its head in one buffer, its extensions, and a copy of its
    /// body that is never read (for a [`ReplayBody`](crate::body::ReplayBody),
    /// a handle on the recording).
    pub struct KeptRequest<B> {
        head: RequestHead,
        extensions: Extensions,
        body: B,
    }

    impl<B> fmt::Debug for KeptRequest<B> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("KeptRequest")
                .field("head", &self.head)
                .finish_non_exhaustive()
        }
    }

    impl<B: TryCloneBody> Replay<Request<B>> for HttpReplay {
        type Kept = KeptRequest<B>;

        fn keep(&self, request: &Request<B>) -> Option<KeptRequest<B>> {
            if !self.idempotency.is_idempotent(request) {
                return None;
            }
            let body = request.body().try_clone_body()?;
            let head = RequestHead::new(request);
            // A head too large to copy whole is sent once.
            if !head.is_complete() {
                return None;
            }
            Some(KeptRequest {
                head,
                extensions: request.extensions().clone(),
                body,
            })
        }

        fn replay(
            &self,
            kept: &KeptRequest<B>,
            previous_attempts: u32,
        ) -> Result<Request<B>, BoxError> {
            let body = kept
                .body
                .try_clone_body()
                .ok_or_else(|| ReplayError::from(ReplayErrorKind::NotReplayable))?;
            // A copy of a valid head parses again; a header value made
            // without validation (`from_maybe_shared_unchecked`) may not.
            let mut copy = kept
                .head
                .to_request(body)
                .ok_or("the request's head could not be copied for a retry")?;
            *copy.extensions_mut() = kept.extensions.clone();
            // A refusal of a retry proves nothing about the attempts before
            // it. Removed here, not when the request is kept, so a call that
            // succeeds at once pays nothing for it.
            copy.extensions_mut().remove::<RefusalToken>();
            if let Some(name) = &self.attempt_header {
                copy.headers_mut()
                    .insert(name.clone(), HeaderValue::from(previous_attempts));
            }
            Ok(copy)
        }

        fn can_replay(&self, kept: &KeptRequest<B>) -> bool {
            kept.body.can_replay()
        }

        fn still_streaming(&self, kept: &KeptRequest<B>) -> bool {
            kept.body.still_streaming()
        }

        fn deadline(&self, request: &Request<B>) -> Option<tower_classify::deadline::Deadline> {
            use tower_classify::deadline::{Deadline, GRPC_TIMEOUT};
            let carried = request.extensions().get::<Deadline>().copied();
            if !self.grpc_timeout {
                return carried;
            }
            // A `grpc-timeout` the caller set (tonic's `set_timeout`) bounds
            // the loop too: the header each attempt carries, rewritten from
            // the loop's deadline, is never longer than the caller's own.
            let asked = Deadline::from_header(request.headers(), GRPC_TIMEOUT);
            carried.into_iter().chain(asked).min()
        }

        fn before_send(&self, request: &mut Request<B>, deadline: Option<tokio::time::Instant>) {
            use tower_classify::deadline::{format_grpc_timeout, GRPC_TIMEOUT};
            if let (true, Some(deadline)) = (self.grpc_timeout, deadline) {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let value = HeaderValue::try_from(format_grpc_timeout(left))
                    .expect("digits and a unit letter are a valid header value");
                request
                    .headers_mut()
                    .insert(http::HeaderName::from_static(GRPC_TIMEOUT), value);
            }
        }
    }

    /// A failed response handed back carries a [`RetryStopped`] extension;
    /// a `2xx` the classifier calls a failure becomes a [`FailedSuccess`],
    /// except a gRPC answer (always `200`), handed back as it is.
    impl<B> StopReport<Response<B>> for HttpReplay {
        fn hand_back(
            &self,
            mut response: Response<B>,
            stopped: RetryStopped,
        ) -> Result<Response<B>, BoxError> {
            if response.status().is_success() && !GrpcClassifier::is_grpc(&response) {
                let head = ResponseHead::new(response.into_parts().0);
                return Err(Box::new(FailedSuccess::new(stopped, head)));
            }
            // Set by a layer below first: its reason is the one that stopped.
            if response.extensions().get::<RetryStopped>().is_none() {
                response.extensions_mut().insert(stopped);
            }
            Ok(response)
        }

        fn spent_below(&self, response: &Response<B>) -> bool {
            response
                .extensions()
                .get::<RetryStopped>()
                .is_some_and(|stopped| stopped.reason == StopReason::Budget)
        }

        fn keep_head(&self, response: Response<B>) -> Option<ResponseHead> {
            Some(ResponseHead::new(response.into_parts().0))
        }
    }
}
