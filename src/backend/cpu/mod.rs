//! The CPU backend: [`CpuForward`] runs a model's graph (as a [`crate::backend::Backend`]) on
//! the kernels here: matrix products over weights kept in their stored format (the
//! activations quantized to 8 bits per block of 32, so the inner loops are integer dot
//! products, as llama.cpp does), norms, RoPE, attention and activations, spread over a
//! thread pool where the platform has threads, for visitors without a usable GPU.
//!
//! Natively the pool is rayon's (one thread per core, at most 8). In the browser the threaded
//! build (`--features threads`, shared memory) runs rayon's pool on Web Workers once the page's
//! worker starts it ([`start_threads`]); the other builds have no threads and every kernel runs
//! on the calling thread.

mod attention;
pub mod dot;
mod f32_tiles;
mod forward;
mod fused;
mod fused_k;
mod fused_vnni;
pub mod kv;
pub mod matmul;
pub mod ops;
pub mod quant;
// The single-threaded wasm builds have no team to lead: only `split` (always declining) runs.
#[cfg_attr(
    all(target_arch = "wasm32", not(feature = "threads")),
    allow(dead_code)
)]
mod team;
#[cfg(test)]
mod test_rng;
#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "wasm32", target_feature = "relaxed-simd")
))]
mod tile_lines;
mod tiled;
mod tiles_k;
mod tiles_q6k;
mod tiles_vnni;

pub use forward::{check_address_space, context_for, longest_context_within, CpuForward};
pub use matmul::{CpuPrecision, QMatrix};

#[cfg(all(target_arch = "wasm32", feature = "threads"))]
mod web_threads;
#[cfg(all(target_arch = "wasm32", feature = "threads"))]
pub use web_threads::start_threads;

use std::sync::OnceLock;

/// Why the kernels run on one thread where the platform could have more (set by the page's
/// worker: no cross-origin isolation, no shared memory, or a pool that failed to start).
static ONE_THREAD_NOTICE: OnceLock<String> = OnceLock::new();

/// Records why the CPU backend has one thread; the first reason given is kept.
pub fn note_one_thread(reason: &str) {
    let _ = ONE_THREAD_NOTICE.set(reason.to_string());
}

/// Why the CPU backend runs on one thread, when it does for a reason the visitor can change.
pub fn threads_notice() -> Option<&'static str> {
    if threads() > 1 {
        return None;
    }
    ONE_THREAD_NOTICE.get().map(String::as_str)
}

/// The pool the kernels run on: one thread per core, at most 8 (`RAYON_NUM_THREADS` chooses
/// another count); `None` where threads cannot be made (WebAssembly without threads), and
/// the kernels run on the calling thread.
#[cfg(not(target_arch = "wasm32"))]
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let wanted = std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map_or(1, |n| n.get())
                    .min(8)
            });
        if wanted <= 1 {
            return None;
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(wanted)
            .thread_name(|i| format!("emberlm-cpu-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// Threads the kernels spread their work over.
pub fn threads() -> usize {
    #[cfg(not(target_arch = "wasm32"))]
    return pool().map_or(1, rayon::ThreadPool::current_num_threads);
    #[cfg(all(target_arch = "wasm32", feature = "threads"))]
    return web_threads::threads();
    #[cfg(all(target_arch = "wasm32", not(feature = "threads")))]
    1
}

/// `f(i, chunk)` for each chunk `i` of `size` values of `out`: shared among the team's
/// threads when called inside [`run`] on the step's thread, one after the other otherwise
/// (no pool, or a caller outside `run`).
pub fn for_each_chunk<T: Send>(out: &mut [T], size: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let size = size.max(1);
    let len = out.len();
    let base = SharedSlice(out.as_mut_ptr());
    let chunk = |i: usize| {
        let start = i * size;
        // SAFETY: chunk `i` is `out[start..start + n]`; the team runs each index once, so the
        // chunks handed out are disjoint, and `out` stays borrowed until `split` returns.
        let c = unsafe { std::slice::from_raw_parts_mut(base.at(start), size.min(len - start)) };
        f(i, c)
    };
    if !team::split(len.div_ceil(size), &chunk) {
        out.chunks_mut(size).enumerate().for_each(|(i, c)| f(i, c));
    }
}

/// A slice's base pointer shared among the team's threads, each of which makes its own
/// disjoint chunk from it.
struct SharedSlice<T>(*mut T);

// SAFETY: the threads only touch disjoint chunks (see `for_each_chunk`), and the values may
// be sent between threads.
unsafe impl<T: Send> Sync for SharedSlice<T> {}

impl<T> SharedSlice<T> {
    /// The pointer to value `i`.
    fn at(&self, i: usize) -> *mut T {
        // SAFETY (of the caller's use): `i` is within the slice.
        self.0.wrapping_add(i)
    }
}

/// Runs `f` (a whole forward step) as the owner of a team of the pool's threads, so that the
/// kernels inside it share their chunks with threads that spin between kernels rather than
/// sleep ([`team`]); on the calling thread when there is no pool.
pub fn run<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if team::leading() {
        return f();
    }
    #[cfg(not(target_arch = "wasm32"))]
    return match pool() {
        Some(p) => p.install(|| team::run_step(p.current_num_threads(), f)),
        None => f(),
    };
    #[cfg(all(target_arch = "wasm32", feature = "threads"))]
    return web_threads::run(f);
    #[cfg(all(target_arch = "wasm32", not(feature = "threads")))]
    f()
}
