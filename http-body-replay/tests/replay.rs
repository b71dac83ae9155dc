//! The rules of `ReplayBody`, one test each.

use std::collections::VecDeque;
use std::error::Error as _;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_replay::{ReplayBody, ReplayErrorKind};
use http_body_util::{channel::Channel, BodyExt, Full};
use proptest::prelude::*;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A body of scripted frames; `Pending` steps make it wait (and wake itself
/// at once), as a body arriving over a network does.
struct Script {
    steps: VecDeque<Step>,
    exact: Option<u64>,
}

enum Step {
    Frame(Frame<Bytes>),
    Pending,
    Fail(&'static str),
}

impl Script {
    fn chunks(chunks: &[&'static str]) -> Self {
        Script {
            steps: chunks
                .iter()
                .map(|c| Step::Frame(Frame::data(Bytes::from_static(c.as_bytes()))))
                .collect(),
            exact: None,
        }
    }
}

impl Body for Script {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.steps.pop_front() {
            None => Poll::Ready(None),
            Some(Step::Pending) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Some(Step::Frame(frame)) => {
                if let (Some(exact), Some(data)) = (self.exact.as_mut(), frame.data_ref()) {
                    *exact -= data.len() as u64;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Step::Fail(message)) => Poll::Ready(Some(Err(message.into()))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.steps.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        self.exact.map(SizeHint::with_exact).unwrap_or_default()
    }
}

fn trailers(status: &'static str) -> HeaderMap {
    let mut map = HeaderMap::new();
    map.insert("grpc-status", status.parse().unwrap());
    map
}

async fn read_all<B>(body: B) -> (Bytes, Option<HeaderMap>)
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let collected = body.collect().await.unwrap();
    let trailers = collected.trailers().cloned();
    (collected.to_bytes(), trailers)
}

#[tokio::test]
async fn each_frame_reaches_the_first_reader_as_it_arrives() {
    let (mut upload, original) = Channel::<Bytes, BoxError>::new(1);
    let mut body = ReplayBody::new(original, 1024);
    for chunk in ["one", "two", "three"] {
        // The next frame is sent only after the previous one was received:
        // a body read ahead would never get here.
        upload.send_data(Bytes::from(chunk)).await.unwrap();
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), chunk);
    }
    drop(upload);
    assert!(body.frame().await.is_none());
    assert!(body.can_replay());
}

#[tokio::test]
async fn a_clone_replays_the_recording_then_continues_the_original() {
    let mut first = ReplayBody::new(Script::chunks(&["ab", "cd", "ef"]), 1024);
    let second = first.clone();
    let frame = first.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "ab");
    // Attempt 1 stops after one frame.
    drop(first);
    assert!(second.can_replay());
    let third = second.clone();
    assert_eq!(read_all(second).await.0, "abcdef");
    // Every later copy, too, once the original is all recorded.
    assert_eq!(read_all(third).await.0, "abcdef");
}

#[tokio::test]
async fn trailers_are_recorded_and_replayed() {
    let mut script = Script::chunks(&["msg"]);
    script
        .steps
        .push_back(Step::Frame(Frame::trailers(trailers("0"))));
    let body = ReplayBody::new(script, 1024);
    let copy = body.clone();
    assert_eq!(
        read_all(body).await,
        (Bytes::from("msg"), Some(trailers("0")))
    );
    assert!(copy.recording().is_complete());
    assert_eq!(
        read_all(copy).await,
        (Bytes::from("msg"), Some(trailers("0")))
    );
}

#[tokio::test]
async fn past_the_limit_the_recording_is_released_and_the_reader_carries_on() {
    let body = ReplayBody::new(Script::chunks(&["1234", "5678", "9"]), 6);
    let behind = body.clone();
    assert!(body.can_replay());
    let mut reader = body;
    reader.frame().await.unwrap().unwrap();
    assert!(reader.can_replay(), "4 bytes are within the limit of 6");
    // A copy that read the first frame already, and the reader moves on.
    let mut half = reader.clone();
    half.frame().await.unwrap().unwrap();
    reader.frame().await.unwrap().unwrap();
    assert!(!reader.can_replay(), "8 bytes are past the limit");
    assert!(reader.recording().is_released());
    assert!(reader.recording().data().is_empty(), "nothing is kept");
    let rest = reader.frame().await.unwrap().unwrap();
    assert_eq!(rest.into_data().unwrap(), "9");
    assert!(reader.frame().await.is_none());
    // A copy that needs released bytes fails; it never yields a hole.
    let error = half.frame().await.unwrap().unwrap_err();
    assert_eq!(error.kind(), ReplayErrorKind::NotReplayable);
    assert!(half.frame().await.is_none());
    let error = behind.collect().await.unwrap_err();
    assert_eq!(error.kind(), ReplayErrorKind::NotReplayable);
}

#[tokio::test]
async fn a_declared_length_above_the_limit_records_nothing() {
    let body = ReplayBody::new(Full::new(Bytes::from("0123456789")), 4);
    assert!(body.recording().is_released(), "nothing will be kept");
    let copy = body.clone();
    assert_eq!(body.size_hint().exact(), Some(10));
    assert_eq!(read_all(body).await.0, "0123456789");
    assert!(!copy.can_replay());
    assert!(copy.recording().data().is_empty());
    let error = copy.collect().await.unwrap_err();
    assert_eq!(error.kind(), ReplayErrorKind::NotReplayable);
}

#[tokio::test]
async fn a_large_body_can_be_sent_again_until_its_first_byte_is_read() {
    // A connection refused before anything was sent: nothing was lost.
    let body = ReplayBody::new(Full::new(Bytes::from("0123456789")), 4);
    let retry = body.clone();
    drop(body);
    assert!(retry.can_replay());
    assert_eq!(read_all(retry).await.0, "0123456789");
}

#[tokio::test]
async fn size_hint_and_end_of_stream_stay_exact_for_every_copy() {
    let mut script = Script::chunks(&["abc", "defg"]);
    script.exact = Some(7);
    let mut first = ReplayBody::new(script, 1024);
    let second = first.clone();
    assert_eq!(first.size_hint().exact(), Some(7));
    first.frame().await.unwrap().unwrap();
    assert_eq!(first.size_hint().exact(), Some(4));
    assert_eq!(
        second.size_hint().exact(),
        Some(7),
        "3 recorded + 4 to come"
    );
    first.frame().await.unwrap().unwrap();
    assert_eq!(first.size_hint().exact(), Some(0));
    assert!(first.is_end_stream());
    assert!(!second.is_end_stream());
    let mut second = second;
    second.frame().await.unwrap().unwrap();
    second.frame().await.unwrap().unwrap();
    assert!(second.is_end_stream());
    assert_eq!(second.size_hint().exact(), Some(0));

    let empty = ReplayBody::new(Full::new(Bytes::new()), 8);
    assert!(empty.is_end_stream());
    assert!(empty.clone().is_end_stream());
}

#[tokio::test]
async fn a_body_that_already_ended_is_an_empty_body_for_every_copy() {
    let empty = ReplayBody::new(Full::new(Bytes::new()), 8);
    let copy = empty.clone();
    assert_eq!(empty.size_hint().exact(), Some(0));
    assert!(empty.can_replay() && copy.can_replay());
    // Each copy keeps the limit it was made with (its `Debug` shows it).
    for body in [&empty, &copy] {
        assert!(format!("{body:?}").contains("limit: 8"), "{body:?}");
    }
    let recording = copy.recording();
    assert!(recording.is_complete() && !recording.is_released());
    assert!(recording.data().is_empty() && recording.trailers().is_none());
    for mut body in [empty, copy] {
        assert!(body.frame().await.is_none(), "no frame, no error");
    }
}

#[tokio::test]
async fn the_debug_output_leaves_the_recorded_bytes_out() {
    let mut body = ReplayBody::new(Full::new(Bytes::from_static(b"password=hunter2")), 64);
    let copy = body.clone();
    while body.frame().await.is_some() {}
    for body in [&body, &copy] {
        let debug = format!("{body:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains("limit: 64"), "{debug}");
    }
}

#[tokio::test]
async fn copies_read_side_by_side_and_each_sees_every_frame_once() {
    let (mut upload, original) = Channel::<Bytes, BoxError>::new(1);
    let a = ReplayBody::new(original, 1024);
    let b = a.clone();
    // Both wait on the original at once (a hedged attempt).
    let a = tokio::spawn(read_all(a));
    let b = tokio::spawn(read_all(b));
    tokio::task::yield_now().await;
    for chunk in ["x", "y", "z"] {
        upload.send_data(Bytes::from(chunk)).await.unwrap();
        tokio::task::yield_now().await;
    }
    upload.send_trailers(trailers("0")).await.unwrap();
    drop(upload);
    assert_eq!(a.await.unwrap(), (Bytes::from("xyz"), Some(trailers("0"))));
    assert_eq!(b.await.unwrap(), (Bytes::from("xyz"), Some(trailers("0"))));
}

#[tokio::test]
async fn dropping_the_copy_the_original_would_wake_wakes_the_others() {
    let (mut upload, original) = Channel::<Bytes, BoxError>::new(1);
    let waiting = ReplayBody::new(original, 1024);
    let mut last = waiting.clone();
    let waiting = tokio::spawn(read_all(waiting));
    tokio::task::yield_now().await;
    // `last` polls the original after `waiting`, so the original holds
    // only `last`'s waker; then `last` goes away.
    assert!(pending_once(&mut last));
    drop(last);
    upload.send_data(Bytes::from("data")).await.unwrap();
    drop(upload);
    let (bytes, _) = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
        .await
        .expect("the waiting copy was woken")
        .unwrap();
    assert_eq!(bytes, "data");
}

/// Polls `body` once with a waker that does nothing; `true` if it is pending.
fn pending_once<B: Body + Unpin>(body: &mut B) -> bool {
    let waker = std::task::Waker::noop();
    Pin::new(body)
        .poll_frame(&mut Context::from_waker(waker))
        .is_pending()
}

#[tokio::test]
async fn a_failed_original_fails_every_copy_and_cannot_be_replayed() {
    let mut script = Script::chunks(&["ab"]);
    script.steps.push_back(Step::Fail("connection reset"));
    let body = ReplayBody::new(script, 1024);
    let copy = body.clone();
    let error = body.collect().await.unwrap_err();
    assert_eq!(error.kind(), ReplayErrorKind::Body);
    assert_eq!(error.source().unwrap().to_string(), "connection reset");
    assert!(!copy.can_replay());
    let mut copy = copy;
    assert_eq!(
        copy.frame().await.unwrap().unwrap().into_data().unwrap(),
        "ab"
    );
    let error = copy.frame().await.unwrap().unwrap_err();
    assert_eq!(error.kind(), ReplayErrorKind::BodyFailedEarlier);
}

fn script_of(chunks: &[Vec<u8>], pending: &[bool], trailer: bool) -> Script {
    let mut steps = VecDeque::new();
    for (chunk, wait) in chunks.iter().zip(pending.iter().cycle()) {
        if *wait {
            steps.push_back(Step::Pending);
        }
        steps.push_back(Step::Frame(Frame::data(Bytes::from(chunk.clone()))));
    }
    if trailer {
        steps.push_back(Step::Frame(Frame::trailers(trailers("14"))));
    }
    Script { steps, exact: None }
}

proptest! {
    /// Random bodies, random chunking and arrival, attempt 1 dropped after
    /// a random number of bytes: every later attempt's bytes and trailers
    /// are the original's. Above the limit: attempt 1 still gets the whole
    /// body, intact, and the body says it cannot be replayed.
    #[test]
    fn every_attempt_reads_the_original_exactly(
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..16),
        pending in proptest::collection::vec(any::<bool>(), 1..8),
        trailer in any::<bool>(),
        stop_after in 0usize..1100,
        limit in 0usize..1100,
        attempts in 2usize..4,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let whole: Bytes = chunks.concat().into();
        let expected_trailers = trailer.then(|| trailers("14"));
        runtime.block_on(async {
            let body = ReplayBody::new(script_of(&chunks, &pending, trailer), limit);
            let mut attempt = body.clone();
            drop(body);
            // Attempt 1 reads until at least `stop_after` bytes, then stops.
            let mut read = Vec::new();
            let mut ended = false;
            while read.len() < stop_after {
                match attempt.frame().await {
                    None => { ended = true; break; }
                    Some(frame) => {
                        if let Ok(data) = frame.unwrap().into_data() {
                            read.extend_from_slice(&data);
                        }
                    }
                }
            }
            prop_assert_eq!(&read[..], &whole[..read.len()]);
            let replayable = attempt.can_replay();
            let mut next = attempt.clone();
            drop(attempt);
            if whole.len() > limit && (read.len() > limit || ended) {
                prop_assert!(!replayable);
            }
            if !replayable {
                return Ok(());
            }
            for _ in 1..attempts {
                let copy = next.clone();
                let (bytes, got_trailers) = read_all(next).await;
                prop_assert_eq!(&bytes, &whole);
                prop_assert_eq!(&got_trailers, &expected_trailers);
                // This attempt may have read the rest of the original, past
                // the limit: then no further attempt is made.
                if !copy.can_replay() {
                    prop_assert!(whole.len() > limit);
                    break;
                }
                next = copy;
            }
            Ok(())
        })?;
        // Past the limit: one attempt, intact.
        runtime.block_on(async {
            let body = ReplayBody::new(script_of(&chunks, &pending, trailer), limit);
            let copy = body.clone();
            let (bytes, got_trailers) = read_all(body).await;
            prop_assert_eq!(&bytes, &whole);
            prop_assert_eq!(&got_trailers, &expected_trailers);
            prop_assert_eq!(copy.can_replay(), whole.len() <= limit);
            Ok(())
        })?;
    }
}

#[test]
fn a_replay_body_is_send_and_sync_when_its_original_is_send() {
    fn send_sync<T: Send + Sync>() {}
    // `Channel` holds a receiver that is `Send` but not `Sync`.
    send_sync::<ReplayBody<Channel<Bytes, BoxError>>>();
}

#[test]
fn copies_counts_the_copies_alive() {
    let body = ReplayBody::new(Full::new(Bytes::from("x")), 8);
    assert_eq!(body.copies(), 1);
    let copy = body.clone();
    assert_eq!((body.copies(), copy.copies()), (2, 2));
    drop(copy);
    assert_eq!(body.copies(), 1);
}

/// Only a copy that polled the original counts as reading it, until it is
/// dropped: an idle copy, or one that only replayed the recording, does not.
#[tokio::test]
async fn copies_reading_counts_the_copies_that_read_the_original() {
    let body = ReplayBody::new(Script::chunks(&["ab", "cd"]), 8);
    let idle = body.clone();
    assert_eq!(idle.copies_reading(), 0);
    let mut first = body.clone();
    first.frame().await.unwrap().unwrap();
    assert_eq!(idle.copies_reading(), 1, "the copy that read it");
    let mut second = body.clone();
    second.frame().await.unwrap().unwrap();
    assert_eq!(idle.copies_reading(), 1, "a replay of the recording");
    drop(first);
    assert_eq!(idle.copies_reading(), 0);
    // The second copy reads on past the recording: it reads the original.
    second.frame().await.unwrap().unwrap();
    assert_eq!(idle.copies_reading(), 1);
    drop((second, body));
    assert_eq!(idle.copies_reading(), 0);
    let ended = ReplayBody::new(Full::new(Bytes::new()), 8);
    assert_eq!(ended.copies_reading(), 0);
}
