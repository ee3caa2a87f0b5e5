//! The fused row dot of the K-quants (Q4_K, Q5_K, Q6_K: 256-value super-blocks with a scale
//! per 32 or 16 values) with 8-bit activations: each super-block's values made in AVX2
//! registers straight from its bytes, as [`super::fused`] does for the 32-value types, instead
//! of unpacking the row into a copy first. A decode step of a Q4_K_M model (Q4_K and Q6_K
//! matrices) reads each row once, not three times.
//!
//! The bits are those of unpacking ([`super::quant::UnpackedRow`]) and the common dot: the
//! same values, the same half-block scales (`d·sc` in f32), the same exact integer sums per
//! half-block, the same f32 products and additions in the same order, and the same offsets'
//! part. Only x86_64 with AVX2 has this path; elsewhere [`available`] is false and the caller
//! unpacks.

#[cfg(target_arch = "x86_64")]
use super::quant::f16_at;
use super::quant::Q8Rows;
use crate::dtype::DType;

/// Values per super-block.
const QK_K: usize = 256;

/// A super-block's bytes.
fn block_size(dtype: DType) -> Option<usize> {
    match dtype {
        DType::Q4_K => Some(144),
        DType::Q5_K => Some(176),
        DType::Q6_K => Some(210),
        _ => None,
    }
}

/// Whether [`row_dot`] computes rows of `dtype` on this machine.
pub fn available(dtype: DType) -> bool {
    block_size(dtype).is_some() && simd_available()
}

#[cfg(target_arch = "x86_64")]
fn simd_available() -> bool {
    super::dot::has_avx2()
}

#[cfg(not(target_arch = "x86_64"))]
fn simd_available() -> bool {
    false
}

/// One token's activations: values, half-block scales, block sums.
type Row<'a> = (&'a [i8], &'a [f32], &'a [f32]);

/// `Σ x·a` of the weight row `bytes` (whole super-blocks of `dtype`) with one token's
/// activations, as the unpacked row's `dot` gives it; `offsets` is room for one value per 32.
/// `None` when [`available`] is false. The one-token reference of the tests.
#[cfg(test)]
pub fn row_dot(
    dtype: DType,
    bytes: &[u8],
    q: &[i8],
    d: &[f32],
    s: &[f32],
    offsets: &mut Vec<f32>,
) -> Option<f32> {
    if !available(dtype) {
        return None;
    }
    // no exact sums: the AVX2 path, the reference the VNNI one is held to
    Some(dots::<1>(dtype, bytes, [(q, d, s)], None, offsets)[0])
}

/// [`row_dot`] of one weight row with every token of `q8` (`out[t]` for `t < out.len()`), each
/// super-block's values made once for up to four tokens; the bits of `row_dot` for each.
/// `false` (and `out` untouched) when [`available`] is false.
pub fn row_dot_tokens(
    dtype: DType,
    bytes: &[u8],
    q8: &Q8Rows,
    out: &mut [f32],
    offsets: &mut Vec<f32>,
) -> bool {
    if !available(dtype) {
        return false;
    }
    for (g, out) in out.chunks_mut(4).enumerate() {
        let t = |k: usize| 4 * g + k.min(out.len() - 1);
        let (row, sum) = (|k: usize| q8.row(t(k)), |k: usize| q8.isums(t(k)));
        match out.len() {
            1 => out.copy_from_slice(&dots::<1>(dtype, bytes, [row(0)], Some([sum(0)]), offsets)),
            2 => out.copy_from_slice(&dots::<2>(
                dtype,
                bytes,
                [row(0), row(1)],
                Some([sum(0), sum(1)]),
                offsets,
            )),
            3 => out.copy_from_slice(&dots::<3>(
                dtype,
                bytes,
                [row(0), row(1), row(2)],
                Some([sum(0), sum(1), sum(2)]),
                offsets,
            )),
            _ => out.copy_from_slice(&dots::<4>(
                dtype,
                bytes,
                [row(0), row(1), row(2), row(3)],
                Some([sum(0), sum(1), sum(2), sum(3)]),
                offsets,
            )),
        }
    }
    true
}

/// The row's offsets (`−dmin·m` per 32 values; Q4_K and Q5_K only, none for Q6_K), for the
/// AVX-512 path (the AVX2 one makes them as it goes).
#[cfg(target_arch = "x86_64")]
fn fill_offsets(dtype: DType, bytes: &[u8], offsets: &mut Vec<f32>) {
    offsets.clear();
    let Some(size) = block_size(dtype).filter(|_| dtype != DType::Q6_K) else {
        return;
    };
    // sized once and written in eights (no per-value push): the same products
    offsets.resize(bytes.len() / size * 8, 0.0);
    for (b, out) in bytes.chunks_exact(size).zip(offsets.chunks_exact_mut(8)) {
        let dmin = f16_at(b, 2);
        let (_, mins) = k_scales_and_mins(&b[4..16]);
        for (o, &m) in out.iter_mut().zip(&mins) {
            *o = -(dmin * f32::from(m));
        }
    }
}

/// Each token's dot product: the accumulators, summed as the common dot sums them, plus the
/// offsets' part (Q4_K and Q5_K; `offsets` is room for them, which the accumulation fills).
fn dots<const N: usize>(
    dtype: DType,
    bytes: &[u8],
    rows: [Row<'_>; N],
    isums: Option<[&[i32]; N]>,
    offsets: &mut Vec<f32>,
) -> [f32; N] {
    let size = block_size(dtype).unwrap_or(usize::MAX);
    let blocks = bytes.len() / size;
    let cols = blocks * QK_K;
    for (q, d, s) in &rows {
        assert!(q.len() >= cols && d.len() >= cols / 16 && s.len() >= cols / 32);
    }
    for isum in isums.iter().flatten() {
        assert!(isum.len() >= cols / 16);
    }
    let accs = accumulate(dtype, size, &bytes[..blocks * size], rows, isums, offsets);
    let has_offset = matches!(dtype, DType::Q4_K | DType::Q5_K);
    std::array::from_fn(|t| {
        let acc = accs[t];
        let dot = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        match has_offset {
            true => dot + super::dot::dot_f32(&offsets[..cols / 32], &rows[t].2[..cols / 32]),
            false => dot,
        }
    })
}

/// The eight 6-bit scales and mins of a Q4_K/Q5_K super-block (its 12 scale bytes), as the
/// unpacked row reads them, four at a time in 32-bit words: scales and mins 0–3 are the low 6
/// bits of bytes 0–3 and 4–7; 4–7 take their low 4 bits from bytes 8–11 (low and high
/// nibbles) and their top 2 from the top bits of bytes 0–3 and 4–7.
#[cfg(any(target_arch = "x86_64", test))]
pub(super) fn k_scales_and_mins(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a, b, c) = (word(0), word(1), word(2));
    let high = |w: u32| ((w >> 6) & LOW2) << 4;
    let bytes = |lo: u32, hi: u32| {
        let (lo, hi) = (lo.to_le_bytes(), hi.to_le_bytes());
        [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
    };
    (
        bytes(a & LOW6, (c & LOW4) | high(a)),
        bytes(b & LOW6, ((c >> 4) & LOW4) | high(b)),
    )
}

/// The scale of each of a super-block's 16 half-blocks (`d·sc` in f32, the products the
/// unpacked row makes), eight to a register (`[j]` holds half-blocks `8j` to `8j + 7`), and
/// for Q4_K and Q5_K its eight offsets `−dmin·m` (zero for Q6_K).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn block_scales(
    dtype: DType,
    b: &[u8],
) -> ([std::arch::x86_64::__m256; 2], std::arch::x86_64::__m256) {
    use std::arch::x86_64::*;

    match dtype {
        DType::Q6_K => {
            let d = _mm256_set1_ps(f16_at(b, 208));
            let sc = |at: usize| {
                let mut v = [0u8; 8];
                v.copy_from_slice(&b[at..at + 8]);
                let v = _mm_cvtsi64_si128(i64::from_le_bytes(v));
                _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)))
            };
            ([sc(192), sc(200)], _mm256_setzero_ps())
        }
        _ => {
            let (sc, mins) = k_scales_and_mins(&b[4..16]);
            let wide = |v: [u8; 8]| {
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(
                    v,
                ))))
            };
            // −(dmin·m): the product's sign flipped, as the scalar negation flips it
            let offset = _mm256_xor_ps(
                _mm256_mul_ps(_mm256_set1_ps(f16_at(b, 2)), wide(mins)),
                _mm256_set1_ps(-0.0),
            );
            let v = _mm256_mul_ps(_mm256_set1_ps(f16_at(b, 0)), wide(sc));
            // each scale twice, one per half-block: [s0 s0 s1 s1 | s4 s4 s5 s5] and
            // [s2 s2 s3 s3 | s6 s6 s7 s7], then halves 0–3 and 4–7 in order
            let (a, c) = (_mm256_unpacklo_ps(v, v), _mm256_unpackhi_ps(v, v));
            (
                [
                    _mm256_permute2f128_ps::<0x20>(a, c),
                    _mm256_permute2f128_ps::<0x31>(a, c),
                ],
                offset,
            )
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn accumulate<const N: usize>(
    _: DType,
    _: usize,
    _: &[u8],
    _: [Row<'_>; N],
    _: Option<[&[i32]; N]>,
    _: &mut Vec<f32>,
) -> [[f32; 4]; N] {
    // never called: `available` is false here
    [[0.0; 4]; N]
}

/// The four accumulators of each token after every super-block, and the row's offsets in
/// `offsets` (Q4_K, Q5_K): with AVX-512 VNNI for two tokens or more where the CPU has it and
/// the exact half-block sums are given, else with AVX2 (checked by the callers through
/// [`available`]); the same bits either way.
#[cfg(target_arch = "x86_64")]
fn accumulate<const N: usize>(
    dtype: DType,
    size: usize,
    bytes: &[u8],
    rows: [Row<'_>; N],
    isums: Option<[&[i32]; N]>,
    offsets: &mut Vec<f32>,
) -> [[f32; 4]; N] {
    assert!(bytes.len().is_multiple_of(size));
    match isums {
        // one token (a decode step) measured slower on VNNI for these types (zmm work per
        // super-block that only one token shares): AVX2 there
        Some(isums) if N > 1 && super::dot::has_vnni() => {
            fill_offsets(dtype, bytes, offsets);
            // SAFETY: `has_vnni` checked the CPU; `dots` checked that the activations and
            // their sums cover the row.
            unsafe { accumulate_vnni(dtype, size, bytes, rows, isums) }
        }
        _ => {
            offsets.clear();
            if dtype != DType::Q6_K {
                offsets.resize(bytes.len() / size * 8, 0.0);
            }
            // SAFETY: `available` checked AVX2; `dots` checked that the activations cover
            // the row; `offsets` has 8 values per super-block (Q4_K, Q5_K).
            unsafe { accumulate_avx2(dtype, size, bytes, rows, offsets) }
        }
    }
}

/// [`block_scales`] as one register: `d · sc` of each half-block, the same f32 products.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn half_block_scales_512(dtype: DType, b: &[u8]) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;

    let (d, sc) = match dtype {
        DType::Q6_K => {
            let mut sc = [0u8; 16];
            sc.copy_from_slice(&b[192..208]);
            // SAFETY: a 16-byte load of a 16-byte array.
            let v = unsafe { _mm_loadu_si128(sc.as_ptr().cast()) };
            (f16_at(b, 208), _mm512_cvtepi8_epi32(v))
        }
        _ => {
            let (sc, _) = k_scales_and_mins(&b[4..16]);
            let v = _mm_cvtsi64_si128(i64::from_le_bytes(sc));
            // each scale twice, one per half-block
            (f16_at(b, 0), _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(v, v)))
        }
    };
    _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sc))
}

/// [`accumulate_avx2`] on AVX-512 VNNI: a super-block's four pairs as 64 unsigned bytes each
/// (Q6_K's values plus 32, the sums then less `32·Σ q`), one `vpdpbusd` per pair and token,
/// the sixteen half-block sums scaled and added pair by pair as AVX2 adds them.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VNNI, AVX2 and F16C; the activations and sums cover the row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn accumulate_vnni<const N: usize>(
    dtype: DType,
    size: usize,
    bytes: &[u8],
    rows: [Row<'_>; N],
    isums: [&[i32]; N],
) -> [[f32; 4]; N] {
    use std::arch::x86_64::*;

    let signed = dtype == DType::Q6_K;
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm_setzero_ps(); N];
    for (i, b) in bytes.chunks_exact(size).enumerate() {
        // the half-block scales made in a register (a 64-byte load of scales just stored one
        // by one would wait for the stores)
        let sc = half_block_scales_512(dtype, b);
        // SAFETY: every load reads 32 bytes inside the super-block `b` (of `size` bytes).
        let pairs = unsafe { pair_values(dtype, b) };
        let w: [__m512i; 4] = std::array::from_fn(|k| {
            let (w01, w23) = pairs[k];
            let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(w01), w23);
            match signed {
                true => _mm512_add_epi8(both, _mm512_set1_epi8(32)),
                false => both,
            }
        });
        let h0 = 16 * i;
        for (acc, ((q, d, _), isum)) in acc.iter_mut().zip(rows.iter().zip(&isums)) {
            // SAFETY: 64-byte loads of the super-block's activations (256 values from 256·i),
            // their 16 scales and 16 sums, inside `q`, `d` and `isum` (checked by `dots`).
            let (dots, dv, iv) = unsafe {
                let qp = q.as_ptr().add(256 * i);
                (
                    std::array::from_fn(|k| {
                        _mm512_dpbusd_epi32(zero, w[k], _mm512_loadu_si512(qp.add(64 * k).cast()))
                    }),
                    _mm512_loadu_ps(d.as_ptr().add(h0)),
                    _mm512_loadu_si512(isum.as_ptr().add(h0).cast()),
                )
            };
            let sums = super::fused_vnni::half_block_sums(dots);
            let sums = match signed {
                true => _mm512_sub_epi32(sums, _mm512_slli_epi32::<5>(iv)),
                false => sums,
            };
            *acc = super::fused_vnni::add_scaled(*acc, sums, _mm512_mul_ps(sc, dv));
        }
    }
    let mut out = [[0.0f32; 4]; N];
    for (o, a) in out.iter_mut().zip(acc) {
        // SAFETY: a 16-byte store into a 16-byte array.
        unsafe { _mm_storeu_ps(o.as_mut_ptr(), a) };
    }
    out
}

/// The AVX2 accumulation, one pass over the row: each super-block's scales and offsets made
/// in registers (its offsets stored into `offsets`), then per token two pairs (128 values,
/// eight half-blocks) at a time — the exact half-block sums by `vpmaddubsw`/`vpmaddwd` and
/// three `vphaddd`s, put in order by one `vpermd`, converted, scaled and added to the
/// accumulators pair by pair, the unpacked row's products and additions in its order.
///
/// # Safety
/// The CPU has AVX2; the activations cover the row; `offsets` holds 8 values per super-block
/// for Q4_K and Q5_K.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn accumulate_avx2<const N: usize>(
    dtype: DType,
    size: usize,
    bytes: &[u8],
    rows: [Row<'_>; N],
    offsets: &mut [f32],
) -> [[f32; 4]; N] {
    use std::arch::x86_64::*;

    let signed = dtype == DType::Q6_K;
    let ones = _mm256_set1_epi16(1);
    // [h0 h2 h0' h2' | h1 h3 h1' h3'] to [h0 h1 h2 h3 | h0' h1' h2' h3']
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut acc = [_mm_setzero_ps(); N];
    for (i, b) in bytes.chunks_exact(size).enumerate() {
        let (scales, offset) = block_scales(dtype, b);
        if !signed {
            assert!(offsets.len() >= 8 * i + 8);
            // SAFETY: a 32-byte store inside `offsets` (asserted).
            unsafe { _mm256_storeu_ps(offsets.as_mut_ptr().add(8 * i), offset) };
        }
        // SAFETY: every load reads 32 bytes inside the super-block `b` (of `size` bytes).
        let pairs = unsafe { pair_values(dtype, b) };
        let abs = pairs.map(|(w01, w23)| match signed {
            true => (_mm256_abs_epi8(w01), _mm256_abs_epi8(w23)),
            false => (w01, w23),
        });
        for (acc, (q, d, _)) in acc.iter_mut().zip(&rows) {
            // two pairs at a time: 128 values, eight half-blocks
            for (two, &sc) in scales.iter().enumerate() {
                // each pair's four sums of four values per half-block, halved by `vphaddd`
                let t: [__m256i; 2] = std::array::from_fn(|j| {
                    let k = 2 * two + j;
                    let ((w01, w23), (a01, a23)) = (pairs[k], abs[k]);
                    // the pair's 64 values start at value 64·p
                    let p = 4 * i + k;
                    // SAFETY: 32-byte loads of the pair's activations, inside `q` (checked).
                    let (q01, q23) = unsafe {
                        (
                            _mm256_loadu_si256(q.as_ptr().add(64 * p).cast()),
                            _mm256_loadu_si256(q.as_ptr().add(64 * p + 32).cast()),
                        )
                    };
                    let (m01, m23) = match signed {
                        true => (
                            _mm256_maddubs_epi16(a01, _mm256_sign_epi8(q01, w01)),
                            _mm256_maddubs_epi16(a23, _mm256_sign_epi8(q23, w23)),
                        ),
                        false => (
                            _mm256_maddubs_epi16(w01, q01),
                            _mm256_maddubs_epi16(w23, q23),
                        ),
                    };
                    _mm256_hadd_epi32(_mm256_madd_epi16(m01, ones), _mm256_madd_epi16(m23, ones))
                });
                // the eight half-blocks' exact sums, in order
                let sums = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(t[0], t[1]), order);
                // SAFETY: a 32-byte load of the eight half-blocks' activation scales (from
                // 16·i + 8·two), inside `d` (checked).
                let dv = unsafe { _mm256_loadu_ps(d.as_ptr().add(16 * i + 8 * two)) };
                // each half-block's `d·sc` times its activations' scale, times its sum: the
                // products the unpacked row's dot makes, added pair by pair as it adds them
                let prod = _mm256_mul_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(sc, dv));
                *acc = _mm_add_ps(*acc, _mm256_castps256_ps128(prod));
                *acc = _mm_add_ps(*acc, _mm256_extractf128_ps::<1>(prod));
            }
        }
    }
    let mut out = [[0.0f32; 4]; N];
    for (o, a) in out.iter_mut().zip(acc) {
        // SAFETY: a 16-byte store into a 16-byte array.
        unsafe { _mm_storeu_ps(o.as_mut_ptr(), a) };
    }
    out
}

/// A super-block's 256 values as four pairs of registers of 32 (values 64·k to 64·k + 63),
/// in the unpacked row's order.
///
/// # Safety
/// The CPU has AVX2 and `b` holds one whole super-block of `dtype`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn pair_values(
    dtype: DType,
    b: &[u8],
) -> [(std::arch::x86_64::__m256i, std::arch::x86_64::__m256i); 4] {
    use std::arch::x86_64::*;

    let load = |at: usize| {
        assert!(at + 32 <= b.len());
        // SAFETY: 32 bytes inside `b` (asserted).
        unsafe { _mm256_loadu_si256(b.as_ptr().add(at).cast()) }
    };
    let m4 = _mm256_set1_epi8(0x0F);
    let lo = |v: __m256i| _mm256_and_si256(v, m4);
    let hi = |v: __m256i| _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    match dtype {
        DType::Q6_K => {
            let m2 = _mm256_set1_epi8(3);
            let c32 = _mm256_set1_epi8(32);
            // two high bits at bit `shift` of each qh byte, moved to bits 4 and 5
            let high = |qh: __m256i, shift: i32| {
                let bits = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(shift)), m2);
                _mm256_slli_epi16(bits, 4)
            };
            let value =
                |nibbles: __m256i, h: __m256i| _mm256_sub_epi8(_mm256_or_si256(nibbles, h), c32);
            let half = |n: usize| {
                let (ql_a, ql_b, qh) = (load(64 * n), load(64 * n + 32), load(128 + 32 * n));
                [
                    (value(lo(ql_a), high(qh, 0)), value(lo(ql_b), high(qh, 2))),
                    (value(hi(ql_a), high(qh, 4)), value(hi(ql_b), high(qh, 6))),
                ]
            };
            let ([p0, p1], [p2, p3]) = (half(0), half(1));
            [p0, p1, p2, p3]
        }
        DType::Q5_K => {
            let one = _mm256_set1_epi8(1);
            let qh = load(16);
            let bit = |shift: i32| {
                let b = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(shift)), one);
                _mm256_slli_epi16(b, 4)
            };
            std::array::from_fn(|k| {
                let v = load(48 + 32 * k);
                let s = 2 * k as i32;
                (
                    _mm256_or_si256(lo(v), bit(s)),
                    _mm256_or_si256(hi(v), bit(s + 1)),
                )
            })
        }
        _ => std::array::from_fn(|k| {
            let v = load(16 + 32 * k);
            (lo(v), hi(v))
        }),
    }
}

#[cfg(test)]
#[path = "fused_k_tests.rs"]
pub(crate) mod tests;
