//! Structs the host writes and a kernel reads (uniform parameters, per-step rows, sampler
//! adjustments): declared through [`host_struct!`], which records each field's name, offset,
//! size and type, so that a test holds every one to the WGSL struct it mirrors (names in
//! order, offsets, sizes, scalar types; fields named `_…` are padding on either side).
//!
//! WGSL has no way to include a Rust definition, so the two are written twice; the test is
//! what keeps them one layout: a field added, reordered or retyped on one side only fails it,
//! as does a WGSL struct that no Rust type claims (see the tests in `ops/host_structs.rs`).

/// One field of a [`HostStruct`]: where it lies in the bytes the host uploads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// The field's name (`_…`: padding).
    pub name: &'static str,
    /// Byte offset in the struct.
    pub offset: usize,
    /// Bytes it takes.
    pub size: usize,
    /// Its Rust type as written (`u32`, `f32`, `[u32; 2]`, …).
    pub ty: &'static str,
}

/// A `#[repr(C)]` struct uploaded for a kernel, with its fields' layout.
pub trait HostStruct: bytemuck::Pod {
    /// The fields in declaration order.
    const FIELDS: &'static [Field];
}

/// Declares a `#[repr(C)]` struct as written and implements [`HostStruct`] for it (the
/// struct's own attributes, `#[repr(C)]` included, are written at the call).
macro_rules! host_struct {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fmeta:meta])* $fvis:vis $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( $(#[$fmeta])* $fvis $field: $ty ),*
        }

        impl $crate::backend::gpu::host_struct::HostStruct for $name {
            const FIELDS: &'static [$crate::backend::gpu::host_struct::Field] = &[
                $( $crate::backend::gpu::host_struct::Field {
                    name: stringify!($field),
                    offset: std::mem::offset_of!($name, $field),
                    size: std::mem::size_of::<$ty>(),
                    ty: stringify!($ty),
                } ),*
            ];
        }
    };
}
pub(crate) use host_struct;
