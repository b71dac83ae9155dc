use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use crate::error::{ReplayError, ReplayErrorKind};

/// A body that streams the original to whichever copy reads it first, while
/// recording what it reads, so that other copies can read it again.
///
/// See the [crate docs](crate) for the rules. Clones are cheap (one `Arc`)
/// and share one recording.
pub struct ReplayBody<B> {
    inner: Inner<B>,
}

enum Inner<B> {
    /// The original had already ended when it was wrapped (the empty body of
    /// a GET): nothing to record, share or lock, and every copy is empty.
    Ended {
        limit: usize,
    },
    Reading(Reader<B>),
}

/// One copy's position in the shared recording.
struct Reader<B> {
    shared: Arc<Shared<B>>,
    /// Tells this copy's waker apart in the waiting list.
    id: usize,
    /// The next recorded data frame to yield.
    frame: usize,
    /// Bytes yielded so far.
    yielded: u64,
    trailers_yielded: bool,
    /// Yielded its end (or an error): nothing more comes.
    finished: bool,
    /// Has polled the original (counted in `Shared::reading`).
    read_original: bool,
}

struct Shared<B> {
    limit: usize,
    next_id: AtomicUsize,
    /// `LOST` (some bytes were read and not kept: no copy can start over)
    /// and `FAILED` (the original failed). Set under the lock and also read
    /// without it, so that asking whether a body can be replayed costs no
    /// lock.
    flags: AtomicU8,
    /// Set under the lock when a copy waits; lets a copy going away skip
    /// the lock when nobody waits (the common case).
    has_waiters: AtomicBool,
    /// Copies alive that have polled the original.
    reading: AtomicUsize,
    state: Mutex<State<B>>,
}

const LOST: u8 = 1;
const FAILED: u8 = 2;

struct State<B> {
    /// `None` once it ended, or failed (`FAILED` tells which).
    original: Option<B>,
    /// Every data frame read from the original while `recording`.
    recorded: Recorded,
    /// Still recording: off from the start for a body declared larger than
    /// the limit, and for good once more than `limit` bytes were read.
    recording: bool,
    frames_read: usize,
    bytes_read: u64,
    trailers: Option<HeaderMap>,
    /// Copies waiting for the original to move. The original keeps only
    /// the waker of the copy that polled it last, so every step forward
    /// (and every copy going away) wakes the others.
    waiting: Vec<(usize, Waker)>,
}

impl<B> State<B> {
    fn wake_others(&mut self, id: usize, has_waiters: &AtomicBool) {
        if self.waiting.is_empty() {
            return;
        }
        has_waiters.store(false, Ordering::Relaxed);
        for (waiter, waker) in std::mem::take(&mut self.waiting) {
            if waiter != id {
                waker.wake();
            }
        }
    }

    fn wait(&mut self, id: usize, waker: &Waker, has_waiters: &AtomicBool) {
        has_waiters.store(true, Ordering::Relaxed);
        match self.waiting.iter_mut().find(|(waiter, _)| *waiter == id) {
            Some((_, registered)) => registered.clone_from(waker),
            None => self.waiting.push((id, waker.clone())),
        }
    }
}

/// The recorded data frames, in order. Most request bodies are one frame,
/// so the first is kept inline and a list is allocated only for a second.
#[derive(Default)]
struct Recorded {
    first: Option<Bytes>,
    rest: Vec<Bytes>,
}

/// The most slots reserved ahead for a body's frames (2 KiB of `Bytes`).
const MAX_RESERVED_FRAMES: u64 = 64;

impl Recorded {
    /// Records `data`; `still_to_come` tells the original's lower size hint
    /// after it, so that a body of many like-sized frames grows its list
    /// once, not once per doubling.
    fn push(&mut self, data: Bytes, still_to_come: impl FnOnce() -> u64) {
        if self.first.is_none() {
            self.first = Some(data);
            return;
        }
        if self.rest.capacity() == 0 {
            let frames = still_to_come().div_ceil(data.len().max(1) as u64) + 1;
            self.rest.reserve(frames.min(MAX_RESERVED_FRAMES) as usize);
        }
        self.rest.push(data);
    }

    /// Frame `index`, which must have been recorded.
    fn get(&self, index: usize) -> &Bytes {
        match index.checked_sub(1) {
            None => self.first.as_ref().expect("frame 0 is recorded"),
            Some(index) => &self.rest[index],
        }
    }

    fn to_vec(&self) -> Vec<Bytes> {
        self.first.iter().chain(&self.rest).cloned().collect()
    }
}

impl<B: Body + Unpin> ReplayBody<B> {
    /// Wraps `body`, recording up to `limit` bytes of it (nothing for a body
    /// whose size hint says it is longer). `B` must be `Unpin`, so that the
    /// shared recording holds it without a box of its own.
    pub fn new(body: B, limit: usize) -> Self {
        if body.is_end_stream() {
            // Most requests have no body: they cost no allocation here.
            return ReplayBody {
                inner: Inner::Ended { limit },
            };
        }
        let recording = body.size_hint().lower() <= limit as u64;
        let shared = Arc::new(Shared {
            limit,
            next_id: AtomicUsize::new(1),
            flags: AtomicU8::new(0),
            has_waiters: AtomicBool::new(false),
            reading: AtomicUsize::new(0),
            state: Mutex::new(State {
                original: Some(body),
                recorded: Recorded::default(),
                recording,
                frames_read: 0,
                bytes_read: 0,
                trailers: None,
                waiting: Vec::new(),
            }),
        });
        ReplayBody {
            inner: Inner::Reading(Reader::new(shared, 0)),
        }
    }
}

impl<B> ReplayBody<B> {
    /// `true` while a fresh clone would yield the whole body: no byte read
    /// from the original was dropped, and the original has not failed.
    ///
    /// Once `false`, it stays `false`. Ask it *after* the attempt that read
    /// the body: a copy made earlier is only a promise. A body declared
    /// larger than the limit can still be replayed until its first byte is
    /// read (a connection refused before sending anything).
    pub fn can_replay(&self) -> bool {
        match &self.inner {
            Inner::Ended { .. } => true,
            Inner::Reading(reader) => reader.shared.flags.load(Ordering::Acquire) == 0,
        }
    }

    /// How many copies of this body exist, this one included (copies of a
    /// body that had ended when it was wrapped share nothing: 1).
    pub fn copies(&self) -> usize {
        match &self.inner {
            Inner::Ended { .. } => 1,
            // Each copy, and nothing else, holds one reference.
            Inner::Reading(reader) => Arc::strong_count(&reader.shared),
        }
    }

    /// How many copies still alive have read from the original, not only
    /// from the recording: attempts that may go on sending the body.
    pub fn copies_reading(&self) -> usize {
        match &self.inner {
            Inner::Ended { .. } => 0,
            Inner::Reading(reader) => reader.shared.reading.load(Ordering::Acquire),
        }
    }

    /// What has been read from the original so far, for a record of the
    /// request (a dead-letter entry, a log).
    pub fn recording(&self) -> Recording {
        let Inner::Reading(reader) = &self.inner else {
            return Recording {
                data: Vec::new(),
                bytes_read: 0,
                trailers: None,
                complete: true,
                released: false,
            };
        };
        let state = reader.shared.lock();
        Recording {
            data: state.recorded.to_vec(),
            bytes_read: state.bytes_read,
            trailers: state.trailers.clone(),
            complete: state.original.is_none() && !reader.shared.failed() && state.recording,
            released: !state.recording,
        }
    }
}

/// A snapshot of what a [`ReplayBody`] has read; see
/// [`ReplayBody::recording`].
#[derive(Debug, Clone)]
pub struct Recording {
    data: Vec<Bytes>,
    bytes_read: u64,
    trailers: Option<HeaderMap>,
    complete: bool,
    released: bool,
}

impl Recording {
    /// The recorded data frames, in order (refcounted, not copied). Empty
    /// once the recording was released.
    pub fn data(&self) -> &[Bytes] {
        &self.data
    }

    /// The recorded trailers, if the original has sent them.
    pub fn trailers(&self) -> Option<&HeaderMap> {
        self.trailers.as_ref()
    }

    /// Bytes read from the original so far, recorded or not.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// `true` when the original has ended and all of it is recorded.
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// `true` when the body outgrew the limit (or was declared larger than
    /// it) and nothing is kept.
    pub fn is_released(&self) -> bool {
        self.released
    }
}

impl<B> Clone for ReplayBody<B> {
    /// A copy that starts from the first byte.
    fn clone(&self) -> Self {
        let inner = match &self.inner {
            Inner::Ended { limit } => Inner::Ended { limit: *limit },
            Inner::Reading(Reader { shared, .. }) => {
                let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
                Inner::Reading(Reader::new(Arc::clone(shared), id))
            }
        };
        ReplayBody { inner }
    }
}

impl<B> Shared<B> {
    fn failed(&self) -> bool {
        self.flags.load(Ordering::Acquire) & FAILED != 0
    }

    fn lock(&self) -> MutexGuard<'_, State<B>> {
        // A panic in the original's `poll_frame` poisons the lock; the state
        // itself is only ever updated whole, so it is still sound to read.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<B> Reader<B> {
    fn new(shared: Arc<Shared<B>>, id: usize) -> Self {
        Reader {
            shared,
            id,
            frame: 0,
            yielded: 0,
            trailers_yielded: false,
            finished: false,
            read_original: false,
        }
    }
}

impl<B> Reader<B>
where
    B: Body + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ReplayError>>> {
        if self.finished {
            return Poll::Ready(None);
        }
        // A borrow of one field, so the others stay free to update: no
        // `Arc` clone per frame.
        let shared = &*self.shared;
        let mut state = shared.lock();
        if self.frame < state.frames_read {
            // Behind the reader in front: replay.
            if !state.recording {
                self.finished = true;
                return Poll::Ready(Some(Err(ReplayError::from(ReplayErrorKind::NotReplayable))));
            }
            let data = state.recorded.get(self.frame).clone();
            self.frame += 1;
            self.yielded += data.len() as u64;
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if !self.trailers_yielded {
            if let Some(trailers) = &state.trailers {
                self.trailers_yielded = true;
                return Poll::Ready(Some(Ok(Frame::trailers(trailers.clone()))));
            }
        }
        if shared.failed() {
            self.finished = true;
            return Poll::Ready(Some(Err(ReplayError::from(
                ReplayErrorKind::BodyFailedEarlier,
            ))));
        }
        let polled = match state.original.as_mut() {
            Some(original) if !original.is_end_stream() => {
                if !self.read_original {
                    self.read_original = true;
                    shared.reading.fetch_add(1, Ordering::Relaxed);
                }
                Pin::new(original).poll_frame(cx)
            }
            _ => Poll::Ready(None),
        };
        match polled {
            Poll::Pending => {
                state.wait(self.id, cx.waker(), &shared.has_waiters);
                Poll::Pending
            }
            Poll::Ready(None) => {
                state.original = None;
                state.wake_others(self.id, &shared.has_waiters);
                self.finished = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(error))) => {
                shared.flags.fetch_or(FAILED, Ordering::Release);
                state.original = None;
                state.wake_others(self.id, &shared.has_waiters);
                self.finished = true;
                Poll::Ready(Some(Err(ReplayError::body(error.into()))))
            }
            Poll::Ready(Some(Ok(frame))) => {
                // In place, so that the frame is not taken apart and built
                // again; a kind of frame other than data and trailers is
                // passed on without being recorded.
                let frame = frame.map_data(|mut data| data.copy_to_bytes(data.remaining()));
                if let Some(data) = frame.data_ref() {
                    state.frames_read += 1;
                    state.bytes_read += data.len() as u64;
                    if state.recording && state.bytes_read > shared.limit as u64 {
                        state.recording = false;
                        state.recorded = Recorded::default();
                    }
                    if state.recording {
                        let state = &mut *state;
                        state.recorded.push(data.clone(), || {
                            state
                                .original
                                .as_ref()
                                .map_or(0, |original| original.size_hint().lower())
                        });
                    } else if shared.flags.load(Ordering::Relaxed) & LOST == 0 {
                        // Once, not a read-modify-write on every frame of a
                        // large body.
                        shared.flags.fetch_or(LOST, Ordering::Release);
                    }
                    self.frame = state.frames_read;
                    self.yielded += data.len() as u64;
                } else if let Some(trailers) = frame.trailers_ref() {
                    state.trailers = Some(trailers.clone());
                    self.trailers_yielded = true;
                }
                state.wake_others(self.id, &shared.has_waiters);
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        if self.finished {
            return true;
        }
        let state = self.shared.lock();
        let at_end = !self.shared.failed() && state.original.as_ref().is_none_or(B::is_end_stream);
        at_end
            && self.frame >= state.frames_read
            && (self.trailers_yielded || state.trailers.is_none())
    }

    fn size_hint(&self) -> SizeHint {
        if self.finished {
            return SizeHint::with_exact(0);
        }
        let state = self.shared.lock();
        let recorded = state.bytes_read.saturating_sub(self.yielded);
        let original = state
            .original
            .as_ref()
            .map_or(SizeHint::with_exact(0), B::size_hint);
        let mut hint = SizeHint::new();
        hint.set_lower(original.lower().saturating_add(recorded));
        if let Some(upper) = original.upper() {
            hint.set_upper(upper.saturating_add(recorded));
        }
        hint
    }
}

impl<B> Drop for Reader<B> {
    fn drop(&mut self) {
        if self.read_original {
            self.shared.reading.fetch_sub(1, Ordering::Release);
        }
        // Nobody waits in the common case: skip the lock. A copy that waits
        // set the flag under the lock before this copy's last poll took it,
        // or it polled the original after this copy and holds the wake-up
        // itself; Relaxed is enough either way.
        if !self.shared.has_waiters.load(Ordering::Relaxed) {
            return;
        }
        let shared = &self.shared;
        let mut state = shared.lock();
        // This copy may have been the one the original would wake: hand
        // the turn to the others.
        state.waiting.retain(|(waiter, _)| *waiter != self.id);
        state.wake_others(self.id, &shared.has_waiters);
    }
}

impl<B> Body for ReplayBody<B>
where
    B: Body + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = ReplayError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ReplayError>>> {
        match &mut self.get_mut().inner {
            Inner::Ended { .. } => Poll::Ready(None),
            Inner::Reading(reader) => reader.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Ended { .. } => true,
            Inner::Reading(reader) => reader.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Ended { .. } => SizeHint::with_exact(0),
            Inner::Reading(reader) => reader.size_hint(),
        }
    }
}

// Sizes and flags only: a request's `Debug` shows its body, and the
// recorded bytes are the caller's payload.
impl<B> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reader = match &self.inner {
            Inner::Ended { limit } => {
                return f
                    .debug_struct("ReplayBody")
                    .field("limit", limit)
                    .field("ended", &true)
                    .finish_non_exhaustive()
            }
            Inner::Reading(reader) => reader,
        };
        let state = reader.shared.lock();
        f.debug_struct("ReplayBody")
            .field("limit", &reader.shared.limit)
            .field("bytes_read", &state.bytes_read)
            .field("recording", &state.recording)
            .field(
                "ended",
                &(state.original.is_none() && !reader.shared.failed()),
            )
            .field("yielded", &reader.yielded)
            .finish()
    }
}
