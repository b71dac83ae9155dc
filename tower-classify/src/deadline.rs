//! The caller's deadline as a request extension, and gRPC's `grpc-timeout`
//! wire format.
//!
//! The retry layer bounds each attempt by what is left of a request's
//! [`Deadline`]; a gRPC client sends what is left as `grpc-timeout`.
//!
//! ```
//! use std::time::Duration;
//! use tower_classify::deadline::format_grpc_timeout;
//!
//! // Written at most 8 digits long, never longer than the time left.
//! assert_eq!(format_grpc_timeout(Duration::from_millis(1500)), "1500000u");
//! assert_eq!(format_grpc_timeout(Duration::from_secs(3 * 86_400)), "259200S");
//! ```

use std::time::Duration;

use tokio::time::Instant;

/// The instant by which the caller needs the answer, carried in a request's
/// extensions.
///
/// Read on tokio's clock, so paused time in tests drives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline(Instant);

impl Deadline {
    /// The deadline at `instant`.
    pub fn at(instant: Instant) -> Self {
        Deadline(instant)
    }

    /// The deadline `timeout` from now (saturating far in the future).
    pub fn after(timeout: Duration) -> Self {
        let now = Instant::now();
        // About 30 years: later than any call lives, and representable.
        let far_future = || now + Duration::from_secs(30 * 365 * 86_400);
        Deadline(now.checked_add(timeout).unwrap_or_else(far_future))
    }

    /// The instant.
    pub fn instant(&self) -> Instant {
        self.0
    }

    /// The time left, zero once it has passed.
    pub fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    /// The deadline a header `name` of `headers` asks for, in the
    /// `grpc-timeout` format (1 to 8 ASCII digits and a unit of `HMSmun`,
    /// nothing else), counted from now; `None` when absent or malformed.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_classify::deadline::{Deadline, GRPC_TIMEOUT};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let mut headers = http::HeaderMap::new();
    /// headers.insert(GRPC_TIMEOUT, "250m".parse().unwrap());
    /// let deadline = Deadline::from_header(&headers, GRPC_TIMEOUT).unwrap();
    /// assert_eq!(deadline.remaining(), Duration::from_millis(250));
    /// assert_eq!(Deadline::from_header(&headers, "x-timeout"), None);
    /// headers.insert(GRPC_TIMEOUT, "123456789n".parse().unwrap());
    /// assert_eq!(Deadline::from_header(&headers, GRPC_TIMEOUT), None, "at most 8 digits");
    /// # }
    /// ```
    #[cfg(feature = "http")]
    pub fn from_header(headers: &http::HeaderMap, name: &str) -> Option<Self> {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .and_then(parse_grpc_timeout)
            .map(Deadline::after)
    }
}

/// The `grpc-timeout` request header.
pub const GRPC_TIMEOUT: &str = "grpc-timeout";

const MAX_DIGITS: usize = 8;

/// `grpc-timeout`'s units, finest first, with their length in nanoseconds.
const UNITS: [(char, u64); 6] = [
    ('n', 1),
    ('u', 1_000),
    ('m', 1_000_000),
    ('S', 1_000_000_000),
    ('M', 60_000_000_000),
    ('H', 3_600_000_000_000),
];

/// A `grpc-timeout` value as [`Deadline::from_header`] reads it; `None` when
/// it does not follow the gRPC wire format.
#[cfg_attr(not(feature = "http"), allow(dead_code))]
fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (&unit, digits) = value.as_bytes().split_last()?;
    if digits.is_empty() || digits.len() > MAX_DIGITS || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // At most 8 digits: fits a `u32`, and 99999999 hours fit a `Duration`.
    let amount: u32 = value[..digits.len()].parse().ok()?;
    let (_, nanos) = UNITS.iter().find(|(name, _)| *name == char::from(unit))?;
    Some(Duration::from_nanos(*nanos) * amount)
}

/// Writes `timeout` in the `grpc-timeout` format, in the finest unit whose
/// value fits 8 digits, rounded down: the value sent is never longer than
/// the time left. A timeout under a nanosecond is `0n`; one beyond
/// `99999999H` is capped there.
pub fn format_grpc_timeout(timeout: Duration) -> String {
    const LIMIT: u128 = 100_000_000;
    let nanos = timeout.as_nanos();
    for (unit, scale) in UNITS {
        let amount = nanos / u128::from(scale);
        if amount < LIMIT {
            return format!("{amount}{unit}");
        }
    }
    format!("{}H", LIMIT - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_parses() {
        for (text, expected) in [
            ("1H", Duration::from_secs(3600)),
            ("2M", Duration::from_secs(120)),
            ("3S", Duration::from_secs(3)),
            ("4m", Duration::from_millis(4)),
            ("5u", Duration::from_micros(5)),
            ("6n", Duration::from_nanos(6)),
            ("0S", Duration::ZERO),
            ("00000001m", Duration::from_millis(1)),
            ("99999999H", Duration::from_secs(99_999_999 * 3600)),
        ] {
            assert_eq!(parse_grpc_timeout(text), Some(expected), "{text}");
        }
    }

    #[test]
    fn hostile_values_are_refused() {
        for text in [
            "",
            "S",
            "1",
            "1s",
            "1h",
            "-1S",
            "+1S",
            " 1S",
            "1S ",
            "1.5S",
            "123456789n",
            "1x",
            "١S",
            "1S\0",
            "0x10S",
            "99999999999999999999S",
        ] {
            assert_eq!(parse_grpc_timeout(text), None, "{text:?}");
        }
    }

    #[test]
    fn formatting_keeps_8_digits_and_rounds_down() {
        assert_eq!(format_grpc_timeout(Duration::ZERO), "0n");
        assert_eq!(
            format_grpc_timeout(Duration::from_nanos(99_999_999)),
            "99999999n"
        );
        assert_eq!(
            format_grpc_timeout(Duration::from_nanos(100_000_000)),
            "100000u"
        );
        assert_eq!(format_grpc_timeout(Duration::from_millis(49)), "49000000n");
        // 123456789 µs is 9 digits: milliseconds, rounded down.
        assert_eq!(
            format_grpc_timeout(Duration::from_nanos(123_456_789_123)),
            "123456m"
        );
        assert_eq!(format_grpc_timeout(Duration::MAX), "99999999H");
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_counts_down_on_tokios_clock() {
        let deadline = Deadline::after(Duration::from_millis(150));
        assert_eq!(deadline.remaining(), Duration::from_millis(150));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(deadline.remaining(), Duration::from_millis(50));
        tokio::time::advance(Duration::from_millis(60)).await;
        assert_eq!(deadline.remaining(), Duration::ZERO, "passed: nothing left");
        assert!(!Deadline::after(Duration::MAX).remaining().is_zero());
    }

    proptest::proptest! {
        #[test]
        fn parsing_never_panics(text in "\\PC{0,12}") {
            let _ = parse_grpc_timeout(&text);
        }

        #[test]
        fn a_written_timeout_parses_back_no_longer_than_it_was(nanos in 0u64..u64::MAX) {
            let timeout = Duration::from_nanos(nanos);
            let written = format_grpc_timeout(timeout);
            let parsed = parse_grpc_timeout(&written).unwrap();
            proptest::prop_assert!(parsed <= timeout);
            // A coarser unit is taken only past 8 digits of the finer one,
            // so at least 5 significant digits remain.
            proptest::prop_assert!(timeout - parsed < timeout / 100_000 + Duration::from_nanos(1));
        }
    }
}

#[cfg(feature = "http")]
pub use self::server::{DeadlineLayer, DeadlineService, ResponseFuture};

#[cfg(feature = "http")]
mod server {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use http::{HeaderName, Request};
    use pin_project_lite::pin_project;
    use tokio::time::Sleep;
    use tower::timeout::error::Elapsed;
    use tower::{Layer, Service};

    use super::{Deadline, GRPC_TIMEOUT};
    use crate::BoxError;

    /// The server side of deadlines: turns an inbound `grpc-timeout` header
    /// (and optionally a header of your own in the same format) into a
    /// [`Deadline`] extension, and ends the call with
    /// [`Elapsed`](tower::timeout::error::Elapsed) (a timeout to every
    /// classifier; `DEADLINE_EXCEEDED` under
    /// [`GrpcStatusLayer`](crate::status::GrpcStatusLayer)) when it
    /// passes, dropping the handler's future.
    ///
    /// The deadline is the earliest of the headers, a `Deadline` already in
    /// the extensions, and [`max_timeout`](Self::max_timeout) when set. A
    /// malformed header is ignored (the call then has no deadline from it),
    /// so a hostile value can neither panic the server nor shorten anyone
    /// else's call.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::{service_fn, Layer, ServiceExt};
    /// use tower_classify::deadline::{Deadline, DeadlineLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let handler = service_fn(|request: http::Request<()>| async move {
    ///     // What is left of the caller's 250 ms.
    ///     let left = request.extensions().get::<Deadline>().unwrap().remaining();
    ///     Ok::<_, tower_classify::BoxError>(left)
    /// });
    /// let service = DeadlineLayer::new().layer(handler);
    /// let request = http::Request::get("/").header("grpc-timeout", "250m").body(()).unwrap();
    /// assert_eq!(service.oneshot(request).await.unwrap(), Duration::from_millis(250));
    /// # }
    /// ```
    #[derive(Debug, Clone, Default)]
    pub struct DeadlineLayer {
        header: Option<HeaderName>,
        max_timeout: Option<Duration>,
    }

    impl DeadlineLayer {
        /// Reads `grpc-timeout`, no cap.
        pub fn new() -> Self {
            Self::default()
        }

        /// Also reads `name`, in the `grpc-timeout` format (`100m`, `5S`),
        /// for HTTP callers.
        pub fn header(mut self, name: HeaderName) -> Self {
            self.header = Some(name);
            self
        }

        /// No call runs longer than `max`, whatever the caller asked.
        pub fn max_timeout(mut self, max: Duration) -> Self {
            self.max_timeout = Some(max);
            self
        }
    }

    impl<S> Layer<S> for DeadlineLayer {
        type Service = DeadlineService<S>;

        fn layer(&self, inner: S) -> Self::Service {
            DeadlineService {
                inner,
                layer: self.clone(),
            }
        }
    }

    /// The service of a [`DeadlineLayer`].
    #[derive(Debug, Clone)]
    pub struct DeadlineService<S> {
        inner: S,
        layer: DeadlineLayer,
    }

    impl<S> DeadlineService<S> {
        fn deadline<B>(&self, request: &Request<B>) -> Option<Deadline> {
            let from = |name: &str| Deadline::from_header(request.headers(), name);
            [
                from(GRPC_TIMEOUT),
                self.layer
                    .header
                    .as_ref()
                    .and_then(|name| from(name.as_str())),
                request.extensions().get::<Deadline>().copied(),
                self.layer.max_timeout.map(Deadline::after),
            ]
            .into_iter()
            .flatten()
            .min()
        }
    }

    impl<S, B> Service<Request<B>> for DeadlineService<S>
    where
        S: Service<Request<B>>,
        S::Error: Into<BoxError>,
    {
        type Response = S::Response;
        type Error = BoxError;
        type Future = ResponseFuture<S::Future>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            self.inner.poll_ready(cx).map_err(Into::into)
        }

        fn call(&mut self, mut request: Request<B>) -> Self::Future {
            let deadline = self.deadline(&request);
            if let Some(deadline) = deadline {
                request.extensions_mut().insert(deadline);
            }
            ResponseFuture {
                inner: self.inner.call(request),
                sleep: deadline
                    .map(|deadline| Box::pin(tokio::time::sleep_until(deadline.instant()))),
            }
        }
    }

    pin_project! {
        /// The response future of [`DeadlineService`].
        #[derive(Debug)]
        pub struct ResponseFuture<F> {
            #[pin]
            inner: F,
            // Boxed: only a call with a deadline has one.
            sleep: Option<Pin<Box<Sleep>>>,
        }
    }

    impl<F, T, E> Future for ResponseFuture<F>
    where
        F: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        type Output = Result<T, BoxError>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let this = self.project();
            // As `tower::timeout` does: the call first, then its limit.
            if let Poll::Ready(result) = this.inner.poll(cx) {
                return Poll::Ready(result.map_err(Into::into));
            }
            match this.sleep {
                Some(sleep) => {
                    std::task::ready!(sleep.as_mut().poll(cx));
                    Poll::Ready(Err(Box::new(Elapsed::new())))
                }
                None => Poll::Pending,
            }
        }
    }
}
