//! The integer dot product at the heart of every quantized matrix product, with SIMD where the
//! target has it (SSE2 on x86_64, which every x86_64 CPU has; SIMD128 in WebAssembly when the
//! module is built with `+simd128`) and a scalar loop elsewhere.
//!
//! Every implementation computes the same thing in the same order, so a model gives the same
//! bits natively and in the browser: for half-block `h` (16 values) the exact integer sum
//! `S_h = Σ w·q`, then `acc[h mod 4] += f32(S_h) · (scale_h · d_h)` in f32 (no fused
//! multiply-add), and finally `(acc₀ + acc₁) + (acc₂ + acc₃)`.

/// Values per half-block.
const H: usize = 16;

/// `Σ a·b` in f32 with eight partial sums (so that the compiler can vectorize it).
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ar.iter().zip(br).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// `(acc₀ + acc₁) + (acc₂ + acc₃)` of `Σ_h f32(S_h) · (scale_h · d_h)` over the half-blocks of
/// `w` and `q` (equal lengths, a multiple of 32), `scale` and `d` one per half-block.
#[inline]
pub fn scaled_dot(w: &[i8], q: &[i8], scale: &[f32], d: &[f32]) -> f32 {
    let groups = w.len() / H;
    debug_assert!(q.len() >= w.len() && scale.len() >= groups && d.len() >= groups);
    let whole = groups / 4 * 4;
    let mut acc = simd_groups(w, q, scale, d, whole);
    for h in whole..groups {
        let s = int_dot16(&w[h * H..][..H], &q[h * H..][..H]);
        acc[h % 4] += s as f32 * (scale[h] * d[h]);
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}

/// `scale_h · d_h` of the four half-blocks from `h` on (one f32 product each).
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    all(target_arch = "wasm32", target_feature = "simd128")
))]
#[inline(always)]
fn group_scales(scale: &[f32], d: &[f32], h: usize) -> [f32; 4] {
    std::array::from_fn(|k| scale[h + k] * d[h + k])
}

/// `Σ w·q` over 16 values, exact.
#[inline(always)]
fn int_dot16(w: &[i8], q: &[i8]) -> i32 {
    w.iter()
        .zip(q)
        .take(H)
        .map(|(&a, &b)| i32::from(a) * i32::from(b))
        .sum()
}

/// The accumulators after the first `groups` half-blocks (a multiple of 4), scalar.
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    all(target_arch = "wasm32", target_feature = "simd128")
)))]
#[inline]
fn simd_groups(w: &[i8], q: &[i8], scale: &[f32], d: &[f32], groups: usize) -> [f32; 4] {
    let mut acc = [0.0f32; 4];
    for h in 0..groups {
        let s = int_dot16(&w[h * H..][..H], &q[h * H..][..H]);
        acc[h % 4] += s as f32 * (scale[h] * d[h]);
    }
    acc
}

/// The instruction set the integer dot product runs on here: `avx512vnni`, `avx2`, `sse2`,
/// `neon`, `simd128`, `simd128+relaxed` (a WebAssembly build whose tiles use relaxed SIMD) or
/// `scalar` (part of what a measured backend choice depends on).
pub fn instruction_set() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if has_vnni() {
            "avx512vnni"
        } else if has_avx2() {
            "avx2"
        } else {
            "sse2"
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        "neon"
    }
    #[cfg(all(
        target_arch = "wasm32",
        target_feature = "simd128",
        not(target_feature = "relaxed-simd")
    ))]
    {
        "simd128"
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
    {
        "simd128+relaxed"
    }
    #[cfg(not(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        all(target_arch = "wasm32", target_feature = "simd128")
    )))]
    {
        "scalar"
    }
}

/// Whether the 32-value types' rows run on AVX-512 VNNI (`vpdpbusd` over 64 bytes): the CPU
/// has AVX-512 F, BW and VNNI (and AVX2 with F16C, which every such CPU has), and
/// `EMBERLM_CPU_ISA` does not ask for `avx2` (to compare the two paths on one machine). Asked
/// once. The results are the same bits either way.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_vnni() -> bool {
    static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VNNI.get_or_init(|| {
        let asked_avx2 =
            std::env::var("EMBERLM_CPU_ISA").is_ok_and(|v| v.trim().eq_ignore_ascii_case("avx2"));
        !asked_avx2
            && has_avx2()
            && std::arch::is_x86_feature_detected!("f16c")
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    })
}

/// Whether this x86_64 CPU has AVX2 and F16C (asked once): what the AVX2 tiles need.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2_f16c() -> bool {
    static AVX2_F16C: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX2_F16C.get_or_init(|| has_avx2() && std::arch::is_x86_feature_detected!("f16c"))
}

/// Whether this x86_64 CPU has AVX2 (asked once).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2() -> bool {
    static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX2.get_or_init(|| std::arch::is_x86_feature_detected!("avx2"))
}

/// The accumulators after the first `groups` half-blocks (a multiple of 4): AVX2 where the CPU
/// has it, SSE2 (the x86_64 baseline) otherwise.
#[cfg(target_arch = "x86_64")]
#[inline]
fn simd_groups(w: &[i8], q: &[i8], scale: &[f32], d: &[f32], groups: usize) -> [f32; 4] {
    assert!(w.len() >= groups * H && q.len() >= groups * H);
    assert!(scale.len() >= groups && d.len() >= groups);
    if has_avx2() {
        // SAFETY: the CPU has AVX2 (checked above); the lengths were checked.
        unsafe { groups_avx2(w, q, scale, d, groups) }
    } else {
        groups_sse2(w, q, scale, d, groups)
    }
}

/// [`simd_groups`] with AVX2, two half-blocks per 32-byte load, their sums by
/// [`half_block_sums_avx2`]. The caller checked the lengths and the CPU.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn groups_avx2(w: &[i8], q: &[i8], scale: &[f32], d: &[f32], groups: usize) -> [f32; 4] {
    use std::arch::x86_64::*;

    let mut acc = _mm_setzero_ps();
    let mut h = 0;
    while h + 4 <= groups {
        // SAFETY: 32-byte loads at `h·16` and `(h + 2)·16` with `h + 4 ≤ groups`, inside both
        // slices.
        let (w01, q01, w23, q23) = unsafe {
            (
                _mm256_loadu_si256(w.as_ptr().add(h * H).cast()),
                _mm256_loadu_si256(q.as_ptr().add(h * H).cast()),
                _mm256_loadu_si256(w.as_ptr().add((h + 2) * H).cast()),
                _mm256_loadu_si256(q.as_ptr().add((h + 2) * H).cast()),
            )
        };
        let sums = half_block_sums_avx2(w01, q01, w23, q23);
        let [c0, c1, c2, c3] = group_scales(scale, d, h);
        let c = _mm_setr_ps(c0, c1, c2, c3);
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(sums), c));
        h += 4;
    }
    let mut out = [0.0f32; 4];
    // SAFETY: a 16-byte store into a 16-byte array.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), acc) };
    out
}

/// The exact sums `Σ w·q` of four half-blocks, as an i32 vector: `w01`/`q01` hold half-blocks
/// 0 and 1 (16 values each), `w23`/`q23` half-blocks 2 and 3. `|w|·sign(q, w)` summed in pairs
/// by `vpmaddubsw` (at most 2·128·127, which fits i16), in fours by `vpmaddwd`, then across
/// lanes by two `vphaddd`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn half_block_sums_avx2(
    w01: std::arch::x86_64::__m256i,
    q01: std::arch::x86_64::__m256i,
    w23: std::arch::x86_64::__m256i,
    q23: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m128i {
    use std::arch::x86_64::*;

    half_block_sums_abs_avx2(
        _mm256_abs_epi8(w01),
        w01,
        q01,
        _mm256_abs_epi8(w23),
        w23,
        q23,
    )
}

/// [`half_block_sums_avx2`] with `|w|` given (`a01 = |w01|`, `a23 = |w23|`): a row that meets
/// several tokens takes its absolute values once.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn half_block_sums_abs_avx2(
    a01: std::arch::x86_64::__m256i,
    w01: std::arch::x86_64::__m256i,
    q01: std::arch::x86_64::__m256i,
    a23: std::arch::x86_64::__m256i,
    w23: std::arch::x86_64::__m256i,
    q23: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m128i {
    use std::arch::x86_64::*;

    sums_of_pairs_avx2(
        _mm256_maddubs_epi16(a01, _mm256_sign_epi8(q01, w01)),
        _mm256_maddubs_epi16(a23, _mm256_sign_epi8(q23, w23)),
    )
}

/// [`half_block_sums_avx2`] for weights that are all in `0..=15` (Q4_1's nibbles): `vpmaddubsw`
/// takes them as they are, with no absolute values or signs (the same exact sums).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn half_block_sums_unsigned_avx2(
    w01: std::arch::x86_64::__m256i,
    q01: std::arch::x86_64::__m256i,
    w23: std::arch::x86_64::__m256i,
    q23: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m128i {
    use std::arch::x86_64::*;

    sums_of_pairs_avx2(
        _mm256_maddubs_epi16(w01, q01),
        _mm256_maddubs_epi16(w23, q23),
    )
}

/// The four half-block sums from `vpmaddubsw`'s pair sums of half-blocks 0 and 1 (`m01`) and
/// 2 and 3 (`m23`): in fours by `vpmaddwd`, then across lanes by two `vphaddd`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn sums_of_pairs_avx2(
    m01: std::arch::x86_64::__m256i,
    m23: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m128i {
    use std::arch::x86_64::*;

    let ones = _mm256_set1_epi16(1);
    let p01 = _mm256_madd_epi16(m01, ones);
    let p23 = _mm256_madd_epi16(m23, ones);
    // per 128-bit lane: [g0 g0 g2 g2 | g1 g1 g3 g3], then [g0 g2 · · | g1 g3 · ·]
    let t = _mm256_hadd_epi32(p01, p23);
    let t = _mm256_hadd_epi32(t, t);
    _mm_unpacklo_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1))
}

/// [`simd_groups`] with SSE2: bytes widened to i16, `pmaddwd`, the four groups' lanes summed
/// by a transpose. The caller checked the lengths.
#[cfg(target_arch = "x86_64")]
#[inline]
fn groups_sse2(w: &[i8], q: &[i8], scale: &[f32], d: &[f32], groups: usize) -> [f32; 4] {
    use std::arch::x86_64::*;

    // SAFETY: SSE2 is part of the x86_64 baseline; every load reads 16 bytes inside `w` or
    // `q`, whose lengths were checked above.
    unsafe {
        let widen = |v: __m128i| {
            (
                _mm_srai_epi16(_mm_unpacklo_epi8(v, v), 8),
                _mm_srai_epi16(_mm_unpackhi_epi8(v, v), 8),
            )
        };
        let group = |h: usize| {
            let wv = _mm_loadu_si128(w.as_ptr().add(h * H).cast());
            let qv = _mm_loadu_si128(q.as_ptr().add(h * H).cast());
            let (wl, wh) = widen(wv);
            let (ql, qh) = widen(qv);
            _mm_add_epi32(_mm_madd_epi16(wl, ql), _mm_madd_epi16(wh, qh))
        };
        let mut acc = _mm_setzero_ps();
        let mut h = 0;
        while h < groups {
            let (v0, v1, v2, v3) = (group(h), group(h + 1), group(h + 2), group(h + 3));
            let s01 = _mm_add_epi32(_mm_unpacklo_epi32(v0, v1), _mm_unpackhi_epi32(v0, v1));
            let s23 = _mm_add_epi32(_mm_unpacklo_epi32(v2, v3), _mm_unpackhi_epi32(v2, v3));
            let sums = _mm_add_epi32(_mm_unpacklo_epi64(s01, s23), _mm_unpackhi_epi64(s01, s23));
            let [c0, c1, c2, c3] = group_scales(scale, d, h);
            let c = _mm_setr_ps(c0, c1, c2, c3);
            acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(sums), c));
            h += 4;
        }
        let mut out = [0.0f32; 4];
        _mm_storeu_ps(out.as_mut_ptr(), acc);
        out
    }
}

/// The accumulators after the first `groups` half-blocks (a multiple of 4), four at a time
/// with WebAssembly SIMD128: bytes widened to i16, `i32x4.dot_i16x8_s`, a transpose.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[inline]
fn simd_groups(w: &[i8], q: &[i8], scale: &[f32], d: &[f32], groups: usize) -> [f32; 4] {
    use std::arch::wasm32::*;

    assert!(w.len() >= groups * H && q.len() >= groups * H);
    assert!(scale.len() >= groups && d.len() >= groups);
    // SAFETY: every load reads 16 bytes inside `w` or `q`, whose lengths were checked above
    // (unaligned loads are allowed in WebAssembly).
    unsafe {
        let group = |h: usize| {
            half_block_dot_simd128(
                v128_load(w.as_ptr().add(h * H).cast()),
                v128_load(q.as_ptr().add(h * H).cast()),
            )
        };
        let mut acc = f32x4_splat(0.0);
        let mut h = 0;
        while h < groups {
            let sums = lane_sums_simd128(group(h), group(h + 1), group(h + 2), group(h + 3));
            let [c0, c1, c2, c3] = group_scales(scale, d, h);
            let c = f32x4(c0, c1, c2, c3);
            acc = f32x4_add(acc, f32x4_mul(f32x4_convert_i32x4(sums), c));
            h += 4;
        }
        [
            f32x4_extract_lane::<0>(acc),
            f32x4_extract_lane::<1>(acc),
            f32x4_extract_lane::<2>(acc),
            f32x4_extract_lane::<3>(acc),
        ]
    }
}

/// One half-block's `Σ w·q` (16 values of `wv` and `qv`) as four partial i32 sums.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[inline(always)]
pub(crate) fn half_block_dot_simd128(
    wv: std::arch::wasm32::v128,
    qv: std::arch::wasm32::v128,
) -> std::arch::wasm32::v128 {
    use std::arch::wasm32::*;
    i32x4_add(
        i32x4_dot_i16x8(i16x8_extend_low_i8x16(wv), i16x8_extend_low_i8x16(qv)),
        i32x4_dot_i16x8(i16x8_extend_high_i8x16(wv), i16x8_extend_high_i8x16(qv)),
    )
}

/// The four half-blocks' sums from their partial sums ([`half_block_dot_simd128`]): lane `k`
/// is the sum of `vk`'s lanes (a transpose by shuffles and adds).
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[inline(always)]
pub(crate) fn lane_sums_simd128(
    v0: std::arch::wasm32::v128,
    v1: std::arch::wasm32::v128,
    v2: std::arch::wasm32::v128,
    v3: std::arch::wasm32::v128,
) -> std::arch::wasm32::v128 {
    use std::arch::wasm32::*;
    let s01 = i32x4_add(
        i32x4_shuffle::<0, 4, 1, 5>(v0, v1),
        i32x4_shuffle::<2, 6, 3, 7>(v0, v1),
    );
    let s23 = i32x4_add(
        i32x4_shuffle::<0, 4, 1, 5>(v2, v3),
        i32x4_shuffle::<2, 6, 3, 7>(v2, v3),
    );
    i32x4_add(
        i64x2_shuffle::<0, 2>(s01, s23),
        i64x2_shuffle::<1, 3>(s01, s23),
    )
}

/// The accumulators after the first `groups` half-blocks (a multiple of 4), four at a time
/// with NEON (the aarch64 baseline): `smull` of the bytes' low and high halves into i16, their
/// pairs added into i32 (`saddlp`, `sadalp`), the four groups' lanes summed by pairwise adds.
#[cfg(target_arch = "aarch64")]
#[inline]
fn simd_groups(w: &[i8], q: &[i8], scale: &[f32], d: &[f32], groups: usize) -> [f32; 4] {
    use std::arch::aarch64::*;

    assert!(w.len() >= groups * H && q.len() >= groups * H);
    assert!(scale.len() >= groups && d.len() >= groups);
    // SAFETY: NEON is part of the aarch64 baseline; every load reads 16 bytes inside `w` or
    // `q`, whose lengths were checked above.
    unsafe {
        let group = |h: usize| {
            half_block_dot_neon(
                vld1q_s8(w.as_ptr().add(h * H)),
                vld1q_s8(q.as_ptr().add(h * H)),
            )
        };
        let mut acc = vdupq_n_f32(0.0);
        let mut h = 0;
        while h < groups {
            let sums = lane_sums_neon(group(h), group(h + 1), group(h + 2), group(h + 3));
            acc = scaled_add_neon(acc, sums, group_scales(scale, d, h));
            h += 4;
        }
        lanes_neon(acc)
    }
}

/// `acc + f32(sums) · c`, lane by lane: a product, then a sum (no fused multiply-add), as every
/// other path adds.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
#[inline]
pub(crate) fn scaled_add_neon(
    acc: std::arch::aarch64::float32x4_t,
    sums: std::arch::aarch64::int32x4_t,
    c: [f32; 4],
) -> std::arch::aarch64::float32x4_t {
    use std::arch::aarch64::*;

    // SAFETY: a 16-byte load from a 16-byte array.
    let c = unsafe { vld1q_f32(c.as_ptr()) };
    vaddq_f32(acc, vmulq_f32(vcvtq_f32_s32(sums), c))
}

/// The four lanes of `v`.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
#[inline]
pub(crate) fn lanes_neon(v: std::arch::aarch64::float32x4_t) -> [f32; 4] {
    let mut out = [0.0f32; 4];
    // SAFETY: a 16-byte store into a 16-byte array.
    unsafe { std::arch::aarch64::vst1q_f32(out.as_mut_ptr(), v) };
    out
}

/// One half-block's `Σ w·q` (16 values of `wv` and `qv`) as four partial i32 sums: products
/// in i16 (at most 128·128, which fits), added in pairs into i32.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
#[inline]
pub(crate) fn half_block_dot_neon(
    wv: std::arch::aarch64::int8x16_t,
    qv: std::arch::aarch64::int8x16_t,
) -> std::arch::aarch64::int32x4_t {
    use std::arch::aarch64::*;

    let low = vmull_s8(vget_low_s8(wv), vget_low_s8(qv));
    let high = vmull_high_s8(wv, qv);
    vpadalq_s16(vpaddlq_s16(low), high)
}

/// The four half-blocks' sums from their partial sums ([`half_block_dot_neon`]): lane `k` is
/// the sum of `vk`'s lanes (two rounds of pairwise adds).
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
#[inline]
pub(crate) fn lane_sums_neon(
    v0: std::arch::aarch64::int32x4_t,
    v1: std::arch::aarch64::int32x4_t,
    v2: std::arch::aarch64::int32x4_t,
    v3: std::arch::aarch64::int32x4_t,
) -> std::arch::aarch64::int32x4_t {
    use std::arch::aarch64::*;

    vpaddq_s32(vpaddq_s32(v0, v1), vpaddq_s32(v2, v3))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SIMD path and the definition agree bit for bit.
    #[test]
    fn simd_matches_the_scalar_definition() {
        let n = 32 * 7;
        let w: Vec<i8> = (0..n).map(|i| ((i * 37 + 11) % 255) as i32 as i8).collect();
        let q: Vec<i8> = (0..n)
            .map(|i| ((i as i32 * 91 + 3) % 255 - 127) as i8)
            .collect();
        let scale: Vec<f32> = (0..n / H).map(|i| 0.013 * (i as f32 + 0.7)).collect();
        let d: Vec<f32> = (0..n / H).map(|i| 0.0071 / (i as f32 + 1.3)).collect();
        let mut acc = [0.0f32; 4];
        for h in 0..n / H {
            let s: i32 = (0..H)
                .map(|i| i32::from(w[h * H + i]) * i32::from(q[h * H + i]))
                .sum();
            acc[h % 4] += s as f32 * (scale[h] * d[h]);
        }
        let want = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        assert_eq!(scaled_dot(&w, &q, &scale, &d).to_bits(), want.to_bits());
        // both x86_64 paths, whichever the CPU picks
        #[cfg(target_arch = "x86_64")]
        {
            let whole = n / H / 4 * 4;
            let sse2 = groups_sse2(&w, &q, &scale, &d, whole);
            assert_eq!(sse2, simd_groups(&w, &q, &scale, &d, whole));
        }
    }
}
