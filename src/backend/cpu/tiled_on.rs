//! [`super`]'s calls where the CPU has tiles (x86_64, and WebAssembly built with relaxed SIMD):
//! matrices kept in tiles, and rows repacked into tiles as a product goes.

use super::super::quant::Q8Rows;
use super::super::{for_each_chunk, run, tiles_vnni};
#[cfg(target_arch = "x86_64")]
use super::super::{tiles_k, tiles_q6k};
use super::ROWS;
use crate::dtype::DType;

/// A matrix's rows kept in tiles (never made where the CPU has none).
#[derive(Debug, Clone)]
pub(in crate::backend::cpu) struct Packed {
    tiles: Tiles,
}

/// The tiles of one type family.
#[derive(Debug, Clone)]
enum Tiles {
    /// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 ([`tiles_vnni`]).
    Blocks(tiles_vnni::Tile),
    /// Q4_K ([`tiles_k`]).
    #[cfg(target_arch = "x86_64")]
    K(tiles_k::KTiles),
    /// Q6_K ([`tiles_q6k`]).
    #[cfg(target_arch = "x86_64")]
    Q6k(tiles_q6k::Q6kTiles),
}

/// Fills `tiles` from 16-row runs of `data` on the thread team (the file's pages are read in
/// as the tiles are filled).
fn fill_all<T: Send>(
    tiles: &mut [T],
    data: &[u8],
    row_bytes: usize,
    fill: impl Fn(&mut T, &[u8]) + Sync,
) {
    const PER_TASK: usize = 8;
    run(|| {
        for_each_chunk(tiles, PER_TASK, |i, tiles| {
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
    pub(in crate::backend::cpu) fn new(
        dtype: DType,
        rows: usize,
        row_bytes: usize,
        data: &[u8],
    ) -> Option<Self> {
        if rows == 0 || !rows.is_multiple_of(ROWS) {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        if tiles_k::available(dtype) {
            let mut tiles = tiles_k::KTiles::new(rows / ROWS, row_bytes);
            fill_all(&mut tiles.tiles_mut(), data, row_bytes, |t, d| {
                tiles_k::KTiles::fill_tile(t, d, row_bytes)
            });
            return Some(Self {
                tiles: Tiles::K(tiles),
            });
        }
        #[cfg(target_arch = "x86_64")]
        if tiles_q6k::available(dtype) {
            let mut tiles = tiles_q6k::Q6kTiles::new(rows / ROWS, row_bytes);
            fill_all(&mut tiles.tiles_mut(), data, row_bytes, |t, d| {
                tiles_q6k::Q6kTiles::fill_tile(t, d, row_bytes)
            });
            return Some(Self {
                tiles: Tiles::Q6k(tiles),
            });
        }
        if !tiles_vnni::available(dtype) {
            return None;
        }
        let mut tiles = tiles_vnni::Tile::with_tiles(dtype, rows / ROWS, row_bytes)?;
        let filler = tiles.filler(row_bytes);
        fill_all(&mut tiles.tiles_mut(), data, row_bytes, |t, d| {
            filler.fill(t, d)
        });
        Some(Self {
            tiles: Tiles::Blocks(tiles),
        })
    }

    /// Bytes held.
    pub(in crate::backend::cpu) fn bytes(&self) -> usize {
        match &self.tiles {
            Tiles::Blocks(t) => t.bytes(),
            #[cfg(target_arch = "x86_64")]
            Tiles::K(t) => t.bytes(),
            #[cfg(target_arch = "x86_64")]
            Tiles::Q6k(t) => t.bytes(),
        }
    }

    /// Row `r` dequantized into `out` (`[cols]`), as the stored row would be.
    pub(in crate::backend::cpu) fn row_f32(
        &self,
        r: usize,
        out: &mut [f32],
    ) -> crate::error::Result<()> {
        match &self.tiles {
            Tiles::Blocks(t) => t.row_f32(r, out),
            #[cfg(target_arch = "x86_64")]
            Tiles::K(t) => t.row_f32(r, out),
            #[cfg(target_arch = "x86_64")]
            Tiles::Q6k(t) => t.row_f32(r, out),
        }
    }

    /// Rows `first..` that `out` (`[n rows, tokens]`, `first` and `n` whole tiles) holds,
    /// computed from the tiles.
    pub(in crate::backend::cpu) fn product(
        &self,
        first: usize,
        (q8, corrections): (&Q8Rows, &[i32]),
        out: &mut [f32],
    ) {
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
}

/// What the tiles start each half-block's sum with.
pub(in crate::backend::cpu) fn corrections(dtype: DType, q8: &Q8Rows) -> Vec<i32> {
    tiles_vnni::corrections(dtype, q8)
}

/// Whether a product of `dtype` kept as rows over `tokens` tokens repacks its rows into
/// tiles as it goes.
pub(in crate::backend::cpu) fn wanted(dtype: DType, tokens: usize) -> bool {
    tokens >= tiles_vnni::MIN_TOKENS && tiles_vnni::available(dtype)
}

/// The whole tiles of the rows from `first` on that `out` (`[n rows, tokens]`) holds, from
/// stored rows repacked one tile at a time, computed into it; the rows done (a multiple of
/// [`ROWS`], the rest left to the caller).
pub(in crate::backend::cpu) fn rows(
    dtype: DType,
    data: &[u8],
    row_bytes: usize,
    first: usize,
    (q8, corrections): (&Q8Rows, &[i32]),
    out: &mut [f32],
) -> usize {
    let tokens = q8.q.len() / q8.cols.max(1);
    let Some(mut tile) = tiles_vnni::Tile::new(dtype) else {
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
