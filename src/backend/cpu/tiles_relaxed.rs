//! The tiles' product in WebAssembly with relaxed SIMD ([`super::Isa::Relaxed`], a build with
//! `+relaxed-simd`): the same tiles as on x86_64, the same bits, four rows to a register.
//!
//! A tile's 64-byte lines hold the same four values of each of its 16 rows (lane `j`: row
//! `j`), so a 128-bit register holds them for four rows and a tile is taken in four passes of
//! four rows (each pass reads a quarter of the lines the first brought in). A token's four
//! activation bytes are broadcast to every lane and `i16x8.relaxed_dot_i8x16_i7x16_s`
//! multiplies them with each row's four values (below 32: inside the instruction's 7-bit
//! operand, where every engine gives the exact products), adding neighbours into 16-bit sums;
//! a half-block's four words of sums are added in 16 bits (eight products of a value below 32
//! and an activation of magnitude at most 127 to a lane: 31496 at most) and one
//! `i32x4.extadd_pairwise_i16x8_s` makes each row's 32-bit sum, with nothing to reduce across
//! rows. On x86 engines the dot is one `pmaddubsw` (the plain SIMD128 row path spends about
//! eight instructions on the same sixteen products). Q8_0's values do not fit 7 bits: they
//! are taken back to signed bytes and multiplied exactly in 16 bits (`extmul`), each word's
//! products added pairwise into 32 bits.
//!
//! The bits are the row path's, as the x86 tiles': the same exact integer sums per
//! half-block, the same f32 products `f32(Σ) · (scale · d)` added to four accumulators by
//! half-block index modulo four, `(a0 + a1) + (a2 + a3)`, and Q4_1's and Q5_1's offsets as
//! `dot_f32` adds them.

use std::arch::wasm32::*;

use super::super::quant::Q8Rows;
use super::{
    by_passes, offset_sum, pair_lines, place, At, Kind, Tile, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, QK,
};

/// Rows to a register (a pass over a quarter of a tile).
const LANES: usize = 4;

/// Tokens a pass takes at once (their four accumulators each and their sums beside a word of
/// values stay within the sixteen registers an x86 engine has).
const TOKENS: usize = 2;

impl Tile {
    /// [`Tile::product`] with relaxed SIMD: `out[r · tokens + t]` (`r` < 16) of the tile at
    /// `tile` for every token `t` of `q8`.
    ///
    /// # Safety
    /// `tile` is a filled tile of this matrix; `q8`'s rows are `blocks` blocks wide,
    /// `corrections` holds theirs (unless the type has none) and `out` has room for
    /// `16 × tokens` values.
    pub(super) unsafe fn product_relaxed(
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

    /// Rows `4·part..4·part + 4` of the tile at `tile` with tokens `first..first + N` of
    /// `q8`, for the type `K` (the tiles'); `corr` holds the tokens' corrections from
    /// `first` on.
    ///
    /// # Safety
    /// As [`Self::product_relaxed`], and the tokens asked for lie inside `q8`.
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
        let mut acc = [[f32x4_splat(0.0); 4]; N];
        let pair = pair_lines(K) * 64;
        for p in 0..self.blocks / 2 {
            // SAFETY: blocks 2p and 2p + 1 lie inside the tile and the tokens' rows.
            unsafe {
                let rec = tile.add(p * pair);
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
            let mut dot = f32x4_add(f32x4_add(acc[0], acc[1]), f32x4_add(acc[2], acc[3]));
            if K == Q4_1 || K == Q5_1 {
                let (_, _, s) = q8.row(first + t);
                // SAFETY: the offsets and the block sums cover `blocks` blocks.
                dot = f32x4_add(dot, unsafe { self.offset_dot_relaxed::<K>(tile, s, part) });
            }
            // SAFETY: a 16-byte store into 4 f32.
            unsafe { v128_store(o.as_mut_ptr().cast(), dot) };
        }
        out
    }

    /// Q4_1's and Q5_1's `Σ_blocks offset · s` for rows `4·part..4·part + 4` of the tile at
    /// `tile` with one token's block sums `s`, added as `dot_f32` adds them: eight lanes by
    /// block index, summed in order, then the blocks past the last eight.
    ///
    /// # Safety
    /// `tile` is a filled tile of type `K` (Q4_1 or Q5_1) and `s` covers `blocks` blocks.
    unsafe fn offset_dot_relaxed<const K: u8>(
        &self,
        tile: *const u8,
        s: &[f32],
        part: usize,
    ) -> v128 {
        let pair = pair_lines(K) * 64;
        // SAFETY: every load reads 4 offsets of a block inside its pair's record.
        let m = |b: usize| unsafe {
            let at = b / 2 * pair + place(K, b % 2).offsets + 2 * LANES * part;
            f16x4(tile.add(at))
        };
        let splat = |x: f32| f32x4_splat(x);
        let (add, mul) = (|a, b| f32x4_add(a, b), |a, b| f32x4_mul(a, b));
        offset_sum(self.blocks, s, m, splat, add, mul)
    }
}

/// Block `b` (the first of its pair's record `rec` where `A` is 0, the second where it is 2)
/// with `N` tokens, for rows `4·part..4·part + 4`: each half-block's four row sums, scaled,
/// added to the accumulators `A` and `A + 1`.
///
/// # Safety
/// `rec` is block `b`'s pair's record in a filled tile; block `b` lies inside each token's
/// values, scales and corrections at `at`.
#[inline(always)]
unsafe fn block<const K: u8, const N: usize, const A: usize>(
    at: At,
    rec: *const u8,
    b: usize,
    part: usize,
    acc: &mut [[v128; 4]; N],
) {
    let place = const { place(K, A / 2) };
    let h = 2 * b;
    let fifth = K == Q5_0 || K == Q5_1;
    // SAFETY: the caller's promise.
    unsafe {
        let dw = f16x4(rec.add(place.scales + 2 * LANES * part));
        let p = rec.add(place.values + 4 * LANES * part);
        let mask = u8x16_splat(0x0F);
        // the four rows' words of fifth bits (lane j: row 4·part + j's)
        let high = match fifth {
            true => v128_load(rec.add(place.high + 4 * LANES * part).cast()),
            false => u32x4_splat(0),
        };
        for half in 0..2 {
            // each token's sums so far: 16-bit pairs of rows (nibble types), or 32-bit
            // pairs (Q8_0)
            let mut sums = [[u32x4_splat(0); 2]; N];
            for i in 0..4 {
                let w = if K == Q8_0 {
                    // stored as `w + 128`: the signed values back
                    let v = v128_load(p.add((4 * half + i) * 64).cast());
                    v128_xor(v, u8x16_splat(0x80))
                } else {
                    let v = v128_load(p.add(i * 64).cast());
                    let v = match half {
                        0 => v,
                        _ => u16x8_shr(v, 4),
                    };
                    let v = v128_and(v, mask);
                    match fifth {
                        true => v128_or(v, fifth_bits(high, 16 * half + 4 * i)),
                        false => v,
                    }
                };
                for (t, sum) in sums.iter_mut().enumerate() {
                    let qp = at.q.add(t * at.cols + b * QK + 16 * half + 4 * i);
                    let word = u32x4_splat(qp.cast::<u32>().read_unaligned());
                    if K == Q8_0 {
                        let lo = i32x4_extadd_pairwise_i16x8(i16x8_extmul_low_i8x16(w, word));
                        let hi = i32x4_extadd_pairwise_i16x8(i16x8_extmul_high_i8x16(w, word));
                        sum[0] = i32x4_add(sum[0], lo);
                        sum[1] = i32x4_add(sum[1], hi);
                    } else {
                        let d = i16x8_relaxed_dot_i8x16_i7x16(word, w);
                        sum[0] = i16x8_add(sum[0], d);
                    }
                }
            }
            for (t, (acc, sum)) in acc.iter_mut().zip(sums).enumerate() {
                let hh = t * at.halves + h + half;
                let mut sum = match K == Q8_0 {
                    // lanes (row 0, row 0, row 1, row 1) and (row 2, row 2, row 3, row 3)
                    true => i32x4_add(
                        i32x4_shuffle::<0, 2, 4, 6>(sum[0], sum[1]),
                        i32x4_shuffle::<1, 3, 5, 7>(sum[0], sum[1]),
                    ),
                    false => i32x4_extadd_pairwise_i16x8(sum[0]),
                };
                if K == Q4_0 || K == Q5_0 {
                    // the unsigned values' correction, `− c · Σq`
                    sum = i32x4_add(sum, i32x4_splat(*at.c.add(hh)));
                }
                let scale = f32x4_mul(dw, f32x4_splat(*at.d.add(hh)));
                let slot = &mut acc[A + half];
                *slot = f32x4_add(*slot, f32x4_mul(f32x4_convert_i32x4(sum), scale));
            }
        }
    }
}

/// Four f16 at `p` as f32, exactly (as [`super::super::quant::f16_at`] converts one): the bits
/// moved into f32 position and scaled by 2¹¹² (f16 subnormals become the right normal f32),
/// infinities and NaNs given f32's all-ones exponent.
///
/// # Safety
/// `p` points at 8 readable bytes.
#[inline(always)]
unsafe fn f16x4(p: *const u8) -> v128 {
    // SAFETY: the caller's promise.
    let h = u32x4_extend_low_u16x8(unsafe { v128_load64_zero(p.cast()) });
    let sign = u32x4_shl(v128_and(h, u32x4_splat(0x8000)), 16);
    let rest = u32x4_shl(v128_and(h, u32x4_splat(0x7fff)), 13);
    // 2¹¹² = 2^(127 − 15): the exponent bias difference
    let magnitude = f32x4_mul(rest, f32x4_splat(f32::from_bits(0x7780_0000)));
    let special = u32x4_eq(v128_and(h, u32x4_splat(0x7c00)), u32x4_splat(0x7c00));
    let finite = v128_or(sign, magnitude);
    let other = v128_or(v128_or(sign, u32x4_splat(0x7f80_0000)), rest);
    v128_bitselect(other, finite, special)
}

/// For each row (lane), the fifth bits of its values `first..first + 4` (bits `first..` of
/// its word in `high`) as `0x10` in the four bytes that hold those values' nibbles, else 0.
#[inline(always)]
fn fifth_bits(high: v128, first: usize) -> v128 {
    let four = v128_and(u32x4_shr(high, first as u32), u32x4_splat(0xF));
    // bit b moves to bit 8b (the four shifted copies, 7 bits apart, never carry into
    // each other), then to bit 4 of byte b
    let spread = v128_and(
        i32x4_mul(four, u32x4_splat(0x0020_4081)),
        u32x4_splat(0x0101_0101),
    );
    u32x4_shl(spread, 4)
}

/// One token's sums in the first of [`TOKENS`] slots.
fn widen(a: [[f32; LANES]; 1]) -> [[f32; LANES]; TOKENS] {
    std::array::from_fn(|k| a.get(k).copied().unwrap_or([0.0; LANES]))
}
