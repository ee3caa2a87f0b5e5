//! Weight matrices in tiles of 16 rows where the CPU has a tiled product (AVX-512 VNNI, or AVX2
//! with F16C: [`super::tiles_vnni`] for the 32-value types, [`super::tiles_k`] and
//! [`super::tiles_q6k`] for Q4_K and Q6_K; in WebAssembly built with relaxed SIMD, the
//! 32-value types), and the same calls, declining, where it has none: the matrix product
//! ([`super::QMatrix`]) asks here before taking its row-at-a-time path.
//!
//! A matrix whose rows can be kept in tiles (a covered type, whole tiles, its bytes its own or
//! a mapped file's) is repacked once when it is made ([`Packed`]) and every product, one token
//! or many, runs on the tiles. Any other matrix keeps its stored rows and a product of
//! `tiles_vnni::MIN_TOKENS` or more repacks its rows tile by tile as it goes ([`rows`]).

/// Rows per tile.
pub(super) use super::quant::TILE_ROWS as ROWS;

#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "wasm32", target_feature = "relaxed-simd")
))]
#[path = "tiled_on.rs"]
mod imp;

/// The same calls where the CPU has no tiles: nothing is kept in tiles, nothing repacked.
#[cfg(not(any(
    target_arch = "x86_64",
    all(target_arch = "wasm32", target_feature = "relaxed-simd")
)))]
mod imp {
    use super::super::quant::Q8Rows;
    use crate::dtype::DType;

    /// Never made: this CPU has no tiles.
    #[derive(Debug, Clone)]
    pub(in crate::backend::cpu) enum Packed {}

    impl Packed {
        /// `None`: this CPU has no tiles.
        pub(in crate::backend::cpu) fn new(
            _dtype: DType,
            _rows: usize,
            _row_bytes: usize,
            _data: &[u8],
        ) -> Option<Self> {
            None
        }

        /// Bytes held (never called: there is no value).
        pub(in crate::backend::cpu) fn bytes(&self) -> usize {
            match *self {}
        }

        /// Row `r` (never called: there is no value).
        pub(in crate::backend::cpu) fn row_f32(
            &self,
            _r: usize,
            _out: &mut [f32],
        ) -> crate::error::Result<()> {
            match *self {}
        }

        /// The product (never called: there is no value).
        pub(in crate::backend::cpu) fn product(
            &self,
            _first: usize,
            _q8: (&Q8Rows, &[i32]),
            _out: &mut [f32],
        ) {
            match *self {}
        }
    }

    /// Empty: nothing is tiled.
    pub(in crate::backend::cpu) fn corrections(_dtype: DType, _q8: &Q8Rows) -> Vec<i32> {
        Vec::new()
    }

    /// Never: there are no tiles to repack into.
    pub(in crate::backend::cpu) fn wanted(_dtype: DType, _tokens: usize) -> bool {
        false
    }

    /// None done: the caller multiplies every row.
    pub(in crate::backend::cpu) fn rows(
        _dtype: DType,
        _data: &[u8],
        _row_bytes: usize,
        _first: usize,
        _q8: (&Q8Rows, &[i32]),
        _out: &mut [f32],
    ) -> usize {
        0
    }
}

pub(super) use imp::{corrections, rows, wanted, Packed};
