// What every linear kernel shares (included by both shapes of linear.wgsl): the
// parameters, the bindings with their fixed numbers, activation reads (normalised under NORM)
// and the fused epilogue `store`. See linear.wgsl for the defines.
#include "quant.wgsl"
#include "activation.wgsl"
#include "rope_angle.wgsl"

struct Params {
    rows: u32,
    cols: u32,
    max_tokens: u32,
    eps: f32,
    // KV_WRITE only
    q_rows: u32,
    kv_rows: u32,
    head_dim: u32,
    max_positions: u32,
    // y[t, r] is y[t * y_stride + y_offset + r]: a matrix split by rows across bindings runs
    // once per part, each writing its rows of the whole output (y_stride = rows, y_offset = 0
    // otherwise). With GLU both count output rows (half the weight rows). Not for KV_WRITE.
    y_stride: u32,
    y_offset: u32,
    // KV_WRITE only: rows per sequence of a local layer's ring (0: every position kept)
    ring: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
#include "step.wgsl"
@group(0) @binding(2) var<storage, read> qw: array<u32>;
// X_F16 / Y_F16 (precision f16 only, so f16 is enabled): x or y held as f16, the activations
// between a product and the next one (attention output, feed-forward hidden); read as f32,
// written rounded to f16 (clamped to its range).
#ifdef X_F16
alias XElem = f16;
#else
alias XElem = f32;
#endif
#ifdef Y_F16
alias YElem = f16;
#else
alias YElem = f32;
#endif
#ifdef X_VEC4
@group(0) @binding(3) var<storage, read> x: array<vec4<XElem>>;
#else
@group(0) @binding(3) var<storage, read> x: array<XElem>;
#endif
@group(0) @binding(4) var<storage, read_write> y: array<YElem>;

// An output value as y holds it.
fn y_value(v: f32) -> YElem {
#ifdef Y_F16
    return YElem(clamp(v, -65504.0, 65504.0));
#else
    return v;
#endif
}
// Optional buffers keep fixed binding numbers.
#ifdef HAS_BIAS
@group(0) @binding(5) var<storage, read> bias: array<f32>;
#endif
// With X_VEC4 (cols a multiple of 32) the norm's vectors are read as vec4s too.
#ifdef X_VEC4
#ifdef NORM
@group(0) @binding(6) var<storage, read> norm_w: array<vec4<f32>>;
#endif
#ifdef NORM_LAYER
@group(0) @binding(7) var<storage, read> norm_b: array<vec4<f32>>;
#endif
#else
#ifdef NORM
@group(0) @binding(6) var<storage, read> norm_w: array<f32>;
#endif
#ifdef NORM_LAYER
@group(0) @binding(7) var<storage, read> norm_b: array<f32>;
#endif
#endif
#ifdef KV_WRITE
#ifndef KV_DEFER
#ifdef KV_BLOCKS
// Caches of kinds K_KIND and V_KIND (kv_kind.wgsl) encoded here, a 32-value block at a time
// (kv_encode_block): two blocks share a scale word, and the workgroups computing them write
// its halves with atomics.
@group(0) @binding(8) var<storage, read_write> k_cache: array<atomic<u32>>;
@group(0) @binding(9) var<storage, read_write> v_cache: array<atomic<u32>>;
#else
#ifdef KV_F16
// f16 caches: a word holds two values (pack2x16float, as the KV store encodes them)
@group(0) @binding(8) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(9) var<storage, read_write> v_cache: array<u32>;
#else
@group(0) @binding(8) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(9) var<storage, read_write> v_cache: array<f32>;
#endif
#endif
#endif
#endif
#ifdef ROPE
// Pair i's turns per position, (hi, lo) 0.64 fixed point.
@group(0) @binding(10) var<storage, read> rope_freqs: array<vec2<u32>>;
#endif

// Tokens this step computes; never more than the buffers were checked for.
fn token_count() -> u32 {
    return min(step_params.n_tokens, params.max_tokens);
}

// Activation x[t, c] for one column, 0 past the row (float types have partial parts).
fn x_at(t: u32, c: u32) -> f32 {
    if c >= params.cols {
        return 0.0;
    }
#ifdef X_VEC4
    let i = t * params.cols + c;
    return f32(x[i >> 2u][i & 3u]);
#else
    return f32(x[t * params.cols + c]);
#endif
}

// Raw activations x[t, c0..c0 + 4] (c0 a multiple of 4).
fn x4_raw(t: u32, c0: u32) -> vec4<f32> {
#ifdef X_VEC4
    return vec4<f32>(x[(t * params.cols + c0) >> 2u]);
#else
    return vec4<f32>(x_at(t, c0), x_at(t, c0 + 1u), x_at(t, c0 + 2u), x_at(t, c0 + 3u));
#endif
}

#ifdef NORM
// norm_w[c0..c0 + 4] (and norm_b), 0 past the row (c0 a multiple of 4).
fn norm_w4(c0: u32) -> vec4<f32> {
#ifdef X_VEC4
    return norm_w[c0 >> 2u];
#else
    var out = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        let c = c0 + i;
        out[i] = select(0.0, norm_w[min(c, params.cols - 1u)], c < params.cols);
    }
    return out;
#endif
}
#ifdef NORM_LAYER
fn norm_b4(c0: u32) -> vec4<f32> {
#ifdef X_VEC4
    return norm_b[c0 >> 2u];
#else
    var out = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        let c = c0 + i;
        out[i] = select(0.0, norm_b[min(c, params.cols - 1u)], c < params.cols);
    }
    return out;
#endif
}
#endif
#endif

// The layer's input at x[t, c0..c0 + 4]: normalised with `stats` = (mean, 1 / sqrt(var + eps))
// under NORM (mean 0 for RMS), raw otherwise.
fn x4(t: u32, c0: u32, stats: vec2<f32>) -> vec4<f32> {
    let v = x4_raw(t, c0);
#ifdef NORM
    var out = (v - stats.x) * stats.y * norm_w4(c0);
#ifdef NORM_LAYER
    out += norm_b4(c0);
#endif
    return out;
#else
    return v;
#endif
}

// Part p (8 values) of token t's input, normalised with `stats` (see x4).
fn x_part(t: u32, p: u32, stats: vec2<f32>) -> Q8 {
    return Q8(x4(t, 8u * p, stats), x4(t, 8u * p + 4u, stats));
}

// Squares of token t's raw part p (the RMS statistic, summed with the products).
fn sq8(t: u32, p: u32) -> f32 {
    let lo = x4_raw(t, 8u * p);
    let hi = x4_raw(t, 8u * p + 4u);
    return dot(lo, lo) + dot(hi, hi);
}

// (mean, 1 / sqrt(var + eps)) of token t from per-invocation partial sums over the columns
// c = first, first + stride, ...: `sum_of` reduces them. Mean is 0 for RMS norms.
fn partial_sum(t: u32, first: u32, stride: u32, mean: f32) -> f32 {
    var s = 0.0;
    for (var c = first; c < params.cols; c += stride) {
        let d = x_at(t, c) - mean;
        s += d * d;
    }
    return s;
}

fn partial_plain_sum(t: u32, first: u32, stride: u32) -> f32 {
    var s = 0.0;
    for (var c = first; c < params.cols; c += stride) {
        s += x_at(t, c);
    }
    return s;
}

// Bias of row r, 0 without HAS_BIAS.
fn bias_at(r: u32) -> f32 {
#ifdef HAS_BIAS
    return bias[r];
#else
    return 0.0;
#endif
}

#ifdef KV_BLOCKS
fn kv_word(which: u32, i: u32) -> u32 {
    if which == 0u {
        return atomicLoad(&k_cache[i]);
    }
    return atomicLoad(&v_cache[i]);
}

fn kv_put(which: u32, i: u32, w: u32) {
    if which == 0u {
        atomicStore(&k_cache[i], w);
    } else {
        atomicStore(&v_cache[i], w);
    }
}

#include "kv_kind.wgsl"

// Value c of token t's K (0) or V (1) row as this dispatch stored it in y (rotated).
fn kv_src(which: u32, t: u32, c: u32) -> f32 {
    if c >= params.kv_rows {
        return 0.0;
    }
    let first = params.q_rows + which * params.kv_rows;
    return f32(y[t * params.y_stride + params.y_offset + first + c]);
}

#include "kv_encode.wgsl"

// Encodes token t's stacked rows r0 .. r0 + 32 into the caches when they are one block of
// K or V (r0 a multiple of 32; q_rows and kv_rows are too, so blocks never straddle). The
// caller has stored those rows to y and passed a storageBarrier since.
fn kv_encode_block(t: u32, r0: u32) {
    let pos = token_pos(t);
    // positions past the cache were refused on the host; never write outside it anyway
    if r0 < params.q_rows || r0 >= params.rows || t >= token_count() || pos >= params.max_positions {
        return;
    }
    let which = select(0u, 1u, r0 >= params.q_rows + params.kv_rows);
    let b = (r0 - params.q_rows - which * params.kv_rows) / 32u;
    let kind = kv_kind(which);
    let base = cache_row(t, pos, params.ring) * kv_row_words(kind, params.kv_rows);
    let sw = kv_scale_words(kind, params.kv_rows);
    let d = encode_block(which, kind, t, b, base, sw, params.kv_rows);
    if sw > 0u {
        // this block's half of the scale word; the other half belongs to block b ^ 1
        let shift = 16u * (b % 2u);
        let half = (pack2x16float(vec2<f32>(d, 0.0)) & 0xffffu) << shift;
        let keep = ~(0xffffu << shift);
        if which == 0u {
            atomicAnd(&k_cache[base + b / 2u], keep);
            atomicOr(&k_cache[base + b / 2u], half);
        } else {
            atomicAnd(&v_cache[base + b / 2u], keep);
            atomicOr(&v_cache[base + b / 2u], half);
        }
    }
}
#endif

// Writes output (t, r) from the dot products: `v` is row r's; with GLU, `v` and `u` are the
// gate and up rows of output r; with ROPE, `u` is row r ^ 1's (the other half of its pair).
fn store(t: u32, r: u32, v: f32, u: f32) {
#ifdef KV_WRITE
    let raw = v + bias_at(r);
    // row r ^ 1's value before rotation
    let other = u + bias_at(r ^ 1u);
    var out = raw;
    // row r ^ 1's output, as its own invocation computes it (KV_F16 writes both)
    var partner = other;
    let pos = token_pos(t);
    let row = cache_row(t, pos, params.ring);
    let kv_end = params.q_rows + params.kv_rows;
#ifdef ROPE
    if r < kv_end {
        let within = select(r, r - params.q_rows, r >= params.q_rows) % params.head_dim;
        let f = rope_freqs[within / 2u];
        let sc = rope_sin_cos_fixed(pos, f.x, f.y);
        if (r & 1u) == 0u {
            out = raw * sc.y - other * sc.x;
            partner = raw * sc.x + other * sc.y;
        } else {
            out = other * sc.x + raw * sc.y;
        }
    }
#endif
    y[t * params.y_stride + params.y_offset + r] = y_value(out);
#ifndef KV_DEFER
#ifndef KV_BLOCKS
    // positions past the cache were refused on the host; never write outside it anyway
    if pos < params.max_positions {
#ifdef KV_F16
        // the even row of each pair writes the word holding both (kv_rows and q_rows are even)
        if (r & 1u) == 0u && r >= params.q_rows {
            let word = pack2x16float(clamp(vec2<f32>(out, partner), vec2<f32>(-65504.0),
                vec2<f32>(65504.0)));
            if r >= kv_end {
                v_cache[(row * params.kv_rows + r - kv_end) / 2u] = word;
            } else {
                k_cache[(row * params.kv_rows + r - params.q_rows) / 2u] = word;
            }
        }
#else
        if r >= kv_end {
            v_cache[row * params.kv_rows + r - kv_end] = out;
        } else if r >= params.q_rows {
            k_cache[row * params.kv_rows + r - params.q_rows] = out;
        }
#endif
    }
#endif
#endif
#else
#ifdef GLU
    let i = t * params.y_stride + params.y_offset + r;
#ifdef GELU
    let gate = gelu_tanh(v + bias_at(2u * r));
#else
    let gate = silu(v + bias_at(2u * r));
#endif
    y[i] = y_value(gate * (u + bias_at(2u * r + 1u)));
#else
    var out = v + bias_at(r);
#ifdef GELU
    out = gelu_tanh(out);
#endif
#ifdef GELU_ERF
    out = gelu_erf(out);
#endif
    let i = t * params.y_stride + params.y_offset + r;
#ifdef ACCUMULATE
    out = f32(y[i]) + out;
#endif
    y[i] = y_value(out);
#endif
#endif
}

