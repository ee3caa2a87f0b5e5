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

use super::quant::Q8Rows;
/// Rows per tile.
pub(super) use super::quant::TILE_ROWS as ROWS;
use crate::dtype::DType;

/// A matrix's rows kept in tiles (never made where the CPU has none).
#[derive(Debug, Clone)]
pub(super) struct Packed {
    #[cfg(any(
        target_arch = "x86_64",
        all(target_arch = "wasm32", target_feature = "relaxed-simd")
    ))]
    tiles: Tiles,
}

#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "wasm32", target_feature = "relaxed-simd")
))]
/// The tiles of one type family.
#[derive(Debug, Clone)]
enum Tiles {
    /// Q8_0, Q4_0, Q4_1 ([`super::tiles_vnni`]).
    Blocks(super::tiles_vnni::Tile),
    /// Q4_K ([`super::tiles_k`]).
    #[cfg(target_arch = "x86_64")]
    K(super::tiles_k::KTiles),
    /// Q6_K ([`super::tiles_q6k`]).
    #[cfg(target_arch = "x86_64")]
    Q6k(super::tiles_q6k::Q6kTiles),
}

/// Fills `tiles` from 16-row runs of `data` on the thread team (the file's pages are read in
/// as the tiles are filled).
#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "wasm32", target_feature = "relaxed-simd")
))]
fn fill_all<T: Send>(
    tiles: &mut [T],
    data: &[u8],
    row_bytes: usize,
    fill: impl Fn(&mut T, &[u8]) + Sync,
) {
    const PER_TASK: usize = 8;
    super::run(|| {
        super::for_each_chunk(tiles, PER_TASK, |i, tiles| {
            for (k, t) in tiles.iter_mut().enumerate() {
                let g = i * PER_TASK + k;
                fill(t, &data[g * ROWS * row_bytes..][..ROWS * row_bytes]);
            }
        })
    });
}

impl Packed {
    /// `rows` rows of `row_bytes` (`data`) of `dtype` in tiles; `None` where this CPU has no
    /// tiles for the type or the rows are not whole tiles.
    pub(super) fn new(dtype: DType, rows: usize, row_bytes: usize, data: &[u8]) -> Option<Self> {
        #[cfg(any(
            target_arch = "x86_64",
            all(target_arch = "wasm32", target_feature = "relaxed-simd")
        ))]
        {
            if rows == 0 || !rows.is_multiple_of(ROWS) {
                return None;
            }
            #[cfg(target_arch = "x86_64")]
            if super::tiles_k::available(dtype) {
                let mut tiles = super::tiles_k::KTiles::new(rows / ROWS, row_bytes);
                fill_all(&mut tiles.tiles_mut(), data, row_bytes, |t, d| {
                    super::tiles_k::KTiles::fill_tile(t, d, row_bytes)
                });
                return Some(Self {
                    tiles: Tiles::K(tiles),
                });
            }
            #[cfg(target_arch = "x86_64")]
            if super::tiles_q6k::available(dtype) {
                let mut tiles = super::tiles_q6k::Q6kTiles::new(rows / ROWS, row_bytes);
                fill_all(&mut tiles.tiles_mut(), data, row_bytes, |t, d| {
                    super::tiles_q6k::Q6kTiles::fill_tile(t, d, row_bytes)
                });
                return Some(Self {
                    tiles: Tiles::Q6k(tiles),
                });
            }
            if !super::tiles_vnni::available(dtype) {
                return None;
            }
            let mut tiles = super::tiles_vnni::Tile::with_tiles(dtype, rows / ROWS, row_bytes)?;
            let filler = tiles.filler(row_bytes);
            fill_all(&mut tiles.tiles_mut(), data, row_bytes, |t, d| {
                filler.fill(t, d)
            });
            Some(Self {
                tiles: Tiles::Blocks(tiles),
            })
        }
        #[cfg(not(any(
            target_arch = "x86_64",
            all(target_arch = "wasm32", target_feature = "relaxed-simd")
        )))]
        {
            let _ = (dtype, rows, row_bytes, data);
            None
        }
    }

    /// Bytes held.
    pub(super) fn bytes(&self) -> usize {
        #[cfg(any(
            target_arch = "x86_64",
            all(target_arch = "wasm32", target_feature = "relaxed-simd")
        ))]
        return match &self.tiles {
            Tiles::Blocks(t) => t.bytes(),
            #[cfg(target_arch = "x86_64")]
            Tiles::K(t) => t.bytes(),
            #[cfg(target_arch = "x86_64")]
            Tiles::Q6k(t) => t.bytes(),
        };
        #[cfg(not(any(
            target_arch = "x86_64",
            all(target_arch = "wasm32", target_feature = "relaxed-simd")
        )))]
        0
    }

    /// Row `r` dequantized into `out` (`[cols]`), as the stored row would be.
    pub(super) fn row_f32(&self, r: usize, out: &mut [f32]) -> crate::error::Result<()> {
        #[cfg(any(
            target_arch = "x86_64",
            all(target_arch = "wasm32", target_feature = "relaxed-simd")
        ))]
        return match &self.tiles {
            Tiles::Blocks(t) => t.row_f32(r, out),
            #[cfg(target_arch = "x86_64")]
            Tiles::K(t) => t.row_f32(r, out),
            #[cfg(target_arch = "x86_64")]
            Tiles::Q6k(t) => t.row_f32(r, out),
        };
        #[cfg(not(any(
            target_arch = "x86_64",
            all(target_arch = "wasm32", target_feature = "relaxed-simd")
        )))]
        {
            let _ = (r, out);
            Ok(())
        }
    }

    /// Rows `first..` that `out` (`[n rows, tokens]`, `first` and `n` whole tiles) holds,
    /// computed from the tiles.
    pub(super) fn product(
        &self,
        first: usize,
        (q8, corrections): (&Q8Rows, &[i32]),
        out: &mut [f32],
    ) {
        #[cfg(any(
            target_arch = "x86_64",
            all(target_arch = "wasm32", target_feature = "relaxed-simd")
        ))]
        {
            let tokens = q8.q.len() / q8.cols.max(1);
            for (g, out) in out.chunks_exact_mut(ROWS * tokens.max(1)).enumerate() {
                match &self.tiles {
                    Tiles::Blocks(t) => t.product(first / ROWS + g, q8, corrections, out),
                    #[cfg(target_arch = "x86_64")]
                    Tiles::K(t) => t.product(first / ROWS + g, q8, out),
                    #[cfg(target_arch = "x86_64")]
                    Tiles::Q6k(t) => t.product(first / ROWS + g, q8, out),
                }
            }
        }
        #[cfg(not(any(
            target_arch = "x86_64",
            all(target_arch = "wasm32", target_feature = "relaxed-simd")
        )))]
        let _ = (first, q8, corrections, out);
    }
}

/// What the tiles start each half-block's sum with (empty where nothing is tiled).
pub(super) fn corrections(dtype: DType, q8: &Q8Rows) -> Vec<i32> {
    #[cfg(any(
        target_arch = "x86_64",
        all(target_arch = "wasm32", target_feature = "relaxed-simd")
    ))]
    return super::tiles_vnni::corrections(dtype, q8);
    #[cfg(not(any(
        target_arch = "x86_64",
        all(target_arch = "wasm32", target_feature = "relaxed-simd")
    )))]
    {
        let _ = (dtype, q8);
        Vec::new()
    }
}

/// Whether a product of `dtype` kept as rows over `tokens` tokens repacks its rows into
/// tiles as it goes.
pub(super) fn wanted(dtype: DType, tokens: usize) -> bool {
    #[cfg(any(
        target_arch = "x86_64",
        all(target_arch = "wasm32", target_feature = "relaxed-simd")
    ))]
    return tokens >= super::tiles_vnni::MIN_TOKENS && super::tiles_vnni::available(dtype);
    #[cfg(not(any(
        target_arch = "x86_64",
        all(target_arch = "wasm32", target_feature = "relaxed-simd")
    )))]
    {
        let _ = (dtype, tokens);
        false
    }
}

/// The whole tiles of the rows from `first` on that `out` (`[n rows, tokens]`) holds, from
/// stored rows repacked one tile at a time, computed into it; the rows done (a multiple of
/// [`ROWS`], the rest left to the caller).
pub(super) fn rows(
    dtype: DType,
    data: &[u8],
    row_bytes: usize,
    first: usize,
    (q8, corrections): (&Q8Rows, &[i32]),
    out: &mut [f32],
) -> usize {
    #[cfg(any(
        target_arch = "x86_64",
        all(target_arch = "wasm32", target_feature = "relaxed-simd")
    ))]
    {
        let tokens = q8.q.len() / q8.cols.max(1);
        let Some(mut tile) = super::tiles_vnni::Tile::new(dtype) else {
            return 0;
        };
        let groups = out.len() / tokens.max(1) / ROWS;
        for (g, out) in out.chunks_exact_mut(ROWS * tokens).take(groups).enumerate() {
            let rows = &data[(first + g * ROWS) * row_bytes..][..ROWS * row_bytes];
            tile.fill(rows, row_bytes);
            tile.product(0, q8, corrections, out);
        }
        groups * ROWS
    }
    #[cfg(not(any(
        target_arch = "x86_64",
        all(target_arch = "wasm32", target_feature = "relaxed-simd")
    )))]
    {
        let _ = (dtype, data, row_bytes, first, q8, corrections, out);
        0
    }
}
