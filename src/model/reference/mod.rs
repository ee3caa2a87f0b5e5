//! Plain CPU implementations of every operation of the forward pass, and [`ReferenceModel`], a
//! whole-model forward pass built from them: the oracle the GPU kernels and the GPU model are
//! tested against.
//!
//! Weights are dequantized exactly to f32 once; activations are stored in f32 between
//! operations, but every reduction (dot products, norms, softmax, attention) accumulates in f64,
//! so the result sits within rounding of the float64 goldens in `tests/fixtures/golden/`.
//! Shapes are written outermost first; matrices are `[out, in]` and row-major.

mod linear;
mod model;
mod ops;

pub use linear::{matmul, matvec};
pub use model::{ReferenceCache, ReferenceModel};
pub use ops::{attention, embedding_row, gelu_tanh, layer_norm, rms_norm, rope, silu, softmax};
