//! An allocator that counts the allocations a thread makes while it is
//! asked to, for the tests that pin a success path's allocations.
//!
//! A test crate installs it as its global allocator, then counts a closure:
//!
//! ```
//! use bench_support::alloc::{allocations, Counting};
//!
//! #[global_allocator]
//! static ALLOCATOR: Counting = Counting;
//!
//! fn main() {
//!     let (made, bytes) = allocations(|| vec![1u8; 8]);
//!     assert_eq!(made, 1);
//!     assert_eq!(allocations(|| bytes.len()).0, 0);
//! }
//! ```
//!
//! Only the calling thread's allocations count, so tests running in
//! parallel on other threads do not disturb the figure.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, counting allocations (and reallocations) made on
/// a thread while [`allocations`] counts there.
#[derive(Debug)]
pub struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<Option<usize>> = const { Cell::new(None) };
}

fn note_allocation() {
    // `try_with`: allocations made while the thread-local is torn down are
    // not counted rather than a panic.
    let _ = ALLOCATIONS.try_with(|count| count.set(count.get().map(|n| n + 1)));
}

// SAFETY: every call is forwarded to `System` unchanged; counting touches
// only a const-initialised thread-local, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// How many allocations `f` makes on this thread, and what it returns.
///
/// Panics unless [`Counting`] is the global allocator (a test that forgot
/// to install it would otherwise read 0 and pass). Calls do not nest.
pub fn allocations<T>(f: impl FnOnce() -> T) -> (usize, T) {
    ALLOCATIONS.with(|count| count.set(Some(0)));
    drop(std::hint::black_box(Box::new(0u8)));
    let probe = ALLOCATIONS.with(|count| count.replace(Some(0)));
    assert_eq!(
        probe,
        Some(1),
        "bench_support::alloc::Counting is not the global allocator"
    );
    let out = f();
    let made = ALLOCATIONS.with(|count| count.replace(None));
    (made.expect("counting was on"), out)
}
