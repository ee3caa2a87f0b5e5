//! Model math. For now: the CPU reference the GPU kernels are tested against.

pub mod reference;
