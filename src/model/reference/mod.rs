//! The CPU reference: plain implementations of every operation of the forward pass and the
//! whole-model forward pass built from them.

mod model;

pub use model::*;
