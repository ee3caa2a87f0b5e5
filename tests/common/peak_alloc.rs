//! The largest single allocation per thread, for tests that show hostile input is refused before
//! anything large is reserved; and the bytes allocated and not yet freed, with their high-water
//! mark, for tests that bound what a load holds at once. Include with `#[path = "common/peak_alloc.rs"] mod peak_alloc;`
//! (`"../common/peak_alloc.rs"` from a test folder's `main.rs`): it installs the test binary's
//! global allocator.

#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

struct PeakAlloc;

thread_local! {
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

/// Bytes allocated and not yet freed, over every thread.
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// The most [`LIVE`] has been since [`reset_live_peak`].
static LIVE_PEAK: AtomicUsize = AtomicUsize::new(0);

fn note(size: usize) {
    let _ = PEAK.try_with(|p| p.set(p.get().max(size)));
}

fn grow(bytes: usize) {
    let now = LIVE
        .fetch_add(bytes, Ordering::Relaxed)
        .saturating_add(bytes);
    LIVE_PEAK.fetch_max(now, Ordering::Relaxed);
}

fn shrink(bytes: usize) {
    LIVE.fetch_sub(bytes, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to the system allocator; `note` only updates a
// thread-local counter and never allocates.
unsafe impl GlobalAlloc for PeakAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        grow(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        grow(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        if new_size >= layout.size() {
            grow(new_size - layout.size());
        } else {
            shrink(layout.size() - new_size);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shrink(layout.size());
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

/// Runs `f` and returns its result with the largest single allocation it made on this thread.
pub fn with_peak<T>(f: impl FnOnce() -> T) -> (T, usize) {
    PEAK.with(|p| p.set(0));
    let out = f();
    (out, PEAK.with(Cell::get))
}

/// Starts a new high-water mark of the bytes held (allocated and not freed) at what is held
/// now, and returns that.
pub fn reset_live_peak() -> usize {
    let now = LIVE.load(Ordering::Relaxed);
    LIVE_PEAK.store(now, Ordering::Relaxed);
    now
}

/// The most bytes held at once since [`reset_live_peak`].
pub fn live_peak() -> usize {
    LIVE_PEAK.load(Ordering::Relaxed)
}
