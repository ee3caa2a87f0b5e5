//! The K-quant tiles' products on AVX2 with F16C (Q4_K here, Q6_K in
//! [`super::super::tiles_q6k`]'s), for CPUs without AVX-512 VNNI: the same tiles and the same
//! bits as the VNNI passes, eight rows to a register.
//!
//! A tile's 64-byte lines hold the same four stored bytes of each of its 16 rows, so a
//! 256-bit register holds them for eight rows and a tile is taken in two passes of eight
//! rows. A token's four activation bytes are broadcast and `vpmaddubsw` multiplies them with
//! each row's four unsigned values, adding neighbours into 16-bit sums that `vpmaddwd` makes
//! 32-bit: Q4_K's values (below 16) let a half-block's four words be added in 16 bits first
//! (eight products of at most 15 · 128 a lane), Q6_K's (below 64) two words at a time.

use std::arch::x86_64::*;

use super::{KTiles, D_LINE, LINES, MINS_LINE, PREFETCH, QK_K, SCALES_LINE};
use crate::backend::cpu::quant::{Q8Rows, TILE_ROWS as ROWS};

/// Rows to a register (a pass over half a tile).
pub(in crate::backend::cpu) const LANES: usize = 8;

/// Tokens a pass takes at once: their four accumulators each, their sums and a half-block's
/// words fit AVX2's sixteen registers.
const TOKENS: usize = 2;

/// A K-quant matrix's pass on AVX2: rows `8·part..8·part + 8` of tile `g` with tokens
/// `first..first + N` of `q8`.
pub(in crate::backend::cpu) trait PartAvx2 {
    /// # Safety
    /// The CPU has AVX2 and F16C; `q8`'s rows are the tiles' width and hold the tokens asked
    /// for; tile `g` is filled.
    unsafe fn part<const N: usize>(
        &self,
        g: usize,
        q8: &Q8Rows,
        first: usize,
        part: usize,
    ) -> [[f32; LANES]; N];
}

/// Tile `g`'s products with every token of `q8` in passes of eight rows and at most two
/// tokens, into `out[r · tokens + t]`: a K-quant tile's product on AVX2 (whatever tiles this
/// CPU's matrices run on).
///
/// # Safety
/// As [`PartAvx2::part`], for every token of `q8`; `out` holds `16 × tokens` values.
pub(in crate::backend::cpu) unsafe fn in_twos<T: PartAvx2>(
    tiles: &T,
    g: usize,
    q8: &Q8Rows,
    out: &mut [f32],
) {
    let tokens = q8.q.len() / q8.cols.max(1);
    let mut first = 0;
    while first < tokens {
        let n = (tokens - first).min(TOKENS);
        for part in 0..ROWS / LANES {
            // SAFETY: the caller's promise, for tokens `first..first + n`.
            let sums = unsafe {
                match n {
                    1 => {
                        let [one] = tiles.part::<1>(g, q8, first, part);
                        [one, [0.0; LANES]]
                    }
                    _ => tiles.part::<TOKENS>(g, q8, first, part),
                }
            };
            for (k, row_sums) in sums.iter().take(n).enumerate() {
                for (r, &v) in row_sums.iter().enumerate() {
                    out[(LANES * part + r) * tokens + first + k] = v;
                }
            }
        }
        first += n;
    }
}

impl KTiles {
    /// The mins' part of rows `8·part..` of the tile at `tile` with tokens `first..first +
    /// N`, as [`KTiles::mins_parts`] adds it.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C; `tile` is a tile of these lines; `q8` holds the tokens at
    /// the tiles' width.
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn mins_parts_avx2<const N: usize>(
        &self,
        tile: *const u8,
        q8: &Q8Rows,
        first: usize,
        part: usize,
    ) -> [__m256; N] {
        let blocks = self.0.blocks();
        let subs = blocks * 8;
        let sign = _mm256_set1_ps(-0.0);
        let mut total = [sign; N];
        for s in 0..8 {
            let mut lane = [_mm256_setzero_ps(); N];
            for b in 0..blocks {
                // SAFETY: super-block `b`'s `dmin`s and mins lie in the tile, its sub-blocks'
                // sums in each token's (the caller's promise).
                unsafe {
                    let p = tile.add(b * LINES * 64);
                    let dmin = p.add(D_LINE * 64 + 32 + 2 * LANES * part);
                    let dmin = _mm256_cvtph_ps(_mm_loadu_si128(dmin.cast()));
                    let m = p.add(MINS_LINE * 64 + s * ROWS + LANES * part);
                    let m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(m.cast())));
                    // −(dmin · m): the row path's offset, its sign flipped exactly
                    let offset = _mm256_xor_ps(_mm256_mul_ps(dmin, m), sign);
                    for (t, lane) in lane.iter_mut().enumerate() {
                        let sb = *q8.s.as_ptr().add((first + t) * subs + b * 8 + s);
                        *lane = _mm256_add_ps(*lane, _mm256_mul_ps(offset, _mm256_set1_ps(sb)));
                    }
                }
            }
            for (total, lane) in total.iter_mut().zip(lane) {
                *total = _mm256_add_ps(*total, lane);
            }
        }
        total
    }
}

impl PartAvx2 for KTiles {
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn part<const N: usize>(
        &self,
        g: usize,
        q8: &Q8Rows,
        first: usize,
        part: usize,
    ) -> [[f32; LANES]; N] {
        let blocks = self.0.blocks();
        let cols = blocks * QK_K;
        let halves = cols / 16;
        let tile = self.0.tile(g).as_ptr();
        let mut acc = [[_mm256_setzero_ps(); 4]; N];
        let mask = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        for b in 0..blocks {
            // SAFETY (every access of this block): super-block `b` of tile `g` lies inside the
            // lines and each token's values, scales and sums (the caller's promise).
            unsafe {
                let p = tile.add(b * LINES * 64);
                if part == 0 {
                    // PREFETCH super-blocks on; the second pass reads what the first brought
                    let ahead = p.wrapping_add(PREFETCH * LINES * 64);
                    for l in 0..LINES {
                        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(l * 64).cast());
                    }
                }
                let scale_of = |s: usize| {
                    let x = p.add(SCALES_LINE * 64 + s * ROWS + LANES * part);
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(x.cast())))
                };
                let d = p.add(D_LINE * 64 + 2 * LANES * part);
                let d = _mm256_cvtph_ps(_mm_loadu_si128(d.cast()));
                let values = p.add(4 * LANES * part);
                for pair in 0..4 {
                    // sub-blocks 2·pair and 2·pair + 1: `d · sc` once each for the 8 rows
                    let scales = [
                        _mm256_mul_ps(d, scale_of(2 * pair)),
                        _mm256_mul_ps(d, scale_of(2 * pair + 1)),
                    ];
                    // half-blocks 4·pair + 0..4: the low nibbles of words 0–3 and 4–7, then
                    // the high nibbles of the same
                    for k in 0..4 {
                        let (high, from) = (k >= 2, 8 * pair + 4 * (k % 2));
                        let w: [__m256i; 4] = std::array::from_fn(|i| {
                            let v = _mm256_loadu_si256(values.add((from + i) * 64).cast());
                            let v = if high { _mm256_srli_epi16::<4>(v) } else { v };
                            _mm256_and_si256(v, mask)
                        });
                        let hb = 4 * pair + k;
                        let scale = scales[k / 2];
                        for (t, acc) in acc.iter_mut().enumerate() {
                            let h = (first + t) * halves + b * 16 + hb;
                            let qp = q8.q.as_ptr().add((first + t) * cols + b * QK_K + 16 * hb);
                            let mut pairs = _mm256_setzero_si256();
                            for (i, w) in w.iter().enumerate() {
                                let word = qp.add(4 * i).cast::<i32>().read_unaligned();
                                let m = _mm256_maddubs_epi16(*w, _mm256_set1_epi32(word));
                                pairs = _mm256_add_epi16(pairs, m);
                            }
                            let sum = _mm256_madd_epi16(pairs, ones);
                            let c = _mm256_mul_ps(scale, _mm256_set1_ps(*q8.d.as_ptr().add(h)));
                            acc[k] =
                                _mm256_add_ps(acc[k], _mm256_mul_ps(_mm256_cvtepi32_ps(sum), c));
                        }
                    }
                }
            }
        }
        // SAFETY: the tokens' block sums cover the row (the caller's promise).
        let mins = unsafe { self.mins_parts_avx2::<N>(tile, q8, first, part) };
        let mut out = [[0.0f32; LANES]; N];
        for ((o, acc), mins) in out.iter_mut().zip(&acc).zip(mins) {
            let dot = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            // SAFETY: a 32-byte store into 8 f32.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), _mm256_add_ps(dot, mins)) };
        }
        out
    }
}
