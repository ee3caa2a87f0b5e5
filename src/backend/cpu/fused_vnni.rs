//! The 32-value types' fused rows ([`super::fused`]) on AVX-512 VNNI: four pairs of blocks
//! (256 values, sixteen half-blocks) per step, each 64-byte pair of blocks met by one
//! `vpdpbusd` per token, where AVX2 takes two `vpmaddubsw`, two `vpmaddwd`, two `vpsignb` and
//! two `vphaddd` per pair.
//!
//! The bits are those of the AVX2 path. `vpdpbusd` multiplies unsigned bytes by signed ones,
//! so the weights go in as unsigned values and the exact integer sum is recovered per
//! half-block: Q4_1's nibbles and Q5_1's five bits as they are; Q4_0's nibbles `u` with
//! `Σ (u − 8)·q = Σ u·q − 8·Σ q`, Q5_0's five bits with `− 16·Σ q`; Q8_0's `w` as `w + 128` with `Σ w·q = Σ (w + 128)·q − 128·Σ q`, `Σ q` being
//! [`Q8Rows::isums`](super::quant::Q8Rows::isums), exact. The sixteen sums are then scaled and
//! added to the four accumulators pair by pair, in the order the AVX2 path adds them (the same
//! f32 products, the same additions), so nothing downstream can tell the paths apart.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::quant::{Layout, Row, QK};

/// Pairs of blocks one step takes.
pub(super) const PAIRS_PER_STEP: usize = 4;

/// One token's activations as the VNNI path reads them: values, half-block scales and block
/// sums, and the exact half-block sums `Σ q`.
pub(super) type VnniRow<'a> = (Row<'a>, &'a [i32]);

/// The accumulators of `N` tokens after the first `steps · 4` pairs of blocks, starting from
/// `acc`. The caller checked the CPU ([`super::dot::has_vnni`]) and that the blocks, values,
/// scales and sums cover `steps · 8` blocks.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VNNI, AVX2 and F16C; `bytes` holds at least `steps · 8`
/// blocks of `l`, and each row's `q`, `d` and sums at least as many blocks' worth.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn steps<const N: usize>(
    l: Layout,
    bytes: &[u8],
    rows: [VnniRow<'_>; N],
    steps: usize,
    mut acc: [__m128; N],
) -> [__m128; N] {
    let zero = _mm512_setzero_si512();
    // Q4_0's nibbles are 8 over their values, Q5_0's five bits 16, Q8_0's bytes 128 (after
    // flipping the sign bit); Q4_1's and Q5_1's are their values
    // `Σ q` times the bias (a power of two), as a shift: none for the unbiased types
    let shift = match l.nibble_bias {
        None => Some(7),
        Some(0) => None,
        Some(bias) => Some(bias.unsigned_abs().trailing_zeros() as i32),
    };
    for step in 0..steps {
        let b0 = step * 2 * PAIRS_PER_STEP;
        let h0 = 2 * b0;
        // SAFETY: the blocks b0..b0 + 8 lie inside `bytes` (the caller's promise).
        let (w, scales) = unsafe {
            (
                [
                    pair_values(l, bytes, b0),
                    pair_values(l, bytes, b0 + 2),
                    pair_values(l, bytes, b0 + 4),
                    pair_values(l, bytes, b0 + 6),
                ],
                block_scales(l, bytes, b0),
            )
        };
        for (acc, ((q, d, _), isum)) in acc.iter_mut().zip(&rows) {
            // SAFETY: 64-byte loads of the activations of blocks b0..b0 + 8 and 64-byte loads
            // of their sixteen scales and sums, inside `q`, `d` and `isum` (the caller's
            // promise).
            let (dots, dv, iv) = unsafe {
                let qp = q.as_ptr().add(b0 * QK);
                (
                    [
                        _mm512_dpbusd_epi32(zero, w[0], _mm512_loadu_si512(qp.cast())),
                        _mm512_dpbusd_epi32(zero, w[1], _mm512_loadu_si512(qp.add(64).cast())),
                        _mm512_dpbusd_epi32(zero, w[2], _mm512_loadu_si512(qp.add(128).cast())),
                        _mm512_dpbusd_epi32(zero, w[3], _mm512_loadu_si512(qp.add(192).cast())),
                    ],
                    _mm512_loadu_ps(d.as_ptr().add(h0)),
                    _mm512_loadu_si512(isum.as_ptr().add(h0).cast()),
                )
            };
            let sums = half_block_sums(dots);
            let sums = match shift {
                None => sums,
                Some(s) => _mm512_sub_epi32(sums, _mm512_sll_epi32(iv, _mm_cvtsi32_si128(s))),
            };
            // `scale_h · d_h` in f32, as the AVX2 path makes it
            *acc = add_scaled(*acc, sums, _mm512_mul_ps(scales, dv));
        }
    }
    acc
}

/// Four pairs' `vpdpbusd` results (lane `j` of pair `p` holding half-block `j`'s four
/// partial sums) as the sixteen half-block sums in order (pair 0's four, then pair 1's, ...).
#[target_feature(enable = "avx512f")]
pub(super) fn half_block_sums(dots: [__m512i; 4]) -> __m512i {
    // half-block j of pair p sits at element 4j + p after the transposing sums; element
    // 4p + j is wanted
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_epi32(order, transposed_sums(dots))
}

/// `acc` plus the sixteen products `f32(sums_h) · c_h`, four at a time in pair order: the
/// additions the AVX2 path makes, one pair after the other.
#[target_feature(enable = "avx512f")]
pub(super) fn add_scaled(acc: __m128, sums: __m512i, c: __m512) -> __m128 {
    let p = _mm512_mul_ps(_mm512_cvtepi32_ps(sums), c);
    let acc = _mm_add_ps(acc, _mm512_castps512_ps128(p));
    let acc = _mm_add_ps(acc, _mm512_extractf32x4_ps::<1>(p));
    let acc = _mm_add_ps(acc, _mm512_extractf32x4_ps::<2>(p));
    _mm_add_ps(acc, _mm512_extractf32x4_ps::<3>(p))
}

/// The four pairs' `vpdpbusd` results (lane `j` of pair `p` holding half-block `j`'s four
/// partial sums) summed per half-block: element `4j + p` is pair `p`'s half-block `j`.
#[target_feature(enable = "avx512f")]
fn transposed_sums(p: [__m512i; 4]) -> __m512i {
    let s01 = _mm512_add_epi32(
        _mm512_unpacklo_epi32(p[0], p[1]),
        _mm512_unpackhi_epi32(p[0], p[1]),
    );
    let s23 = _mm512_add_epi32(
        _mm512_unpacklo_epi32(p[2], p[3]),
        _mm512_unpackhi_epi32(p[2], p[3]),
    );
    _mm512_add_epi32(
        _mm512_unpacklo_epi64(s01, s23),
        _mm512_unpackhi_epi64(s01, s23),
    )
}

/// Blocks `b` and `b + 1`'s 64 values as unsigned bytes, in the activations' order (block
/// `b`'s 32, then block `b + 1`'s): Q8_0's bytes with the sign bit flipped (`w + 128`), the
/// 4-bit types' nibbles (low nibbles first in each block).
///
/// # Safety
/// The CPU has AVX-512 F and BW and AVX2; blocks `b` and `b + 1` lie inside `bytes`.
#[target_feature(enable = "avx2,avx512f,avx512bw")]
unsafe fn pair_values(l: Layout, bytes: &[u8], b: usize) -> __m512i {
    // SAFETY: each block's values (32 bytes, or 16 of nibbles) lie inside it, and the caller
    // promised that both blocks lie inside `bytes`.
    unsafe {
        let p0 = bytes.as_ptr().add(b * l.size + l.values);
        let p1 = p0.add(l.size);
        match l.nibble_bias {
            None => {
                let both = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_loadu_si256(p0.cast())),
                    _mm256_loadu_si256(p1.cast()),
                );
                _mm512_xor_si512(both, _mm512_set1_epi8(-128))
            }
            Some(_) => {
                let n = _mm256_set_m128i(_mm_loadu_si128(p1.cast()), _mm_loadu_si128(p0.cast()));
                // [n0 n1 n0 n1], the upper half shifted to its high nibbles
                let twice = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(n), n);
                let counts = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(4));
                let v = _mm512_and_si512(_mm512_srlv_epi16(twice, counts), _mm512_set1_epi8(0x0F));
                // [b lo, b+1 lo, b hi, b+1 hi] → [b lo, b hi, b+1 lo, b+1 hi]
                let v = _mm512_shuffle_i64x2::<0b11_01_10_00>(v, v);
                match l.high_bits {
                    // value j of the pair (block b's 32, then block b + 1's) gets its fifth bit
                    Some(_) => {
                        let bits = u64::from(l.high_word(bytes, b))
                            | (u64::from(l.high_word(bytes, b + 1)) << 32);
                        _mm512_or_si512(v, _mm512_maskz_set1_epi8(bits, 0x10))
                    }
                    None => v,
                }
            }
        }
    }
}

/// The f16 scales of blocks `b..b + 8`, each twice (one per half-block), as 16 f32.
///
/// # Safety
/// The CPU has AVX-512 F, AVX2 and F16C; blocks `b..b + 8` lie inside `bytes` (each at least
/// 4 bytes long, so each gathered 4-byte word lies inside its block).
#[target_feature(enable = "avx2,f16c,avx512f")]
unsafe fn block_scales(l: Layout, bytes: &[u8], b: usize) -> __m512 {
    let size = l.size as i32;
    let offsets = _mm256_setr_epi32(
        0,
        size,
        2 * size,
        3 * size,
        4 * size,
        5 * size,
        6 * size,
        7 * size,
    );
    // SAFETY: eight 4-byte reads at the starts of blocks b..b + 8, inside `bytes`.
    let words =
        unsafe { _mm256_i32gather_epi32::<1>(bytes.as_ptr().add(b * l.size).cast(), offsets) };
    let low = _mm256_and_si256(words, _mm256_set1_epi32(0xFFFF));
    _mm512_cvtph_ps(_mm256_or_si256(low, _mm256_slli_epi32::<16>(low)))
}
