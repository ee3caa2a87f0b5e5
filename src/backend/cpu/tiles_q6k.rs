//! Q6_K matrices on AVX-512 VNNI (AVX2 with F16C: [`avx2`]) in tiles of 16 weight rows × up to 4 tokens, as
//! [`super::tiles_k`] does for Q4_K: a Q4_K_M model's V and down matrices (and often its LM
//! head).
//!
//! A super-block (256 values of 6 bits, a signed 8-bit scale per 16) is kept as its stored
//! words, lane `j` of each 64-byte register row `j`'s: 32 registers of low nibbles (`ql`) and
//! 16 of high bit pairs (`qh`), as many bytes as the rows. Four values of a half-block are a
//! nibble of an `ql` word and two bits of a `qh` word, put together as `value + 32` (0..63,
//! unsigned); one `vpdpbusd` per word and token adds four products to each row's sum, which
//! starts at `−32 · Σ q` so that it ends exact.
//!
//! The bits are those of the row path: the same exact integer sums per half-block, the same
//! f32 products `f32(Σ) · ((d · sc) · d_q)` added to four accumulators by half-block index
//! modulo four in order, summed as `(a0 + a1) + (a2 + a3)`. The tests hold the tiles to the
//! unpacked row bit for bit.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::quant::{Q8Rows, TILE_ROWS as ROWS};
use super::tile_lines::TileLines;
use super::tiles_k::{in_fours, Pass};
use crate::dtype::DType;

/// Values per super-block.
const QK_K: usize = 256;
/// Bytes of a stored super-block: 128 of low nibbles, 64 of high bit pairs, 16 scales, `d`.
const BLOCK: usize = 210;
/// 4-byte words of low nibbles per super-block.
const QL_WORDS: usize = 32;
/// 4-byte words of high bit pairs per super-block.
const QH_WORDS: usize = 16;
/// Cache lines of values per super-block of a tile.
const VALUE_LINES: usize = QL_WORDS + QH_WORDS;
/// The first of the four lines of scales (`[16 half-blocks, 16 rows]`, signed).
const SCALES_LINE: usize = VALUE_LINES;
/// The line of the 16 rows' `d`.
const D_LINE: usize = VALUE_LINES + 4;
/// Cache lines of one super-block of a tile.
const LINES: usize = D_LINE + 1;
/// Super-blocks ahead of the one multiplied whose lines are prefetched (into L2), as
/// [`super::tiles_k`]'s.
const PREFETCH: usize = 8;

/// Whether [`Q6kTiles`] computes products of `dtype` on this CPU.
pub(super) fn available(dtype: DType) -> bool {
    dtype == DType::Q6_K && super::tiles_vnni::isa().is_some()
}

/// A Q6_K matrix's rows repacked in tiles of 16 ([`TileLines`]). A super-block of a tile is
/// [`LINES`] cache lines: its 32 `ql` and 16 `qh` words with lane `j` of each line row `j`'s,
/// its 16 scales per row, the 16 rows' `d` as the f16 stored.
#[derive(Debug, Clone, Default)]
pub(super) struct Q6kTiles(TileLines);

/// Where half-block `hb`'s four words lie in a super-block: its first `ql` word, whether it
/// takes their high nibbles, its first `qh` word and the shift of its bit pair. Values
/// `128·n + 32·g + l` are nibble `g / 2` of `ql[64·n + 32·(g % 2) + l]` and bits `2·g` of
/// `qh[32·n + l]`.
fn place(hb: usize) -> (usize, bool, usize, i32) {
    let (n, g, l0) = (hb / 8, (hb % 8) / 2, 16 * (hb % 2));
    (
        (64 * n + 32 * (g % 2) + l0) / 4,
        g >= 2,
        (32 * n + l0) / 4,
        2 * g as i32,
    )
}

impl Q6kTiles {
    /// Room for `tiles` tiles of rows of `row_bytes` (whole super-blocks), filled by
    /// [`Self::fill_tile`] on each of [`Self::tiles_mut`].
    pub(super) fn new(tiles: usize, row_bytes: usize) -> Self {
        let blocks = row_bytes / BLOCK;
        assert_eq!(
            blocks * BLOCK,
            row_bytes,
            "Q6_K rows are whole super-blocks"
        );
        Self(TileLines::new(tiles, blocks, LINES))
    }

    /// The rows of `data` (a multiple of 16 rows of `row_bytes`) repacked, one tile after
    /// the other on this thread (the tests').
    #[cfg(test)]
    pub(super) fn fill(&mut self, data: &[u8], row_bytes: usize) {
        *self = Self::new(data.len() / (ROWS * row_bytes), row_bytes);
        for (t, tile) in self.tiles_mut().into_iter().enumerate() {
            Self::fill_tile(tile, &data[t * ROWS * row_bytes..], row_bytes);
        }
    }

    /// Each tile's bytes, to be filled apart.
    pub(super) fn tiles_mut(&mut self) -> Vec<&mut [u8]> {
        self.0.tiles_mut()
    }

    /// Repacks the 16 rows at the start of `data` (`16 × row_bytes`) into one tile's bytes.
    pub(super) fn fill_tile(tile: &mut [u8], data: &[u8], row_bytes: usize) {
        let blocks = row_bytes / BLOCK;
        assert!(data.len() >= ROWS * row_bytes && tile.len() == blocks * LINES * 64);
        for j in 0..ROWS {
            let row = &data[j * row_bytes..][..row_bytes];
            for (b, block) in row.chunks_exact(BLOCK).enumerate() {
                let dst = &mut tile[b * LINES * 64..][..LINES * 64];
                for (w, word) in block[..192].chunks_exact(4).enumerate() {
                    dst[w * 64 + j * 4..][..4].copy_from_slice(word);
                }
                for (h, &s) in block[192..208].iter().enumerate() {
                    dst[SCALES_LINE * 64 + h * ROWS + j] = s;
                }
                dst[D_LINE * 64 + 2 * j..][..2].copy_from_slice(&block[208..210]);
            }
        }
    }

    /// Bytes held (the rows' and 32 more per super-block and tile).
    pub(super) fn bytes(&self) -> usize {
        self.0.bytes()
    }

    /// Row `r` dequantized into `out` (`[blocks · 256]`): each super-block's stored bytes put
    /// back together (on the stack) and dequantized as the stored row would be.
    pub(super) fn row_f32(&self, r: usize, out: &mut [f32]) -> crate::error::Result<()> {
        let (tile, j) = (self.0.tile(r / ROWS), r % ROWS);
        let mut stored = [0u8; BLOCK];
        for (b, out) in out.chunks_exact_mut(QK_K).take(self.0.blocks()).enumerate() {
            let src = &tile[b * LINES * 64..][..LINES * 64];
            for w in 0..VALUE_LINES {
                stored[4 * w..][..4].copy_from_slice(&src[w * 64 + j * 4..][..4]);
            }
            for h in 0..16 {
                stored[192 + h] = src[SCALES_LINE * 64 + h * ROWS + j];
            }
            stored[208..].copy_from_slice(&src[D_LINE * 64 + 2 * j..][..2]);
            crate::dtype::dequantize_into(DType::Q6_K, &stored, out, "row")?;
        }
        Ok(())
    }

    /// `out[r · tokens + t]` (`r` < 16) for row `16·g + r` and every token `t` of `q8`, whose
    /// rows have the tiles' width.
    pub(super) fn product(&self, g: usize, q8: &Q8Rows, out: &mut [f32]) {
        let tokens = q8.q.len() / q8.cols.max(1);
        let cols = self.0.blocks() * QK_K;
        assert!(out.len() >= ROWS * tokens && q8.cols == cols);
        assert_eq!(self.0.tile(g).len(), self.0.blocks() * LINES * 64);
        assert!(q8.d.len() >= tokens * cols / 16 && q8.isum.len() >= tokens * cols / 16);
        // SAFETY: tiles are made only where the CPU has VNNI or AVX2 and F16C (`available`);
        // the lengths were checked above.
        unsafe {
            match super::tiles_vnni::isa() {
                Some(super::tiles_vnni::Isa::Vnni) => in_fours(self, g, q8, tokens, out),
                _ => super::tiles_k::avx2::in_twos(self, g, q8, out),
            }
        }
    }

    /// Tile `g`'s 16 rows' products with tokens `first..first + N` of `q8`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and VNNI and F16C; `q8`'s rows are the tiles' width and hold
    /// the tokens asked for; tile `g` exists.
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
    unsafe fn pass<const N: usize>(&self, g: usize, q8: &Q8Rows, first: usize) -> [[f32; ROWS]; N] {
        let blocks = self.0.blocks();
        let cols = blocks * QK_K;
        let halves = cols / 16;
        let tile = self.0.tile(g).as_ptr();
        let mut acc = [[_mm512_setzero_ps(); 4]; N];
        let (low4, low2) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(3));
        for b in 0..blocks {
            // SAFETY (every access of this block): super-block `b` of tile `g` lies inside
            // the lines and each token's values, scales and sums (the caller's promise, the
            // lengths asserted by `product`).
            unsafe {
                let p = tile.add(b * LINES * 64);
                // PREFETCH super-blocks on (into the next tiles at a tile's end)
                let ahead = p.wrapping_add(PREFETCH * LINES * 64);
                for l in 0..LINES {
                    _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(l * 64).cast());
                }
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(D_LINE * 64).cast()));
                let word = |w: usize| _mm512_load_si512(p.add(w * 64).cast());
                for hb in 0..16 {
                    let (ql, high, qh, shift) = place(hb);
                    let shift = _mm_cvtsi32_si128(shift);
                    // value + 32: the nibble, and the bit pair above it
                    let w: [__m512i; 4] = std::array::from_fn(|i| {
                        let nibbles = word(ql + i);
                        let nibbles = if high {
                            _mm512_srli_epi16::<4>(nibbles)
                        } else {
                            nibbles
                        };
                        let bits = _mm512_and_si512(
                            _mm512_srl_epi16(word(QL_WORDS + qh + i), shift),
                            low2,
                        );
                        _mm512_or_si512(
                            _mm512_and_si512(nibbles, low4),
                            _mm512_slli_epi16::<4>(bits),
                        )
                    });
                    let sc = _mm_loadu_si128(p.add(SCALES_LINE * 64 + hb * ROWS).cast());
                    let scale = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
                    for (t, acc) in acc.iter_mut().enumerate() {
                        let h = (first + t) * halves + b * 16 + hb;
                        let qp = q8.q.as_ptr().add((first + t) * cols + b * QK_K + 16 * hb);
                        // the unsigned values' sum less 32 · Σ q: the signed values' sum
                        let mut sum = _mm512_set1_epi32(-32 * *q8.isum.as_ptr().add(h));
                        for (i, w) in w.iter().enumerate() {
                            let a = _mm512_set1_epi32(qp.add(4 * i).cast::<i32>().read_unaligned());
                            sum = _mm512_dpbusd_epi32(sum, *w, a);
                        }
                        let c = _mm512_mul_ps(scale, _mm512_set1_ps(*q8.d.as_ptr().add(h)));
                        let slot = &mut acc[hb % 4];
                        *slot = _mm512_add_ps(*slot, _mm512_mul_ps(_mm512_cvtepi32_ps(sum), c));
                    }
                }
            }
        }
        let mut out = [[0.0f32; ROWS]; N];
        for (o, acc) in out.iter_mut().zip(&acc) {
            let dot = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
            // SAFETY: a 64-byte store into 16 f32.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), dot) };
        }
        out
    }
}

impl Pass for Q6kTiles {
    unsafe fn tokens<const N: usize>(
        &self,
        g: usize,
        q8: &Q8Rows,
        first: usize,
    ) -> [[f32; ROWS]; N] {
        // SAFETY: the caller's promise.
        unsafe { self.pass::<N>(g, q8, first) }
    }
}

#[path = "tiles_q6k_avx2.rs"]
mod avx2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_match_the_unpacked_rows_bit_for_bit() {
        if !available(DType::Q6_K) {
            eprintln!("no Q6_K tiles on this CPU");
            return;
        }
        super::super::tiles_k::tests::check_tiles(
            DType::Q6_K,
            BLOCK,
            Q6kTiles::fill,
            |t, q8, out| t.product(0, q8, out),
            Q6kTiles::row_f32,
        );
    }

    #[test]
    fn avx2_tiles_match_the_unpacked_rows_bit_for_bit() {
        if !crate::backend::cpu::dot::has_avx2_f16c() {
            eprintln!("no AVX2 and F16C on this CPU");
            return;
        }
        super::super::tiles_k::tests::check_tiles(
            DType::Q6_K,
            BLOCK,
            Q6kTiles::fill,
            // SAFETY: the CPU has AVX2 and F16C (checked above).
            |t, q8, out| unsafe { super::super::tiles_k::avx2::in_twos(t, 0, q8, out) },
            Q6kTiles::row_f32,
        );
    }
}
