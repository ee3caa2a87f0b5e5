//! The tiles' product on AVX2 with F16C ([`super::Isa::Avx2`]), for CPUs without AVX-512
//! VNNI: the same tiles, the same bits, eight rows to a register.
//!
//! A tile's 64-byte lines hold the same four values of each of its 16 rows (lane `j`: row
//! `j`), so a 256-bit register holds them for eight rows and a tile is taken in two passes of
//! eight rows (the second reads lines the first has just brought in). A token's four
//! activation bytes are broadcast to every lane and `vpmaddubsw` multiplies them with each
//! row's four unsigned values, adding neighbours into 16-bit sums; a half-block's four words
//! of 16-bit sums are added before one `vpmaddwd` makes each row's 32-bit sum, with nothing
//! to reduce across lanes (the row-at-a-time path ends every 64 values in a horizontal sum).
//! The 16-bit sums cannot overflow: a lane adds eight products of a value below 32 and an
//! activation of magnitude at most 128 (31744 at most). Q8_0's values (stored as `w + 128`)
//! would, so they take the signed form: `|w|` times the activation with `w`'s sign, one
//! `vpmaddwd` per word.
//!
//! The bits are the row path's, as the VNNI tiles': the same exact integer sums per
//! half-block, the same f32 products `f32(Σ) · (scale · d)` added to four accumulators by
//! half-block index modulo four, `(a0 + a1) + (a2 + a3)`, and Q4_1's and Q5_1's offsets as
//! `dot_f32` adds them.

use std::arch::x86_64::*;

use super::super::quant::Q8Rows;
use super::{
    by_passes, offset_sum, pair_lines, place, At, Kind, Tile, PREFETCH, Q4_0, Q4_1, Q5_0, Q5_1,
    Q8_0, QK,
};

/// Rows to a register (a pass over half a tile).
const LANES: usize = 8;

/// Tokens a pass takes at once: their four accumulators each, their sums and a word of
/// values fit AVX2's sixteen registers.
const TOKENS: usize = 2;

impl Tile {
    /// [`Tile::product`] on AVX2: `out[r · tokens + t]` (`r` < 16) of the tile at `tile` for
    /// every token `t` of `q8`.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C; `tile` is a filled tile of this matrix; `q8`'s rows are
    /// `blocks` blocks wide, `corrections` holds theirs (unless the type has none) and `out`
    /// has room for `16 × tokens` values.
    pub(super) unsafe fn product_avx2(
        &self,
        tile: *const u8,
        q8: &Q8Rows,
        corrections: &[i32],
        out: &mut [f32],
    ) {
        let tokens = q8.q.len() / q8.cols.max(1);
        let halves = self.blocks * 2;
        let pass = |first, n, corr: &[i32], part| {
            // SAFETY: the caller's promise.
            unsafe {
                by_kind!(self.kind, n, TOKENS, [1], |K, N| self
                    .part::<K, N>(tile, q8, corr, first, part))
            }
        };
        by_passes::<LANES, TOKENS>(tokens, halves, corrections, out, pass);
    }

    /// Rows `8·part..8·part + 8` of the tile at `tile` with tokens `first..first + N` of
    /// `q8`, for the type `K` (the tiles'); `corr` holds the tokens' corrections from
    /// `first` on.
    ///
    /// # Safety
    /// As [`Self::product_avx2`], and the tokens asked for lie inside `q8`.
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn part<const K: u8, const N: usize>(
        &self,
        tile: *const u8,
        q8: &Q8Rows,
        corr: &[i32],
        first: usize,
        part: usize,
    ) -> [[f32; LANES]; N] {
        let halves = 2 * self.blocks;
        let cols = self.blocks * QK;
        // SAFETY (of every access below): each token's values, scales and corrections are
        // `cols`, `halves` and `halves` long from these bases, inside `q8` and `corr` (the
        // caller's promise); the tile holds `blocks` blocks of values and scales.
        let at = unsafe {
            At {
                q: q8.q.as_ptr().add(first * cols),
                d: q8.d.as_ptr().add(first * halves),
                c: corr.as_ptr(),
                cols,
                halves,
            }
        };
        let mut acc = [[_mm256_setzero_ps(); 4]; N];
        let pair = pair_lines(K) * 64;
        for p in 0..self.blocks / 2 {
            // SAFETY: blocks 2p and 2p + 1 lie inside the tile and the tokens' rows.
            unsafe {
                let rec = tile.add(p * pair);
                if part == 0 {
                    // PREFETCH pairs on (into the next tiles at a tile's end); the second
                    // pass reads what the first brought in
                    let ahead = rec.wrapping_add(PREFETCH * pair);
                    for l in 0..pair_lines(K) {
                        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(l * 64).cast());
                    }
                }
                block::<K, N, 0>(at, rec, 2 * p, part, &mut acc);
                block::<K, N, 2>(at, rec, 2 * p + 1, part, &mut acc);
            }
        }
        if self.blocks % 2 == 1 {
            // SAFETY: as above, for the last block (the first of the last pair).
            unsafe {
                let rec = tile.add(self.blocks / 2 * pair);
                block::<K, N, 0>(at, rec, self.blocks - 1, part, &mut acc)
            };
        }
        let mut out = [[0.0f32; LANES]; N];
        for (t, (o, acc)) in out.iter_mut().zip(&acc).enumerate() {
            let mut dot =
                _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            if K == Q4_1 || K == Q5_1 {
                let (_, _, s) = q8.row(first + t);
                // SAFETY: the offsets and the block sums cover `blocks` blocks.
                dot = _mm256_add_ps(dot, unsafe { self.offset_dot_avx2::<K>(tile, s, part) });
            }
            // SAFETY: a 32-byte store into 8 f32.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), dot) };
        }
        out
    }

    /// Q4_1's and Q5_1's `Σ_blocks offset · s` for rows `8·part..8·part + 8` of the tile at
    /// `tile` with one token's block sums `s`, added as `dot_f32` adds them: eight lanes by
    /// block index, summed in order, then the blocks past the last eight.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C; `tile` is a filled tile of type `K` (Q4_1 or Q5_1) and `s`
    /// covers `blocks` blocks.
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn offset_dot_avx2<const K: u8>(
        &self,
        tile: *const u8,
        s: &[f32],
        part: usize,
    ) -> __m256 {
        let pair = pair_lines(K) * 64;
        // SAFETY: every load reads 8 offsets of a block inside its pair's record.
        let m = |b: usize| unsafe {
            let at = b / 2 * pair + place(K, b % 2).offsets + 2 * LANES * part;
            _mm256_cvtph_ps(_mm_loadu_si128(tile.add(at).cast()))
        };
        let splat = |x: f32| _mm256_set1_ps(x);
        let (add, mul) = (|a, b| _mm256_add_ps(a, b), |a, b| _mm256_mul_ps(a, b));
        offset_sum(self.blocks, s, m, splat, add, mul)
    }
}

/// Block `b` (the first of its pair's record `rec` where `A` is 0, the second where it is 2)
/// with `N` tokens, for rows `8·part..8·part + 8`: each half-block's eight row sums, scaled,
/// added to the accumulators `A` and `A + 1`.
///
/// # Safety
/// The CPU has AVX2 and F16C; `rec` is block `b`'s pair's record in a filled tile; block `b`
/// lies inside each token's values, scales and corrections at `at`.
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn block<const K: u8, const N: usize, const A: usize>(
    at: At,
    rec: *const u8,
    b: usize,
    part: usize,
    acc: &mut [[__m256; 4]; N],
) {
    let place = const { place(K, A / 2) };
    let h = 2 * b;
    let fifth = K == Q5_0 || K == Q5_1;
    let ones = _mm256_set1_epi16(1);
    // SAFETY: the caller's promise.
    unsafe {
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(
            rec.add(place.scales + 2 * LANES * part).cast(),
        ));
        let p = rec.add(place.values + 4 * LANES * part);
        let mask = _mm256_set1_epi8(0x0F);
        // the eight rows' words of fifth bits (lane j: row 8·part + j's)
        let high = match fifth {
            true => _mm256_loadu_si256(rec.add(place.high + 4 * LANES * part).cast()),
            false => _mm256_setzero_si256(),
        };
        for half in 0..2 {
            // each token's sums so far: 16-bit pairs of rows (nibble types), or 32-bit
            // (Q8_0)
            let mut sums = [_mm256_setzero_si256(); N];
            for i in 0..4 {
                let w = if K == Q8_0 {
                    let v = _mm256_loadu_si256(p.add((4 * half + i) * 64).cast());
                    _mm256_xor_si256(v, _mm256_set1_epi8(-128))
                } else {
                    let v = _mm256_loadu_si256(p.add(i * 64).cast());
                    let v = match half {
                        0 => v,
                        _ => _mm256_srli_epi16::<4>(v),
                    };
                    let v = _mm256_and_si256(v, mask);
                    match fifth {
                        true => _mm256_or_si256(v, fifth_bits(high, 16 * half + 4 * i)),
                        false => v,
                    }
                };
                let a = match K == Q8_0 {
                    true => _mm256_abs_epi8(w),
                    false => w,
                };
                for (t, sum) in sums.iter_mut().enumerate() {
                    let qp = at.q.add(t * at.cols + b * QK + 16 * half + 4 * i);
                    let word = _mm256_set1_epi32(qp.cast::<i32>().read_unaligned());
                    *sum = if K == Q8_0 {
                        let m = _mm256_maddubs_epi16(a, _mm256_sign_epi8(word, w));
                        _mm256_add_epi32(*sum, _mm256_madd_epi16(m, ones))
                    } else {
                        _mm256_add_epi16(*sum, _mm256_maddubs_epi16(w, word))
                    };
                }
            }
            for (t, (acc, sum)) in acc.iter_mut().zip(sums).enumerate() {
                let hh = t * at.halves + h + half;
                let mut sum = match K == Q8_0 {
                    true => sum,
                    false => _mm256_madd_epi16(sum, ones),
                };
                if K == Q4_0 || K == Q5_0 {
                    // the unsigned values' correction, `− c · Σq`
                    sum = _mm256_add_epi32(sum, _mm256_set1_epi32(*at.c.add(hh)));
                }
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*at.d.add(hh)));
                let slot = &mut acc[A + half];
                *slot = _mm256_add_ps(*slot, _mm256_mul_ps(_mm256_cvtepi32_ps(sum), scale));
            }
        }
    }
}

/// For each row (lane), the fifth bits of its values `first..first + 4` (bits `first..` of
/// its word in `high`) as `0x10` in the four bytes that hold those values' nibbles, else 0.
#[target_feature(enable = "avx2")]
#[inline]
fn fifth_bits(high: __m256i, first: usize) -> __m256i {
    let four = _mm256_and_si256(
        _mm256_srl_epi32(high, _mm_cvtsi32_si128(first as i32)),
        _mm256_set1_epi32(0xF),
    );
    // bit b moves to bit 8b (the four shifted copies, 7 bits apart, never carry into
    // each other), then to bit 4 of byte b
    let spread = _mm256_and_si256(
        _mm256_mullo_epi32(four, _mm256_set1_epi32(0x0020_4081)),
        _mm256_set1_epi32(0x0101_0101),
    );
    _mm256_slli_epi32::<4>(spread)
}

/// One token's sums in the first of [`TOKENS`] slots.
fn widen(a: [[f32; LANES]; 1]) -> [[f32; LANES]; TOKENS] {
    std::array::from_fn(|k| a.get(k).copied().unwrap_or([0.0; LANES]))
}
