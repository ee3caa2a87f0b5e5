//! The tiles' product on AVX-512 VNNI ([`super::Isa::Vnni`]): 16 rows to a register, a
//! token's four activation bytes broadcast and one `vpdpbusd` adding four products to each
//! row's sum, up to four tokens at a time.

use std::arch::x86_64::*;

use super::super::quant::Q8Rows;
use super::{
    by_passes, offset_sum, pair_lines, place, At, Kind, Tile, PREFETCH, Q4_0, Q4_1, Q5_0, Q5_1,
    Q8_0, QK, ROWS,
};

/// Tokens per tile (their accumulators, four each, stay in registers beside a half-block's
/// four registers of values).
const TOKENS: usize = 4;

impl Tile {
    /// [`Tile::product`] on AVX-512 VNNI: `out[r · tokens + t]` (`r` < 16) of the tile at
    /// `tile` for every token `t` of `q8`, up to four tokens at a time.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and VNNI and F16C; `tile` is a filled tile of this matrix;
    /// `q8`'s rows are `blocks` blocks wide, `corrections` holds theirs (unless the type has
    /// none) and `out` has room for `16 × tokens` values.
    pub(super) unsafe fn product_vnni(
        &self,
        tile: *const u8,
        q8: &Q8Rows,
        corrections: &[i32],
        out: &mut [f32],
    ) {
        let tokens = q8.q.len() / q8.cols.max(1);
        let halves = self.blocks * 2;
        let pass = |first, n, corr: &[i32], _| {
            // SAFETY: `available` was checked by whoever made the tile (it is made only
            // where the CPU has VNNI); the lengths were checked above.
            unsafe {
                by_kind!(self.kind, n, TOKENS, [1, 2, 3], |K, N| self
                    .tokens::<K, N>(tile, q8, corr, first))
            }
        };
        by_passes::<ROWS, TOKENS>(tokens, halves, corrections, out, pass);
    }

    /// The 16 rows' products with tokens `first..first + N` of `q8`, for the type `K`
    /// (the tiles'), of the tile at `tile`; `corr` holds the tokens' corrections from `first`
    /// on.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and VNNI; `tile` is a filled tile of these lines; `q8`'s rows
    /// are `blocks` blocks wide and hold the tokens asked for, and `corr` theirs (unless `K`
    /// has no correction).
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
    unsafe fn tokens<const K: u8, const N: usize>(
        &self,
        tile: *const u8,
        q8: &Q8Rows,
        corr: &[i32],
        first: usize,
    ) -> [[f32; ROWS]; N] {
        let halves = 2 * self.blocks;
        let cols = self.blocks * QK;
        // SAFETY (of every access below): each token's values, scales and corrections are
        // `cols`, `halves` and `halves` long from these bases, inside `q8` and `corr` (the
        // caller's promise); the tile holds `blocks` blocks of values and scales.
        let (q, d, c) = unsafe {
            (
                q8.q.as_ptr().add(first * cols),
                q8.d.as_ptr().add(first * halves),
                corr.as_ptr(),
            )
        };
        let at = At {
            q,
            d,
            c,
            cols,
            halves,
        };
        let mut acc = [[_mm512_setzero_ps(); 4]; N];
        let pair = pair_lines(K) * 64;
        for p in 0..self.blocks / 2 {
            // SAFETY: blocks 2p and 2p + 1 lie inside the tile and the tokens' rows.
            unsafe {
                let rec = tile.add(p * pair);
                // PREFETCH pairs on (into the next tiles at a tile's end)
                let ahead = rec.wrapping_add(PREFETCH * pair);
                for l in 0..pair_lines(K) {
                    _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(l * 64).cast());
                }
                self.block::<K, N, 0>(at, rec, 2 * p, &mut acc);
                self.block::<K, N, 2>(at, rec, 2 * p + 1, &mut acc);
            }
        }
        if self.blocks % 2 == 1 {
            // SAFETY: as above, for the last block (the first of the last pair).
            unsafe {
                let rec = tile.add(self.blocks / 2 * pair);
                self.block::<K, N, 0>(at, rec, self.blocks - 1, &mut acc)
            };
        }
        let mut out = [[0.0f32; ROWS]; N];
        for (t, (o, acc)) in out.iter_mut().zip(&acc).enumerate() {
            let mut dot =
                _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
            if K == Q4_1 || K == Q5_1 {
                let (_, _, s) = q8.row(first + t);
                // SAFETY: the offsets and the block sums cover `blocks` blocks.
                dot = _mm512_add_ps(dot, unsafe { self.offset_dot::<K>(tile, s) });
            }
            // SAFETY: a 64-byte store into 16 f32.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), dot) };
        }
        out
    }

    /// Block `b` (the first of its pair's record `rec` where `A` is 0, the second where it
    /// is 2) with `N` tokens: each half-block's 16 row sums, scaled, added to the
    /// accumulators `A` and `A + 1` (half-block index modulo four: 0 and 1 for even blocks,
    /// 2 and 3 for odd ones).
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and VNNI; `rec` is block `b`'s pair's record in a filled
    /// tile; block `b` lies inside each token's values, scales and corrections at `at`.
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn block<const K: u8, const N: usize, const A: usize>(
        &self,
        at: At,
        rec: *const u8,
        b: usize,
        acc: &mut [[__m512; 4]; N],
    ) {
        let place = const { place(K, A / 2) };
        let h = 2 * b;
        // SAFETY: the caller's promise.
        unsafe {
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(place.scales).cast()));
            let p = rec.add(place.values);
            let mask = _mm512_set1_epi8(0x0F);
            let fifth = K == Q5_0 || K == Q5_1;
            // the 16 rows' words of fifth bits (lane j: row j's)
            let high = match fifth {
                true => _mm512_loadu_si512(rec.add(place.high).cast()),
                false => _mm512_setzero_si512(),
            };
            for half in 0..2 {
                let w: [__m512i; 4] = std::array::from_fn(|i| {
                    if K == Q8_0 {
                        _mm512_loadu_si512(p.add((4 * half + i) * 64).cast())
                    } else {
                        let v = _mm512_loadu_si512(p.add(i * 64).cast());
                        let v = if half == 0 {
                            v
                        } else {
                            _mm512_srli_epi16::<4>(v)
                        };
                        let v = _mm512_and_si512(v, mask);
                        match fifth {
                            true => _mm512_or_si512(v, fifth_bits(high, 16 * half + 4 * i)),
                            false => v,
                        }
                    }
                });
                for (t, acc) in acc.iter_mut().enumerate() {
                    let hh = t * at.halves + h + half;
                    let mut sum = if K == Q4_1 || K == Q5_1 {
                        _mm512_setzero_si512()
                    } else {
                        _mm512_set1_epi32(*at.c.add(hh))
                    };
                    let qp = at.q.add(t * at.cols + b * QK + 16 * half);
                    for (i, w) in w.iter().enumerate() {
                        let word = _mm512_set1_epi32(qp.add(4 * i).cast::<i32>().read_unaligned());
                        sum = _mm512_dpbusd_epi32(sum, *w, word);
                    }
                    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*at.d.add(hh)));
                    let slot = &mut acc[A + half];
                    *slot = _mm512_add_ps(*slot, _mm512_mul_ps(_mm512_cvtepi32_ps(sum), scale));
                }
            }
        }
    }

    /// Q4_1's and Q5_1's `Σ_blocks offset · s` for the 16 rows of the tile at `tile` with one
    /// token's block sums `s`, added as `dot_f32` adds them: eight lanes by block index,
    /// summed in order, then the blocks past the last eight.
    ///
    /// # Safety
    /// The CPU has AVX-512 F; `tile` is a filled tile of type `K` (Q4_1 or Q5_1) and `s`
    /// covers `blocks` blocks.
    #[target_feature(enable = "avx2,f16c,avx512f")]
    unsafe fn offset_dot<const K: u8>(&self, tile: *const u8, s: &[f32]) -> __m512 {
        let pair = pair_lines(K) * 64;
        // SAFETY: every load reads 16 offsets of a block inside its pair's record.
        let m = |b: usize| unsafe {
            let at = b / 2 * pair + place(K, b % 2).offsets;
            _mm512_cvtph_ps(_mm256_loadu_si256(tile.add(at).cast()))
        };
        let splat = |x: f32| _mm512_set1_ps(x);
        let (add, mul) = (|a, b| _mm512_add_ps(a, b), |a, b| _mm512_mul_ps(a, b));
        offset_sum(self.blocks, s, m, splat, add, mul)
    }
}

/// For each row (lane), the fifth bits of its values `first..first + 4` (bits `first..` of its
/// word in `high`) as `0x10` in the four bytes that hold those values' nibbles, else 0.
#[target_feature(enable = "avx512f")]
#[inline]
fn fifth_bits(high: __m512i, first: usize) -> __m512i {
    let four = _mm512_and_si512(
        _mm512_srl_epi32(high, _mm_cvtsi32_si128(first as i32)),
        _mm512_set1_epi32(0xF),
    );
    // bit b moves to bit 8b (the four shifted copies, 7 bits apart, never carry into
    // each other), then to bit 4 of byte b
    let spread = _mm512_and_si512(
        _mm512_mullo_epi32(four, _mm512_set1_epi32(0x0020_4081)),
        _mm512_set1_epi32(0x0101_0101),
    );
    _mm512_slli_epi32::<4>(spread)
}

/// `N` tokens' sums in the first `N` of four slots.
fn widen<const N: usize>(a: [[f32; ROWS]; N]) -> [[f32; ROWS]; TOKENS] {
    std::array::from_fn(|k| a.get(k).copied().unwrap_or([0.0; ROWS]))
}
