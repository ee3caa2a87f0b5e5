//! The model on the host: the files' bytes, tensors and weights as loaded, and the CPU
//! reference forward pass the GPU kernels are tested against.

pub mod file_bytes;
pub mod reference;
pub mod unfuse;
pub mod weights;
