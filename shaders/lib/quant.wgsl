// Weight decoding for every stored type, included by the kernels that read weights as stored
// (linear.wgsl, embed.wgsl). Exactly one flag selects the type: WEIGHT_F32, WEIGHT_F16,
// WEIGHT_BF16, WEIGHT_Q8_0, WEIGHT_Q4_0, WEIGHT_Q4_1, WEIGHT_Q5_0, WEIGHT_Q5_1, WEIGHT_Q4_K,
// WEIGHT_Q5_K, WEIGHT_Q6_K.
//
// The includer declares the tensor as `qw: array<u32>`: its bytes as stored, zero-padded to a
// multiple of 4, a matrix [rows, cols] row-major (quantized rows are whole blocks).
//
// Unit of work: a *part*, 8 consecutive values of one row (part p holds columns 8p..8p+8).
// Every type has a single scale per 8 values (Q6_K's scales cover 16), so a part is 8 small
// numbers plus one scale and one offset, and its dot product with activations costs 8 FMAs and
// 2 multiplies. Parts are fine-grained enough that neighbouring invocations take neighbouring
// parts of a row: a warp reads a contiguous run of blocks (coalesced), even for short rows.
//
// Interface:
//   struct QPart                           the part as quants, scale and offset
//   fn q_parts(cols) -> u32                parts per row (the last may be partial for floats)
//   fn q_load(row, part, cols) -> QPart    decode; values past `cols` come back as 0
//   fn q_dequant(p) -> Q8                  the 8 values, bit-exact with the CPU dequantization
//   fn q_dot(p, x: Q8) -> f32              sum of value * x over the part (factored: not exact;
//                                          with MM_F16, f16 products of f16-rounded inputs)
//   const Q_BLOCK: u32                     values per block (1 for float types)
//
// Exactness (`q_dequant`): each value is computed with the operations of
// `model::weights::dequantize`, in the same order, in f32, so the results are the same bits.
// f16 fields are widened by hand when subnormal, since unpack2x16float may flush them to zero.
// Byte fields of blocks whose size is not a multiple of 4 (Q4_0 18 B, Q4_1 20 B, Q5_0 22 B, Q5_1 24 B, Q8_0 34 B,
// Q6_K 210 B) are read from the two words they straddle. f16 fields sit at even offsets of
// blocks of even size, so they never straddle.

#ifdef MM_F16
enable f16;
#endif

// Eight f32 values: 0..4 in `lo`, 4..8 in `hi`.
struct Q8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// A decoded part. Value i is `q[i] * scale + offset` for the affine types (Q4_1, Q4_K, Q5_K),
// `q[i] * scale` for the scaled ones (Q8_0, Q4_0, Q6_K: the zero point is already subtracted,
// so q holds small signed integers) and `q[i]` itself for the float types.
struct QPart {
    q: Q8,
    scale: f32,
    offset: f32,
}

fn q_parts(cols: u32) -> u32 {
    return (cols + 7u) / 8u;
}

// --- Raw reads --------------------------------------------------------------------------------

// Word `i`, clamped to the buffer: used where a part at the end of a row of a float type may
// reach past the tensor (the values read there are masked, but the read must stay in bounds).
fn q_word_clamped(i: u32) -> u32 {
    return qw[min(i, arrayLength(&qw) - 1u)];
}

// The 8 bytes starting at byte `a` (any alignment), little-endian, as two words. The third word
// is read only when `a` is unaligned, and then it holds the last of the 8 bytes: in bounds.
fn q_bytes8(a: u32) -> vec2<u32> {
    let i = a >> 2u;
    let s = (a & 3u) * 8u;
    let w0 = qw[i];
    let w1 = qw[i + 1u];
    if s == 0u {
        return vec2<u32>(w0, w1);
    }
    let w2 = qw[i + 2u];
    return vec2<u32>((w0 >> s) | (w1 << (32u - s)), (w1 >> s) | (w2 << (32u - s)));
}

// Two f16 (low half first) widened to f32, exactly. Zero and subnormal halves (exponent field
// 0) are rebuilt as mantissa * 2^-24, which is exact in f32, because unpack2x16float may flush
// f16 subnormals to zero on some backends.
fn q_f16x2(w: u32) -> vec2<f32> {
    let h = vec2<u32>(w & 0xffffu, w >> 16u);
    let sub = vec2<f32>(h & vec2<u32>(0x3ffu)) * 5.9604644775390625e-8;
    let signed_sub = select(sub, -sub, (h & vec2<u32>(0x8000u)) != vec2<u32>(0u));
    return select(unpack2x16float(w), signed_sub, (h & vec2<u32>(0x7c00u)) == vec2<u32>(0u));
}

// The f16 at byte `a` (even).
fn q_f16_at(a: u32) -> f32 {
    return q_f16x2(qw[a >> 2u] >> (8u * (a & 2u))).x;
}

// The 4 unsigned nibbles at bit `shift` (0 or 4) of each byte of `w`.
fn q_u4x4(w: u32, shift: u32) -> vec4<u32> {
    return (vec4<u32>(w >> shift) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xfu);
}

// The fifth bits of part p's 8 values in a Q5_0/Q5_1 block (bits 8p .. 8p + 8 of qh), as 16s.
fn q5_fifth(qh: u32, p: u32) -> Q8 {
    let bits = vec4<u32>(qh >> (8u * p)) >> vec4<u32>(0u, 1u, 2u, 3u);
    return Q8(vec4<f32>((bits & vec4<u32>(1u)) << vec4<u32>(4u)),
        vec4<f32>(((bits >> vec4<u32>(4u)) & vec4<u32>(1u)) << vec4<u32>(4u)));
}

// The 4 signed bytes of `w`, as f32.
fn q_i8x4(w: u32) -> vec4<f32> {
    let s = bitcast<i32>(w);
    return vec4<f32>(vec4<i32>(
        extractBits(s, 0u, 8u),
        extractBits(s, 8u, 8u),
        extractBits(s, 16u, 8u),
        extractBits(s, 24u, 8u),
    ));
}

// Zeroes the values of a float-type part at columns >= `cols` (c0: the part's first column).
fn q_mask(v: Q8, c0: u32, cols: u32) -> Q8 {
    let c = vec4<u32>(c0) + vec4<u32>(0u, 1u, 2u, 3u);
    let zero = vec4<f32>(0.0);
    return Q8(
        select(zero, v.lo, c < vec4<u32>(cols)),
        select(zero, v.hi, c + vec4<u32>(4u) < vec4<u32>(cols)),
    );
}

// --- K-quant helpers ----------------------------------------------------------------------------

// 6-bit scale and minimum of sub-block j (0..8) of a Q4_K/Q5_K block, from its 12 scale bytes
// as words s0 (bytes 0-3), s1 (4-7), s2 (8-11); ggml's get_scale_min_k4.
fn q_scale_min_k4(j: u32, s0: u32, s1: u32, s2: u32) -> vec2<u32> {
    if j < 4u {
        let k = 8u * j;
        return vec2<u32>((s0 >> k) & 63u, (s1 >> k) & 63u);
    }
    let k = 8u * (j - 4u);
    let low = (s2 >> k) & 0xffu;
    return vec2<u32>(
        (low & 0xfu) | (((s0 >> (k + 6u)) & 3u) << 4u),
        (low >> 4u) | (((s1 >> (k + 6u)) & 3u) << 4u),
    );
}

// Scale and offset of sub-block j of a Q4_K/Q5_K block starting at word `wb`:
// (d * sc, -(dmin * m)); y = scale * q + offset equals ggml's (d * sc) * q - dmin * m, bit for
// bit (a - b is a + (-b) in IEEE arithmetic).
fn q_k4_scale_offset(wb: u32, j: u32) -> vec2<f32> {
    let dm = q_f16x2(qw[wb]);
    let sm = q_scale_min_k4(j, qw[wb + 1u], qw[wb + 2u], qw[wb + 3u]);
    return vec2<f32>(dm.x * f32(sm.x), -(dm.y * f32(sm.y)));
}

// --- Per-type decoding --------------------------------------------------------------------------

#ifdef WEIGHT_F32
const Q_BLOCK: u32 = 1u;
const Q_SCALED: bool = false;
const Q_AFFINE: bool = false;
fn q_load(row: u32, part: u32, cols: u32) -> QPart {
    let c0 = part * 8u;
    let e = row * cols + c0;
    let lo = vec4<u32>(q_word_clamped(e), q_word_clamped(e + 1u), q_word_clamped(e + 2u), q_word_clamped(e + 3u));
    let hi = vec4<u32>(q_word_clamped(e + 4u), q_word_clamped(e + 5u), q_word_clamped(e + 6u), q_word_clamped(e + 7u));
    return QPart(q_mask(Q8(bitcast<vec4<f32>>(lo), bitcast<vec4<f32>>(hi)), c0, cols), 1.0, 0.0);
}
#endif

// The 8 consecutive 16-bit values starting at element `e`, as 4 words of 2 halves each. Rows of
// odd length start in the middle of a word: then the 8 halves come from 5 words.
fn q_halves8(e: u32) -> vec4<u32> {
    let i = e >> 1u;
    var w = vec4<u32>(q_word_clamped(i), q_word_clamped(i + 1u), q_word_clamped(i + 2u), q_word_clamped(i + 3u));
    if (e & 1u) != 0u {
        let w4 = q_word_clamped(i + 4u);
        w = (w >> vec4<u32>(16u)) | (vec4<u32>(w.yzw, w4) << vec4<u32>(16u));
    }
    return w;
}

#ifdef WEIGHT_F16
const Q_BLOCK: u32 = 1u;
const Q_SCALED: bool = false;
const Q_AFFINE: bool = false;
fn q_load(row: u32, part: u32, cols: u32) -> QPart {
    let w = q_halves8(row * cols + part * 8u);
    let v = Q8(vec4<f32>(q_f16x2(w.x), q_f16x2(w.y)), vec4<f32>(q_f16x2(w.z), q_f16x2(w.w)));
    return QPart(q_mask(v, part * 8u, cols), 1.0, 0.0);
}
#endif

#ifdef WEIGHT_BF16
const Q_BLOCK: u32 = 1u;
const Q_SCALED: bool = false;
const Q_AFFINE: bool = false;
fn q_bf16x2(w: u32) -> vec2<f32> {
    return bitcast<vec2<f32>>(vec2<u32>(w << 16u, w & 0xffff0000u));
}
fn q_load(row: u32, part: u32, cols: u32) -> QPart {
    let w = q_halves8(row * cols + part * 8u);
    let v = Q8(vec4<f32>(q_bf16x2(w.x), q_bf16x2(w.y)), vec4<f32>(q_bf16x2(w.z), q_bf16x2(w.w)));
    return QPart(q_mask(v, part * 8u, cols), 1.0, 0.0);
}
#endif

#ifdef WEIGHT_Q8_0
// 34 bytes: d f16 | 32 x i8.  y = q * d.
const Q_BLOCK: u32 = 32u;
const Q_SCALED: bool = true;
const Q_AFFINE: bool = false;
fn q_load(row: u32, part: u32, cols: u32) -> QPart {
    let b = (row * (cols / 32u) + part / 4u) * 34u;
    let qs = q_bytes8(b + 2u + 8u * (part & 3u));
    return QPart(Q8(q_i8x4(qs.x), q_i8x4(qs.y)), q_f16_at(b), 0.0);
}
#endif

#ifdef WEIGHT_Q4_0
// 18 bytes: d f16 | 16 bytes, byte j = value j (low nibble), value j + 16 (high).
// y = (q - 8) * d.
const Q_BLOCK: u32 = 32u;
const Q_SCALED: bool = true;
const Q_AFFINE: bool = false;
fn q_load(row: u32, part: u32, cols: u32) -> QPart {
    let b = (row * (cols / 32u) + part / 4u) * 18u;
    let p = part & 3u;
    let qs = q_bytes8(b + 2u + 8u * (p & 1u));
    let shift = 4u * (p >> 1u);
    let lo = vec4<f32>(q_u4x4(qs.x, shift)) - 8.0;
    let hi = vec4<f32>(q_u4x4(qs.y, shift)) - 8.0;
    return QPart(Q8(lo, hi), q_f16_at(b), 0.0);
}
#endif

#ifdef WEIGHT_Q4_1
// 20 bytes: d f16 | m f16 | 16 bytes of nibbles as in Q4_0.  y = d * q + m.
const Q_BLOCK: u32 = 32u;
const Q_SCALED: bool = true;
const Q_AFFINE: bool = true;
fn q_load(row: u32, part: u32, cols: u32) -> QPart {
    let b = (row * (cols / 32u) + part / 4u) * 20u;
    let p = part & 3u;
    // 20-byte blocks start on even bytes: d and m share one word.
    let dm = q_f16x2(q_bytes8(b).x);
    let qs = q_bytes8(b + 4u + 8u * (p & 1u));
    let shift = 4u * (p >> 1u);
    return QPart(Q8(vec4<f32>(q_u4x4(qs.x, shift)), vec4<f32>(q_u4x4(qs.y, shift))), dm.x, dm.y);
}
#endif

#ifdef WEIGHT_Q5_0
// 22 bytes: d f16 | qh 4 bytes (bit j: the fifth bit of value j) | 16 bytes of low nibbles as
// in Q4_0.  y = (q - 16) * d.
const Q_BLOCK: u32 = 32u;
const Q_SCALED: bool = true;
const Q_AFFINE: bool = false;
fn q_load(row: u32, part: u32, cols: u32) -> QPart {
    let b = (row * (cols / 32u) + part / 4u) * 22u;
    let p = part & 3u;
    let qh = q_bytes8(b + 2u).x;
    let qs = q_bytes8(b + 6u + 8u * (p & 1u));
    let shift = 4u * (p >> 1u);
    let high = q5_fifth(qh, p);
    let lo = vec4<f32>(q_u4x4(qs.x, shift)) + high.lo - 16.0;
    let hi = vec4<f32>(q_u4x4(qs.y, shift)) + high.hi - 16.0;
    return QPart(Q8(lo, hi), q_f16_at(b), 0.0);
}
#endif

#ifdef WEIGHT_Q5_1
// 24 bytes (even, word-aligned every other block): d f16 | m f16 | qh 4 bytes | 16 bytes of
// low nibbles, as in Q5_0.  y = d * q + m.
const Q_BLOCK: u32 = 32u;
const Q_SCALED: bool = true;
const Q_AFFINE: bool = true;
fn q_load(row: u32, part: u32, cols: u32) -> QPart {
    let b = (row * (cols / 32u) + part / 4u) * 24u;
    let p = part & 3u;
    let head = q_bytes8(b);
    let dm = q_f16x2(head.x);
    let qs = q_bytes8(b + 8u + 8u * (p & 1u));
    let shift = 4u * (p >> 1u);
    let high = q5_fifth(head.y, p);
    let lo = vec4<f32>(q_u4x4(qs.x, shift)) + high.lo;
    let hi = vec4<f32>(q_u4x4(qs.y, shift)) + high.hi;
    return QPart(Q8(lo, hi), dm.x, dm.y);
}
#endif

#ifdef WEIGHT_Q4_K
// 144 bytes (word-aligned): d f16 | dmin f16 | 12 scale bytes | 128 bytes of nibbles; each 32
// bytes hold sub-block 2k (low nibbles) and 2k + 1 (high nibbles).
const Q_BLOCK: u32 = 256u;
const Q_SCALED: bool = true;
const Q_AFFINE: bool = true;
fn q_load(row: u32, part: u32, cols: u32) -> QPart {
    let wb = (row * (cols / 256u) + part / 32u) * 36u;
    let j = (part & 31u) >> 2u;
    let p = part & 3u;
    let so = q_k4_scale_offset(wb, j);
    let wq = wb + 4u + 8u * (j >> 1u) + 2u * p;
    let shift = 4u * (j & 1u);
    return QPart(Q8(vec4<f32>(q_u4x4(qw[wq], shift)), vec4<f32>(q_u4x4(qw[wq + 1u], shift))), so.x, so.y);
}
#endif

#ifdef WEIGHT_Q5_K
// 176 bytes (word-aligned): d | dmin | 12 scale bytes | 32 bytes qh | 128 bytes of nibbles as
// in Q4_K. Bit j of qh[l] is the 5th bit of value l of sub-block j.
const Q_BLOCK: u32 = 256u;
const Q_SCALED: bool = true;
const Q_AFFINE: bool = true;
fn q5_high(w: u32, j: u32) -> vec4<u32> {
    return ((vec4<u32>(w) >> (vec4<u32>(0u, 8u, 16u, 24u) + j)) & vec4<u32>(1u)) << vec4<u32>(4u);
}
fn q_load(row: u32, part: u32, cols: u32) -> QPart {
    let wb = (row * (cols / 256u) + part / 32u) * 44u;
    let j = (part & 31u) >> 2u;
    let p = part & 3u;
    let so = q_k4_scale_offset(wb, j);
    let wh = wb + 4u + 2u * p;
    let wq = wb + 12u + 8u * (j >> 1u) + 2u * p;
    let shift = 4u * (j & 1u);
    let lo = q_u4x4(qw[wq], shift) | q5_high(qw[wh], j);
    let hi = q_u4x4(qw[wq + 1u], shift) | q5_high(qw[wh + 1u], j);
    return QPart(Q8(vec4<f32>(lo), vec4<f32>(hi)), so.x, so.y);
}
#endif

#ifdef WEIGHT_Q6_K
// 210 bytes: 128 bytes ql | 64 bytes qh | 16 x i8 scales | d f16. Values 128n + 32g + l
// (half n, quarter g, l < 32): low 4 bits from ql[64n + 32(g & 1) + l] (high nibble when
// g >= 2), top 2 bits from bits 2g..2g+2 of qh[32n + l], scale scales[8n + 2g + l / 16].
// y = (d * scale) * (q - 32).
const Q_BLOCK: u32 = 256u;
const Q_SCALED: bool = true;
const Q_AFFINE: bool = false;
fn q_load(row: u32, part: u32, cols: u32) -> QPart {
    let b = (row * (cols / 256u) + part / 32u) * 210u;
    let sub = (part & 31u) >> 2u;
    let n = sub >> 2u;
    let g = sub & 3u;
    let p = part & 3u;
    let ql = q_bytes8(b + 64u * n + 32u * (g & 1u) + 8u * p);
    let qh = q_bytes8(b + 128u + 32u * n + 8u * p);
    let shift = 4u * (g >> 1u);
    let hs = vec4<u32>(0u, 8u, 16u, 24u) + 2u * g;
    let lo = q_u4x4(ql.x, shift) | (((vec4<u32>(qh.x) >> hs) & vec4<u32>(3u)) << vec4<u32>(4u));
    let hi = q_u4x4(ql.y, shift) | (((vec4<u32>(qh.y) >> hs) & vec4<u32>(3u)) << vec4<u32>(4u));
    let a = b + 192u + 8u * n + 2u * g + (p >> 1u);
    let sc = extractBits(bitcast<i32>(qw[a >> 2u]), 8u * (a & 3u), 8u);
    let scale = q_f16_at(b + 208u) * f32(sc);
    return QPart(Q8(vec4<f32>(lo) - 32.0, vec4<f32>(hi) - 32.0), scale, 0.0);
}
#endif

// --- Uses ---------------------------------------------------------------------------------------

// The part's 8 values, bit-exact with the CPU dequantization (see the formulas above; the
// products are exact in f32, so a fused multiply-add gives the same bits).
fn q_dequant(p: QPart) -> Q8 {
    if Q_AFFINE {
        return Q8(p.q.lo * p.scale + p.offset, p.q.hi * p.scale + p.offset);
    }
    if Q_SCALED {
        return Q8(p.q.lo * p.scale, p.q.hi * p.scale);
    }
    return p.q;
}

#ifdef MM_F16
// Four values rounded to f16 (clamped to its finite range first: a conversion out of range is
// undefined in WGSL).
fn mm_h4(v: vec4<f32>) -> vec4<f16> {
    return vec4<f16>(clamp(v, vec4<f32>(-65504.0), vec4<f32>(65504.0)));
}

// The products of four weights and four activations, both rounded to f16 and multiplied in
// f16, widened to f32 for the sum (precision f16: inputs and products f16, accumulation f32).
fn mm_prod4(w: vec4<f32>, x: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(mm_h4(w) * mm_h4(x));
}

// Sum over the part of value * x in f16 products (see mm_prod4), summed in f32.
fn q_dot(p: QPart, x: Q8) -> f32 {
    let w = q_dequant(p);
    return dot(mm_prod4(w.lo, x.lo) + mm_prod4(w.hi, x.hi), vec4<f32>(1.0));
}
#else
// Sum over the part of value * x, factored as scale * (q . x) + offset * sum(x): 2 multiplies
// per part instead of 8 (the rounding differs from dequantize-then-dot by a few ulps of the
// terms, well inside the tests' 1e-5 relative tolerance).
fn q_dot(p: QPart, x: Q8) -> f32 {
    let d = dot(p.q.lo, x.lo) + dot(p.q.hi, x.hi);
    if Q_AFFINE {
        return p.scale * d + p.offset * dot(x.lo + x.hi, vec4<f32>(1.0));
    }
    if Q_SCALED {
        return p.scale * d;
    }
    return d;
}
#endif
