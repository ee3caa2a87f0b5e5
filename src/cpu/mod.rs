//! The CPU backend's kernels: matrix products over weights kept in their stored format (the
//! activations quantized to 8 bits per block of 32, so the inner loops are integer dot
//! products, as llama.cpp does), norms, RoPE, attention and activations, spread over a
//! thread pool where the platform has threads. [`crate::forward`] runs a model's graph on them
//! for visitors without a usable GPU.
//!
//! Natively the pool is rayon's (one thread per core, at most 8); in the browser the module
//! has no threads and every kernel runs on the calling thread.

pub mod dot;
pub mod matmul;
pub mod ops;
pub mod quant;

pub use matmul::QMatrix;

use std::sync::OnceLock;

/// The pool the kernels run on: one thread per core, at most 8 (`RAYON_NUM_THREADS` chooses
/// another count); `None` where threads cannot be made (WebAssembly without threads), and
/// the kernels run on the calling thread.
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
    pool().map_or(1, rayon::ThreadPool::current_num_threads)
}

/// `f(i, chunk)` for each chunk `i` of `size` values of `out`: spread over the pool when
/// called inside [`run`] on a pool thread, one after the other otherwise (no pool, or a
/// caller outside `run`), so that no call hands work to another thread and waits for it.
pub fn for_each_chunk<T: Send>(out: &mut [T], size: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    use rayon::prelude::*;
    let size = size.max(1);
    if rayon::current_thread_index().is_some() {
        out.par_chunks_mut(size)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    } else {
        out.chunks_mut(size).enumerate().for_each(|(i, c)| f(i, c));
    }
}

/// Runs `f` (a whole forward step) on the pool, so that the kernels inside it share work
/// among the pool's threads without waking the caller for each; on the calling thread when
/// there is no pool. Kernels called outside `run` run on the calling thread.
pub fn run<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    match pool() {
        Some(p) => p.install(f),
        None => f(),
    }
}
