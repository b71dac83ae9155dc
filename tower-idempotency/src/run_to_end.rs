//! Store operations that finish even when their waiter goes away: a claim
//! cut short would hold its key until the in-flight TTL, an outcome not
//! written would answer repeats with 409.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{ready, Context, Poll};

/// A store write that runs to its end even if whoever waits for it goes
/// away (see [`RunToEnd`]).
pub(crate) type Write = RunToEnd<()>;

/// A store operation that runs to its end even if whoever waits for it goes
/// away: polled in place first (an in-memory store is done then, with no
/// task to spawn), then, if it has to wait, in a task of its own that this
/// future waits for; in place outside a tokio runtime. A result the waiter
/// never takes is dropped where it ends, so one that must be undone (a
/// claim whose call is gone) undoes itself in its `Drop`.
pub(crate) struct RunToEnd<T> {
    state: RunState<T>,
}

enum RunState<T> {
    /// Polled only through `&mut`, so the mutex is never locked: it only
    /// makes the operation `Sync`, and with it the bodies that hold one.
    Here(Mutex<Pin<Box<dyn Future<Output = T> + Send>>>),
    Spawned(tokio::task::JoinHandle<T>),
    /// Its result was taken.
    Done,
}

impl<T: Send + 'static> RunToEnd<T> {
    pub(crate) fn new(operation: impl Future<Output = T> + Send + 'static) -> Self {
        RunToEnd {
            state: RunState::Here(Mutex::new(Box::pin(operation))),
        }
    }
}

impl Write {
    /// Runs the write with no one waiting for it: in a task of its own, or
    /// not at all outside a runtime (it is shutting down; a claim left in
    /// flight lapses after the in-flight TTL).
    pub(crate) fn detach(self) {
        if let (RunState::Here(write), Ok(runtime)) =
            (self.state, tokio::runtime::Handle::try_current())
        {
            runtime.spawn(write.into_inner().unwrap_or_else(PoisonError::into_inner));
        }
    }
}

// The result is only ever moved, never pinned.
impl<T> Unpin for RunToEnd<T> {}

impl<T: Send + 'static> Future for RunToEnd<T> {
    /// `None` when the operation, spawned, panicked or was dropped with the
    /// runtime: it is over either way.
    type Output = Option<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        loop {
            match &mut self.state {
                RunState::Here(operation) => {
                    let operation = operation.get_mut().unwrap_or_else(PoisonError::into_inner);
                    if let Poll::Ready(output) = operation.as_mut().poll(cx) {
                        self.state = RunState::Done;
                        return Poll::Ready(Some(output));
                    }
                    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                        return Poll::Pending;
                    };
                    let RunState::Here(operation) =
                        std::mem::replace(&mut self.state, RunState::Done)
                    else {
                        unreachable!("matched above");
                    };
                    let operation = operation
                        .into_inner()
                        .unwrap_or_else(PoisonError::into_inner);
                    self.state = RunState::Spawned(runtime.spawn(operation));
                }
                RunState::Spawned(task) => {
                    let output = ready!(Pin::new(task).poll(cx)).ok();
                    self.state = RunState::Done;
                    return Poll::Ready(output);
                }
                RunState::Done => return Poll::Ready(None),
            }
        }
    }
}
