//! Model description and math: tensor storage types, and the CPU reference the GPU kernels are
//! tested against.

pub mod config;
pub mod forward;
pub mod fuse;
pub mod reference;
pub mod weights;
