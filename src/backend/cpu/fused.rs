//! The dot product of one stored weight row of a 32-value type (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; the
//! K-quants' are in [`super::fused_k`]) with one token's 8-bit activations, reading the row's blocks straight into SIMD registers: no
//! unpacked copy of the row is written and read back, which is most of a decode step's
//! matrix × vector work when each row meets one token. [`row_dot_tokens`] does the same for
//! several tokens (a batched decoding step, a prompt chunk), making each block's values once
//! for up to four of them.
//!
//! The result is bit for bit what unpacking the row ([`super::quant::UnpackedRow`]) and
//! [`super::dot::scaled_dot`] give: the same exact integer sums per half-block, the same f32
//! products and the same order of additions (see `dot.rs`), so the fused and unpacked paths
//! (and the native and browser builds) agree exactly. Where the target has no such path (no
//! AVX2, WebAssembly without SIMD) [`row_dot`] and [`row_dot_tokens`] decline and the caller
//! unpacks. The integer sums may be made differently (Q4_1's and Q5_1's values, never negative,
//! skip the sign trick): they are exact either way, so the bits do not change.

use super::quant::{f16_at, layout, Layout, Q8Rows, Row, QK};
use crate::dtype::DType;

/// Whether [`row_dot`] computes rows of `dtype` on this machine (the K-quants through
/// [`super::fused_k`]).
#[cfg(test)]
pub fn available(dtype: DType) -> bool {
    (layout(dtype).is_some() && simd_available()) || super::fused_k::available(dtype)
}

/// `Σ x·a` of the weight row `bytes` (whole blocks of `dtype`) with one token's activations
/// `q` (values), `d` (half-block scales) and `s` (block sums), as the unpacked row's `dot`
/// gives it; `offsets` is room for one value per block. `None` when [`available`] is false.
/// The one-token reference the tests hold [`row_dot_tokens`] to (the product runs that).
#[cfg(test)]
pub fn row_dot(
    dtype: DType,
    bytes: &[u8],
    q: &[i8],
    d: &[f32],
    s: &[f32],
    offsets: &mut Vec<f32>,
) -> Option<f32> {
    if super::fused_k::available(dtype) {
        return super::fused_k::row_dot(dtype, bytes, q, d, s, offsets);
    }
    let l = layout(dtype)?;
    if !simd_available() {
        return None;
    }
    let blocks = bytes.len() / l.size;
    assert!(q.len() >= blocks * QK && d.len() >= blocks * 2 && s.len() >= blocks);
    // Blocks in pairs (four half-blocks, as the unpacked path's SIMD loop takes them).
    let acc = simd_pairs(l, bytes, q, d, blocks / 2);
    fill_offsets(l, bytes, offsets);
    Some(finish(l, bytes, (q, d, s), acc, offsets))
}

/// Tokens whose dot products one pass over a row computes together (their accumulators stay in
/// registers, and each block's values are made once for all of them).
const TOKENS_AT_ONCE: usize = 4;

/// [`row_dot`] of one weight row with every token of `q8`: `out[t]` for `t < out.len()`, bit
/// for bit what `row_dot` gives each token alone. Each pair of blocks is turned into values
/// once for up to four tokens, so a batched or multi-token step pays the unpacking once per
/// row. `false` (and `out` untouched) when [`available`] is false.
pub fn row_dot_tokens(
    dtype: DType,
    bytes: &[u8],
    q8: &Q8Rows,
    out: &mut [f32],
    offsets: &mut Vec<f32>,
) -> bool {
    if super::fused_k::available(dtype) {
        return super::fused_k::row_dot_tokens(dtype, bytes, q8, out, offsets);
    }
    let Some(l) = layout(dtype) else {
        return false;
    };
    if !simd_available() {
        return false;
    }
    let blocks = bytes.len() / l.size;
    let pairs = blocks / 2;
    fill_offsets(l, bytes, offsets);
    for (g, out) in out.chunks_mut(TOKENS_AT_ONCE).enumerate() {
        let first = g * TOKENS_AT_ONCE;
        let rows: [Row<'_>; TOKENS_AT_ONCE] =
            std::array::from_fn(|k| q8.row(first + k.min(out.len() - 1)));
        for (q, d, s) in &rows {
            assert!(q.len() >= blocks * QK && d.len() >= blocks * 2 && s.len() >= blocks);
        }
        let isums: [&[i32]; TOKENS_AT_ONCE] =
            std::array::from_fn(|k| q8.isums(first + k.min(out.len() - 1)));
        let accs = match out.len() {
            1 => group::<1>(l, bytes, rows, isums, pairs),
            2 => group::<2>(l, bytes, rows, isums, pairs),
            3 => group::<3>(l, bytes, rows, isums, pairs),
            _ => group::<TOKENS_AT_ONCE>(l, bytes, rows, isums, pairs),
        };
        for ((o, row), acc) in out.iter_mut().zip(&rows).zip(accs) {
            *o = finish(l, bytes, *row, acc, offsets);
        }
    }
    true
}

/// The accumulators of the first `N` tokens of `rows` (the rest zero) after the first `pairs`
/// pairs of blocks, on the instruction set this CPU runs (VNNI, AVX2 or SIMD128), the same
/// bits on each.
fn group<const N: usize>(
    l: Layout,
    bytes: &[u8],
    rows: [Row<'_>; TOKENS_AT_ONCE],
    isums: [&[i32]; TOKENS_AT_ONCE],
    pairs: usize,
) -> [[f32; 4]; TOKENS_AT_ONCE] {
    let rows: [Row<'_>; N] = std::array::from_fn(|k| rows[k]);
    #[cfg(target_arch = "x86_64")]
    if super::dot::has_vnni() {
        let isums: [&[i32]; N] = std::array::from_fn(|k| isums[k]);
        return widen(vnni_pairs_tokens(l, bytes, rows, isums, pairs));
    }
    let _ = isums;
    match N {
        1 => widen([simd_pairs(l, bytes, rows[0].0, rows[0].1, pairs)]),
        _ => widen(simd_pairs_tokens(l, bytes, rows, pairs)),
    }
}

/// `N` tokens' accumulators in the first `N` of four slots.
fn widen<const N: usize>(a: [[f32; 4]; N]) -> [[f32; 4]; TOKENS_AT_ONCE] {
    std::array::from_fn(|k| a.get(k).copied().unwrap_or_default())
}

/// The blocks' offsets (`m`), for the types that have them.
fn fill_offsets(l: Layout, bytes: &[u8], offsets: &mut Vec<f32>) {
    offsets.clear();
    if l.offset {
        offsets.extend(bytes.chunks_exact(l.size).map(|b| f16_at(b, 2)));
    }
}

/// One token's dot product from the accumulators of the block pairs: the odd last block, the
/// four accumulators summed, the offsets' part added.
fn finish(l: Layout, bytes: &[u8], (q, d, s): Row<'_>, mut acc: [f32; 4], offsets: &[f32]) -> f32 {
    let blocks = bytes.len() / l.size;
    if blocks % 2 == 1 {
        // The last block: half-blocks 4·pairs and 4·pairs + 1, so accumulators 0 and 1.
        let b = &bytes[(blocks - 1) * l.size..][..l.size];
        let w = block_values(l, b);
        let scale = f16_at(b, 0);
        let h = 2 * (blocks - 1);
        for k in 0..2 {
            let sum: i32 = w[k * 16..][..16]
                .iter()
                .zip(&q[(h + k) * 16..][..16])
                .map(|(&a, &b)| i32::from(a) * i32::from(b))
                .sum();
            acc[k] += sum as f32 * (scale * d[h + k]);
        }
    }
    let dot = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    if !l.offset {
        return dot;
    }
    dot + super::dot::dot_f32(offsets, &s[..blocks])
}

/// Block `b`'s 32 values as small integers (the unpacked row's).
fn block_values(l: Layout, b: &[u8]) -> [i8; 32] {
    let mut w = [0i8; 32];
    let v = &b[l.values..];
    match l.nibble_bias {
        None => {
            for (w, &x) in w.iter_mut().zip(v) {
                *w = x as i8;
            }
        }
        Some(bias) => {
            let qh = l.high_word(b, 0);
            let fifth = |j: usize| (((qh >> j) & 1) as u8) << 4;
            for j in 0..16 {
                w[j] = ((v[j] & 0x0F) | fifth(j)) as i8 + bias;
                w[j + 16] = ((v[j] >> 4) | fifth(j + 16)) as i8 + bias;
            }
        }
    }
    w
}

#[cfg(target_arch = "x86_64")]
fn simd_available() -> bool {
    super::dot::has_avx2()
}

#[cfg(any(
    target_arch = "aarch64",
    all(target_arch = "wasm32", target_feature = "simd128")
))]
fn simd_available() -> bool {
    true
}

#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    all(target_arch = "wasm32", target_feature = "simd128")
)))]
fn simd_available() -> bool {
    false
}

/// Never called where [`simd_available`] is false.
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    all(target_arch = "wasm32", target_feature = "simd128")
)))]
fn simd_pairs(_: Layout, _: &[u8], _: &[i8], _: &[f32], _: usize) -> [f32; 4] {
    [0.0; 4]
}

/// The accumulators after the first `pairs` pairs of blocks, with AVX2 (checked by the
/// caller): the unpacked path's `groups_avx2` with each 32-byte weight load replaced by the
/// block's values made in a register.
#[cfg(target_arch = "x86_64")]
fn simd_pairs(l: Layout, bytes: &[u8], q: &[i8], d: &[f32], pairs: usize) -> [f32; 4] {
    let value_bytes = if l.nibble_bias.is_some() { 16 } else { 32 };
    assert!(bytes.len() >= 2 * pairs * l.size && l.values + value_bytes <= l.size);
    assert!(q.len() >= pairs * 64 && d.len() >= pairs * 4);
    // SAFETY: the CPU has AVX2 (the only caller checked `simd_available`); the lengths were
    // checked above.
    unsafe { pairs_avx2(l, bytes, q, d, pairs) }
}

/// [`simd_pairs`] for `N` tokens at once, with AVX2 (checked by the caller).
#[cfg(target_arch = "x86_64")]
fn simd_pairs_tokens<const N: usize>(
    l: Layout,
    bytes: &[u8],
    rows: [Row<'_>; N],
    pairs: usize,
) -> [[f32; 4]; N] {
    let value_bytes = if l.nibble_bias.is_some() { 16 } else { 32 };
    assert!(bytes.len() >= 2 * pairs * l.size && l.values + value_bytes <= l.size);
    for (q, d, _) in &rows {
        assert!(q.len() >= pairs * 64 && d.len() >= pairs * 4);
    }
    // SAFETY: the CPU has AVX2 (the only caller checked `simd_available`); the lengths were
    // checked above.
    unsafe {
        let acc = pairs_tokens_avx2(
            l,
            bytes,
            rows,
            0..pairs,
            [std::arch::x86_64::_mm_setzero_ps(); N],
        );
        stored(acc)
    }
}

/// The four lanes of each accumulator.
#[cfg(target_arch = "x86_64")]
fn stored<const N: usize>(acc: [std::arch::x86_64::__m128; N]) -> [[f32; 4]; N] {
    use std::arch::x86_64::*;
    let mut out = [[0.0f32; 4]; N];
    for (o, a) in out.iter_mut().zip(acc) {
        // SAFETY: SSE is part of the x86_64 baseline; a 16-byte store into a 16-byte array.
        unsafe { _mm_storeu_ps(o.as_mut_ptr(), a) };
    }
    out
}

/// [`simd_pairs_tokens`] on AVX-512 VNNI (checked by the caller): four pairs at a time
/// ([`super::fused_vnni`]), the last pairs on AVX2, the same bits as AVX2 throughout.
#[cfg(target_arch = "x86_64")]
fn vnni_pairs_tokens<const N: usize>(
    l: Layout,
    bytes: &[u8],
    rows: [Row<'_>; N],
    isums: [&[i32]; N],
    pairs: usize,
) -> [[f32; 4]; N] {
    use super::fused_vnni::{self, PAIRS_PER_STEP};

    let value_bytes = if l.nibble_bias.is_some() { 16 } else { 32 };
    assert!(bytes.len() >= 2 * pairs * l.size && l.values + value_bytes <= l.size);
    for ((q, d, _), isum) in rows.iter().zip(&isums) {
        assert!(q.len() >= pairs * 64 && d.len() >= pairs * 4 && isum.len() >= pairs * 4);
    }
    let steps = pairs / PAIRS_PER_STEP;
    let vnni: [fused_vnni::VnniRow<'_>; N] = std::array::from_fn(|k| (rows[k], isums[k]));
    // SAFETY: the caller checked the CPU (`has_vnni`, which includes AVX2); the lengths were
    // checked above.
    unsafe {
        let zero = [std::arch::x86_64::_mm_setzero_ps(); N];
        let acc = fused_vnni::steps(l, bytes, vnni, steps, zero);
        let acc = pairs_tokens_avx2(l, bytes, rows, steps * PAIRS_PER_STEP..pairs, acc);
        stored(acc)
    }
}

/// [`pairs_avx2`] for `N` tokens over the pairs `pairs`, from the accumulators `acc`: each
/// pair of blocks' values, their absolute values and their scales made once, then every
/// token's sums and accumulators as `pairs_avx2` makes them (the same operations in the same
/// order, so the same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn pairs_tokens_avx2<const N: usize>(
    l: Layout,
    bytes: &[u8],
    rows: [Row<'_>; N],
    pairs: std::ops::Range<usize>,
    mut acc: [std::arch::x86_64::__m128; N],
) -> [std::arch::x86_64::__m128; N] {
    use std::arch::x86_64::*;

    // Q4_1's and Q5_1's values are never negative.
    let unsigned = l.nibble_bias == Some(0);
    let ones = _mm256_set1_epi16(1);
    // [h0 h2 h0' h2' | h1 h3 h1' h3'] to [h0 h1 h2 h3 | h0' h1' h2' h3']
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut p = pairs.start;
    // two pairs at a time for several tokens (a prompt's rows: 12–15 % faster on a Zen 3;
    // one token's decode step measured 5 % slower so, and keeps one pair at a time): four
    // blocks, eight half-blocks reduced and scaled together, then added pair by pair as one
    // pair at a time adds them (the same bits)
    while N > 1 && p + 2 <= pairs.end {
        let blocks = [2 * p, 2 * p + 1, 2 * p + 2, 2 * p + 3];
        // SAFETY: the blocks lie inside `bytes` (checked by the caller).
        let w = blocks.map(|b| unsafe { block_register(l, bytes, b) });
        let a = w.map(|w| match unsigned {
            true => w,
            false => _mm256_abs_epi8(w),
        });
        let ds = blocks.map(|b| f16_at(&bytes[b * l.size..], 0));
        let scales = _mm256_setr_ps(ds[0], ds[0], ds[1], ds[1], ds[2], ds[2], ds[3], ds[3]);
        for (acc, (q, d, _)) in acc.iter_mut().zip(&rows) {
            // each pair's four sums of four values per half-block, halved by `vphaddd`
            let t: [__m256i; 2] = std::array::from_fn(|j| {
                let m: [__m256i; 2] = std::array::from_fn(|k| {
                    let b = blocks[2 * j + k];
                    // SAFETY: a 32-byte load of block b's activations, inside `q`
                    // (checked by the caller).
                    let qv = unsafe { _mm256_loadu_si256(q.as_ptr().add(b * QK).cast()) };
                    match unsigned {
                        true => _mm256_maddubs_epi16(w[2 * j + k], qv),
                        false => {
                            _mm256_maddubs_epi16(a[2 * j + k], _mm256_sign_epi8(qv, w[2 * j + k]))
                        }
                    }
                });
                _mm256_hadd_epi32(_mm256_madd_epi16(m[0], ones), _mm256_madd_epi16(m[1], ones))
            });
            let sums = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(t[0], t[1]), order);
            // SAFETY: a 32-byte load of the eight half-blocks' scales (from 4·p), inside `d`
            // (checked by the caller).
            let dv = unsafe { _mm256_loadu_ps(d.as_ptr().add(4 * p)) };
            // `scale_h · d_h` in f32, as the one-token path's scalar products
            let prod = _mm256_mul_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(scales, dv));
            *acc = _mm_add_ps(*acc, _mm256_castps256_ps128(prod));
            *acc = _mm_add_ps(*acc, _mm256_extractf128_ps::<1>(prod));
        }
        p += 2;
    }
    for p in p..pairs.end {
        let (b0, b1) = (2 * p, 2 * p + 1);
        // SAFETY: the blocks lie inside `bytes` (checked by the caller).
        let (w01, w23) = unsafe { (block_register(l, bytes, b0), block_register(l, bytes, b1)) };
        let (a01, a23) = if unsigned {
            (w01, w23)
        } else {
            (_mm256_abs_epi8(w01), _mm256_abs_epi8(w23))
        };
        let (d0, d1) = (
            f16_at(&bytes[b0 * l.size..], 0),
            f16_at(&bytes[b1 * l.size..], 0),
        );
        let scales = _mm_setr_ps(d0, d0, d1, d1);
        let h = 4 * p;
        for (acc, (q, d, _)) in acc.iter_mut().zip(&rows) {
            // SAFETY: 32-byte loads of the activations of blocks b0 and b1 and a 16-byte load
            // of their four half-block scales, inside `q` and `d` (checked by the caller).
            let (q01, q23, dv) = unsafe {
                (
                    _mm256_loadu_si256(q.as_ptr().add(b0 * QK).cast()),
                    _mm256_loadu_si256(q.as_ptr().add(b1 * QK).cast()),
                    _mm_loadu_ps(d.as_ptr().add(h)),
                )
            };
            let sums = if unsigned {
                super::dot::half_block_sums_unsigned_avx2(w01, q01, w23, q23)
            } else {
                super::dot::half_block_sums_abs_avx2(a01, w01, q01, a23, w23, q23)
            };
            // `scale_h · d_h` in f32, as the one-token path's scalar products.
            let c = _mm_mul_ps(scales, dv);
            *acc = _mm_add_ps(*acc, _mm_mul_ps(_mm_cvtepi32_ps(sums), c));
        }
    }
    acc
}

/// Block `b`'s 32 values in a register: first the 16 low nibbles, then the 16 high ones, each
/// with its fifth bit where the type has them (or the 32 bytes).
///
/// # Safety
/// The CPU has AVX2 and block `b` lies inside `bytes`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn block_register(l: Layout, bytes: &[u8], b: usize) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;

    // SAFETY: the block's values (32 bytes, or 16 of nibbles) lie inside it, and the caller
    // promised that the block lies inside `bytes`.
    let p = unsafe { bytes.as_ptr().add(b * l.size + l.values) };
    match l.nibble_bias {
        None => unsafe { _mm256_loadu_si256(p.cast()) },
        Some(bias) => {
            let v = unsafe { _mm_loadu_si128(p.cast()) };
            let mask = _mm_set1_epi8(0x0F);
            let lo = _mm_and_si128(v, mask);
            let hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
            let mut w = _mm256_set_m128i(hi, lo);
            if l.high_bits.is_some() {
                w = _mm256_or_si256(w, fifth_bits_avx2(l.high_word(bytes, b)));
            }
            _mm256_add_epi8(w, _mm256_set1_epi8(bias))
        }
    }
}

/// `0x10` in byte `j` where bit `j` of `qh` is set, else 0.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn fifth_bits_avx2(qh: u32) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;

    // byte j gets byte j / 8 of the word (each 128-bit lane holds the whole word)
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(qh as i32),
        _mm256_setr_epi64x(
            0x0000_0000_0000_0000,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        ),
    );
    // every bit but bit j % 8 set: all ones exactly where bit j was
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// [`simd_pairs`] for `N` tokens, one after the other (WebAssembly and aarch64; other targets
/// never call it).
#[cfg(not(target_arch = "x86_64"))]
fn simd_pairs_tokens<const N: usize>(
    l: Layout,
    bytes: &[u8],
    rows: [Row<'_>; N],
    pairs: usize,
) -> [[f32; 4]; N] {
    std::array::from_fn(|k| simd_pairs(l, bytes, rows[k].0, rows[k].1, pairs))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn pairs_avx2(l: Layout, bytes: &[u8], q: &[i8], d: &[f32], pairs: usize) -> [f32; 4] {
    use std::arch::x86_64::*;

    // SAFETY: the CPU has AVX2 and the blocks lie inside `bytes` (both checked by the caller).
    let values = |b: usize| unsafe { block_register(l, bytes, b) };
    // Q4_1's and Q5_1's values are never negative.
    let unsigned = l.nibble_bias == Some(0);
    let mut acc = _mm_setzero_ps();
    for p in 0..pairs {
        let (b0, b1) = (2 * p, 2 * p + 1);
        let (w01, w23) = (values(b0), values(b1));
        // SAFETY: 32-byte loads of the activations of blocks b0 and b1, inside `q`.
        let (q01, q23) = unsafe {
            (
                _mm256_loadu_si256(q.as_ptr().add(b0 * QK).cast()),
                _mm256_loadu_si256(q.as_ptr().add(b1 * QK).cast()),
            )
        };
        let sums = if unsigned {
            super::dot::half_block_sums_unsigned_avx2(w01, q01, w23, q23)
        } else {
            super::dot::half_block_sums_avx2(w01, q01, w23, q23)
        };
        let (d0, d1) = (
            f16_at(&bytes[b0 * l.size..], 0),
            f16_at(&bytes[b1 * l.size..], 0),
        );
        let h = 4 * p;
        let c = _mm_setr_ps(d0 * d[h], d0 * d[h + 1], d1 * d[h + 2], d1 * d[h + 3]);
        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(sums), c));
    }
    let mut out = [0.0f32; 4];
    // SAFETY: a 16-byte store into a 16-byte array.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), acc) };
    out
}

/// The accumulators after the first `pairs` pairs of blocks, with WebAssembly SIMD128: the
/// unpacked path's `simd_groups` with each 16-byte weight load replaced by the half-block's
/// values made in a register.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
fn simd_pairs(l: Layout, bytes: &[u8], q: &[i8], d: &[f32], pairs: usize) -> [f32; 4] {
    use std::arch::wasm32::*;

    assert!(bytes.len() >= 2 * pairs * l.size);
    assert!(q.len() >= pairs * 64 && d.len() >= pairs * 4);
    // SAFETY: every load reads 16 bytes inside a block of `bytes` or inside `q`, whose lengths
    // were checked above (unaligned loads are allowed in WebAssembly).
    unsafe {
        // Half-blocks 2b and 2b + 1 of block b.
        let halves = |b: usize| -> (v128, v128) {
            let p = bytes.as_ptr().add(b * l.size + l.values);
            match l.nibble_bias {
                None => (v128_load(p.cast()), v128_load(p.add(16).cast())),
                Some(bias) => {
                    let v = v128_load(p.cast());
                    let mask = u8x16_splat(0x0F);
                    let bias = i8x16_splat(bias);
                    let (mut lo, mut hi) = (v128_and(v, mask), u8x16_shr(v, 4));
                    if l.high_bits.is_some() {
                        let qh = l.high_word(bytes, b);
                        lo = v128_or(lo, fifth_bits_simd128(qh as u16));
                        hi = v128_or(hi, fifth_bits_simd128((qh >> 16) as u16));
                    }
                    (i8x16_add(lo, bias), i8x16_add(hi, bias))
                }
            }
        };
        let group = |wv: v128, h: usize| {
            super::dot::half_block_dot_simd128(wv, v128_load(q.as_ptr().add(h * 16).cast()))
        };
        let mut acc = f32x4_splat(0.0);
        for p in 0..pairs {
            let (b0, b1) = (2 * p, 2 * p + 1);
            let h = 4 * p;
            let ((w0, w1), (w2, w3)) = (halves(b0), halves(b1));
            let sums = super::dot::lane_sums_simd128(
                group(w0, h),
                group(w1, h + 1),
                group(w2, h + 2),
                group(w3, h + 3),
            );
            let (d0, d1) = (
                f16_at(&bytes[b0 * l.size..], 0),
                f16_at(&bytes[b1 * l.size..], 0),
            );
            let c = f32x4(d0 * d[h], d0 * d[h + 1], d1 * d[h + 2], d1 * d[h + 3]);
            acc = f32x4_add(acc, f32x4_mul(f32x4_convert_i32x4(sums), c));
        }
        [
            f32x4_extract_lane::<0>(acc),
            f32x4_extract_lane::<1>(acc),
            f32x4_extract_lane::<2>(acc),
            f32x4_extract_lane::<3>(acc),
        ]
    }
}

/// `0x10` in byte `j` where bit `j` of `bits` is set, else 0 (16 bytes).
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
fn fifth_bits_simd128(bits: u16) -> std::arch::wasm32::v128 {
    use std::arch::wasm32::*;

    let [b0, b1] = bits.to_le_bytes();
    let spread = u8x16(
        b0, b0, b0, b0, b0, b0, b0, b0, b1, b1, b1, b1, b1, b1, b1, b1,
    );
    let bit = u8x16(1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128);
    let set = u8x16_eq(v128_and(spread, bit), bit);
    v128_and(set, u8x16_splat(0x10))
}

/// The NEON rows (aarch64): the same made-in-register blocks as SIMD128's, in NEON.
#[cfg(target_arch = "aarch64")]
#[path = "fused_neon.rs"]
mod neon;
#[cfg(target_arch = "aarch64")]
use neon::simd_pairs;

#[cfg(test)]
#[path = "fused_tests.rs"]
pub(super) mod tests;
