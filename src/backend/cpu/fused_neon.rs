//! The fused rows of the 32-value types with NEON (aarch64, where NEON is the baseline): each
//! block's values made in a register, as the SIMD128 build makes them, and multiplied by the
//! unpacked path's NEON dot ([`crate::backend::cpu::dot`]), so the bits are every other
//! path's.

use super::{f16_at, Layout};

/// The accumulators after the first `pairs` pairs of blocks, with NEON: the unpacked path's
/// `simd_groups` with each 16-byte weight load replaced by the half-block's values made in a
/// register (as the SIMD128 build does).
pub(super) fn simd_pairs(l: Layout, bytes: &[u8], q: &[i8], d: &[f32], pairs: usize) -> [f32; 4] {
    use std::arch::aarch64::*;

    let value_bytes = if l.nibble_bias.is_some() { 16 } else { 32 };
    assert!(bytes.len() >= 2 * pairs * l.size && l.values + value_bytes <= l.size);
    assert!(q.len() >= pairs * 64 && d.len() >= pairs * 4);
    // SAFETY: NEON is part of the aarch64 baseline; every load reads 16 bytes inside a block
    // of `bytes` or inside `q`, whose lengths were checked above.
    unsafe {
        // Half-blocks 2b and 2b + 1 of block b.
        let halves = |b: usize| -> (int8x16_t, int8x16_t) {
            let p = bytes.as_ptr().add(b * l.size + l.values);
            match l.nibble_bias {
                None => (vld1q_s8(p.cast()), vld1q_s8(p.add(16).cast())),
                Some(bias) => {
                    let v = vld1q_u8(p);
                    let (mut lo, mut hi) = (vandq_u8(v, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(v));
                    if l.high_bits.is_some() {
                        let qh = l.high_word(bytes, b);
                        lo = vorrq_u8(lo, fifth_bits_neon(qh as u16));
                        hi = vorrq_u8(hi, fifth_bits_neon((qh >> 16) as u16));
                    }
                    let bias = vdupq_n_s8(bias);
                    (
                        vaddq_s8(vreinterpretq_s8_u8(lo), bias),
                        vaddq_s8(vreinterpretq_s8_u8(hi), bias),
                    )
                }
            }
        };
        let group = |wv: int8x16_t, h: usize| {
            crate::backend::cpu::dot::half_block_dot_neon(wv, vld1q_s8(q.as_ptr().add(h * 16)))
        };
        let mut acc = vdupq_n_f32(0.0);
        for p in 0..pairs {
            let (b0, b1) = (2 * p, 2 * p + 1);
            let h = 4 * p;
            let ((w0, w1), (w2, w3)) = (halves(b0), halves(b1));
            let sums = crate::backend::cpu::dot::lane_sums_neon(
                group(w0, h),
                group(w1, h + 1),
                group(w2, h + 2),
                group(w3, h + 3),
            );
            let (d0, d1) = (
                f16_at(&bytes[b0 * l.size..], 0),
                f16_at(&bytes[b1 * l.size..], 0),
            );
            let c = [d0 * d[h], d0 * d[h + 1], d1 * d[h + 2], d1 * d[h + 3]];
            acc = crate::backend::cpu::dot::scaled_add_neon(acc, sums, c);
        }
        crate::backend::cpu::dot::lanes_neon(acc)
    }
}

/// `0x10` in byte `j` where bit `j` of `bits` is set, else 0 (16 bytes).
#[target_feature(enable = "neon")]
#[inline]
fn fifth_bits_neon(bits: u16) -> std::arch::aarch64::uint8x16_t {
    use std::arch::aarch64::*;

    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let [b0, b1] = bits.to_le_bytes();
    // SAFETY: a 16-byte load from a 16-byte constant.
    let bit = unsafe { vld1q_u8(BIT.as_ptr()) };
    let spread = vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
    vandq_u8(vtstq_u8(spread, bit), vdupq_n_u8(0x10))
}
