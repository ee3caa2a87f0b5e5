//! Tensor element types as stored on disk (and kept on the GPU): the GGML type ids, block
//! geometry and byte sizes. Dequantization to f32 lives here too, so that the CPU path is the
//! exact reference the GPU kernels are checked against.

use crate::error::{Error, Result};

pub mod kv;

/// A tensor's storage type. Quantized types pack `block_elements()` values into
/// `block_bytes()` bytes; a tensor's element count must be a multiple of the block size.
/// Variant names are the format's own (`Q4_K`, not `Q4K`).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (the upper half of an f32).
    BF16,
    /// 32 values: f16 scale `d`, 32 × i8; `x = d·q`.
    Q8_0,
    /// 32 values: f16 scale `d`, 16 bytes of 4-bit `q`; `x = d·(q − 8)`.
    Q4_0,
    /// 32 values: f16 scale `d`, f16 minimum `m`, 16 bytes of 4-bit `q`; `x = d·q + m`.
    Q4_1,
    /// 32 values: f16 scale `d`, 32 fifth bits, 16 bytes of low nibbles; `x = d·(q − 16)`.
    Q5_0,
    /// 32 values: f16 scale `d`, f16 minimum `m`, 32 fifth bits, 16 bytes of low nibbles;
    /// `x = d·q + m`.
    Q5_1,
    /// 256 values in 8 sub-blocks of 32 with 6-bit scales and minimums; 4-bit `q`.
    Q4_K,
    /// 256 values in 8 sub-blocks of 32 with 6-bit scales and minimums; 5-bit `q`.
    Q5_K,
    /// 256 values in 16 sub-blocks of 16 with 8-bit scales; 6-bit `q`.
    Q6_K,
}

impl DType {
    /// Every supported type.
    pub const ALL: [DType; 11] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ];

    /// The type for a GGML type id, or `None` when emberlm does not support it
    /// (see [`ggml_type_name`] for a name to put in the error).
    pub fn from_ggml(id: u32) -> Option<DType> {
        Some(match id {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::Q4_0,
            3 => DType::Q4_1,
            6 => DType::Q5_0,
            7 => DType::Q5_1,
            8 => DType::Q8_0,
            12 => DType::Q4_K,
            13 => DType::Q5_K,
            14 => DType::Q6_K,
            30 => DType::BF16,
            _ => return None,
        })
    }

    /// The GGML type id.
    pub fn ggml_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
            DType::BF16 => 30,
        }
    }

    /// The name used by GGUF tools and safetensors (`F32`, `Q4_K`, ...).
    pub fn name(self) -> &'static str {
        ggml_type_name(self.ggml_id())
    }

    /// Values per block (1 for float types).
    pub fn block_elements(self) -> u64 {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 => 32,
            DType::Q4_K | DType::Q5_K | DType::Q6_K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
        }
    }

    /// Bytes taken by `elements` values, or an error when `elements` is not a whole number of
    /// blocks or the size overflows. `what` names the tensor for the message.
    pub fn bytes_for(self, elements: u64, what: &str) -> Result<u64> {
        let block = self.block_elements();
        if !elements.is_multiple_of(block) {
            return Err(Error::invalid(
                "elements",
                format!(
                    "tensor `{what}` has {elements} values, not a multiple of the {} block size {block}",
                    self.name()
                ),
            ));
        }
        (elements / block)
            .checked_mul(self.block_bytes())
            .ok_or_else(|| {
                Error::invalid(
                    "elements",
                    format!("tensor `{what}`: byte size of {elements} values overflows"),
                )
            })
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A readable name for any GGML type id, supported or not (for error messages).
pub fn ggml_type_name(id: u32) -> &'static str {
    match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => "unknown",
    }
}

// ---------------------------------------------------------------------------------------------
// Dequantization
//
// Bit-exact with ggml's `dequantize_row_*` (and gguf-py's `gguf.quants.dequantize`): every value is
// computed in f32 with the same operations in the same order, so the GPU kernels can be checked
// against this code with `==`. In every formula below the product of a scale and a quant is exact
// in f32 (at most 24 significant bits), so only the final add or subtract rounds; a fused
// multiply-add on the GPU therefore gives the same bits. All multi-byte fields are little-endian.
// ---------------------------------------------------------------------------------------------

/// Dequantizes `n_elements` values of `dtype` stored in `bytes` (exactly
/// `dtype.bytes_for(n_elements)` bytes) into f32. `name` names the tensor in errors.
///
/// The byte length is checked before anything is allocated, so a hostile element count cannot
/// allocate more than a small multiple of `bytes.len()`.
pub fn dequantize(dtype: DType, bytes: &[u8], n_elements: u64, name: &str) -> Result<Vec<f32>> {
    check_len(dtype, bytes, n_elements, name)?;
    let n = usize::try_from(n_elements).map_err(|_| {
        Error::invalid(
            "n_elements",
            format!("tensor `{name}`: {n_elements} values do not fit in memory"),
        )
    })?;
    let mut out = vec![0.0; n];
    dequantize_into(dtype, bytes, &mut out, name)?;
    Ok(out)
}

/// Same as [`dequantize`], into a caller-provided slice of `out.len()` values.
pub fn dequantize_into(dtype: DType, bytes: &[u8], out: &mut [f32], name: &str) -> Result<()> {
    check_len(dtype, bytes, out.len() as u64, name)?;
    match dtype {
        DType::F32 => {
            bytemuck::cast_slice_mut::<f32, u8>(out).copy_from_slice(bytes);
            if cfg!(target_endian = "big") {
                out.iter_mut()
                    .for_each(|y| *y = f32::from_bits(u32::from_le(y.to_bits())));
            }
        }
        DType::F16 => {
            // half's slice conversion is vectorized (F16C, NEON) and, unlike a `to_f32` per
            // value, is fast in unoptimized test builds too. Exact, except that signalling NaNs
            // come out quiet (as with F16C in ggml; gguf-py's numpy keeps them signalling).
            use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
            let mut bits = [0u16; 256];
            for (b, y) in bytes.chunks(512).zip(out.chunks_mut(256)) {
                let bits = &mut bits[..y.len()];
                bytemuck::cast_slice_mut::<u16, u8>(bits).copy_from_slice(b);
                if cfg!(target_endian = "big") {
                    bits.iter_mut().for_each(|v| *v = u16::from_le(*v));
                }
                bits.reinterpret_cast::<half::f16>().convert_to_f32_slice(y);
            }
        }
        DType::BF16 => {
            // A plain shift, as ggml does: `half::bf16::to_f32` would also set the quiet bit of
            // signalling NaNs, and the GPU kernel will be a shift too.
            for (b, y) in bytes.chunks_exact(2).zip(out.iter_mut()) {
                *y = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
            }
        }
        DType::Q8_0 => for_each_block(bytes, out, q8_0_block),
        DType::Q4_0 => for_each_block(bytes, out, q4_0_block),
        DType::Q4_1 => for_each_block(bytes, out, q4_1_block),
        DType::Q5_0 => for_each_block(bytes, out, q5_0_block),
        DType::Q5_1 => for_each_block(bytes, out, q5_1_block),
        DType::Q4_K => for_each_block(bytes, out, q4_k_block),
        DType::Q5_K => for_each_block(bytes, out, q5_k_block),
        DType::Q6_K => for_each_block(bytes, out, q6_k_block),
    }
    Ok(())
}

/// Converts f32 values to `dtype` bytes for the float types: F32 as is, F16 and BF16 rounded to
/// nearest, ties to even (NaNs stay NaN). Quantized types are an error: emberlm does not quantize.
pub fn encode_float(dtype: DType, values: &[f32]) -> Result<Vec<u8>> {
    Ok(match dtype {
        DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        DType::Q8_0
        | DType::Q4_0
        | DType::Q4_1
        | DType::Q5_0
        | DType::Q5_1
        | DType::Q4_K
        | DType::Q5_K
        | DType::Q6_K => {
            return Err(Error::invalid(
                "dtype",
                format!("encode_float writes F32, F16 or BF16, not {dtype}"),
            ))
        }
    })
}

/// Errors unless `bytes` holds exactly `n_elements` values of `dtype`.
fn check_len(dtype: DType, bytes: &[u8], n_elements: u64, name: &str) -> Result<()> {
    let expected = dtype.bytes_for(n_elements, name)?;
    if bytes.len() as u64 != expected {
        return Err(Error::invalid(
            "bytes",
            format!(
                "tensor `{name}`: {n_elements} {dtype} values take {expected} bytes, got {}",
                bytes.len()
            ),
        ));
    }
    Ok(())
}

/// Runs `f` on each block of `B` bytes and its `N` outputs. The lengths were checked by the
/// caller; fixed-size arrays let the compiler drop the bounds checks inside `f`.
#[inline(always)]
fn for_each_block<const B: usize, const N: usize>(
    bytes: &[u8],
    out: &mut [f32],
    f: impl Fn(&[u8; B], &mut [f32; N]),
) {
    debug_assert_eq!(bytes.len() / B, out.len() / N);
    for (b, y) in bytes.chunks_exact(B).zip(out.chunks_exact_mut(N)) {
        let b: &[u8; B] = b.try_into().expect("chunks_exact yields B bytes");
        let y: &mut [f32; N] = y.try_into().expect("chunks_exact_mut yields N values");
        f(b, y);
    }
}

/// The f16 at `b[at..at + 2]`, widened to f32 (exact).
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Q8_0, 34 bytes for 32 values:
/// `[0..2]` d: f16 | `[2..34]` qs: 32 × i8.  `y[j] = qs[j] * d`.
fn q8_0_block(b: &[u8; 34], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..]) {
        *y = f32::from(q as i8) * d;
    }
}

/// Q4_0, 18 bytes for 32 values:
/// `[0..2]` d: f16 | `[2..18]` qs: 16 bytes. Byte `j`'s low nibble is value `j`, its high nibble
/// value `j + 16`.  `y = (q - 8) * d`.
fn q4_0_block(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let (lo, hi) = y.split_at_mut(16);
    for ((&q, lo), hi) in b[2..].iter().zip(lo).zip(hi) {
        *lo = f32::from(i16::from(q & 0x0F) - 8) * d;
        *hi = f32::from(i16::from(q >> 4) - 8) * d;
    }
}

/// Q4_1, 20 bytes for 32 values:
/// `[0..2]` d: f16 | `[2..4]` m: f16 | `[4..20]` qs: 16 bytes, nibbles as in Q4_0.
/// `y = d * q + m`.
fn q4_1_block(b: &[u8; 20], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let (lo, hi) = y.split_at_mut(16);
    for ((&q, lo), hi) in b[4..].iter().zip(lo).zip(hi) {
        *lo = d * f32::from(q & 0x0F) + m;
        *hi = d * f32::from(q >> 4) + m;
    }
}

/// The 5-bit values of a Q5_0/Q5_1 block: `qh` (32 bits, bit `j` the fifth bit of value `j`)
/// and 16 bytes whose byte `j` holds value `j` in its low nibble and value `j + 16` in its high.
#[inline(always)]
fn q5_values(qh: u32, qs: &[u8]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for (j, &b) in qs.iter().enumerate().take(16) {
        q[j] = (b & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (b >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

/// Q5_0, 22 bytes for 32 values:
/// `[0..2]` d: f16 | `[2..6]` qh: u32, the fifth bits | `[6..22]` qs: low nibbles as in Q4_0.
/// `y = (q - 16) * d`.
fn q5_0_block(b: &[u8; 22], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for (y, &q) in y.iter_mut().zip(&q5_values(qh, &b[6..])) {
        *y = f32::from(i16::from(q) - 16) * d;
    }
}

/// Q5_1, 24 bytes for 32 values:
/// `[0..2]` d: f16 | `[2..4]` m: f16 | `[4..8]` qh | `[8..24]` qs, as in Q5_0.
/// `y = d * q + m`.
fn q5_1_block(b: &[u8; 24], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for (y, &q) in y.iter_mut().zip(&q5_values(qh, &b[8..])) {
        *y = d * f32::from(q) + m;
    }
}

/// The 6-bit scale and minimum of sub-block `j` (0..8) of a Q4_K/Q5_K block, from its 12-byte
/// `scales` field (ggml's `get_scale_min_k4`). Bytes 0-3 hold the scales of sub-blocks 0-3 in
/// their low 6 bits, bytes 4-7 their minimums; sub-blocks 4-7 take their low 4 bits from the
/// nibbles of bytes 8-11 (scale low, minimum high) and their top 2 bits from the spare top bits
/// of bytes 0-3 (scales) and 4-7 (minimums).
#[inline(always)]
fn scale_min_k4(j: usize, s: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Sub-block scales and minimums of a Q4_K/Q5_K block as ggml computes them: `d * sc` and
/// `dmin * m`, each one f32 product.
#[inline(always)]
fn k4_scales(d: f32, dmin: f32, scales: &[u8; 12]) -> ([f32; 8], [f32; 8]) {
    let mut ds = [0.0; 8];
    let mut ms = [0.0; 8];
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, scales);
        ds[j] = d * f32::from(sc);
        ms[j] = dmin * f32::from(m);
    }
    (ds, ms)
}

/// Q4_K, 144 bytes for 256 values in 8 sub-blocks of 32:
/// `[0..2]` d: f16 | `[2..4]` dmin: f16 | `[4..16]` scales: 12 bytes, 6-bit scale and minimum per
/// sub-block (see [`scale_min_k4`]) | `[16..144]` qs: 128 bytes. Each 32 bytes of `qs` hold 64
/// values: the low nibbles are sub-block `2k`, the high nibbles sub-block `2k + 1`.
/// `y = (d * sc) * q - (dmin * m)`.
fn q4_k_block(b: &[u8; 144], y: &mut [f32; 256]) {
    let scales: &[u8; 12] = b[4..16].try_into().expect("12 bytes");
    let (ds, ms) = k4_scales(f16_at(b, 0), f16_at(b, 2), scales);
    for (k, (qs, y)) in b[16..]
        .chunks_exact(32)
        .zip(y.chunks_exact_mut(64))
        .enumerate()
    {
        let (d1, m1, d2, m2) = (ds[2 * k], ms[2 * k], ds[2 * k + 1], ms[2 * k + 1]);
        let (lo, hi) = y.split_at_mut(32);
        for ((&q, lo), hi) in qs.iter().zip(lo).zip(hi) {
            *lo = d1 * f32::from(q & 0x0F) - m1;
            *hi = d2 * f32::from(q >> 4) - m2;
        }
    }
}

/// Q5_K, 176 bytes for 256 values in 8 sub-blocks of 32:
/// `[0..2]` d: f16 | `[2..4]` dmin: f16 | `[4..16]` scales: 12 bytes as in Q4_K |
/// `[16..48]` qh: 32 bytes | `[48..176]` qs: 128 bytes, nibbles as in Q4_K. The 5th bit of value
/// `l` (0..32) of sub-block `s` is bit `s` of `qh[l]`. `y = (d * sc) * q - (dmin * m)`.
fn q5_k_block(b: &[u8; 176], y: &mut [f32; 256]) {
    let scales: &[u8; 12] = b[4..16].try_into().expect("12 bytes");
    let (ds, ms) = k4_scales(f16_at(b, 0), f16_at(b, 2), scales);
    let qh = &b[16..48];
    for (k, (qs, y)) in b[48..]
        .chunks_exact(32)
        .zip(y.chunks_exact_mut(64))
        .enumerate()
    {
        let (d1, m1, d2, m2) = (ds[2 * k], ms[2 * k], ds[2 * k + 1], ms[2 * k + 1]);
        let (lo, hi) = y.split_at_mut(32);
        for (((&q, &h), lo), hi) in qs.iter().zip(qh).zip(lo).zip(hi) {
            let q_lo = (q & 0x0F) | (((h >> (2 * k)) & 1) << 4);
            let q_hi = (q >> 4) | (((h >> (2 * k + 1)) & 1) << 4);
            *lo = d1 * f32::from(q_lo) - m1;
            *hi = d2 * f32::from(q_hi) - m2;
        }
    }
}

/// Q6_K, 210 bytes for 256 values in 16 sub-blocks of 16:
/// `[0..128]` ql: low 4 bits | `[128..192]` qh: high 2 bits | `[192..208]` scales: 16 × i8 |
/// `[208..210]` d: f16. Each half `n` (values `128n..128n+128`) uses `ql[64n..64n+64]`,
/// `qh[32n..32n+32]` and `scales[8n..8n+8]`; for `l` in 0..32 its four values are
/// `l`: low nibble of `ql[l]`, bits 0-1 of `qh[l]`;
/// `l + 32`: low nibble of `ql[l + 32]`, bits 2-3;
/// `l + 64`: high nibble of `ql[l]`, bits 4-5;
/// `l + 96`: high nibble of `ql[l + 32]`, bits 6-7.
/// `y = (d * scale) * (q - 32)`, the scale of value `i` of the half being `scales[8n + i / 16]`.
fn q6_k_block(b: &[u8; 210], y: &mut [f32; 256]) {
    let d = f16_at(b, 208);
    let mut ds = [0.0f32; 16];
    for (ds, &sc) in ds.iter_mut().zip(&b[192..208]) {
        *ds = d * f32::from(sc as i8);
    }
    for (n, y) in y.chunks_exact_mut(128).enumerate() {
        let ql = &b[64 * n..64 * n + 64];
        let qh = &b[128 + 32 * n..128 + 32 * n + 32];
        let ds = &ds[8 * n..8 * n + 8];
        for l in 0..32 {
            let is = l / 16;
            let h = qh[l];
            let q1 = i16::from((ql[l] & 0x0F) | ((h & 3) << 4)) - 32;
            let q2 = i16::from((ql[l + 32] & 0x0F) | (((h >> 2) & 3) << 4)) - 32;
            let q3 = i16::from((ql[l] >> 4) | (((h >> 4) & 3) << 4)) - 32;
            let q4 = i16::from((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) - 32;
            y[l] = ds[is] * f32::from(q1);
            y[l + 32] = ds[is + 2] * f32::from(q2);
            y[l + 64] = ds[is + 4] * f32::from(q3);
            y[l + 96] = ds[is + 6] * f32::from(q4);
        }
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_q5;
