//! The model on the host: the files' bytes, tensors and weights as loaded, the architectures
//! (one file each, [`arch`]) and the graph they build ([`graph`]), and the CPU reference forward
//! pass the backends are tested against. Nothing here knows a backend.

pub mod arch;
pub mod byte_source;
pub mod file_bytes;
pub mod fuse;
pub mod graph;
pub mod reference;
pub mod unfuse;
pub mod weights;
