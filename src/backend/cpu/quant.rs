//! 8-bit activations and the unpacking of quantized weight rows into one common form, so that
//! every weight type shares one integer dot product.
//!
//! Activations are quantized per half-block of [`QA`] = 16 values: `a ≈ d · q` with `q` in
//! −127..=127 and `d = max|a| / 127` (as llama.cpp's `Q8_0`/`Q8_1` activations, with scales
//! twice as fine: the products need one scale per 16 values anyway, for Q6_K, so the finer
//! activations cost one multiply per 16 and halve the rounding of outlier-heavy blocks). A
//! weight row of any quantized type unpacks into small integers `w` with one scale per 16
//! values and one offset per 32, `x = scale · w + offset`, so that
//! `Σ x·a = Σ_halves scale · d · Σ w·q + Σ_blocks offset · Σ d·q`,
//! the sums `Σ w·q` over 16 values being exact in `i32`.

use crate::dtype::DType;

/// Values per weight block (an offset each, and the granularity rows are checked against).
pub const QK: usize = 32;

/// Values per activation scale.
pub const QA: usize = 16;

/// Rows of activations quantized to 8 bits per block: `tokens × cols` values.
#[derive(Debug, Default, Clone)]
pub struct Q8Rows {
    /// Quantized values, `[tokens, cols]`.
    pub q: Vec<i8>,
    /// Scale of each half-block, `[tokens, cols / QA]`.
    pub d: Vec<f32>,
    /// `Σ d · q` of each block (what a weight offset multiplies), `[tokens, cols / QK]`.
    pub s: Vec<f32>,
    /// `Σ q` of each half-block, exact, `[tokens, cols / QA]`: what the VNNI dot products
    /// subtract after multiplying offset (unsigned) weights.
    pub isum: Vec<i32>,
    /// Values per row (a multiple of [`QK`]).
    pub cols: usize,
}

/// `y.round() as i32` (halves away from zero) for `|y|` below 2²³, without the call to
/// `roundf` that `f32::round` becomes where the CPU has no such instruction (x86_64's baseline
/// SSE2, WebAssembly), so that the quantizing loop stays in vector registers. Truncation toward
/// zero is exact, and so is the remainder `y − trunc(y)` (Sterbenz: `trunc(y)` is within a
/// factor of two of `y`, or zero); NaN gives 0 as `round() as i32` does.
#[inline(always)]
fn round_half_away(y: f32) -> i32 {
    let t = y as i32;
    let rem = y - t as f32;
    t + i32::from(rem >= 0.5) - i32::from(rem <= -0.5)
}

impl Q8Rows {
    /// Quantizes `x: [tokens, cols]` (`cols` a multiple of [`QK`]) into `self`, reusing its
    /// buffers.
    pub fn quantize(&mut self, x: &[f32], cols: usize) {
        debug_assert!(cols.is_multiple_of(QK) && x.len().is_multiple_of(cols));
        self.cols = cols;
        self.q.resize(x.len(), 0);
        self.d.resize(x.len() / QA, 0.0);
        self.s.resize(x.len() / QK, 0.0);
        self.isum.resize(x.len() / QA, 0);
        for (h, (xs, qs)) in x
            .chunks_exact(QA)
            .zip(self.q.chunks_exact_mut(QA))
            .enumerate()
        {
            let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut sum = 0i32;
            for (q, &v) in qs.iter_mut().zip(xs) {
                let r = round_half_away(v * inv);
                *q = r as i8;
                sum += r;
            }
            self.d[h] = d;
            self.isum[h] = sum;
            if h % 2 == 0 {
                self.s[h / 2] = d * sum as f32;
            } else {
                self.s[h / 2] += d * sum as f32;
            }
        }
    }

    /// Row `t`'s exact half-block sums `Σ q`.
    #[inline]
    pub fn isums(&self, t: usize) -> &[i32] {
        let nh = self.cols / QA;
        &self.isum[t * nh..][..nh]
    }

    /// Row `t`: its values, block scales and block sums.
    #[inline]
    pub fn row(&self, t: usize) -> (&[i8], &[f32], &[f32]) {
        let (nh, nb) = (self.cols / QA, self.cols / QK);
        (
            &self.q[t * self.cols..][..self.cols],
            &self.d[t * nh..][..nh],
            &self.s[t * nb..][..nb],
        )
    }
}

/// A weight row unpacked: `x[i] = scale[i / 16] · w[i] + offset[i / 32]`.
#[derive(Debug, Default, Clone)]
pub struct UnpackedRow {
    /// Small integers, `[cols]`.
    pub w: Vec<i8>,
    /// One scale per 16 values, `[cols / 16]`.
    pub scale: Vec<f32>,
    /// One offset per 32 values, `[cols / 32]` (all zero for the symmetric types).
    pub offset: Vec<f32>,
    /// Whether any offset can be non-zero.
    pub has_offset: bool,
}

impl UnpackedRow {
    /// Room for rows of `cols` values.
    pub fn with_cols(cols: usize) -> Self {
        Self {
            w: vec![0; cols],
            scale: vec![0.0; cols / 16],
            offset: vec![0.0; cols / 32],
            has_offset: false,
        }
    }

    /// Unpacks one row of `dtype` (a quantized type; `bytes` hold exactly one row).
    pub fn unpack(&mut self, dtype: DType, bytes: &[u8]) {
        self.has_offset = matches!(dtype, DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K);
        match dtype {
            DType::Q8_0 => self.blocks32(bytes, 34, |b, w| {
                w.copy_from_slice(bytemuck::cast_slice(&b[2..34]));
                (f16_at(b, 0), 0.0)
            }),
            DType::Q4_0 => self.blocks32(bytes, 18, |b, w| {
                nibbles(&b[2..18], w, -8);
                (f16_at(b, 0), 0.0)
            }),
            DType::Q4_1 => self.blocks32(bytes, 20, |b, w| {
                nibbles(&b[4..20], w, 0);
                (f16_at(b, 0), f16_at(b, 2))
            }),
            DType::Q5_0 => self.blocks32(bytes, 22, |b, w| {
                fives(
                    u32::from_le_bytes([b[2], b[3], b[4], b[5]]),
                    &b[6..22],
                    w,
                    -16,
                );
                (f16_at(b, 0), 0.0)
            }),
            DType::Q5_1 => self.blocks32(bytes, 24, |b, w| {
                fives(
                    u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
                    &b[8..24],
                    w,
                    0,
                );
                (f16_at(b, 0), f16_at(b, 2))
            }),
            DType::Q4_K => self.q4_k(bytes),
            DType::Q5_K => self.q5_k(bytes),
            DType::Q6_K => self.q6_k(bytes),
            DType::F32 | DType::F16 | DType::BF16 => {
                debug_assert!(false, "float rows are not unpacked to integers")
            }
        }
    }

    /// The 32-value types: `f` fills a block's integers and returns its scale and offset.
    #[inline(always)]
    fn blocks32(&mut self, bytes: &[u8], size: usize, f: impl Fn(&[u8], &mut [i8]) -> (f32, f32)) {
        for (i, (b, w)) in bytes
            .chunks_exact(size)
            .zip(self.w.chunks_exact_mut(32))
            .enumerate()
        {
            let (d, m) = f(b, w);
            self.scale[2 * i] = d;
            self.scale[2 * i + 1] = d;
            self.offset[i] = m;
        }
    }

    fn q4_k(&mut self, bytes: &[u8]) {
        for (i, b) in bytes.chunks_exact(144).enumerate() {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let scales: &[u8; 12] = b[4..16].try_into().unwrap_or(&[0; 12]);
            let w = &mut self.w[256 * i..][..256];
            for (k, qs) in b[16..144].chunks_exact(32).enumerate() {
                let (lo, hi) = w[64 * k..][..64].split_at_mut(32);
                split_nibbles(&qs[..16], &mut lo[..16], &mut hi[..16], 0);
                split_nibbles(&qs[16..], &mut lo[16..], &mut hi[16..], 0);
            }
            self.k_scales(i, d, dmin, scales);
        }
    }

    fn q5_k(&mut self, bytes: &[u8]) {
        for (i, b) in bytes.chunks_exact(176).enumerate() {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let scales: &[u8; 12] = b[4..16].try_into().unwrap_or(&[0; 12]);
            let qh = &b[16..48];
            let w = &mut self.w[256 * i..][..256];
            for (k, qs) in b[48..176].chunks_exact(32).enumerate() {
                let (lo, hi) = w[64 * k..][..64].split_at_mut(32);
                for (((&q, &h), lo), hi) in qs.iter().zip(qh).zip(lo).zip(hi) {
                    *lo = ((q & 0x0F) | (((h >> (2 * k)) & 1) << 4)) as i8;
                    *hi = ((q >> 4) | (((h >> (2 * k + 1)) & 1) << 4)) as i8;
                }
            }
            self.k_scales(i, d, dmin, scales);
        }
    }

    /// Scales and offsets of super-block `i` of a Q4_K/Q5_K row.
    fn k_scales(&mut self, i: usize, d: f32, dmin: f32, s: &[u8; 12]) {
        for j in 0..8 {
            let (sc, m) = if j < 4 {
                (s[j] & 63, s[j + 4] & 63)
            } else {
                (
                    (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
                    (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
                )
            };
            let scale = d * f32::from(sc);
            self.scale[16 * i + 2 * j] = scale;
            self.scale[16 * i + 2 * j + 1] = scale;
            self.offset[8 * i + j] = -(dmin * f32::from(m));
        }
    }

    fn q6_k(&mut self, bytes: &[u8]) {
        for (i, b) in bytes.chunks_exact(210).enumerate() {
            let d = f16_at(b, 208);
            for (s, &sc) in self.scale[16 * i..][..16].iter_mut().zip(&b[192..208]) {
                *s = d * f32::from(sc as i8);
            }
            self.offset[8 * i..][..8].fill(0.0);
            let w = &mut self.w[256 * i..][..256];
            for (n, w) in w.chunks_exact_mut(128).enumerate() {
                let ql = &b[64 * n..64 * n + 64];
                let qh = &b[128 + 32 * n..128 + 32 * n + 32];
                for l in 0..32 {
                    let h = qh[l];
                    w[l] = ((ql[l] & 0x0F) | ((h & 3) << 4)) as i8 - 32;
                    w[l + 32] = ((ql[l + 32] & 0x0F) | (((h >> 2) & 3) << 4)) as i8 - 32;
                    w[l + 64] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
                    w[l + 96] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
                }
            }
        }
    }

    /// `Σ x·a` of this row with one quantized activation row (values, half-block scales,
    /// block sums).
    #[inline]
    pub fn dot(&self, q: &[i8], d: &[f32], s: &[f32]) -> f32 {
        let acc = super::dot::scaled_dot(&self.w, q, &self.scale, d);
        if self.has_offset {
            acc + super::dot::dot_f32(&self.offset, s)
        } else {
            acc
        }
    }
}

/// The f16 at `b[at..at + 2]` as f32, exactly: the bits moved into f32 position and scaled by
/// 2¹¹² (which also turns f16 subnormals into the right normal f32), infinities and NaNs
/// given f32's all-ones exponent. Branch-free but for those, and inlined, where a library
/// conversion is a call behind a CPU-feature check per value.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    let h = u32::from(u16::from_le_bytes([b[at], b[at + 1]]));
    let sign = (h & 0x8000) << 16;
    let rest = (h & 0x7fff) << 13;
    if h & 0x7c00 == 0x7c00 {
        return f32::from_bits(sign | 0x7f80_0000 | rest);
    }
    // 2¹¹² = 2^(127 − 15): the exponent bias difference
    let magnitude = f32::from_bits(rest) * f32::from_bits(0x7780_0000);
    f32::from_bits(sign | magnitude.to_bits())
}

/// 16 bytes of nibbles (byte `j`: value `j` low, value `j + 16` high), plus `bias`.
#[inline(always)]
fn nibbles(qs: &[u8], w: &mut [i8], bias: i8) {
    let (lo, hi) = w.split_at_mut(16);
    split_nibbles(qs, lo, hi, bias);
}

/// `lo[j] = (qs[j] & 15) + bias`, `hi[j] = (qs[j] >> 4) + bias` for 16 bytes.
#[inline(always)]
fn split_nibbles(qs: &[u8], lo: &mut [i8], hi: &mut [i8], bias: i8) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        assert!(qs.len() >= 16 && lo.len() >= 16 && hi.len() >= 16);
        // SAFETY: SSE2 is part of the x86_64 baseline; the three 16-byte accesses are inside
        // the slices, whose lengths were checked above.
        unsafe {
            let v = _mm_loadu_si128(qs.as_ptr().cast());
            let mask = _mm_set1_epi8(0x0F);
            let b = _mm_set1_epi8(bias);
            let l = _mm_add_epi8(_mm_and_si128(v, mask), b);
            let h = _mm_add_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), mask), b);
            _mm_storeu_si128(lo.as_mut_ptr().cast(), l);
            _mm_storeu_si128(hi.as_mut_ptr().cast(), h);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    for ((&q, lo), hi) in qs.iter().zip(lo).zip(hi).take(16) {
        *lo = (q & 0x0F) as i8 + bias;
        *hi = (q >> 4) as i8 + bias;
    }
}

/// Q5_0/Q5_1 values: nibbles as [`nibbles`] with bit `j` of `qh` the fifth bit of value `j`.
#[inline(always)]
fn fives(qh: u32, qs: &[u8], w: &mut [i8], bias: i8) {
    for (j, &b) in qs.iter().enumerate().take(16) {
        w[j] = ((b & 0x0F) | ((((qh >> j) & 1) as u8) << 4)) as i8 + bias;
        w[j + 16] = ((b >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4)) as i8 + bias;
    }
}

/// The layout of a 32-value block: its size, where its 32 values start, how they are stored.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    /// Bytes per block.
    pub(super) size: usize,
    /// Where its values start.
    pub(super) values: usize,
    /// Nibbles (with the fifth bits, when `high_bits`) plus this bias (Q4_0: −8, Q5_0: −16,
    /// Q4_1 and Q5_1: 0); `None`: one i8 per value (Q8_0).
    pub(super) nibble_bias: Option<i8>,
    /// Whether the block has an offset (`x = d·w + m`, `m` the f16 after `d`).
    pub(super) offset: bool,
    /// Where the 32-bit word of fifth bits starts (Q5_0, Q5_1: bit `j` is value `j`'s).
    pub(super) high_bits: Option<usize>,
}

/// The layout of `dtype`'s blocks, for the 32-value types the fused rows read.
pub(super) fn layout(dtype: DType) -> Option<Layout> {
    let (size, values, nibble_bias, offset, high_bits) = match dtype {
        DType::Q8_0 => (34, 2, None, false, None),
        DType::Q4_0 => (18, 2, Some(-8), false, None),
        DType::Q4_1 => (20, 4, Some(0), true, None),
        DType::Q5_0 => (22, 6, Some(-16), false, Some(2)),
        DType::Q5_1 => (24, 8, Some(0), true, Some(4)),
        _ => return None,
    };
    Some(Layout {
        size,
        values,
        nibble_bias,
        offset,
        high_bits,
    })
}

impl Layout {
    /// Block `b`'s word of fifth bits (0 for the types without them).
    #[inline(always)]
    pub(super) fn high_word(&self, bytes: &[u8], b: usize) -> u32 {
        match self.high_bits {
            Some(at) => {
                let at = b * self.size + at;
                u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
            }
            None => 0,
        }
    }
}

/// Rows per tile: one 32-bit lane each of a 512-bit register.
pub(super) const TILE_ROWS: usize = 16;

/// One token's activations: values, half-block scales, block sums.
pub(super) type Row<'a> = (&'a [i8], &'a [f32], &'a [f32]);

#[cfg(test)]
mod tests {
    /// The quantizer's rounding is `f32::round`'s over the range it sees (activations over
    /// their scale: at most 127 in magnitude), halves and their neighbours included.
    #[test]
    fn rounding_matches_f32_round_halves_away_from_zero() {
        let mut values = vec![
            0.0f32,
            -0.0,
            f32::NAN,
            0.49999997,
            -0.49999997,
            1e-30,
            -1e-30,
        ];
        for k in -140 * 1024..=140 * 1024 {
            values.push(k as f32 / 1024.0);
        }
        for k in -140..=140 {
            let half = k as f32 + 0.5;
            values.extend([half, half.next_up(), half.next_down(), -half]);
        }
        for y in values {
            assert_eq!(super::round_half_away(y), y.round() as i32, "{y:e}");
        }
    }

    /// Every f16 converts exactly as `half` converts it.
    #[test]
    fn f16_conversion_is_exact_for_every_value() {
        for bits in 0..=u16::MAX {
            let want = half::f16::from_bits(bits).to_f32();
            let got = super::f16_at(&bits.to_le_bytes(), 0);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{bits:#06x}: {got} vs {want}"
            );
        }
    }
}
