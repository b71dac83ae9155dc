//! Delivery counts a queue puts on the request.

use http::header::HeaderName;
use http::{Extensions, HeaderMap, HeaderValue};

/// Which delivery of its message a request is (1 for the first), as counted
/// by the queue, for a consumer that reads the count from the queue's
/// client (Redis Streams' `XPENDING` times-delivered or the count `XCLAIM`
/// raised, SQS's `ApproximateReceiveCount`):
///
/// ```
/// use tower_poison::DeliveryAttempt;
///
/// let mut request = http::Request::new(());
/// // XPENDING reported this entry delivered 3 times, this one included.
/// request.extensions_mut().insert(DeliveryAttempt(3));
/// ```
///
/// [`HttpCapture`](crate::HttpCapture) reads it from every request, before
/// any [`DeliveryCount`] header; with [`describe_fn`](crate::describe_fn),
/// set [`RequestRecord::delivery`](crate::RequestRecord::delivery) instead.
/// `DeliveryAttempt(0)` is read as the first delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeliveryAttempt(pub u32);

/// Reads a queue's delivery count from a request header: where it finds
/// one, poison detection believes it and asks no
/// [`FailureCountStore`](super::FailureCountStore); a request without a
/// readable count falls back to the store.
///
/// Two conventions exist, and each reader knows its own:
///
/// | reader | header | first delivery reads |
/// |---|---|---|
/// | [`sqs`](Self::sqs) | `x-aws-sqsd-receive-count` | `1` |
/// | [`rabbitmq`](Self::rabbitmq) | `x-delivery-count` | absent or `0` |
/// | [`redis_streams`](Self::redis_streams) | `x-redis-stream-delivery-count` | `1` |
/// | [`deliveries`](Self::deliveries) | any | `1` |
/// | [`redeliveries`](Self::redeliveries) | any | absent or `0` |
///
/// An SQS worker behind Elastic Beanstalk's daemon, which forwards the
/// message id and the receive count as headers:
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let store = tower_poison::store::MemoryStore::new(10_000);
/// use http::HeaderName;
/// use tower_poison::{DeadLetterLayer, DeliveryCount, PoisonPolicy};
///
/// let layer = DeadLetterLayer::new(store)
///     .message_id_header(HeaderName::from_static("x-aws-sqsd-msgid"))
///     .delivery_count(DeliveryCount::sqs())
///     .poison(PoisonPolicy::new(3)?);
/// # drop(layer);
/// # Ok(())
/// # }
/// ```
///
/// # Hostile values
///
/// A header is read as ASCII digits, with surrounding spaces or tabs
/// allowed. Anything else — empty, a sign, a fraction, non-ASCII, a second
/// value of the same header — is ignored, and the count store decides. A
/// number past `u32::MAX` saturates there (it is a real, if absurd, count,
/// and diverts the message); parsing never allocates and never panics.
///
/// # Trust
///
/// The header is believed, so it must be set by a hop you trust (the queue's
/// own daemon, such as SQS's `sqsd` on the worker host), never by whoever can
/// reach the service: a client that sends `x-aws-sqsd-receive-count: 1` on
/// every delivery is never diverted. On a public endpoint strip these headers
/// at the edge, or leave the count to a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryCount {
    header: HeaderName,
    redeliveries: bool,
}

impl DeliveryCount {
    /// SQS's `ApproximateReceiveCount` (approximate, SQS says), as an
    /// Elastic Beanstalk worker's daemon (`sqsd`) forwards it in
    /// `X-Aws-Sqsd-Receive-Count`: `1` on the first delivery.
    pub fn sqs() -> Self {
        Self::deliveries(HeaderName::from_static("x-aws-sqsd-receive-count"))
    }

    /// RabbitMQ's `x-delivery-count` header (quorum queues, and classic
    /// queues from 4.3): absent on the first delivery, `1` on the second.
    /// Since 4.3 it counts only returns taken as failures (`basic.reject`
    /// with requeue, a channel or connection closing unacknowledged), not
    /// `basic.nack` with requeue (the separate `x-acquired-count` counts
    /// every return): reject a failed message. On a queue that
    /// never sets it every delivery reads as the first: use a count store.
    pub fn rabbitmq() -> Self {
        Self::redeliveries(HeaderName::from_static("x-delivery-count"))
    }

    /// A Redis Streams times-delivered count (`XPENDING`'s: `1` on the first
    /// `XREADGROUP` delivery, raised by each `XCLAIM`) that the consumer
    /// forwards in `x-redis-stream-delivery-count`, a name of this crate's.
    pub fn redis_streams() -> Self {
        Self::deliveries(HeaderName::from_static("x-redis-stream-delivery-count"))
    }

    /// Header `name` carries the delivery number: `1` on the first delivery.
    /// An absent header leaves the count to the store; `0` is ignored.
    pub fn deliveries(name: HeaderName) -> Self {
        DeliveryCount {
            header: name,
            redeliveries: false,
        }
    }

    /// Header `name` counts redeliveries: absent or `0` on the first
    /// delivery, `1` on the second.
    pub fn redeliveries(name: HeaderName) -> Self {
        DeliveryCount {
            header: name,
            redeliveries: true,
        }
    }

    /// Which delivery a request with `headers` and `extensions` is (1 for
    /// the first): the [`DeliveryAttempt`] extension if there is one, else
    /// this header; `None` when neither gives a usable count.
    pub(crate) fn read_from(&self, headers: &HeaderMap, extensions: &Extensions) -> Option<u32> {
        if let Some(attempt) = read_extension(extensions) {
            return Some(attempt);
        }
        let mut values = headers.get_all(&self.header).iter();
        let value = values.next();
        if values.next().is_some() {
            // Two counts disagree, or a client appended one: neither is
            // trusted.
            return None;
        }
        match (value.map(parse_count), self.redeliveries) {
            (None, true) => Some(1),
            (None, false) => None,
            (Some(count), true) => count.map(|count| count.saturating_add(1)),
            (Some(count), false) => count.filter(|&count| count > 0),
        }
    }
}

/// The [`DeliveryAttempt`] in a request's extensions (0 read as 1).
pub(crate) fn read_extension(extensions: &Extensions) -> Option<u32> {
    extensions.get::<DeliveryAttempt>().map(|a| a.0.max(1))
}

/// ASCII digits with optional surrounding spaces or tabs, saturating at
/// `u32::MAX`.
pub(crate) fn parse_count(value: &HeaderValue) -> Option<u32> {
    let bytes = value.as_bytes();
    let start = bytes.iter().position(|b| !matches!(b, b' ' | b'\t'))?;
    let end = bytes.iter().rposition(|b| !matches!(b, b' ' | b'\t'))?;
    let digits = &bytes[start..=end];
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0u32, |count, digit| {
        count
            .saturating_mul(10)
            .saturating_add(u32::from(digit - b'0'))
    }))
}

#[cfg(test)]
mod tests {
    use http::request::Parts;

    use super::*;

    impl DeliveryCount {
        fn read(&self, parts: &Parts) -> Option<u32> {
            self.read_from(&parts.headers, &parts.extensions)
        }
    }

    fn parts(headers: &[(&str, &[u8])]) -> Parts {
        let mut request = http::Request::builder();
        for (name, value) in headers {
            request = request.header(*name, HeaderValue::from_bytes(value).unwrap());
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn sqs_reads_the_receive_count() {
        let sqs = DeliveryCount::sqs();
        assert_eq!(
            sqs.read(&parts(&[("x-aws-sqsd-receive-count", b"1")])),
            Some(1)
        );
        assert_eq!(
            sqs.read(&parts(&[("X-Aws-Sqsd-Receive-Count", b" 4\t")])),
            Some(4)
        );
        assert_eq!(sqs.read(&parts(&[])), None, "absent: the store decides");
        assert_eq!(
            sqs.read(&parts(&[("x-aws-sqsd-receive-count", b"0")])),
            None
        );
    }

    #[test]
    fn rabbitmq_counts_redeliveries() {
        let rabbit = DeliveryCount::rabbitmq();
        assert_eq!(
            rabbit.read(&parts(&[])),
            Some(1),
            "absent: the first delivery"
        );
        assert_eq!(rabbit.read(&parts(&[("x-delivery-count", b"0")])), Some(1));
        assert_eq!(rabbit.read(&parts(&[("x-delivery-count", b"2")])), Some(3));
        assert_eq!(
            rabbit.read(&parts(&[("x-delivery-count", b"4294967295")])),
            Some(u32::MAX)
        );
        assert_eq!(rabbit.read(&parts(&[("x-delivery-count", b"two")])), None);
    }

    #[test]
    fn redis_streams_reads_the_forwarded_counter_and_the_extension_wins() {
        let redis = DeliveryCount::redis_streams();
        let mut request = parts(&[("x-redis-stream-delivery-count", b"2")]);
        assert_eq!(redis.read(&request), Some(2));
        request.extensions.insert(DeliveryAttempt(7));
        assert_eq!(redis.read(&request), Some(7));
        request.extensions.insert(DeliveryAttempt(0));
        assert_eq!(redis.read(&request), Some(1));
    }

    #[test]
    fn hostile_values_are_ignored_or_saturate() {
        let sqs = DeliveryCount::sqs();
        let read = |value: &[u8]| sqs.read(&parts(&[("x-aws-sqsd-receive-count", value)]));
        for ignored in [
            &b""[..],
            b"   ",
            b"-1",
            b"+3",
            b"3.0",
            b"0x10",
            b"1 2",
            b"\xff",
            b"\xd9\xa3", // an Arabic-Indic digit three
        ] {
            assert_eq!(read(ignored), None, "{ignored:?}");
        }
        assert_eq!(read(b"99999999999999999999999999"), Some(u32::MAX));
        assert_eq!(read(b"0003"), Some(3));
        let twice = parts(&[
            ("x-aws-sqsd-receive-count", b"1"),
            ("x-aws-sqsd-receive-count", b"9"),
        ]);
        assert_eq!(sqs.read(&twice), None, "two values: neither is trusted");
    }

    proptest::proptest! {
        /// Any header value parses without panicking; a count is read
        /// exactly when the value is digits (with optional blanks), and it is
        /// the number's value or `u32::MAX`.
        #[test]
        fn parse_count_matches_a_model(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..40)) {
            let Ok(value) = HeaderValue::from_bytes(&bytes) else { return Ok(()); };
            let text = String::from_utf8_lossy(&bytes);
            let trimmed = text.trim_matches(|c| c == ' ' || c == '\t');
            let expected = if !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()) {
                Some(trimmed.parse::<u128>().map_or(u32::MAX, |n| u32::try_from(n).unwrap_or(u32::MAX)))
            } else {
                None
            };
            proptest::prop_assert_eq!(parse_count(&value), expected);
        }

        /// A number written in the header reads back as itself, plus one for
        /// a redelivery counter.
        #[test]
        fn numbers_round_trip(n in 0u32..=u32::MAX) {
            let text = n.to_string();
            let sqs = parts(&[("x-aws-sqsd-receive-count", text.as_bytes())]);
            proptest::prop_assert_eq!(DeliveryCount::sqs().read(&sqs), (n > 0).then_some(n));
            let rabbit = parts(&[("x-delivery-count", text.as_bytes())]);
            proptest::prop_assert_eq!(DeliveryCount::rabbitmq().read(&rabbit), Some(n.saturating_add(1)));
        }
    }
}
