//! The CPU backend's kernels: matrix products over weights kept in their stored format (the
//! activations quantized to 8 bits per block of 32, so the inner loops are integer dot
//! products, as llama.cpp does), norms, RoPE, attention and activations, spread over a
//! thread pool where the platform has threads. [`crate::forward`] runs a model's graph on them
//! for visitors without a usable GPU.
//!
//! Natively the pool is rayon's (one thread per core); in the browser the module has no
//! threads and every kernel runs on the calling thread.

pub mod matmul;
pub mod ops;
pub mod quant;

pub use matmul::QMatrix;

/// Threads the kernels spread their work over.
pub fn threads() -> usize {
    rayon::current_num_threads().max(1)
}
